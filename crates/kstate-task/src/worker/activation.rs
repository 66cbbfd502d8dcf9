//! How a task comes to run, as functions over the application, the input and the worker's
//! [`Slots`]: the restore jobs of an assignment (one batch, so that a restorer asks for the
//! ends of all their changelogs at once), where each task's inputs start (the group's committed
//! offsets, or the log's start or end), a restored task's start, the seek there, and the
//! rewind of every running task after an abort. The worker's [`Core`] calls them and applies
//! what they return; none of them calls it back.
//!
//! [`Core`]: crate::worker::core::Core

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use kstate_kafka::{CancelToken, ChangelogError, RestoredStore, SharedProducer};
use rdkafka::types::RDKafkaErrorCode;

use crate::error::TaskError;
use crate::ids::{InputPartition, TaskId};
use crate::restorer::{Batch, Done, Job};
use crate::shared::AppShared;
use crate::status::Progress;
use crate::task::Task;
use crate::worker::input::Input;
use crate::worker::recovery::Recovery;
use crate::worker::slots::{Restoring, Slots};

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
    worker: usize,
    /// `None` once the worker ends (the restorers end when every worker's sender is gone).
    jobs: Option<Sender<Job>>,
    /// Where the restorers answer this worker's jobs.
    reply: Sender<Done>,
    next_job: u64,
}

impl RestoreQueue {
    pub(crate) fn new(worker: usize, jobs: Sender<Job>, reply: Sender<Done>) -> Self {
        RestoreQueue {
            worker,
            jobs: Some(jobs),
            reply,
            next_job: 0,
        }
    }

    /// The worker is ending (its consumer closing): no more restores.
    pub(crate) fn close(&mut self) {
        self.jobs = None;
    }

    /// Starts restoring the tasks of `partitions` (their slots → Restoring), as one batch: a
    /// restorer asks for the ends of all their changelogs at once before it restores the first
    /// of them. `reread`: their inputs were consumed past the committed offsets
    /// ([`Restoring::reread`](crate::worker::slots::Restoring::reread)). Once the worker is
    /// ending (its consumer closing), an assignment that arrives is left to the next owner: it
    /// is no failure.
    pub(crate) fn start(
        &mut self,
        app: &AppShared,
        slots: &mut Slots,
        partitions: &[i32],
        reread: bool,
    ) -> Result<(), TaskError> {
        if partitions.is_empty() {
            return Ok(());
        }
        if self.jobs.is_none() {
            tracing::debug!(
                worker = self.worker,
                ?partitions,
                "assigned while ending; not restored"
            );
            return Ok(());
        }
        for job in self.jobs(app, partitions) {
            let (cancel, progress) = (job.cancel.clone(), job.progress.clone());
            slots.begin_restore(job.task.partition, job.id, cancel, progress, reread);
            self.send(job)?;
        }
        Ok(())
    }

    /// Restores finished (`done`): the tasks ready to start (out of their slots until the
    /// caller runs them, or gives them back with [`Slots::restore_failed`]), with where their inputs start, fetched in one request for all of
    /// them. A restore whose broker did not answer while the cluster is in motion restores
    /// again at once; when where the inputs start is not known yet, the ready tasks restore
    /// again after a pause ([`Recovery::start_later`]). An error fails the worker; every slot of
    /// `done` has left Restoring by then. `healthy`: the worker has not failed (otherwise the
    /// tasks only leave their slots).
    pub(crate) fn finished(
        &mut self,
        input: &dyn Input,
        app: &AppShared,
        slots: &mut Slots,
        recovery: &mut Recovery,
        done: Vec<Done>,
        healthy: bool,
    ) -> Result<Started, TaskError> {
        let mut ready = Vec::new();
        let mut again = Vec::new();
        let mut failure = None;
        for done in done {
            let p = done.task.partition;
            let Some(restoring) = slots.finish_restore(p, done.id) else {
                continue; // cancelled: revoked meanwhile
            };
            match done.result {
                Ok(stores) => ready.push(Ready {
                    id: done.task,
                    restoring,
                    stores,
                }),
                Err(e) => {
                    slots.restore_failed(p);
                    if in_motion(&e) {
                        tracing::warn!(worker = self.worker, task = p, error = %e, "the restore's broker did not answer; the task restores again");
                        match recovery.start_later(&[p], e, false) {
                            Ok(()) => again.push(p),
                            Err(e) => failure = failure.or(Some(e)),
                        }
                    } else {
                        failure = failure.or(Some(e));
                    }
                }
            }
        }
        let tasks: Vec<i32> = ready.iter().map(|r| r.id.partition).collect();
        if let Some(failure) = failure.filter(|_| healthy) {
            slots.restore_failed_all(&tasks);
            return Err(failure);
        }
        if !healthy {
            slots.restore_failed_all(&tasks);
            return Ok(Started::default());
        }
        // Its records since the committed offsets may have been taken into the restore's
        // buffer, now dropped: it reads them again.
        if let Err(e) = self.start(app, slots, &again, true) {
            slots.restore_failed_all(&tasks);
            return Err(e);
        }
        if tasks.is_empty() {
            return Ok(Started::default());
        }
        let partitions: Vec<InputPartition> =
            tasks.iter().flat_map(|p| slots.inputs_of(*p)).collect();
        match start_positions(input, app, &partitions) {
            Ok(positions) => Ok(Started { ready, positions }),
            Err(e) => {
                slots.restore_failed_all(&tasks);
                if !in_motion(&e) {
                    return Err(e);
                }
                // They restore again (nothing to replay) and ask again, after a pause.
                tracing::warn!(worker = self.worker, error = %e, "where the inputs start is not known yet; the tasks restore again and ask again");
                recovery.start_later(&tasks, e, true)?;
                self.start(app, slots, &tasks, true)?;
                Ok(Started::default())
            }
        }
    }

