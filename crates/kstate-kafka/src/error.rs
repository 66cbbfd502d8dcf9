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
        "Kafka broker at {bootstrap_servers} did not answer within {timeout:?} (topic {topic}): {source}{}",
        last_error.as_deref().map(|e| format!("; the client's last error: {e}")).unwrap_or_default()
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
        /// The last error the client reported about its connections, which says why (e.g.
        /// librdkafka's "connecting to a SSL listener?").
        last_error: Option<String>,
    },

    /// The cluster refused the client's credentials or its TLS handshake; reported as soon as
    /// seen, since waiting cannot fix it.
    #[error("cannot log in to the Kafka cluster at {bootstrap_servers} (topic {topic}): {failure}")]
    Security {
        /// The bootstrap servers tried.
        bootstrap_servers: String,
        /// The changelog topic.
        topic: String,
        /// What failed.
        #[source]
        failure: crate::connection::SecurityFailure,
    },

    /// An output record sent through a [`SharedProducer`](crate::SharedProducer) was not
    /// delivered: the input that produced it must not be committed.
    #[error("{message}")]
    OutputFailed {
        /// Which output, and the client's error.
        message: String,
        /// The client's error code, when the broker or librdkafka gave one (a record over
        /// `message.max.bytes`, a partition the topic lacks, a denied write, ...); `None` when
        /// the outputs were not acknowledged in time.
        code: Option<rdkafka::types::RDKafkaErrorCode>,
    },

    /// A producer that is not one store's own ([`ProducerConfig`](crate::ProducerConfig)) could
    /// not be created or initialised.
    #[error("producer for {bootstrap_servers}: {operation} failed: {source}")]
    Producer {
        /// The cluster.
        bootstrap_servers: String,
        /// What was being done.
        operation: &'static str,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },

    /// The restore was cancelled through its [`CancelToken`](crate::CancelToken).
    #[error("restore of changelog {topic}/{partition} cancelled")]
    Cancelled {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
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

    /// The store holds a changelog position, but its changelog is missing or empty: a deleted
    /// topic, a typo in its name, or a bootstrap address of the wrong cluster. Nothing was
    /// created or changed; the local store may be the only copy of the state left.
    #[error(
        "the store at {path} holds changelog {topic}/{partition} up to offset {stored_offset}, \
         but that changelog {found}. Nothing was created or wiped: the local store may be the \
         only copy left. Check the topic name and bootstrap servers; to go on, open with \
         ChangelogConfig::lost_changelog(LostChangelog::Reseed) to write the local contents \
         into the changelog, or LostChangelog::Rebuild to discard them"
    )]
    ChangelogLost {
        /// The store directory.
        path: std::path::PathBuf,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset the store holds.
        stored_offset: i64,
        /// What was found: "does not exist", "is empty", ...
        found: String,
    },

    /// The store's position names another changelog than the one configured.
    #[error(
        "the store at {path} holds changelog {stored_topic}/{stored_partition}, not the \
         configured {topic}/{partition}; refusing to wipe it (a typo in the topic name?). Open it \
         with its own changelog, or choose LostChangelog::Rebuild or ::Reseed explicitly"
    )]
    PositionMismatch {
        /// The store directory.
        path: std::path::PathBuf,
        /// The topic the store holds.
        stored_topic: String,
        /// The partition the store holds.
        stored_partition: i32,
        /// The configured topic.
        topic: String,
        /// The configured partition.
        partition: i32,
    },

    /// The directory holds data but no changelog position: it was not written by a logged
    /// store (e.g. a plain `RocksDbStore`), so its contents are not a prefix of any changelog.
    #[error(
        "{path} holds data but no changelog position, so it is not a changelog-backed store; \
         refusing to wipe it (choose LostChangelog::Rebuild to replace it with changelog {topic})"
    )]
    NotAChangelogStore {
        /// The store directory.
        path: std::path::PathBuf,
        /// The configured topic.
        topic: String,
    },

    /// A transaction on the changelog partition stayed open for the whole open timeout: the
    /// records from its first offset on cannot be read yet, so the restore cannot reach the end.
    #[error(
        "changelog {topic}/{partition}: a transaction open since offset {last_stable_offset} \
         (the log ends at {high_watermark}) did not finish within {waited:?}; the restore \
         cannot read past it. Find the producer holding it (kafka-transactions.sh \
         find-hanging) or wait for transaction.timeout.ms"
    )]
    OpenTransaction {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The last stable offset: the first offset of the oldest open transaction.
        last_stable_offset: i64,
        /// The log's end.
        high_watermark: i64,
        /// How long the open waited.
        waited: Duration,
    },

    /// The changelog topic exists with settings the store cannot work with.
    #[error("changelog topic {topic}: {problem}")]
    TopicSettings {
        /// The topic.
        topic: String,
        /// What is wrong, with the setting's name and value.
        problem: String,
    },
}

