//! How a task comes to run, as functions over the application and the input that hold no
//! worker state: the restore jobs of an assignment (one batch, so that a restorer asks for the
//! ends of all their changelogs at once), where each task's inputs start (the group's committed
//! offsets, or the log's start or end), and the seek there. The worker's [`Core`] calls them
//! and applies what they return; none of them calls it back.
//!
//! [`Core`]: crate::worker::core::Core

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kstate_kafka::{CancelToken, ChangelogError, RestoredStore, SharedProducer};
use rdkafka::types::RDKafkaErrorCode;

use crate::error::TaskError;
use crate::ids::{InputPartition, TaskId};
use crate::restorer::{Batch, Done, Job};
use crate::shared::AppShared;
use crate::status::Progress;
use crate::task::Task;
use crate::worker::input::Input;

/// How long a worker waits before it asks again where its tasks' inputs start, while the
/// cluster is in motion.
pub(crate) const START_RETRY: Duration = Duration::from_millis(500);

/// Whether `error` is a request to the cluster that failed only because the cluster is in
/// motion ([`kstate_kafka::error_in_motion`]): the group coordinator or a leader moving past
/// the timeout (a broker killed: KRaft fences it after 9 s). On the three-node cluster such an
/// error failed the application ("fetch the committed offsets failed ... OperationTimedOut");
/// the worker asks again instead.
///
/// A seek counts too when librdkafka refused it because it does not fetch the partition at the
/// moment (`Local: Erroneous state`, or a stop still in progress): a rebalance is under way,
/// and the partition is either handed over next, or revoked (and its task with it). Seen on the
/// cluster: a member whose session timed out in a rolling restart got its partitions back and
/// sought one before librdkafka started fetching it.
///
/// A restore counts when its broker did not answer within the open timeout with an error of a
/// cluster in motion. Seen on the cluster: during a rolling restart a restore's watermark
/// queries answered `Local: Unknown partition` for the whole open timeout, and the application
/// failed while the other members restored at once. The restorer drops its clients after such
/// a failure, so that the restore again asks with new ones.
pub(crate) fn in_motion(error: &TaskError) -> bool {
    match error {
        TaskError::Input {
            operation: "seek",
            source,
            ..
        } if matches!(
            source.rdkafka_error_code(),
            Some(RDKafkaErrorCode::State | RDKafkaErrorCode::PreviousInProgress)
        ) =>
        {
            true
        }
        TaskError::Input { source, .. } => kstate_kafka::error_in_motion(source),
        TaskError::Restore { source, .. } => matches!(
            &**source,
            ChangelogError::BrokerUnreachable { source, .. } if kstate_kafka::error_in_motion(source)
        ),
        _ => false,
    }
}

/// Where a worker's restore jobs go: the process's restorer threads, until the worker ends.
pub(crate) struct RestoreQueue {
    /// `None` once the worker ends (the restorers end when every worker's sender is gone).
    jobs: Option<Sender<Job>>,
    /// Where the restorers answer this worker's jobs.
    reply: Sender<Done>,
    next_job: u64,
}

impl RestoreQueue {
    pub(crate) fn new(jobs: Sender<Job>, reply: Sender<Done>) -> Self {
        RestoreQueue {
            jobs: Some(jobs),
            reply,
            next_job: 0,
        }
    }

    /// The worker is ending (its consumer closing): no more restores.
    pub(crate) fn close(&mut self) {
        self.jobs = None;
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.jobs.is_none()
    }

    /// The jobs that restore the tasks of `partitions`, as one [`Batch`].
    pub(crate) fn jobs(&mut self, app: &AppShared, partitions: &[i32]) -> Vec<Job> {
        let config = &app.config;
        let tasks: Vec<(i32, Vec<_>)> = partitions
            .iter()
            .map(|&partition| {
                let stores = config
                    .stores
                    .iter()
                    .map(|s| {
                        (
                            s.name.clone(),
                            config.changelog(s, partition, app.partitions),
                        )
                    })
                    .collect();
                (partition, stores)
            })
            .collect();
        let changelogs = |new_only: bool| {
            tasks
                .iter()
                .filter(|(partition, _)| !new_only || !has_local_state(app, *partition))
                .flat_map(|(_, stores)| stores.iter().map(|(_, c)| c.clone()))
                .collect()
        };
        let batch = Arc::new(Batch {
            changelogs: changelogs(false),
            of_new_tasks: changelogs(true),
            prefetched: Mutex::new(false),
        });
        tasks
            .into_iter()
            .map(|(partition, stores)| {
                self.next_job += 1;
                Job {
                    id: self.next_job,
                    task: TaskId { partition },
                    dir: config.task_dir(partition),
                    stores,
                    batch: batch.clone(),
                    cancel: CancelToken::new(),
                    progress: Arc::new(Progress::new()),
                    reply: self.reply.clone(),
                }
            })
            .collect()
    }

    /// Hands `job` to a restorer thread.
    pub(crate) fn send(&self, job: Job) -> Result<(), TaskError> {
        match &self.jobs {
            Some(jobs) if jobs.send(job).is_ok() => Ok(()),
            _ => Err(TaskError::Thread {
                name: "kstate-restorer".into(),
                message: "the restorer threads stopped".into(),
            }),
        }
    }
}

