//! A worker thread: one member of the consumer group, its producer, its restorer thread, and the
//! tasks it runs.
//!
//! The rebalance callbacks run inside `poll` on the worker's own thread, so they share the
//! worker's state through a mutex that is never contended: the loop holds it between polls, the
//! callbacks during them.
//!
//! - **Assigned**: the new partitions are paused and their tasks' stores restored on the
//!   restorer thread; the worker keeps processing its other tasks. A restored task starts, runs
//!   the records fetched before the pause took hold, and its partitions resume.
//! - **Revoked**: the revoked tasks are committed (producer flushed, stores committed, offsets
//!   committed synchronously) and their stores closed, within the revocation timeout; a restore
//!   in progress is cancelled. The directories stay: a later reassignment replays only the tail.
//! - **Lost** (the member was fenced or timed out): the tasks are dropped without a commit; their
//!   new owner replays from the last committed offsets.
//! - A failure (a poisoned store, an undeliverable output, a processor error) stops the worker,
//!   and with it the application: nothing after it is committed, and a restart restores.
//!
//! # Exactly-once
//! The worker's producer is transactional (`<app-id>-<instance-id>-<worker>`), created before
//! the consumer subscribes, so its fencing of an earlier incarnation (which aborts that one's
//! open transaction) happens before any restore captures its end offset. A transaction is
//! always open; every commit interval (or sooner, when a store's overlay is full) it commits
//! with all tasks' input offsets, and the stores apply their overlays after it.
//! - A failed write or output, or an abortable commit: the transaction aborts, the stores drop
//!   their overlays, and every task starts again from its committed input offsets (a new
//!   processor; the input is sought back). Nothing is wiped and nothing is restored.
//! - **Revoked**: the transaction commits (it carries every task's records), then the revoked
//!   tasks close. **Lost**: it aborts (nothing of a task that is no longer ours may become
//!   visible); the tasks are dropped.
//! - Fenced (the broker aborted our transaction and bumped the producer's epoch, as when a
//!   paused process lost its partitions): the worker drops every task without applying anything,
//!   makes a new producer and rejoins the group; the tasks it gets restore their committed tails.
//!   Fenced three times within five minutes (something else holds our transactional id), or a
//!   store that cannot apply a committed transaction: the worker fails, and with it the
//!   application.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate_kafka::{CancelToken, ChangelogError, SharedProducer};
use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Message, Timestamp};
use rdkafka::{ClientContext, TopicPartitionList};

use crate::app::AppShared;
use crate::config::ProcessingGuarantee;
use crate::error::TaskError;
use crate::processor::{Record, TaskId};
use crate::restorer::{Done, Job};
use crate::status::{Progress, lock};
use crate::task::Task;

/// A worker fenced this many times within [`FENCING_WINDOW`] fails instead of rejoining.
const MAX_FENCINGS: usize = 3;
const FENCING_WINDOW: Duration = Duration::from_secs(300);

/// A record fetched for a task that is still restoring.
struct Buffered {
    topic: String,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

struct Restoring {
    job: u64,
    cancel: CancelToken,
    buffered: Vec<Buffered>,
}

/// The worker's state, shared with its consumer's rebalance callbacks.
pub(crate) struct Core {
    index: usize,
    app: Arc<AppShared>,
    producer: SharedProducer,
    tasks: BTreeMap<i32, Task>,
    restoring: BTreeMap<i32, Restoring>,
    jobs: Sender<Job>,
    next_job: u64,
    /// The first failure: the worker stops on it.
    failed: Option<TaskError>,
    /// Exactly-once: the producer was fenced (the broker aborted our transaction and another
    /// member owns our partitions, as after a long pause). The tasks are dropped without
    /// applying anything, and the worker rejoins with a new producer.
    fenced: Option<TaskError>,
    /// When the last fencings happened: one after another means something else holds our
    /// transactional id, and the worker fails instead of fighting it.
    fencings: Vec<Instant>,
}

pub(crate) struct WorkerContext {
    core: Arc<Mutex<Core>>,
}

impl ClientContext for WorkerContext {
    /// Consumer lag per task, from librdkafka's statistics (every 5 s): the `metrics` gauge
    /// `kstate_task_consumer_lag{topic, partition}`.
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                if *partition >= 0 && p.consumer_lag >= 0 {
                    metrics::gauge!(
                        "kstate_task_consumer_lag",
                        "topic" => topic.clone(),
                        "partition" => partition.to_string()
                    )
                    .set(p.consumer_lag as f64);
                }
            }
        }
    }
}

