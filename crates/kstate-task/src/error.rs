//! [`TaskError`]: what can stop an application, naming the topic, partition or task involved.

use kstate_core::BoxError;
use kstate_kafka::ChangelogError;

/// Why an application could not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The configuration is inconsistent.
    #[error("invalid application configuration: {0}")]
    InvalidConfig(String),

    /// The input topics do not have the same partition count: task *p* reads partition *p* of
    /// every input, so they must be co-partitioned.
    #[error("input topics are not co-partitioned: {counts}")]
    NotCoPartitioned {
        /// Each topic with its partition count.
        counts: String,
    },

    /// An input topic does not exist.
    #[error("input topic {topic} does not exist on {bootstrap_servers}")]
    MissingInput {
        /// The topic.
        topic: String,
        /// Where it was looked for.
        bootstrap_servers: String,
    },

    /// The cluster did not answer, or refused the client's credentials or TLS handshake (the
    /// latter reported at once: waiting cannot fix it).
    #[error("{operation} at {bootstrap_servers}: {source}")]
    Cluster {
        /// What was being done.
        operation: &'static str,
        /// The bootstrap servers.
        bootstrap_servers: String,
        /// Why it failed.
        #[source]
        source: Box<kstate_kafka::MetadataError>,
    },

    /// A Kafka client call failed.
    #[error("{operation} failed (topic {topic}, partition {partition}): {source}")]
    Kafka {
        /// What was being done.
        operation: &'static str,
        /// The topic, or a description of the topics.
        topic: String,
        /// The partition, or -1 for several.
        partition: i32,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },

    /// A store of a task failed.
    #[error("task {partition}, store {store}: {source}")]
    Store {
        /// The task.
        partition: i32,
        /// The store's name.
        store: String,
        /// What went wrong.
        #[source]
        source: kstate_core::Error,
    },

    /// Opening or restoring a store of a task failed, or writing an output.
    #[error("task {partition}: {source}")]
    Changelog {
        /// The task.
        partition: i32,
        /// What went wrong.
        #[source]
        source: Box<ChangelogError>,
    },

    /// The processor returned an error for a record or a timer.
    #[error("task {partition}: the processor failed at {topic}/{partition}@{offset}: {source}")]
    Processor {
        /// The input topic (or `timer`).
        topic: String,
        /// The task.
        partition: i32,
        /// The record's offset (-1 for a timer).
        offset: i64,
        /// The processor's error.
        #[source]
        source: BoxError,
    },

    /// A transaction could not commit and the worker cannot go on (exactly-once): fenced by a
    /// newer producer with the same transactional id, or a store that cannot apply it. Nothing
    /// of the open transaction was applied; a restart restores from the stored offsets.
    #[error("worker {worker}: {source}")]
    Transaction {
        /// The worker thread.
        worker: usize,
        /// What went wrong.
        #[source]
        source: Box<kstate_kafka::TransactionError>,
    },

    /// A thread of the runtime could not start, or panicked.
    #[error("thread {name}: {message}")]
    Thread {
        /// The thread.
        name: String,
        /// What happened.
        message: String,
    },
}

impl TaskError {
    pub(crate) fn transaction(worker: usize, source: kstate_kafka::TransactionError) -> Self {
        TaskError::Transaction {
            worker,
            source: Box::new(source),
        }
    }

    pub(crate) fn changelog(partition: i32, source: ChangelogError) -> Self {
        TaskError::Changelog {
            partition,
            source: Box::new(source),
        }
    }
}
