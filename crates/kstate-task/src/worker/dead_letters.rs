//! What the error policy does with a record that failed on its own account, and the records
//! an abort undid that it must take when they come again.
//!
//! At-least-once the policy takes a failing record at once: skipped (logged and counted), or
//! written to the dead-letter topic with Kafka Streams' headers (KIP-1034) and skipped.
//! Exactly-once the record's partial effects must go first, so the transaction aborts and the
//! record is remembered ([`DeadLetters`]); when the input brings it again, the policy takes it
//! instead of the processor, inside the transaction that carries its offset. It is remembered
//! until such a transaction commits: a later record's failure aborts the dead letter with the
//! rest, and the input replays the record once more.

use kstate_kafka::SharedProducer;

use crate::config::{AppConfig, ErrorPolicy};
use crate::error::TaskError;
use crate::ids::{InputPartition, Record, TaskId};
use crate::worker::slots::Slots;

/// Kafka Streams' dead-letter headers (KIP-1034), so that tools made for its dead-letter
/// queues read ours; and the task, which it does not name.
const DEAD_LETTER_EXCEPTION: &str = "__streams.errors.exception";
const DEAD_LETTER_MESSAGE: &str = "__streams.errors.message";
const DEAD_LETTER_TOPIC: &str = "__streams.errors.topic";
const DEAD_LETTER_PARTITION: &str = "__streams.errors.partition";
const DEAD_LETTER_OFFSET: &str = "__streams.errors.offset";
const DEAD_LETTER_TASK: &str = "__kstate.errors.task";

/// Exactly-once: a record whose own failure an abort undid.
pub(crate) struct FailedRecord {
    input: InputPartition,
    offset: i64,
    pub(crate) error: TaskError,
    /// The error policy took it in the open transaction.
    applied: bool,
}

/// The failed records a worker's error policy must take when they come again.
#[derive(Default)]
pub(crate) struct DeadLetters {
    failed: Vec<FailedRecord>,
}

impl DeadLetters {
    /// `record` failed on its own account and the transaction is about to abort.
    pub(crate) fn remember(&mut self, record: &Record<'_>, error: TaskError) {
        self.failed.push(FailedRecord {
            input: InputPartition::new(record.topic, record.partition),
            offset: record.offset,
            error,
            applied: false,
        });
    }

    /// The failure `record` had before, if it is one remembered: the caller hands it to the
    /// policy, then gives it back with [`applied`](Self::applied).
    pub(crate) fn again(&mut self, record: &Record<'_>) -> Option<FailedRecord> {
        let i = self.failed.iter().position(|f| {
            f.input.partition == record.partition
                && f.input.topic == record.topic
                && f.offset == record.offset
        })?;
        Some(self.failed.swap_remove(i))
    }

    /// The policy took `failed` in the open transaction.
    pub(crate) fn applied(&mut self, mut failed: FailedRecord) {
        failed.applied = true;
        self.failed.push(failed);
    }

    /// A transaction committed: the records the policy took in it are done.
    pub(crate) fn committed(&mut self) {
        self.failed.retain(|f| !f.applied);
    }

    /// A transaction aborted and the tasks rewound: the dead letters it held are gone, and
    /// each record comes again.
    pub(crate) fn rewound(&mut self) {
        for failed in &mut self.failed {
            failed.applied = false;
        }
    }

    /// The tasks of `partitions` left this worker: their next owner meets their failing
    /// records on its own.
    pub(crate) fn forget(&mut self, partitions: &[i32]) {
        self.failed
            .retain(|f| !partitions.contains(&f.input.partition));
    }

    /// Every task was dropped (the producer was lost).
    pub(crate) fn clear(&mut self) {
        self.failed.clear();
    }
}

