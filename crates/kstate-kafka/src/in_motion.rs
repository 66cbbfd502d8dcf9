//! Errors of a cluster in motion, and asking again through them.
//!
//! On a cluster whose brokers restart or die, a request can fail at once for a while: a
//! partition has no leader until the controller elects one (after it fences a dead broker, some
//! seconds), a new leader's high watermark has not caught up, a connection to a broker that
//! went away is torn down. Each passes by itself; a client that already knows the cluster asks
//! again within its timeout instead of failing the store, the restore or the task (found on the
//! three-node cluster: a restore and a task's start failed at once on such errors).

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaErrorCode;

/// How long to wait before asking again.
const PAUSE: Duration = Duration::from_millis(50);

/// Whether a request's error may pass by itself once the cluster has settled: a partition
/// without a leader (being elected, or its leader dead and not yet fenced), a new leader whose
/// high watermark has not caught up yet, a connection to a broker that went away, a request
/// that ran out of its time (sent, or still queued for a broker it could not reach).
pub fn is_in_motion(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownPartition
            | RDKafkaErrorCode::OffsetNotAvailable
            | RDKafkaErrorCode::FencedLeaderEpoch
            | RDKafkaErrorCode::UnknownLeaderEpoch
            | RDKafkaErrorCode::ReplicaNotAvailable
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::CoordinatorNotAvailable
            | RDKafkaErrorCode::CoordinatorLoadInProgress
            | RDKafkaErrorCode::DestroyBroker
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::TimedOutQueue
    )
}

/// Whether `error` is one of a cluster in motion ([`is_in_motion`]). An admin request's error
/// counts too, though rdkafka's `rdkafka_error_code` names no code for it.
pub fn error_in_motion(error: &KafkaError) -> bool {
    match error {
        KafkaError::AdminOp(code) => is_in_motion(*code),
        other => other.rdkafka_error_code().is_some_and(is_in_motion),
    }
}

/// Calls `call` with what is left of `timeout` until it succeeds, fails otherwise than by the
/// cluster moving, or the time is up (then its last error).
pub fn retry_in_motion<T>(
    timeout: Duration,
    mut call: impl FnMut(Duration) -> KafkaResult<T>,
) -> KafkaResult<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match call(left) {
            Err(e) if error_in_motion(&e) && Instant::now() + PAUSE < deadline => {
                std::thread::sleep(PAUSE);
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rdkafka gives an admin request's error no code (`rdkafka_error_code` is `None`), so a
    /// changelog's DescribeConfigs that timed out on a broker in a rolling restart was not asked
    /// again, and the task's open failed (the windowed chaos run on the cluster).
    #[test]
    fn an_admin_requests_error_of_a_moving_cluster_is_one() {
        assert!(error_in_motion(&KafkaError::AdminOp(
            RDKafkaErrorCode::OperationTimedOut
        )));
        assert!(!error_in_motion(&KafkaError::AdminOp(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
        let mut calls = 0;
        let answer = retry_in_motion(Duration::from_secs(5), |_| {
            calls += 1;
            if calls < 2 {
                Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(answer.ok(), Some(2));
    }

    /// The window store's chaos run on the cluster at the acceptance size: a task's start
    /// asked for the committed offsets while the group coordinator's node was down, and the
    /// request timed out in librdkafka's queue, never sent; the application failed.
    #[test]
    fn a_request_that_timed_out_in_the_queue_is_one_of_a_moving_cluster() {
        assert!(error_in_motion(&KafkaError::MetadataFetch(
            RDKafkaErrorCode::TimedOutQueue
        )));
    }

    #[test]
    fn errors_of_a_moving_cluster_are_asked_again_and_others_are_not() {
        let mut calls = 0;
        let answer = retry_in_motion(Duration::from_secs(5), |_| {
            calls += 1;
            if calls < 3 {
                Err(KafkaError::MetadataFetch(RDKafkaErrorCode::DestroyBroker))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(answer.ok(), Some(3));
        let mut calls = 0;
        let refused: KafkaResult<()> = retry_in_motion(Duration::from_secs(5), |_| {
            calls += 1;
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::TopicAuthorizationFailed,
            ))
        });
        assert!(refused.is_err());
        assert_eq!(calls, 1);
    }
}
