//! [`ChangelogError`]: what can go wrong between a store and its changelog, naming the topic,
//! partition and offset involved.

use std::time::Duration;

use kstate_core::BoxError;

/// Why opening, restoring or writing a logged store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChangelogError {
    /// The broker did not answer within the open timeout.
    #[error(
        "Kafka broker at {bootstrap_servers} did not answer within {timeout:?} (topic {topic}): {source}"
    )]
    BrokerUnreachable {
        /// The bootstrap servers tried.
        bootstrap_servers: String,
        /// The changelog topic.
        topic: String,
        /// How long we waited.
        timeout: Duration,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },

    /// The changelog topic exists with another partition count than configured.
    #[error(
        "changelog topic {topic} has {actual} partitions, but this store expects {expected}; refusing to write to what may be the wrong partition"
    )]
    PartitionCountMismatch {
        /// The topic.
        topic: String,
        /// The configured count.
        expected: i32,
        /// The topic's count.
        actual: i32,
    },

    /// The changelog topic exists and is not compacted.
    #[error(
        "changelog topic {topic} has cleanup.policy={actual:?}; a changelog must be compacted (cleanup.policy=compact)"
    )]
    NotCompacted {
        /// The topic.
        topic: String,
        /// Its cleanup policy.
        actual: String,
    },

    /// The configuration is inconsistent.
    #[error("invalid changelog configuration for topic {topic}: {message}")]
    InvalidConfig {
        /// The topic.
        topic: String,
        /// What is wrong.
        message: String,
    },

    /// A Kafka client operation failed.
    #[error("changelog {topic}/{partition}: {operation} failed: {source}")]
    Kafka {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// What was being done.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },

    /// A changelog record could not be applied.
    #[error("changelog {topic}/{partition} at offset {offset}: {problem}")]
    BadRecord {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// What was wrong.
        problem: String,
        /// The decoder's error, if a decoder rejected it.
        #[source]
        source: Option<BoxError>,
    },

    /// The local store failed to open.
    #[error(transparent)]
    Open(#[from] kstate_rocksdb::OpenError),

    /// The local store failed.
    #[error(transparent)]
    Store(#[from] kstate_core::Error),

    /// Removing a store directory for a rebuild failed.
    #[error("cannot wipe {path} for a rebuild: {source}")]
    Wipe {
        /// The store directory.
        path: std::path::PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}