/// Whether task `partition` has state in this process to resume from: a position in the
/// shared RocksDB, or a directory an older kstate left (moved in when the task opens). An
/// unreadable (or already closed) RocksDB counts as state: the restore reports what is wrong.
fn has_local_state(app: &AppShared, partition: i32) -> bool {
    let in_shared = match (u32::try_from(partition), app.state_db()) {
        (Ok(task), Some(db)) => db.has_state(task).unwrap_or(true),
        (Ok(_), None) => true,
        (Err(_), _) => false,
    };
    in_shared || app.config.task_dir(partition).exists()
}

/// Where each of `partitions` starts: the group's committed offset, or for one without, the
/// log's start (or end, by `auto.offset.reset`). Two requests for all of them: one offset
/// fetch, one list-offsets round.
pub(crate) fn start_positions(
    input: &dyn Input,
    app: &AppShared,
    partitions: &[InputPartition],
) -> Result<BTreeMap<InputPartition, i64>, TaskError> {
    let timeout = app.config.commit_timeout();
    let mut positions = input.committed(partitions, timeout)?;
    let fresh: Vec<InputPartition> = partitions
        .iter()
        .filter(|ip| !positions.contains_key(ip))
        .cloned()
        .collect();
    if !fresh.is_empty() {
        let latest = app.config.starts_at_latest();
        positions.extend(input.log_starts(&fresh, latest, timeout)?);
    }
    Ok(positions)
}

/// One task's start offset per input topic, from `positions` ([`start_positions`]), for its
/// `inputs`; an error names the input partition missing from them.
pub(crate) fn start_offsets(
    inputs: Vec<InputPartition>,
    positions: &BTreeMap<InputPartition, i64>,
) -> Result<BTreeMap<String, i64>, TaskError> {
    let mut offsets = BTreeMap::new();
    for ip in inputs {
        let Some(offset) = positions.get(&ip) else {
            return Err(TaskError::Input {
                operation: "ask where the input starts",
                topic: ip.topic.clone(),
                partition: ip.partition,
                source: Box::new(rdkafka::error::KafkaError::OffsetFetch(
                    rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition,
                )),
            });
        };
        offsets.insert(ip.topic, *offset);
    }
    Ok(offsets)
}

/// Task `id` starts, over its restored `stores`, at the input `offsets` ([`start_offsets`]).
pub(crate) fn start_task(
    app: &AppShared,
    producer: &SharedProducer,
    id: TaskId,
    stores: Vec<RestoredStore>,
    offsets: &BTreeMap<String, i64>,
) -> Result<Task, TaskError> {
    let config = &app.config;
    let timeout = config.delivery_timeout();
    Task::start(
        id,
        &config.stores,
        stores,
        producer,
        &app.factory,
        timeout,
        offsets,
    )
}

/// Seeks each input of task `partition` to its offset in `offsets` (topic, offset): the input
/// reads on from there, never from where librdkafka's fetcher was.
pub(crate) fn seek(
    input: &dyn Input,
    app: &AppShared,
    partition: i32,
    offsets: impl IntoIterator<Item = (String, i64)>,
) -> Result<(), TaskError> {
    for (topic, offset) in offsets {
        let ip = InputPartition::new(topic, partition);
        input.seek(&ip, offset, app.config.commit_timeout())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(topic: &str, partition: i32) -> InputPartition {
        InputPartition::new(topic.to_string(), partition)
    }

    #[test]
    fn a_task_starts_at_each_inputs_position() {
        let positions = BTreeMap::from([(ip("a", 0), 4), (ip("b", 0), 9), (ip("a", 1), 2)]);
        let offsets = start_offsets(vec![ip("a", 0), ip("b", 0)], &positions).unwrap();
        assert_eq!(
            offsets,
            BTreeMap::from([("a".to_string(), 4), ("b".to_string(), 9)])
        );
    }

    fn refused(operation: &'static str, code: RDKafkaErrorCode) -> TaskError {
        TaskError::Input {
            operation,
            topic: "a".into(),
            partition: 0,
            source: Box::new(rdkafka::error::KafkaError::OffsetFetch(code)),
        }
    }

    #[test]
    fn a_seek_refused_while_the_group_rebalances_is_in_motion_and_other_refusals_are_not() {
        assert!(in_motion(&refused("seek", RDKafkaErrorCode::State)));
        assert!(in_motion(&refused(
            "seek",
            RDKafkaErrorCode::PreviousInProgress
        )));
        assert!(in_motion(&refused(
            "seek",
            RDKafkaErrorCode::UnknownPartition
        )));
        assert!(!in_motion(&refused(
            "seek",
            RDKafkaErrorCode::InvalidArgument
        )));
        assert!(
            !in_motion(&refused("pause", RDKafkaErrorCode::State)),
            "only a seek's refusal says the partition is not fetched yet"
        );
    }

    #[test]
    fn an_input_without_a_position_is_an_error_naming_it() {
        let positions = BTreeMap::from([(ip("a", 0), 4)]);
        let error = start_offsets(vec![ip("a", 0), ip("b", 0)], &positions).unwrap_err();
        assert!(
            matches!(&error, TaskError::Input { topic, partition: 0, .. } if topic == "b"),
            "{error}"
        );
    }
}