    /// The jobs that restore the tasks of `partitions`, as one [`Batch`].
    fn jobs(&mut self, app: &AppShared, partitions: &[i32]) -> Vec<Job> {
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
    fn send(&self, job: Job) -> Result<(), TaskError> {
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
    match (u32::try_from(partition), app.state_db()) {
        (Ok(task), Some(state)) => state.has_state(task),
        (Ok(_), None) => true,
        (Err(_), _) => false,
    }
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

/// A restored task, ready to start.
pub(crate) struct Ready {
    pub(crate) id: TaskId,
    pub(crate) restoring: Restoring,
    pub(crate) stores: Vec<RestoredStore>,
}

/// The restored tasks ready to start ([`RestoreQueue::finished`]), and where their inputs
/// start.
#[derive(Default)]
pub(crate) struct Started {
    pub(crate) ready: Vec<Ready>,
    pub(crate) positions: BTreeMap<InputPartition, i64>,
}

/// Why tasks did not start, or start over.
pub(crate) enum NotStarted {
    /// The task itself failed to start (its processor, a store): its failure's reaction says
    /// what follows.
    Task(TaskError),
    /// The cluster or the group is in motion (the committed offsets not known yet, a seek
    /// refused during a rebalance, [`in_motion`]): the tasks restore again and try later.
    InMotion(TaskError),
    /// Anything else: the worker fails.
    Worker(TaskError),
}

impl NotStarted {
    /// A request to the cluster that failed: in motion, or the worker's failure.
    fn asked(error: TaskError) -> Self {
        if in_motion(&error) {
            NotStarted::InMotion(error)
        } else {
            NotStarted::Worker(error)
        }
    }
}

/// Restored task `id` starts over its `stores` at its inputs' `positions`
/// ([`start_positions`]) and runs in its slot (Restoring → Running); the result is its start
/// offsets. On an error its slot leaves Restoring.
pub(crate) fn run_restored(
    app: &AppShared,
    slots: &mut Slots,
    producer: &SharedProducer,
    id: TaskId,
    stores: Vec<RestoredStore>,
    positions: &BTreeMap<InputPartition, i64>,
) -> Result<BTreeMap<String, i64>, NotStarted> {
    let p = id.partition;
    let started = start_offsets(slots.inputs_of(p), positions)
        .map_err(NotStarted::Worker)
        .and_then(|offsets| {
            let task = start_task(app, producer, id, stores, &offsets).map_err(NotStarted::Task)?;
            Ok((task, offsets))
        });
    match started {
        Ok((task, offsets)) => {
            tracing::info!(worker = slots.worker(), task = %id, "restored; running");
            slots.run(Box::new(task));
            Ok(offsets)
        }
        Err(e) => {
            slots.restore_failed(p);
            Err(e)
        }
    }
}

/// Running task `partition`, which started at `offsets`, takes its inputs again: every input
/// reads on from the record after the last the task took, by a seek, never from where
/// librdkafka's fetcher was (records it fetched before the pause took hold and did not hand
/// over were skipped on resume: the three-node cluster's chaos run lost four records of each
/// input of one task, under exactly-once, with their offsets committed); then they resume.
pub(crate) fn resume(
    input: &dyn Input,
    app: &AppShared,
    slots: &mut Slots,
    partition: i32,
    offsets: &BTreeMap<String, i64>,
) -> Result<(), NotStarted> {
    let Some(task) = slots.task_mut(partition) else {
        return Ok(()); // it failed on a buffered record, and is gone
    };
    seek(input, app, partition, task.next_offsets(offsets)).map_err(NotStarted::asked)?;
    if let Some(task) = slots.task_mut(partition) {
        task.resumed();
    }
    input
        .resume(&slots.inputs_of(partition))
        .map_err(NotStarted::Worker)
}

/// Every running task starts over from its committed input offsets: a new processor, nothing
/// pending, the input sought back. All or nothing: the caller fails the worker on an error (or,
/// for [`NotStarted::InMotion`], drops the tasks and restores them), as nothing may be
/// committed past records whose effects the abort dropped.
pub(crate) fn rewind(
    input: &dyn Input,
    app: &AppShared,
    slots: &mut Slots,
    producer: &SharedProducer,
) -> Result<(), NotStarted> {
    let ids = slots.running_ids();
    if ids.is_empty() {
        return Ok(());
    }
    let partitions: Vec<InputPartition> = ids.iter().flat_map(|p| slots.inputs_of(*p)).collect();
    let positions = start_positions(input, app, &partitions).map_err(NotStarted::asked)?;
    metrics::counter!("kstate_task_rewinds").increment(1);
    for p in ids {
        let offsets = start_offsets(slots.inputs_of(p), &positions).map_err(NotStarted::Worker)?;
        let Some(task) = slots.task_mut(p) else {
            continue;
        };
        (task.rewind(producer, &app.factory, &offsets)).map_err(NotStarted::Worker)?;
        seek(input, app, p, offsets).map_err(NotStarted::asked)?;
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
