//! What kind of failure a task's error is, which decides what the worker does with it:
//!
//! | kind | at-least-once | exactly-once |
//! |---|---|---|
//! | the record's own ([`Failure::Record`]) | the error policy, at once | abort, rewind, and the error policy when the record comes again |
//! | transient (a broker that did not answer) | fail | abort and rewind, at most [`MAX_ABORTS`](super::retries::MAX_ABORTS) times in a row |
//! | a store that disagrees with its changelog | restore the task again (bounded) | abort, rewind the others, restore the task again |
//! | the producer cannot go on | — | drop every task, new producer, rejoin |
//! | anything else (a panic, a denied write, a missing topic) | fail | fail |
//!
//! [`react`] is this table, and the worker's only answer to a task's failure.
//!
//! A record's own failures are the ones that would fail the same way every time: the processor
//! returned an error (a value that does not decode among them), or an output cannot ever be
//! sent (larger than `message.max.bytes`, to a partition the topic lacks). Only a failure that
//! happened while the record was processed is attributed to it; an output that fails later, in
//! the commit, is transient (under exactly-once the retry then fails while processing, and is
//! attributed).

use kstate_core::PoisonReason;
use kstate_kafka::{ChangelogError, TransactionError};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::ErrorPolicy;
use crate::error::TaskError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The record's own: the error policy decides.
    Record,
    /// May pass: under exactly-once, abort and retry.
    Transient,
    /// A store disagrees with its changelog (another writer's records, perhaps aborted ones):
    /// the task with the store named here restores again.
    Corrupted { store: Option<String> },
    /// The producer cannot go on: fenced (the broker says a newer producer took over, or a
    /// transaction of ours timed out), or failed otherwise (an abort that could not complete).
    ProducerLost { fenced: bool },
    /// Nothing a retry or a skip can fix.
    Fatal,
}

/// What the worker does about a task's failure: the table in the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reaction {
    /// At-least-once: the error policy takes the record now (skipped, or dead-lettered).
    ErrorPolicy,
    /// Exactly-once: abort (the record's partial effects go) and rewind; the error policy takes
    /// the record when it comes again, inside the transaction that carries its offset.
    AbortThenErrorPolicy,
    /// Exactly-once: abort, and every running task starts over from its committed offsets
    /// (after a back-off, a bounded number of times in a row).
    AbortAndStartOver,
    /// The task holding the store named (or else the record's task) restores again.
    RestoreAgain { store: Option<String> },
    /// Every task is dropped and restored in place with a new producer.
    ReplaceProducer,
    /// The worker fails with the error.
    Fail,
}

/// The reaction to `failure`: `shared_fate`, every task's work is in one transaction
/// (exactly-once); `on_record`, a record was being processed when it happened.
pub(crate) fn react(
    failure: Failure,
    shared_fate: bool,
    policy: &ErrorPolicy,
    on_record: bool,
) -> Reaction {
    match failure {
        Failure::Record if on_record && *policy != ErrorPolicy::Fail => {
            if shared_fate {
                Reaction::AbortThenErrorPolicy
            } else {
                Reaction::ErrorPolicy
            }
        }
        Failure::Record | Failure::Fatal => Reaction::Fail,
        Failure::Transient if shared_fate => Reaction::AbortAndStartOver,
        Failure::Transient => Reaction::Fail,
        Failure::Corrupted { store } => Reaction::RestoreAgain { store },
        Failure::ProducerLost { .. } => Reaction::ReplaceProducer,
    }
}

/// What the worker does when the last commit of ending tasks (a revocation's, or the end's)
/// failed: their work is not committed either way, and they are dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndingFailed {
    /// At-least-once: their next owner replays their input from their last commit.
    Replay,
    /// Exactly-once: the transaction aborts, and the remaining tasks start over.
    AbortAndStartOver,
    /// The producer cannot go on: replaced, every task restored again.
    ReplaceProducer,
    /// The worker fails with the error.
    Fail,
}

/// The reaction to `failure` of the last commit of ending tasks; `shared_fate` as in [`react`].
pub(crate) fn react_to_ending(failure: Failure, shared_fate: bool) -> EndingFailed {
    match failure {
        _ if !shared_fate => EndingFailed::Replay,
        Failure::ProducerLost { .. } => EndingFailed::ReplaceProducer,
        Failure::Fatal => EndingFailed::Fail,
        Failure::Record | Failure::Transient | Failure::Corrupted { .. } => {
            EndingFailed::AbortAndStartOver
        }
    }
}

pub(crate) fn classify(error: &TaskError) -> Failure {
    match error {
        TaskError::Processor { source, .. } => {
            if let Some(task) = source.downcast_ref::<TaskError>() {
                classify(task)
            } else if let Some(store) = source.downcast_ref::<kstate_core::Error>() {
                store_failure(store)
            } else {
                // The processor's own error.
                Failure::Record
            }
        }
        TaskError::Store { source, .. } => store_failure(source),
        TaskError::Output { source, .. } => changelog_failure(source, true),
        TaskError::Producer { source, .. } => changelog_failure(source, false),
        TaskError::Transaction { source, .. } => match &**source {
            TransactionError::Aborted { .. } => Failure::Transient,
            TransactionError::Fatal { fenced, .. } => Failure::ProducerLost { fenced: *fenced },
            TransactionError::Store { store, source, .. } => match store_failure(source) {
                Failure::Corrupted { .. } => Failure::Corrupted {
                    store: Some(store.clone()),
                },
                other => other,
            },
            _ => Failure::Fatal,
        },
        _ => Failure::Fatal,
    }
}