/// Why a transaction of a transactional [`SharedProducer`](crate::SharedProducer) did not
/// commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// The transaction was aborted: none of its records or offsets is visible to
    /// `read_committed` readers, and every attached store is as at the last commit. The next
    /// transaction is open; rewind the input to its committed offsets and go on.
    #[error(
        "transaction of {transactional_id} aborted ({reason}); the stores are as at the last commit"
    )]
    Aborted {
        /// The producer's transactional id.
        transactional_id: String,
        /// What made it abort.
        reason: String,
    },
    /// The producer cannot go on (fenced by a newer producer with the same transactional id,
    /// or another fatal error): nothing of the open transaction was applied to any store. Drop
    /// the producer and its stores; a new producer and a restore start over.
    #[error("transactional producer {transactional_id} failed for good in {operation}: {message}")]
    Fatal {
        /// The producer's transactional id.
        transactional_id: String,
        /// The call that failed.
        operation: &'static str,
        /// The client's error.
        message: String,
        /// The broker fenced the producer: a newer producer with the same transactional id
        /// exists, or the broker aborted a transaction of ours that stayed open past
        /// `transaction.timeout.ms` (which bumps the producer's epoch). Otherwise the producer
        /// failed some other way (an abort that could not complete, a begin refused).
        fenced: bool,
    },
    /// A store cannot go on: it could not apply a committed transaction, or its changelog
    /// disagrees with it (another writer). Reopen it (the restore replays what it lacks).
    #[error("transaction of {transactional_id}: store {store}: {source}")]
    Store {
        /// The producer's transactional id.
        transactional_id: String,
        /// The store.
        store: String,
        /// Its error.
        #[source]
        source: kstate_core::Error,
    },
}

impl TransactionError {
    /// Whether the transaction was aborted and everything may go on after a rewind.
    pub fn is_aborted(&self) -> bool {
        matches!(self, TransactionError::Aborted { .. })
    }

    /// Whether the broker fenced the producer (see [`TransactionError::Fatal`]'s `fenced`).
    pub fn is_fenced(&self) -> bool {
        matches!(self, TransactionError::Fatal { fenced: true, .. })
    }
}

/// Why a client properties file could not be read. Never quotes the file's text: it may hold
/// secrets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientPropertiesError {
    /// The file could not be read.
    #[error("cannot read the client properties file {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `key=value`.
    #[error("{}:{line}: {problem}", path.display())]
    Syntax {
        /// The file.
        path: std::path::PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Why members could not be removed from a consumer group
/// ([`remove_group_members`](crate::remove_group_members)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemberRemovalError {
    /// The cluster is reached through a security protocol this client does not speak.
    #[error(
        "cannot remove members of group {group}: security.protocol {protocol} is not supported (PLAINTEXT only)"
    )]
    Unsupported {
        /// The group.
        group: String,
        /// The configured `security.protocol`.
        protocol: String,
    },
    /// `bootstrap.servers` names no broker.
    #[error(
        "cannot remove members of group {group}: no broker in bootstrap.servers {bootstrap_servers:?}"
    )]
    NoBroker {
        /// The group.
        group: String,
        /// The configured brokers.
        bootstrap_servers: String,
    },
    /// A broker could not be reached, or the connection failed.
    #[error("cannot remove members of group {group}: broker {broker}: {source}")]
    Io {
        /// The group.
        group: String,
        /// The broker, `host:port`.
        broker: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A broker answered with an error code.
    #[error(
        "cannot remove members of group {group}: broker {broker} answered {request} with error code {code}"
    )]
    Broker {
        /// The group.
        group: String,
        /// The broker, `host:port`.
        broker: String,
        /// `FindCoordinator` or `LeaveGroup`.
        request: &'static str,
        /// Kafka's error code.
        code: i16,
    },
    /// A broker's answer could not be read.
    #[error(
        "cannot remove members of group {group}: broker {broker}'s answer to {request}: {problem}"
    )]
    Malformed {
        /// The group.
        group: String,
        /// The broker, `host:port`.
        broker: String,
        /// `FindCoordinator` or `LeaveGroup`.
        request: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The time given ran out before any answer.
    #[error("cannot remove members of group {group}: no answer within {timeout:?}")]
    Timeout {
        /// The group.
        group: String,
        /// The time given.
        timeout: std::time::Duration,
    },
}
