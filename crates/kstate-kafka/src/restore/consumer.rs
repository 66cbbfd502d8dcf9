//! The restore consumer's type and context.

use rdkafka::consumer::BaseConsumer;

/// The restore consumer: it asks for `enable.partition.eof` (how a restore learns it has read
/// to the end), and librdkafka reports some of those ends as client errors; they are news, not
/// failures, and are logged at debug level (rdkafka's default context logs them as errors).
pub(crate) type RestoreConsumer = BaseConsumer<EndIsNews>;

/// The restore consumer's context: see [`RestoreConsumer`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EndIsNews;

impl rdkafka::ClientContext for EndIsNews {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if matches!(error, rdkafka::error::KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
        {
            tracing::debug!(reason, "restore consumer reached the end of a partition");
        } else {
            tracing::error!(error = %error, reason, "Kafka client error");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for EndIsNews {}
