//! Opening a worker's transactional producer while the cluster is in motion.
//!
//! `init_transactions` asks the transaction coordinator for the producer id, which fences the
//! worker's previous incarnation. During a rolling restart the coordinator moves from node to
//! node, and one call (its init timeout plus the transaction timeout, 40 s by default) can end
//! on "Not coordinator" though the next would succeed. Seen on the three-node cluster: a copy
//! restarted after its kill while two nodes restarted one after the other, and the
//! application failed ("init transactions failed: ... Broker: Not coordinator"). So a
//! producer whose init failed by a cluster in motion is replaced by a new one until the task
//! timeout ([`AppBuilder::task_timeout`](crate::AppBuilder::task_timeout)); a fenced or
//! refused one fails at once.

use kstate_kafka::{ChangelogError, SharedProducer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::error::TaskError;
use crate::shared::AppShared;

/// Worker `worker`'s transactional producer, opened again while its init fails by a cluster
/// in motion, until the task timeout or the application stops.
pub(crate) fn open(app: &AppShared, worker: usize) -> Result<SharedProducer, TaskError> {
    let config = &app.config;
    let in_motion =
        |e: &TaskError| matches!(e, TaskError::Producer { source, .. } if init_in_motion(source));
    crate::start_retry::until_task_timeout(
        &format!("worker {worker}'s transactional producer"),
        config.task_timeout,
        &|| app.stopping(),
        in_motion,
        || {
            SharedProducer::transactional_with(
                &config.producer_config(),
                config.transactional_id(worker),
                config.transaction_timeout,
            )
            .map_err(|e| TaskError::producer(worker, e))
        },
    )
}

/// Whether opening a transactional producer failed only because the cluster is in motion.
fn init_in_motion(error: &ChangelogError) -> bool {
    match error {
        ChangelogError::Producer {
            source: KafkaError::Transaction(e),
            ..
        } => may_init_again(e.code(), e.is_retriable(), e.is_fatal()),
        ChangelogError::Producer { source, .. } => kstate_kafka::error_in_motion(source),
        _ => false,
    }
}

/// librdkafka's verdict on a failed `init_transactions`: a fatal error (fenced, refused) never
/// passes; a retriable one, or one of a cluster in motion, may.
fn may_init_again(code: RDKafkaErrorCode, retriable: bool, fatal: bool) -> bool {
    !fatal && (retriable || kstate_kafka::is_in_motion(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_init_that_met_a_moving_coordinator_is_tried_again_and_a_fenced_or_refused_one_is_not() {
        assert!(may_init_again(
            RDKafkaErrorCode::NotCoordinator,
            false,
            false
        ));
        assert!(may_init_again(
            RDKafkaErrorCode::CoordinatorLoadInProgress,
            false,
            false
        ));
        assert!(may_init_again(
            RDKafkaErrorCode::MessageTimedOut,
            true,
            false
        ));
        assert!(!may_init_again(
            RDKafkaErrorCode::ProducerFenced,
            false,
            true
        ));
        assert!(!may_init_again(
            RDKafkaErrorCode::NotCoordinator,
            true,
            true
        ));
        assert!(!may_init_again(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
            false,
            false
        ));
    }
}