fn store_failure(error: &kstate_core::Error) -> Failure {
    match error {
        kstate_core::Error::Poisoned { reason, store } => {
            if reason.is_transient() {
                Failure::Transient
            } else if matches!(
                reason,
                PoisonReason::ForeignWrite { .. }
                    | PoisonReason::UncheckedGap { .. }
                    | PoisonReason::OutOfOrder { .. }
            ) {
                Failure::Corrupted {
                    store: Some(store.clone()),
                }
            } else {
                Failure::Fatal
            }
        }
        // A bounded commit that gave up: the store is fine, its changelog slow.
        kstate_core::Error::Timeout { .. } => Failure::Transient,
        kstate_core::Error::Decode { .. }
        | kstate_core::Error::Encode { .. }
        | kstate_core::Error::InvalidArgument { .. } => Failure::Record,
        _ => Failure::Fatal,
    }
}

/// `attributed`: the failure happened while the record was processed (a send refused at once).
fn changelog_failure(error: &ChangelogError, attributed: bool) -> Failure {
    let code = match error {
        ChangelogError::Kafka { source, .. } => kafka_code(source),
        ChangelogError::OutputFailed { code, .. } => *code,
        ChangelogError::Store(store) => return store_failure(store),
        _ => return Failure::Fatal,
    };
    match code {
        Some(code) if never_deliverable(code) => {
            if attributed {
                Failure::Record
            } else {
                Failure::Transient
            }
        }
        Some(code) if misconfigured(code) => Failure::Fatal,
        _ => Failure::Transient,
    }
}

fn kafka_code(error: &KafkaError) -> Option<RDKafkaErrorCode> {
    error.rdkafka_error_code()
}

/// An output that can never be delivered, whatever the broker does next.
fn never_deliverable(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::UnknownPartition
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidMessage
    )
}