/// Takes `record`, which failed with `error`, as the error policy says, and skips it in its
/// task (of `slots`): logged and counted as skipped, or first sent to the dead-letter topic
/// through `producer`. `Err`: the dead letter could not be sent (the worker fails). Callers
/// take [`ErrorPolicy::Fail`] first (the worker fails); were it to come here, the record would
/// be skipped.
pub(crate) fn skip(
    config: &AppConfig,
    producer: &SharedProducer,
    slots: &mut Slots,
    record: &Record<'_>,
    error: &TaskError,
) -> Result<(), TaskError> {
    dispose(config, producer, record, error, slots.worker())?;
    if let Some(task) = slots.task_mut(record.partition) {
        task.skip(record);
    }
    Ok(())
}

fn dispose(
    config: &AppConfig,
    producer: &SharedProducer,
    record: &Record<'_>,
    error: &TaskError,
    worker: usize,
) -> Result<(), TaskError> {
    let task = TaskId {
        partition: record.partition,
    };
    let topic = match &config.error_policy {
        ErrorPolicy::Fail | ErrorPolicy::LogAndContinue => {
            tracing::warn!(worker, %task, topic = record.topic, offset = record.offset, error = %error, "skipping a record that failed");
            metrics::counter!("kstate_task_skipped_records").increment(1);
            return Ok(());
        }
        ErrorPolicy::DeadLetter(topic) => topic,
    };
    let message = error.to_string();
    let partition = record.partition.to_string();
    let offset = record.offset.to_string();
    let task_name = task.to_string();
    let headers: [(&str, &[u8]); 6] = [
        (DEAD_LETTER_EXCEPTION, kind_of(error).as_bytes()),
        (DEAD_LETTER_MESSAGE, message.as_bytes()),
        (DEAD_LETTER_TOPIC, record.topic.as_bytes()),
        (DEAD_LETTER_PARTITION, partition.as_bytes()),
        (DEAD_LETTER_OFFSET, offset.as_bytes()),
        (DEAD_LETTER_TASK, task_name.as_bytes()),
    ];
    producer
        .send_with_headers(
            topic,
            record.key,
            record.value,
            &headers,
            config.delivery_timeout(),
        )
        .map_err(|source| TaskError::Output {
            task,
            topic: topic.clone(),
            source: Box::new(source),
        })?;
    tracing::warn!(worker, %task, topic = record.topic, offset = record.offset, dead_letter = %topic, error = %error, "a record that failed went to the dead-letter topic");
    metrics::counter!("kstate_task_dead_letters").increment(1);
    Ok(())
}

/// The failure's kind, for the dead-letter header Kafka Streams fills with an exception class.
fn kind_of(error: &TaskError) -> &'static str {
    match error {
        TaskError::Processor { .. } => "kstate_task::TaskError::Processor",
        TaskError::Output { .. } => "kstate_task::TaskError::Output",
        TaskError::Store { .. } => "kstate_task::TaskError::Store",
        _ => "kstate_task::TaskError",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64) -> Record<'static> {
        Record {
            topic: "in",
            partition: 2,
            offset,
            timestamp: None,
            key: None,
            value: None,
        }
    }

    fn error() -> TaskError {
        TaskError::RetriesExhausted {
            worker: 0,
            attempts: 1,
            last: "a record failed".into(),
        }
    }

    #[test]
    fn a_remembered_record_is_met_again_until_a_commit_carries_its_dead_letter() {
        let mut letters = DeadLetters::default();
        letters.remember(&record(7), error());
        assert!(letters.again(&record(8)).is_none(), "another offset");
        let failed = letters.again(&record(7)).expect("remembered");
        letters.applied(failed);
        // An abort drops the dead letter: the record comes again.
        letters.rewound();
        letters.committed();
        let failed = letters
            .again(&record(7))
            .expect("still remembered after the abort");
        letters.applied(failed);
        letters.committed();
        assert!(letters.again(&record(7)).is_none(), "done once committed");
    }

    #[test]
    fn a_task_that_leaves_takes_its_failed_records_with_it() {
        let mut letters = DeadLetters::default();
        letters.remember(&record(7), error());
        letters.forget(&[1, 3]);
        assert!(letters.again(&record(7)).is_some(), "partition 2 stays");
        letters.remember(&record(7), error());
        letters.forget(&[2]);
        assert!(letters.again(&record(7)).is_none());
    }
}
