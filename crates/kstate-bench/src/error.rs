//! One error type for the harness, naming what it was doing (topic, file).

use std::path::PathBuf;

/// What went wrong while measuring.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A Kafka client call failed.
    #[error("{what}: {source}")]
    Kafka {
        /// The call and the topic it was for.
        what: String,
        /// librdkafka's error.
        source: rdkafka::error::KafkaError,
    },
    /// The broker did not do what the measurement needs (records not acknowledged, a topic
    /// without append times, a read that stalled).
    #[error("{0}")]
    Broker(String),
    /// A result could not be written.
    #[error("write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A result could not be encoded as JSON.
    #[error("encode JSON for {}: {source}", path.display())]
    Json {
        /// The file it was for.
        path: PathBuf,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// A client properties file could not be read.
    #[error(transparent)]
    ClientProperties(#[from] kstate_kafka::ClientPropertiesError),
    /// Nothing names the brokers, or a file or flag names none.
    #[error(
        "no Kafka brokers named: give --bootstrap-servers, a --client-properties file with \
         bootstrap.servers, or set KAFKA_BOOTSTRAP_SERVERS"
    )]
    NoCluster,
    /// A store, or a bare RocksDB, failed while measuring.
    #[error("{what}: {source}")]
    Store {
        /// The configuration, the call and the path.
        what: String,
        /// The store's error.
        source: kstate_core::BoxError,
    },
    /// A file or directory of the run could not be made or removed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A flag's value cannot be run as given.
    #[error("{flag}: {reason}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// Why not.
        reason: String,
    },
    /// A measuring thread panicked.
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    /// Two histograms could not be merged (different bounds).
    #[error("merge latency histograms: {0}")]
    Histogram(#[from] hdrhistogram::errors::AdditionError),
}

impl BenchError {
    /// A Kafka error while doing `what`.
    pub fn kafka(what: impl Into<String>) -> impl FnOnce(rdkafka::error::KafkaError) -> Self {
        let what = what.into();
        move |source| BenchError::Kafka { what, source }
    }

    /// A store (or bare RocksDB) error while doing `what`.
    pub fn store<E: Into<kstate_core::BoxError>>(
        what: impl Into<String>,
    ) -> impl FnOnce(E) -> Self {
        let what = what.into();
        move |source| BenchError::Store {
            what,
            source: source.into(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| BenchError::Io { path, source }
    }
}