/// The application's setup is wrong (a topic missing, a write denied): skipping records would
/// lose them for a mistake an operator can fix.
fn misconfigured(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ProcessorStep;
    use crate::ids::TaskId;

    const TASK: TaskId = TaskId { partition: 0 };

    fn output(code: RDKafkaErrorCode) -> TaskError {
        TaskError::Output {
            task: TASK,
            topic: "out".into(),
            source: Box::new(ChangelogError::Kafka {
                topic: "out".into(),
                partition: 1,
                operation: "send output",
                source: KafkaError::MessageProduction(code),
            }),
        }
    }

    /// What a processor returns when its `ctx.send(..)?` failed.
    fn through_processor(error: TaskError) -> TaskError {
        TaskError::Processor {
            task: TASK,
            step: ProcessorStep::Init,
            source: Box::new(error),
        }
    }

    const SKIP: ErrorPolicy = ErrorPolicy::LogAndContinue;

    #[test]
    fn a_failed_last_commit_of_ending_tasks_under_at_least_once_is_replayed_by_their_next_owner() {
        for failure in [Failure::Transient, Failure::Fatal, Failure::Record] {
            assert_eq!(react_to_ending(failure, false), EndingFailed::Replay);
        }
    }

    #[test]
    fn a_failed_last_transaction_of_ending_tasks_aborts_and_the_others_start_over() {
        for failure in [
            Failure::Transient,
            Failure::Record,
            Failure::Corrupted { store: None },
        ] {
            assert_eq!(
                react_to_ending(failure, true),
                EndingFailed::AbortAndStartOver
            );
        }
    }

    #[test]
    fn a_last_transaction_that_lost_the_producer_replaces_it_and_a_fatal_one_fails() {
        assert_eq!(
            react_to_ending(Failure::ProducerLost { fenced: true }, true),
            EndingFailed::ReplaceProducer
        );
        assert_eq!(react_to_ending(Failure::Fatal, true), EndingFailed::Fail);
    }
    const EXACTLY_ONCE: bool = true;
    const AT_LEAST_ONCE: bool = false;
    const ON_RECORD: bool = true;

    #[test]
    fn a_records_own_failure_at_least_once_goes_to_the_error_policy_at_once() {
        let dead_letter = ErrorPolicy::DeadLetter("dlq".into());
        for policy in [SKIP, dead_letter] {
            let reaction = react(Failure::Record, AT_LEAST_ONCE, &policy, ON_RECORD);
            assert_eq!(reaction, Reaction::ErrorPolicy, "{policy:?}");
        }
    }

    #[test]
    fn a_records_own_failure_exactly_once_aborts_first_and_the_policy_takes_it_again() {
        let reaction = react(Failure::Record, EXACTLY_ONCE, &SKIP, ON_RECORD);
        assert_eq!(reaction, Reaction::AbortThenErrorPolicy);
    }

    #[test]
    fn a_records_own_failure_fails_under_the_fail_policy_or_with_no_record_at_hand() {
        for shared in [AT_LEAST_ONCE, EXACTLY_ONCE] {
            let fail = react(Failure::Record, shared, &ErrorPolicy::Fail, ON_RECORD);
            assert_eq!(fail, Reaction::Fail);
            let no_record = react(Failure::Record, shared, &SKIP, false);
            assert_eq!(no_record, Reaction::Fail);
        }
    }

    #[test]
    fn a_transient_failure_aborts_and_starts_over_exactly_once_and_fails_at_least_once() {
        let eos = react(Failure::Transient, EXACTLY_ONCE, &SKIP, ON_RECORD);
        assert_eq!(eos, Reaction::AbortAndStartOver);
        let alos = react(Failure::Transient, AT_LEAST_ONCE, &SKIP, ON_RECORD);
        assert_eq!(alos, Reaction::Fail);
    }

    #[test]
    fn a_store_that_disagrees_with_its_changelog_restores_again_under_either_guarantee() {
        let corrupted = Failure::Corrupted {
            store: Some("counts".into()),
        };
        for shared in [AT_LEAST_ONCE, EXACTLY_ONCE] {
            let reaction = react(corrupted.clone(), shared, &ErrorPolicy::Fail, ON_RECORD);
            assert_eq!(
                reaction,
                Reaction::RestoreAgain {
                    store: Some("counts".into())
                }
            );
        }
    }

    #[test]
    fn a_lost_producer_is_replaced_whether_fenced_or_not() {
        for fenced in [true, false] {
            let lost = Failure::ProducerLost { fenced };
            let reaction = react(lost, EXACTLY_ONCE, &SKIP, false);
            assert_eq!(reaction, Reaction::ReplaceProducer);
        }
    }

    #[test]
    fn anything_else_fails_whatever_the_policy() {
        for shared in [AT_LEAST_ONCE, EXACTLY_ONCE] {
            let reaction = react(Failure::Fatal, shared, &SKIP, ON_RECORD);
            assert_eq!(reaction, Reaction::Fail);
        }
    }

    #[test]
    fn outputs_that_can_never_be_sent_are_the_records_fault_when_refused_at_once() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::UnknownPartition,
        ] {
            assert_eq!(classify(&output(code)), Failure::Record, "{code:?}");
            assert_eq!(
                classify(&through_processor(output(code))),
                Failure::Record,
                "{code:?} through the processor"
            );
        }
        let later = TaskError::Producer {
            worker: 0,
            source: Box::new(ChangelogError::OutputFailed {
                message: "too large".into(),
                code: Some(RDKafkaErrorCode::MessageSizeTooLarge),
            }),
        };
        assert_eq!(classify(&later), Failure::Transient, "found at the commit");
    }

    #[test]
    fn a_missing_topic_or_a_denied_write_fails_instead_of_skipping() {
        for code in [
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert_eq!(classify(&output(code)), Failure::Fatal, "{code:?}");
        }
        assert_eq!(
            classify(&output(RDKafkaErrorCode::QueueFull)),
            Failure::Transient
        );
    }

    #[test]
    fn store_failures_by_kind() {
        let poisoned = |reason| kstate_core::Error::Poisoned {
            store: "s".into(),
            reason,
        };
        let store = |source| TaskError::Store {
            task: TASK,
            store: "s".into(),
            source: Box::new(source),
        };
        let foreign = poisoned(PoisonReason::ForeignWrite {
            expected_offset: 1,
            actual_offset: 5,
        });
        assert_eq!(
            classify(&store(foreign)),
            Failure::Corrupted {
                store: Some("s".into())
            }
        );
        let timeout = poisoned(PoisonReason::Timeout {
            waiting_for: "acks".into(),
            waited: std::time::Duration::from_secs(1),
        });
        assert_eq!(classify(&store(timeout)), Failure::Transient);
        let decode = kstate_core::Error::Decode {
            store: "s".into(),
            what: "value",
            location: "key 00".into(),
            source: "bad bytes".into(),
        };
        assert_eq!(
            classify(&through_processor_store(decode)),
            Failure::Record,
            "a value that does not decode is the record's failure"
        );
    }

    fn through_processor_store(error: kstate_core::Error) -> TaskError {
        TaskError::Processor {
            task: TASK,
            step: ProcessorStep::Init,
            source: Box::new(error),
        }
    }

    #[test]
    fn panics_and_fencing() {
        let panicked = TaskError::Panicked {
            task: TASK,
            step: ProcessorStep::Init,
            message: "boom".into(),
        };
        assert_eq!(classify(&panicked), Failure::Fatal);
        let fenced = TaskError::transaction(
            0,
            TransactionError::Fatal {
                transactional_id: "t".into(),
                operation: "commit",
                message: "fenced".into(),
                fenced: true,
            },
        );
        assert_eq!(classify(&fenced), Failure::ProducerLost { fenced: true });
        let user = TaskError::Processor {
            task: TASK,
            step: ProcessorStep::Init,
            source: "the processor's own error".into(),
        };
        assert_eq!(classify(&user), Failure::Record);
    }
}