impl ConsumerContext for WorkerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions = partitions_of(tpl);
            let lost = consumer.assignment_lost();
            // Failures are logged; the tasks' input replays from their last commit.
            let _ = lock(&self.core).revoke(consumer, &partitions, lost);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => lock(&self.core).assign(consumer, &partitions_of(tpl)),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            // The next commit covers these offsets again; a crash meanwhile replays a little more.
            tracing::warn!(error = %e, "input offset commit failed");
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<i32> {
    let mut partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
    partitions.sort_unstable();
    partitions.dedup();
    partitions
}

type WorkerConsumer = BaseConsumer<WorkerContext>;

impl Core {
    /// Every input topic's partition `p`.
    fn input_tpl(&self, partitions: &[i32]) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for topic in &self.app.config.inputs {
            for &p in partitions {
                tpl.add_partition(topic, p);
            }
        }
        tpl
    }

    fn fail(&mut self, error: TaskError) {
        if let TaskError::Transaction { source, .. } = &error
            && matches!(**source, kstate_kafka::TransactionError::Fatal { .. })
            && self.failed.is_none()
        {
            let now = Instant::now();
            self.fencings
                .retain(|t| now.duration_since(*t) < FENCING_WINDOW);
            if self.fencings.len() < MAX_FENCINGS {
                tracing::warn!(worker = self.index, error = %error, "producer fenced: dropping the tasks without applying anything and rejoining");
                self.fencings.push(now);
                self.fenced.get_or_insert(error);
                return;
            }
            tracing::error!(
                worker = self.index,
                "fenced {MAX_FENCINGS} times within {FENCING_WINDOW:?}: does another process run with this instance id?"
            );
        }
        tracing::error!(worker = self.index, error = %error, "worker failed");
        if self.failed.is_none() {
            self.failed = Some(error);
        }
    }

    fn assign(&mut self, consumer: &WorkerConsumer, partitions: &[i32]) {
        let new: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| !self.tasks.contains_key(p) && !self.restoring.contains_key(p))
            .collect();
        if new.is_empty() {
            return;
        }
        if let Err(e) = consumer.pause(&self.input_tpl(&new)) {
            self.fail(TaskError::Kafka {
                operation: "pause newly assigned partitions",
                topic: self.app.config.inputs.join(","),
                partition: -1,
                source: e,
            });
            return;
        }
        tracing::info!(worker = self.index, partitions = ?new, "assigned; restoring");
        for p in new {
            let progress = Arc::new(Progress::new());
            let cancel = CancelToken::new();
            self.next_job += 1;
            let config = &self.app.config;
            let job = Job {
                id: self.next_job,
                partition: p,
                stores: config
                    .stores
                    .iter()
                    .map(|s| {
                        (
                            config.store_dir(p, &s.name),
                            config.changelog(&s.name, p, self.app.partitions),
                        )
                    })
                    .collect(),
                cancel: cancel.clone(),
                progress: progress.clone(),
            };
            self.app.registry.restoring(self.index, p, progress);
            self.restoring.insert(
                p,
                Restoring {
                    job: self.next_job,
                    cancel,
                    buffered: Vec::new(),
                },
            );
            if self.jobs.send(job).is_err() {
                self.fail(TaskError::Thread {
                    name: format!("kstate-restorer-{}", self.index),
                    message: "the restorer thread stopped".into(),
                });
            }
        }
    }

    /// Ends the tasks of `partitions` on this worker: revocation, loss, and shutdown. Restores
    /// in progress are cancelled. Unless the assignment was `lost` or the worker failed, the
    /// tasks are committed and their stores closed; otherwise, or if the commit fails, they are
    /// dropped without closing (nothing uncommitted reaches RocksDB, and their input replays).
    /// Returns the commit's failure.
    fn revoke(
        &mut self,
        consumer: &WorkerConsumer,
        partitions: &[i32],
        lost: bool,
    ) -> Result<(), TaskError> {
        for p in partitions {
            if let Some(restoring) = self.restoring.remove(p) {
                restoring.cancel.cancel();
                self.app.registry.remove(*p);
            }
        }
        if self.exactly_once() {
            return self.revoke_exactly_once(consumer, partitions, lost);
        }
        let mut revoked: Vec<Task> = partitions
            .iter()
            .filter_map(|p| self.tasks.remove(p))
            .collect();
        if revoked.is_empty() {
            return Ok(());
        }
        let ids: Vec<i32> = revoked.iter().map(|t| t.id.partition).collect();
        let commit = !lost && self.failed.is_none();
        if commit {
            tracing::info!(worker = self.index, partitions = ?ids, "committing and closing tasks");
        } else {
            tracing::warn!(worker = self.index, partitions = ?ids, lost, "dropping tasks without a commit");
        }
        let committed = if commit {
            let mut refs: Vec<&mut Task> = revoked.iter_mut().collect();
            let timeout = self.app.config.revocation_timeout;
            commit_tasks(
                &self.producer,
                consumer,
                &mut refs,
                CommitMode::Sync,
                timeout,
            )
        } else {
            Ok(())
        };
        if let Err(e) = &committed {
            tracing::warn!(worker = self.index, error = %e, "commit of ending tasks failed; their input will be replayed");
        }
        let close = commit && committed.is_ok();
        for task in revoked {
            // Out of the query registry first: it holds the stores too.
            self.app.registry.remove(task.id.partition);
            if close && let Err(e) = task.close() {
                tracing::warn!(worker = self.index, error = %e, "closing a task failed");
            }
        }
        committed
    }

    fn exactly_once(&self) -> bool {
        self.app.config.guarantee == ProcessingGuarantee::ExactlyOnce
    }

    /// After the producer was fenced: every task and restore is dropped without applying
    /// anything (the fenced transaction's overlays die with the stores), and a new producer
    /// fences the old one for good.
    fn drop_fenced_tasks(&mut self) {
        for (p, restoring) in std::mem::take(&mut self.restoring) {
            restoring.cancel.cancel();
            self.app.registry.remove(p);
        }
        for p in std::mem::take(&mut self.tasks).into_keys() {
            self.app.registry.remove(p);
        }
        let config = &self.app.config;
        let client = config.changelog("outputs", 0, self.app.partitions);
        match SharedProducer::transactional(
            &client,
            config.transactional_id(self.index),
            config.transaction_timeout,
        ) {
            Ok(producer) => {
                self.producer = producer;
                self.fenced = None;
                metrics::counter!("kstate_task_fenced").increment(1);
            }
            Err(source) => {
                let fenced = self.fenced.take();
                tracing::warn!(
                    worker = self.index,
                    ?fenced,
                    "no new producer after being fenced"
                );
                self.failed.get_or_insert(TaskError::changelog(-1, source));
            }
        }
    }

    /// [`revoke`](Self::revoke) under exactly-once: the open transaction carries every task's
    /// records, so it commits (revoked) or aborts (lost, failed) for all of them.
    fn revoke_exactly_once(
        &mut self,
        consumer: &WorkerConsumer,
        partitions: &[i32],
        lost: bool,
    ) -> Result<(), TaskError> {
        let ending: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| self.tasks.contains_key(p))
            .collect();
        if ending.is_empty() {
            return Ok(());
        }
        let timeout = self.app.config.revocation_timeout;
        let outcome = if lost || self.failed.is_some() {
            tracing::warn!(worker = self.index, partitions = ?ending, lost, "aborting the transaction and dropping tasks");
            self.producer
                .abort_transaction("tasks lost or worker failed", timeout)
                .map_err(|source| TaskError::transaction(self.index, source))
                .map(|()| false)
        } else {
            tracing::info!(worker = self.index, partitions = ?ending, "committing the transaction and closing tasks");
            self.commit_exactly_once(consumer).map(|()| true)
        };
        let close = matches!(outcome, Ok(true));
        for p in &ending {
            let Some(task) = self.tasks.remove(p) else {
                continue;
            };
            self.app.registry.remove(*p);
            if close && let Err(e) = task.close() {
                tracing::warn!(worker = self.index, error = %e, "closing a task failed");
            }
        }
        if !close && outcome.is_ok() && self.failed.is_none() {
            // The abort dropped the other tasks' work too: they start again from their commits.
            self.rewind(consumer)?;
        }
        outcome.map(|_| ())
    }

    /// Exactly-once commit of every task: outputs and caches out, then one transaction with
    /// the input offsets; the stores apply their overlays after it. An abort rewinds.
    fn commit_exactly_once(&mut self, consumer: &WorkerConsumer) -> Result<(), TaskError> {
        let started = Instant::now();
        let mut prepared = Ok(());
        for task in self.tasks.values_mut() {
            prepared = task.prepare_commit(&self.producer);
            if prepared.is_err() {
                break;
            }
        }
        if let Err(e) = prepared {
            return self.abort_or_fail(consumer, e);
        }
        let mut offsets = TopicPartitionList::new();
        for task in self.tasks.values_mut() {
            task.take_offsets(&mut offsets);
        }
        let group = consumer.group_metadata();
        let with_offsets = match &group {
            Some(group) if offsets.count() > 0 => Some((&offsets, group)),
            _ => None,
        };
        let timeout = self.app.config.revocation_timeout;
        match self.producer.commit_transaction(with_offsets, timeout) {
            Ok(()) => {
                for task in self.tasks.values_mut() {
                    task.transaction_committed()?;
                }
                metrics::histogram!("kstate_task_commit_seconds")
                    .record(started.elapsed().as_secs_f64());
                Ok(())
            }
            Err(e) if e.is_aborted() => {
                tracing::warn!(worker = self.index, error = %e, "transaction aborted; tasks rewind to their committed offsets");
                self.rewind(consumer)
            }
            Err(source) => Err(TaskError::transaction(self.index, source)),
        }
    }

    /// A task failed: under exactly-once a failed write or output aborts the transaction and
    /// rewinds; anything else (and every failure under at-least-once) fails the worker.
    fn task_failed(&mut self, consumer: &WorkerConsumer, error: TaskError) {
        if let Err(e) = self.abort_or_fail(consumer, error) {
            self.fail(e);
        }
    }

    fn abort_or_fail(
        &mut self,
        consumer: &WorkerConsumer,
        error: TaskError,
    ) -> Result<(), TaskError> {
        if !self.exactly_once() || !abortable(&error) {
            return Err(error);
        }
        tracing::warn!(worker = self.index, error = %error, "aborting the transaction");
        self.producer
            .abort_transaction(&error.to_string(), self.app.config.revocation_timeout)
            .map_err(|source| TaskError::transaction(self.index, source))?;
        self.rewind(consumer)
    }

    /// After an abort: every task starts again from its committed input offsets.
    fn rewind(&mut self, consumer: &WorkerConsumer) -> Result<(), TaskError> {
        if self.tasks.is_empty() {
            return Ok(());
        }
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        let timeout = self.app.config.revocation_timeout;
        let kafka = |operation, partition, source| TaskError::Kafka {
            operation,
            topic: self.app.config.inputs.join(","),
            partition,
            source,
        };
        let committed = consumer
            .committed_offsets(self.input_tpl(&partitions), timeout)
            .map_err(|e| kafka("fetch committed offsets", -1, e))?;
        let mut by_task: BTreeMap<i32, BTreeMap<String, i64>> = BTreeMap::new();
        for element in committed.elements() {
            if let Offset::Offset(offset) = element.offset() {
                by_task
                    .entry(element.partition())
                    .or_default()
                    .insert(element.topic().to_string(), offset);
            }
        }
        metrics::counter!("kstate_task_rewinds").increment(1);
        for (p, task) in &mut self.tasks {
            let offsets = by_task.remove(p).unwrap_or_default();
            task.rewind(&self.producer, &self.app.factory, &offsets)?;
            for topic in &self.app.config.inputs {
                let to = offsets
                    .get(topic)
                    .map_or(Offset::Beginning, |o| Offset::Offset(*o));
                consumer
                    .seek(topic, *p, to, timeout)
                    .map_err(|e| kafka("seek to the committed offset", *p, e))?;
            }
        }
        Ok(())
    }

    fn on_record(
        &mut self,
        consumer: &WorkerConsumer,
        message: &rdkafka::message::BorrowedMessage<'_>,
    ) {
        let partition = message.partition();
        let timestamp = match message.timestamp() {
            Timestamp::NotAvailable => None,
            Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
        };
        if let Some(task) = self.tasks.get_mut(&partition) {
            let record = Record {
                topic: message.topic(),
                partition,
                offset: message.offset(),
                timestamp,
                key: message.key(),
                value: message.payload(),
            };
            if let Err(e) = task.process(&self.producer, &record) {
                self.task_failed(consumer, e);
            }
        } else if let Some(restoring) = self.restoring.get_mut(&partition) {
            // Fetched before the pause took hold: kept for when the task is ready.
            restoring.buffered.push(Buffered {
                topic: message.topic().to_string(),
                offset: message.offset(),
                timestamp,
                key: message.key().map(<[u8]>::to_vec),
                value: message.payload().map(<[u8]>::to_vec),
            });
        } else {
            // Not ours any more: nobody commits its offset here, so its next owner reads it.
            tracing::debug!(
                partition,
                offset = message.offset(),
                "record for a task not on this worker"
            );
        }
    }

    /// Starts the tasks whose restores finished, and resumes their partitions.
    fn on_restored(&mut self, consumer: &WorkerConsumer, done: Done) {
        let current = self
            .restoring
            .get(&done.partition)
            .is_some_and(|r| r.job == done.id);
        if !current {
            return; // cancelled: revoked meanwhile
        }
        let Some(restoring) = self.restoring.remove(&done.partition) else {
            return;
        };
        let restored = match done.result {
            Ok(restored) => restored,
            Err(e) => {
                self.fail(e);
                return;
            }
        };
        let id = TaskId {
            partition: done.partition,
        };
        let config = &self.app.config;
        let task = Task::start(
            id,
            &config.stores,
            restored,
            &self.producer,
            &self.app.factory,
            Duration::from_secs(60),
        );
        let mut task = match task {
            Ok(task) => task,
            Err(e) => {
                self.fail(e);
                return;
            }
        };
        for b in &restoring.buffered {
            let record = Record {
                topic: &b.topic,
                partition: done.partition,
                offset: b.offset,
                timestamp: b.timestamp,
                key: b.key.as_deref(),
                value: b.value.as_deref(),
            };
            if let Err(e) = task.process(&self.producer, &record) {
                // Under exactly-once the task is not running yet: it is dropped and the
                // worker fails either way (its transaction is aborted at the shutdown).
                self.fail(e);
                return;
            }
        }
        self.app
            .registry
            .running(done.partition, task.processed.clone(), task.logged_stores());
        tracing::info!(worker = self.index, task = %id, "restored; running");
        self.tasks.insert(done.partition, task);
        if let Err(e) = consumer.resume(&self.input_tpl(&[done.partition])) {
            self.fail(TaskError::Kafka {
                operation: "resume a restored task's partitions",
                topic: self.app.config.inputs.join(","),
                partition: done.partition,
                source: e,
            });
        }
    }

    fn fire_timers(&mut self, consumer: &WorkerConsumer) {
        let now = Instant::now();
        let mut failed = None;
        for task in self.tasks.values_mut() {
            if task.next_timer().is_some_and(|t| t <= now)
                && let Err(e) = task.fire_timers(&self.producer, now, false)
            {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            self.task_failed(consumer, e);
        }
    }

    /// Commits every task, by the application's guarantee.
    fn commit(&mut self, consumer: &WorkerConsumer) {
        let committed = if self.exactly_once() {
            self.commit_exactly_once(consumer)
        } else {
            let mut tasks: Vec<&mut Task> = self.tasks.values_mut().collect();
            commit_tasks(
                &self.producer,
                consumer,
                &mut tasks,
                CommitMode::Async,
                self.app.config.revocation_timeout,
            )
        };
        if let Err(e) = committed {
            self.fail(e);
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.tasks.values().filter_map(Task::next_timer).min()
    }
}

/// Whether a task's failure is one an abort undoes (exactly-once): a write or output that was
/// not delivered, not the processor's own error or a store that disagrees with its changelog.
fn abortable(error: &TaskError) -> bool {
    match error {
        TaskError::Store { source, .. } => store_failure_is_transient(source),
        TaskError::Changelog { source, .. } => matches!(
            **source,
            ChangelogError::OutputFailed { .. } | ChangelogError::Kafka { .. }
        ),
        TaskError::Processor { source, .. } => {
            if let Some(store) = source.downcast_ref::<kstate_core::Error>() {
                store_failure_is_transient(store)
            } else if let Some(task) = source.downcast_ref::<TaskError>() {
                abortable(task)
            } else {
                false
            }
        }
        _ => false,
    }
}

fn store_failure_is_transient(error: &kstate_core::Error) -> bool {
    matches!(error, kstate_core::Error::Poisoned { reason, .. } if reason.is_transient())
}

/// The commit protocol over some tasks of one worker.
fn commit_tasks(
    producer: &SharedProducer,
    consumer: &WorkerConsumer,
    tasks: &mut [&mut Task],
    mode: CommitMode,
    timeout: Duration,
) -> Result<(), TaskError> {
    let started = Instant::now();
    for task in tasks.iter_mut() {
        task.prepare_commit(producer)?;
    }
    producer
        .flush(timeout)
        .map_err(|source| TaskError::changelog(-1, source))?;
    let mut offsets = TopicPartitionList::new();
    for task in tasks.iter_mut() {
        task.commit_stores()?;
        task.take_offsets(&mut offsets);
    }
    if offsets.count() > 0
        && let Err(e) = consumer.commit(&offsets, mode)
    {
        for task in tasks.iter_mut() {
            task.untake_offsets();
        }
        // Not fatal: the stores are committed, and the next commit covers these offsets.
        tracing::warn!(error = %e, "input offset commit failed");
    }
    metrics::histogram!("kstate_task_commit_seconds").record(started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs worker `index` until the application shuts down or the worker fails.
pub(crate) fn run(
    index: usize,
    app: Arc<AppShared>,
    done: Receiver<Done>,
    jobs: Sender<Job>,
) -> Result<(), TaskError> {
    let config = &app.config;
    // Under exactly-once, before the consumer subscribes: creating the transactional producer
    // fences this worker's previous incarnation and aborts its open transaction, which must not
    // hold any restore of ours back.
    let client = config.changelog("outputs", 0, app.partitions);
    let producer = match config.guarantee {
        ProcessingGuarantee::AtLeastOnce => SharedProducer::new(&client),
        ProcessingGuarantee::ExactlyOnce => SharedProducer::transactional(
            &client,
            config.transactional_id(index),
            config.transaction_timeout,
        ),
    }
    .map_err(|source| TaskError::changelog(-1, source))?;
    let core = Arc::new(Mutex::new(Core {
        index,
        app: app.clone(),
        producer: producer.clone(),
        tasks: BTreeMap::new(),
        restoring: BTreeMap::new(),
        jobs,
        next_job: 0,
        failed: None,
        fenced: None,
        fencings: Vec::new(),
    }));
    let consumer: WorkerConsumer = crate::app::consumer_config(config)
        .create_with_context(WorkerContext { core: core.clone() })
        .map_err(|source| TaskError::Kafka {
            operation: "create consumer",
            topic: config.inputs.join(","),
            partition: -1,
            source: config.client.redact_error(source),
        })?;
    let topics: Vec<&str> = config.inputs.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|source| TaskError::Kafka {
            operation: "subscribe",
            topic: config.inputs.join(","),
            partition: -1,
            source,
        })?;

    let mut next_commit = Instant::now() + config.commit_interval;
    // Records are polled back to back while there are any; the rest (finished restores, timers,
    // the commit) is looked after at most every millisecond, or whenever the input is idle.
    let mut wait = Duration::ZERO;
    let mut next_chores = Instant::now();
    while !app.stopping() {
        let polled = consumer.poll(wait);
        let mut core = lock(&core);
        let idle = match polled {
            Some(Ok(message)) => {
                core.on_record(&consumer, &message);
                false
            }
            Some(Err(e)) => {
                if let rdkafka::error::KafkaError::MessageConsumption(code) = &e
                    && *code == rdkafka::types::RDKafkaErrorCode::Fatal
                {
                    core.fail(TaskError::Kafka {
                        operation: "poll",
                        topic: config.inputs.join(","),
                        partition: -1,
                        source: e,
                    });
                } else {
                    tracing::warn!(worker = index, error = %e, "consumer error");
                }
                true
            }
            None => true,
        };
        wait = Duration::ZERO;
        let now = Instant::now();
        if !idle && now < next_chores && core.failed.is_none() {
            continue;
        }
        next_chores = now + Duration::from_millis(1);
        while let Ok(finished) = done.try_recv() {
            core.on_restored(&consumer, finished);
        }
        core.fire_timers(&consumer);
        // A store whose overlay is full under a transaction asks for an early commit.
        if (now >= next_commit || core.producer.commit_requested()) && core.failed.is_none() {
            core.commit(&consumer);
            next_commit = Instant::now() + config.commit_interval;
        }
        if idle {
            // Nothing to read: sleep in the poll until the next commit, timer or restore check.
            let mut wake = next_commit;
            if let Some(t) = core.next_timer() {
                wake = wake.min(t);
            }
            if !core.restoring.is_empty() {
                wake = wake.min(now + Duration::from_millis(20));
            }
            wait = wake
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
        }
        if core.failed.is_some() {
            break;
        }
        if core.fenced.is_some() {
            // Rejoining: a new assignment fetches the committed offsets, and each task restores
            // the committed tail of its stores.
            core.drop_fenced_tasks();
            drop(core);
            consumer.unsubscribe();
            consumer
                .subscribe(&topics)
                .map_err(|source| TaskError::Kafka {
                    operation: "subscribe again after being fenced",
                    topic: config.inputs.join(","),
                    partition: -1,
                    source,
                })?;
        }
    }

    // Shutting down (or failed): a final commit, the stores closed, then the group left.
    let mut core = lock(&core);
    let partitions: Vec<i32> = core
        .tasks
        .keys()
        .chain(core.restoring.keys())
        .copied()
        .collect();
    let committed = core.revoke(&consumer, &partitions, false);
    let failed = core.failed.take();
    drop(core);
    // Leaving the group revokes nothing left: every task is ended.
    consumer.unsubscribe();
    drop(consumer);
    match failed {
        Some(e) => Err(e),
        None => committed,
    }
}
