//! The worker's state and the transitions the poll loop and the rebalance callbacks drive:
//! assigned, revoked (or lost), restored, a record, timers, the periodic commit, a task's
//! failure (the error policy, an abort and rewind, a restore again), the producer lost. The
//! consumer is an [`Input`] and the commit path a [`CommitPath`], so that every transition has a
//! unit test without a broker (`worker::tests`).

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate_kafka::{CancelToken, ChangelogConfig};
use rdkafka::consumer::CommitMode;
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::TaskError;
use crate::ids::{InputPartition, Record, TaskId};
use crate::restorer::{Batch, Done, Job};
use crate::shared::AppShared;
use crate::status::Progress;
use crate::task::Task;
use crate::worker::commit::{CommitPath, Committed, Occasion};
use crate::worker::dead_letters::{self, DeadLetters};
use crate::worker::failure::{Failure, Reaction, classify, react};
use crate::worker::health::{Health, ProducerLosses};
use crate::worker::input::Input;
use crate::worker::retries::Retries;
use crate::worker::slots::{Buffered, Released, Slots};

/// A task whose stores keep disagreeing with their changelog after this many restores in a row
/// (without a commit of records it took in between) fails the worker. A commit that carries
/// none of its records does not count: under at-least-once every periodic commit succeeds (its
/// offsets go asynchronously), so a task that restores, fails again before it takes a record,
/// and restores again would otherwise loop for ever.
const MAX_RESTORES: u32 = 3;

/// How often the last offset commit is looked for in the group's offsets.
pub(crate) const CONFIRM_RETRY: Duration = Duration::from_millis(50);

/// The longest one look at the group's offsets may take before the commit is sent again.
const CONFIRM_QUERY: Duration = Duration::from_secs(2);

/// A worker's state.
pub(crate) struct Core {
    pub(crate) index: usize,
    app: Arc<AppShared>,
    path: Box<dyn CommitPath>,
    pub(crate) slots: Slots,
    /// Restore jobs go to the process's restorer threads; `None` once the worker ends (they end
    /// when every worker's sender is gone).
    jobs: Option<Sender<Job>>,
    /// Where the restorers answer this worker's jobs.
    reply: Sender<Done>,
    next_job: u64,
    pub(crate) health: Health,
    losses: ProducerLosses,
    retries: Retries,
    dead_letters: DeadLetters,
    /// Restores in a row per task whose stores disagreed with their changelogs.
    restores: BTreeMap<i32, u32>,
    /// After an abort: nothing is processed before this.
    pub(crate) backoff_until: Option<Instant>,
    /// At-least-once: the offsets of the last commit of ending tasks, until the group is seen
    /// to hold them ([`confirm_last_commit`](Self::confirm_last_commit)).
    pub(crate) unconfirmed: Option<Vec<(InputPartition, i64)>>,
}

impl Core {
    pub(crate) fn new(
        index: usize,
        app: Arc<AppShared>,
        path: Box<dyn CommitPath>,
        jobs: Sender<Job>,
        reply: Sender<Done>,
    ) -> Self {
        Core {
            index,
            slots: Slots::new(index, app.clone()),
            app,
            path,
            jobs: Some(jobs),
            reply,
            next_job: 0,
            health: Health::Ok,
            losses: ProducerLosses::default(),
            retries: Retries::default(),
            dead_letters: DeadLetters::default(),
            restores: BTreeMap::new(),
            backoff_until: None,
            unconfirmed: None,
        }
    }

    /// The consumer's statistics: `lag` records of input `topic` past the committed position in
    /// `partition`.
    pub(crate) fn input_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.app
            .registry
            .input_lag(self.index, topic, partition, lag);
    }

    fn fail(&mut self, error: TaskError) {
        self.health.fail(self.index, error);
    }

    /// The producer could not go on, or something else failed in it.
    fn producer_failed(&mut self, error: TaskError) {
        if let Failure::ProducerLost { fenced } = classify(&error) {
            self.health
                .producer_lost(self.index, error, fenced, &mut self.losses);
        } else {
            self.fail(error);
        }
    }

    fn timeout(&self) -> Duration {
        self.app.config.commit_timeout()
    }

    // ----- assignment -----

    /// Input partitions were assigned: each is paused (an input is fetched only while its task
    /// runs); a task whose every input is now held starts restoring.
    pub(crate) fn assigned(&mut self, input: &dyn Input, partitions: &[InputPartition]) {
        self.app.registry.joined(self.index);
        if partitions.is_empty() {
            return;
        }
        if let Err(e) = input.pause(partitions) {
            self.fail(e);
            return;
        }
        let mut complete: Vec<i32> = partitions
            .iter()
            .filter_map(|ip| self.slots.hold(ip))
            .collect();
        complete.sort_unstable();
        complete.dedup();
        if !complete.is_empty() {
            tracing::info!(worker = self.index, tasks = ?complete, "assigned; restoring");
        }
        // Judged once the whole assignment is held (a task's inputs come in one event, one
        // partition after another), not at each partition.
        let incomplete = self.slots.incomplete_among(partitions);
        if !incomplete.is_empty() {
            tracing::warn!(
                worker = self.index,
                tasks = ?incomplete,
                inputs = ?self.app.config.inputs,
                "holds only some of these tasks' input partitions: they stay paused and a task does not start until every input's partition is assigned here"
            );
        }
        self.start_restores(&complete, false);
    }

    /// Whether task `partition` has state in this process to resume from: a position in the
    /// shared RocksDB, or a directory an older kstate left (moved in when the task opens). An
    /// unreadable (or already closed) RocksDB counts as state: the restore reports what is
    /// wrong.
    fn has_local_state(&self, partition: i32) -> bool {
        let in_shared = match (u32::try_from(partition), self.app.state_db()) {
            (Ok(task), Some(db)) => db.has_state(task).unwrap_or(true),
            (Ok(_), None) => true,
            (Err(_), _) => false,
        };
        in_shared || self.app.config.task_dir(partition).exists()
    }

    /// Starts restoring the tasks of `partitions`, as one batch: a restorer asks for the ends
    /// of all their changelogs at once before it restores the first of them. `reread`: their
    /// inputs were consumed past the committed offsets ([`Restoring::reread`](crate::worker::slots::Restoring::reread)).
    fn start_restores(&mut self, partitions: &[i32], reread: bool) {
        if partitions.is_empty() {
            return;
        }
        if self.jobs.is_none() {
            // The worker is ending (its consumer closing): an assignment that arrives now is
            // left to the next owner; it is no failure.
            tracing::debug!(
                worker = self.index,
                ?partitions,
                "assigned while ending; not restored"
            );
            return;
        }
        let config = &self.app.config;
        let tasks: Vec<(i32, Vec<(String, ChangelogConfig)>)> = partitions
            .iter()
            .map(|&partition| {
                let stores = config
                    .stores
                    .iter()
                    .map(|s| {
                        let changelog = config.changelog(s, partition, self.app.partitions);
                        (s.name.clone(), changelog)
                    })
                    .collect();
                (partition, stores)
            })
            .collect();
        let changelogs = |new_only: bool| {
            tasks
                .iter()
                .filter(|(partition, _)| !new_only || !self.has_local_state(*partition))
                .flat_map(|(_, stores)| stores.iter().map(|(_, c)| c.clone()))
                .collect()
        };
        let batch = Arc::new(Batch {
            changelogs: changelogs(false),
            of_new_tasks: changelogs(true),
            prefetched: Mutex::new(false),
        });
        for (partition, stores) in tasks {
            let progress = Arc::new(Progress::new());
            let cancel = CancelToken::new();
            self.next_job += 1;
            let job = Job {
                id: self.next_job,
                task: TaskId { partition },
                dir: self.app.config.task_dir(partition),
                stores,
                batch: batch.clone(),
                cancel: cancel.clone(),
                progress: progress.clone(),
                reply: self.reply.clone(),
            };
            self.slots
                .begin_restore(partition, self.next_job, cancel, progress, reread);
            let sent = self
                .jobs
                .as_ref()
                .is_some_and(|jobs| jobs.send(job).is_ok());
            if !sent {
                self.fail(TaskError::Thread {
                    name: "kstate-restorer".into(),
                    message: "the restorer threads stopped".into(),
                });
                return;
            }
        }
    }

    /// Input partitions were revoked (or `lost`: taken away without a revocation, after a
    /// session timeout or a fencing). The tasks they end are committed and closed, unless the
    /// assignment was lost or the worker is unhealthy: then their uncommitted work is dropped
    /// (under exactly-once the transaction aborts, and the remaining tasks start over from
    /// their committed offsets). A task's other inputs still held are paused.
    pub(crate) fn revoked(&mut self, input: &dyn Input, partitions: &[InputPartition], lost: bool) {
        let mut ending: Vec<i32> = partitions
            .iter()
            .map(|ip| ip.partition)
            .filter(|p| self.slots.task_mut(*p).is_some())
            .collect();
        ending.sort_unstable();
        ending.dedup();
        let mut close = false;
        let mut rewind = false;
        if !ending.is_empty() {
            if !lost && self.health.is_ok() {
                tracing::info!(worker = self.index, tasks = ?ending, "committing and closing tasks");
                for p in &ending {
                    self.slots.closing(*p);
                }
                (close, rewind) = self.commit_ending(input, &ending);
            } else {
                tracing::warn!(worker = self.index, tasks = ?ending, lost, "dropping tasks without a commit");
                rewind = self.abandon("tasks lost, or the worker failed");
            }
        }
        let mut touched: Vec<i32> = Vec::new();
        for ip in partitions {
            touched.push(ip.partition);
            if let Released::Task(task) = self.slots.release(ip) {
                if close {
                    if let Err(e) = task.close() {
                        tracing::warn!(worker = self.index, error = %e, "closing a task failed");
                    }
                } else {
                    drop(task);
                }
            }
        }
        // A task's inputs still held here are paused: the task no longer runs.
        touched.sort_unstable();
        touched.dedup();
        // Its next owner meets its failing records on its own.
        self.dead_letters.forget(&touched);
        let still_held: Vec<InputPartition> = self
            .slots
            .held()
            .into_iter()
            .filter(|ip| touched.contains(&ip.partition))
            .collect();
        if let Err(e) = input.pause(&still_held) {
            self.fail(e);
        }
        if rewind && self.health.is_ok() {
            self.rewind(input);
        }
    }

    /// The last commit of ending tasks: returns whether to close them (they committed), and
    /// whether the remaining tasks must start over (a shared transaction aborted).
    fn commit_ending(&mut self, input: &dyn Input, ending: &[i32]) -> (bool, bool) {
        let shared = self.path.shared_fate();
        let Core { slots, path, .. } = self;
        let mut tasks: Vec<&mut Task> = slots
            .running()
            .into_iter()
            .filter(|t| shared || ending.contains(&t.id.partition))
            .collect();
        let sent: Vec<(InputPartition, i64)> = tasks.iter().flat_map(|t| t.positions()).collect();
        match path.commit(&mut tasks, input, Occasion::Ending) {
            Ok(Committed::Done) => {
                self.retries.committed();
                if !shared {
                    self.unconfirmed = Some(sent);
                }
                self.dead_letters.committed();
                (true, false)
            }
            Ok(Committed::Aborted(why)) => {
                tracing::warn!(worker = self.index, reason = %why, "the last transaction of ending tasks aborted; the others start over");
                (false, true)
            }
            Err(e) if shared => {
                tracing::warn!(worker = self.index, error = %e, "the last commit of ending tasks failed");
                match classify(&e) {
                    Failure::ProducerLost { .. } | Failure::Fatal => {
                        self.producer_failed(e);
                        (false, false)
                    }
                    _ => (false, self.abandon(&e.to_string())),
                }
            }
            Err(e) => {
                // At-least-once: the ending tasks' input replays from their last commit.
                tracing::warn!(worker = self.index, error = %e, "the last commit of ending tasks failed; their input will be replayed");
                (false, false)
            }
        }
    }

    /// Drops the uncommitted work of every task: under exactly-once the transaction aborts, and
    /// the result is true (every running task must start over); an abort that fails loses the
    /// producer.
    fn abandon(&mut self, why: &str) -> bool {
        if !self.path.shared_fate() {
            return false;
        }
        match self.path.abandon(why) {
            Ok(()) => true,
            Err(e) => {
                self.producer_failed(e);
                false
            }
        }
    }

    /// The consumer reported a rebalance error and unassigned everything: every task is
    /// dropped as if lost.
    pub(crate) fn rebalance_error(&mut self, input: &dyn Input, error: &dyn std::fmt::Display) {
        tracing::warn!(worker = self.index, %error, "rebalance error: the assignment is dropped");
        let held = self.slots.held();
        self.revoked(input, &held, true);
    }

    // ----- restores -----

    /// Restores finished: their tasks start from their committed input offsets (fetched in
    /// one request for all of them), run the records buffered meanwhile, and resume.
    pub(crate) fn restored(&mut self, input: &dyn Input, done: Vec<Done>) {
        let mut ready = Vec::new();
        for done in done {
            let p = done.task.partition;
            let Some(restoring) = self.slots.finish_restore(p, done.id) else {
                continue; // cancelled: revoked meanwhile
            };
            match done.result {
                Ok(stores) => ready.push((done.task, restoring, stores)),
                Err(e) => {
                    self.slots.restore_failed(p);
                    self.fail(e);
                }
            }
        }
        if ready.is_empty() || !self.health.is_ok() {
            for (task, _, _) in ready {
                self.slots.restore_failed(task.partition);
            }
            return;
        }
        let partitions: Vec<InputPartition> = ready
            .iter()
            .flat_map(|(task, _, _)| self.slots.inputs_of(task.partition))
            .collect();
        let positions = match self.positions(input, &partitions) {
            Ok(c) => c,
            Err(e) if in_motion(&e) => {
                // The group coordinator or a leader is moving past the timeout (a broker
                // killed: KRaft fences it after 9 s): the tasks restore again (nothing to
                // replay) and ask again, after a pause. On the three-node cluster this failed
                // the application ("fetch the committed offsets failed ... OperationTimedOut").
                tracing::warn!(worker = self.index, error = %e, "where the inputs start is not known yet; the tasks restore again and ask again");
                let tasks: Vec<i32> = ready.iter().map(|(task, _, _)| task.partition).collect();
                for &p in &tasks {
                    self.slots.restore_failed(p);
                }
                self.backoff_until = Some(Instant::now() + START_RETRY);
                self.start_restores(&tasks, true);
                return;
            }
            Err(e) => {
                for (task, _, _) in ready {
                    self.slots.restore_failed(task.partition);
                }
                self.fail(e);
                return;
            }
        };
        for (id, restoring, stores) in ready {
            let p = id.partition;
            if !self.health.is_ok() {
                self.slots.restore_failed(p);
                continue;
            }
            let Some(offsets) = self.start_offsets(p, &positions) else {
                self.slots.restore_failed(p);
                continue;
            };
            let config = &self.app.config;
            let started = Task::start(
                id,
                &config.stores,
                stores,
                self.path.producer(),
                &self.app.factory,
                config.delivery_timeout(),
                &offsets,
            );
            let task = match started {
                Ok(task) => task,
                Err(e) => {
                    self.slots.restore_failed(p);
                    self.task_failed(input, None, e);
                    continue;
                }
            };
            tracing::info!(worker = self.index, task = %id, "restored; running");
            self.slots.run(Box::new(task));
            if !restoring.reread {
                self.process_buffered(input, p, restoring.buffered);
            }
            // Every input reads on from the record after the last the task took, by a seek,
            // never from where librdkafka's fetcher was: records it fetched before the pause
            // took hold and did not hand over were skipped on resume (the three-node cluster's
            // chaos run: four records of each input of one task, under exactly-once, with
            // their offsets committed).
            let next = self.slots.task_mut(p).map(|t| t.next_offsets(&offsets));
            for (topic, offset) in next.unwrap_or_default() {
                let ip = InputPartition::new(topic, p);
                if let Err(e) = input.seek(&ip, offset, self.timeout()) {
                    return self.fail(e);
                }
            }
            if let Some(task) = self.slots.task_mut(p) {
                task.resumed();
                if let Err(e) = input.resume(&self.slots.inputs_of(p)) {
                    self.fail(e);
                }
            }
        }
    }

    /// Records of task `p`'s inputs that came while it restored, in order.
    fn process_buffered(&mut self, input: &dyn Input, p: i32, buffered: Vec<Buffered>) {
        for b in buffered {
            if !self.health.is_ok() || self.slots.task_mut(p).is_none() {
                break;
            }
            let record = Record {
                topic: &b.topic,
                partition: p,
                offset: b.offset,
                timestamp: b.timestamp,
                key: b.key.as_deref(),
                value: b.value.as_deref(),
            };
            self.process(input, &record);
        }
    }

    /// Where each of `partitions` starts: the group's committed offset, or for one without,
    /// the log's start (or end, by `auto.offset.reset`). Two requests for all of them: one
    /// offset fetch, one list-offsets round.
    fn positions(
        &self,
        input: &dyn Input,
        partitions: &[InputPartition],
    ) -> Result<BTreeMap<InputPartition, i64>, TaskError> {
        let mut positions = input.committed(partitions, self.timeout())?;
        let fresh: Vec<InputPartition> = partitions
            .iter()
            .filter(|ip| !positions.contains_key(ip))
            .cloned()
            .collect();
        if !fresh.is_empty() {
            let latest = self.app.config.starts_at_latest();
            positions.extend(input.log_starts(&fresh, latest, self.timeout())?);
        }
        Ok(positions)
    }

    /// Task `partition`'s start offset per input topic, from [`positions`](Self::positions);
    /// `None` (and the worker failed) if one is missing.
    fn start_offsets(
        &mut self,
        partition: i32,
        positions: &BTreeMap<InputPartition, i64>,
    ) -> Option<BTreeMap<String, i64>> {
        let mut offsets = BTreeMap::new();
        for ip in self.slots.inputs_of(partition) {
            let Some(offset) = positions.get(&ip) else {
                let error = TaskError::Input {
                    operation: "ask where the input starts",
                    topic: ip.topic.clone(),
                    partition: ip.partition,
                    source: Box::new(rdkafka::error::KafkaError::OffsetFetch(
                        rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition,
                    )),
                };
                self.fail(error);
                return None;
            };
            offsets.insert(ip.topic, *offset);
        }
        Some(offsets)
    }

    // ----- records and timers -----

    /// A record from the consumer.
    pub(crate) fn record(&mut self, input: &dyn Input, record: &Record<'_>) {
        if self.slots.task_mut(record.partition).is_some() {
            self.process(input, record);
        } else if let Some(restoring) = self.slots.restoring_mut(record.partition) {
            // Handed over before the pause took hold: kept for when the task is ready.
            restoring.buffered.push(Buffered {
                topic: record.topic.to_string(),
                offset: record.offset,
                timestamp: record.timestamp,
                key: record.key.map(<[u8]>::to_vec),
                value: record.value.map(<[u8]>::to_vec),
            });
        } else {
            // No task runs for it here: nothing commits its offset, so its next owner (or this
            // worker's task, once it runs) reads it.
            tracing::debug!(
                worker = self.index,
                topic = record.topic,
                partition = record.partition,
                offset = record.offset,
                "record for a task not running on this worker"
            );
        }
    }

    fn process(&mut self, input: &dyn Input, record: &Record<'_>) {
        if let Some(failed) = self.dead_letters.again(record) {
            self.skip_or_dead_letter(record, &failed.error);
            self.dead_letters.applied(failed);
            return;
        }
        let Core { slots, path, .. } = self;
        let Some(task) = slots.task_mut(record.partition) else {
            return;
        };
        if let Err(e) = task.process(path.producer(), record) {
            self.task_failed(input, Some(record), e);
        }
    }

    /// Fires the due wall-clock timers.
    pub(crate) fn fire_timers(&mut self, input: &dyn Input) {
        let now = Instant::now();
        for p in self.slots.running_ids() {
            if !self.health.is_ok() {
                return;
            }
            let Core { slots, path, .. } = self;
            let Some(task) = slots.task_mut(p) else {
                continue;
            };
            if task.next_timer().is_some_and(|t| t <= now)
                && let Err(e) = task.fire_timers(path.producer(), now, false)
            {
                self.task_failed(input, None, e);
            }
        }
    }

    pub(crate) fn next_timer(&mut self) -> Option<Instant> {
        self.slots
            .running()
            .into_iter()
            .filter_map(|t| t.next_timer())
            .min()
    }

    // ----- commits -----

    /// The periodic commit of every running task.
    pub(crate) fn commit(&mut self, input: &dyn Input) {
        if !self.health.is_ok() {
            return;
        }
        let Core { slots, path, .. } = self;
        let mut tasks = slots.running();
        let progressed: Vec<i32> = tasks
            .iter()
            .filter(|t| t.progressed())
            .map(|t| t.id.partition)
            .collect();
        match path.commit(&mut tasks, input, Occasion::Periodic) {
            Ok(Committed::Done) => {
                self.retries.committed();
                self.restores.retain(|p, _| !progressed.contains(p));
                self.dead_letters.committed();
            }
            Ok(Committed::Aborted(why)) => {
                tracing::warn!(worker = self.index, reason = %why, "transaction aborted; tasks start over from their committed offsets");
                self.start_over(input, why);
            }
            Err(e) => self.task_failed(input, None, e),
        }
    }

    /// The result of an asynchronous offset commit: on success the tasks know the group holds
    /// their offsets; on failure the offsets stay pending and the next commit sends them again.
    /// (The commit callback that brings it is not called by rust-rdkafka 0.39,
    /// fede1024/rust-rdkafka#856; until it is, an unconfirmed offset is sent again after
    /// [`RESEND_UNCONFIRMED`](crate::task::RESEND_UNCONFIRMED).)
    pub(crate) fn offsets_committed(
        &mut self,
        result: KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        match result {
            Ok(()) => {
                self.unconfirmed = None;
                for task in self.slots.running() {
                    task.offsets_committed(offsets);
                }
            }
            Err(e) => {
                for task in self.slots.running() {
                    task.offsets_commit_failed(offsets);
                }
                tracing::warn!(worker = self.index, error = %e, "input offset commit failed; the next commit sends the offsets again");
            }
        }
    }

    // ----- failures -----

    /// A task failed, on `record` if a record was being processed.
    pub(crate) fn task_failed(
        &mut self,
        input: &dyn Input,
        record: Option<&Record<'_>>,
        error: TaskError,
    ) {
        let policy = &self.app.config.error_policy;
        match react(
            classify(&error),
            self.path.shared_fate(),
            policy,
            record.is_some(),
        ) {
            Reaction::ErrorPolicy => match record {
                Some(record) => self.skip_or_dead_letter(record, &error),
                None => self.fail(error),
            },
            Reaction::AbortThenErrorPolicy => match record {
                // Undo the record's partial effects first; when it comes again, the policy
                // takes it (inside the transaction that carries its offset).
                Some(record) => {
                    tracing::warn!(worker = self.index, error = %error, "a record failed: aborting, then the error policy takes it");
                    self.dead_letters.remember(record, error);
                    if self.abandon("a record failed") {
                        self.rewind(input);
                    }
                }
                None => self.fail(error),
            },
            Reaction::AbortAndStartOver => {
                let why = error.to_string();
                if self.abandon(&why) {
                    self.start_over(input, why);
                }
            }
            Reaction::RestoreAgain { store } => {
                let partition = store
                    .and_then(|s| self.slots.task_with_store(&s))
                    .or(record.map(|r| r.partition));
                match partition {
                    Some(p) => self.restore_again(input, p, error),
                    None => self.fail(error),
                }
            }
            Reaction::ReplaceProducer => self.producer_failed(error),
            Reaction::Fail => self.fail(error),
        }
    }

    /// After an abort: every running task starts over from its committed offsets, after a
    /// back-off; too many aborts in a row fail the worker.
    fn start_over(&mut self, input: &dyn Input, why: String) {
        match self.retries.aborted() {
            Some(wait) => {
                self.backoff_until = Some(Instant::now() + wait);
                self.rewind(input);
            }
            None => {
                let attempts = self.retries.aborts();
                self.fail(TaskError::RetriesExhausted {
                    worker: self.index,
                    attempts,
                    last: why,
                });
            }
        }
    }

    /// Every running task starts over from its committed input offsets: a new processor,
    /// nothing pending, the input sought back. All or nothing: a failure fails the worker, as
    /// nothing may be committed past records whose effects the abort dropped.
    pub(crate) fn rewind(&mut self, input: &dyn Input) {
        let ids = self.slots.running_ids();
        if ids.is_empty() {
            return;
        }
        let partitions: Vec<InputPartition> =
            ids.iter().flat_map(|p| self.slots.inputs_of(*p)).collect();
        let positions = match self.positions(input, &partitions) {
            Ok(c) => c,
            Err(e) if in_motion(&e) => {
                // As at a start ([`restored`](Self::restored)): a killed broker can keep the
                // group coordinator or a leader from answering past the timeout. The tasks'
                // stores are as at the last commit (the abort dropped the rest), so the held
                // tasks are dropped and restore again, and their start asks again after a
                // pause. On the three-node cluster this failed the application ("fetch the
                // committed offsets failed ... OperationTimedOut").
                tracing::warn!(worker = self.index, error = %e, "where the inputs start again is not known yet; the tasks restore again and ask again");
                self.dead_letters.rewound();
                self.slots.drop_all();
                self.backoff_until = Some(Instant::now() + START_RETRY);
                return self.restore_held(input);
            }
            Err(e) => return self.fail(e),
        };
        metrics::counter!("kstate_task_rewinds").increment(1);
        // The abort dropped the dead letters of the open transaction: each comes again.
        self.dead_letters.rewound();
        for p in ids {
            let Some(offsets) = self.start_offsets(p, &positions) else {
                return;
            };
            let Core {
                slots, path, app, ..
            } = self;
            let Some(task) = slots.task_mut(p) else {
                continue;
            };
            if let Err(e) = task.rewind(path.producer(), &app.factory, &offsets) {
                return self.fail(e);
            }
            for (topic, offset) in &offsets {
                let ip = InputPartition::new(topic.clone(), p);
                if let Err(e) = input.seek(&ip, *offset, self.timeout()) {
                    return self.fail(e);
                }
            }
        }
    }

    /// Task `p`'s stores disagree with their changelogs (another writer's records, such as a
    /// paused member's aborted ones, after its restore's end): it is dropped without a commit
    /// and restored again, which replays what is committed since its stored offsets, and its
    /// inputs are read again from the committed offsets when it starts.
    fn restore_again(&mut self, input: &dyn Input, partition: i32, error: TaskError) {
        let restores = self.restores.entry(partition).or_insert(0);
        *restores += 1;
        if *restores > MAX_RESTORES {
            let restores = *restores - 1;
            return self.fail(TaskError::Corrupted {
                task: TaskId { partition },
                restores,
                last: error.to_string(),
            });
        }
        tracing::warn!(worker = self.index, task = partition, error = %error, "a store disagrees with its changelog: restoring the task again");
        metrics::counter!("kstate_task_restored_again").increment(1);
        let rewind = self.abandon("a store disagrees with its changelog");
        if let Some(task) = self.slots.take_for_restore(partition) {
            drop(task);
        }
        if let Err(e) = input.pause(&self.slots.inputs_of(partition)) {
            return self.fail(e);
        }
        if !self.health.is_ok() {
            return;
        }
        // Its records since the last commit were consumed; their work is dropped with the
        // task (and, under exactly-once, with the aborted transaction): it reads them again.
        self.start_restores(&[partition], true);
        if rewind {
            self.rewind(input);
        }
    }

    /// A record that failed on its own account is skipped, or sent to the dead-letter topic
    /// and skipped, as the error policy says ([`dead_letters::dispose`]).
    fn skip_or_dead_letter(&mut self, record: &Record<'_>, error: &TaskError) {
        let disposed = dead_letters::dispose(
            &self.app.config.error_policy,
            self.path.producer(),
            record,
            error,
            self.app.config.delivery_timeout(),
            self.index,
        );
        match disposed {
            Ok(()) => {
                if let Some(t) = self.slots.task_mut(record.partition) {
                    t.skip(record);
                }
            }
            Err(e) => self.fail(e),
        }
    }

    // ----- the producer lost, and the end -----

    /// The producer could not go on: every task and restore is dropped without applying
    /// anything (the lost transaction's overlays die with the stores), and a new producer is
    /// made. The caller restores the held tasks again ([`restore_held`](Self::restore_held)).
    pub(crate) fn replace_producer(&mut self) {
        if let Health::ProducerLost(why) = &self.health {
            tracing::info!(worker = self.index, reason = %why, "replacing the producer");
        }
        self.slots.drop_all();
        self.dead_letters.clear();
        match self.path.renew(&self.app.config) {
            Ok(()) => self.health.recovered(),
            Err(e) => self.fail(e),
        }
    }

    /// After [`replace_producer`](Self::replace_producer): the tasks this consumer still holds
    /// restore again and resume from their committed offsets (their inputs were read past
    /// them), paused until then. No rejoin: the new producer has fenced the old one, and the
    /// group's assignment did not change. (Rejoining by unsubscribing and subscribing again
    /// was seen to leave a static member of a cooperative group with its partitions assigned
    /// in the group and never handed to it: librdkafka found the assignment unchanged and
    /// called no assign, and the worker sat idle for good.)
    pub(crate) fn restore_held(&mut self, input: &dyn Input) {
        let tasks = self.slots.held_whole();
        let partitions: Vec<InputPartition> = tasks
            .iter()
            .flat_map(|&p| self.slots.inputs_of(p))
            .collect();
        if let Err(e) = input.pause(&partitions) {
            return self.fail(e);
        }
        if !tasks.is_empty() {
            tracing::info!(
                worker = self.index,
                ?tasks,
                "restoring the held tasks again with the new producer"
            );
        }
        self.start_restores(&tasks, true);
    }

    /// The worker ends: no more restores (the restorer threads end after their jobs once every
    /// worker has).
    pub(crate) fn stop_restorer(&mut self) {
        self.jobs = None;
    }

    /// Shutting down (or failed): every task is ended as by a revocation.
    pub(crate) fn end(&mut self, input: &dyn Input) {
        let held = self.slots.held();
        // Only the last commit is confirmed: earlier revocations' partitions are others' now.
        self.unconfirmed = None;
        self.revoked(input, &held, false);
    }

    /// At-least-once, after [`end`](Self::end): whether the group holds the offsets of the
    /// last commit, asked of the group coordinator until `deadline`; a commit the group does not
    /// hold (it failed) is sent again. The answer to an asynchronous commit cannot be waited
    /// for instead: rust-rdkafka 0.39 gives no commit callback for `CommitMode::Async`
    /// (fede1024/rust-rdkafka#856), and a synchronous commit waits without a time limit. The
    /// coordinator answers one connection's requests in order, so an offset fetch sent after
    /// the commit sees it unless it failed.
    pub(crate) fn confirm_last_commit(&mut self, input: &dyn Input, deadline: Instant) -> bool {
        let Some(sent) = self.unconfirmed.take() else {
            return true;
        };
        let partitions: Vec<InputPartition> = sent.iter().map(|(p, _)| p.clone()).collect();
        // The commit, as it is sent again.
        let mut again = TopicPartitionList::new();
        for (p, offset) in &sent {
            let _ = again.add_partition_offset(&p.topic, p.partition, Offset::Offset(*offset));
        }
        loop {
            // Each question is bounded on its own: after a broker pause one offset fetch was
            // seen to hang for the whole revocation timeout while the commit never reached the
            // group (tests/graceful_handover_after_failed_commit.rs).
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(CONFIRM_QUERY);
            let held = match input.committed(&partitions, left.max(Duration::from_millis(1))) {
                Ok(held) => Some(held),
                Err(e) => {
                    tracing::debug!(worker = self.index, error = %e, "the committed offsets could not be fetched");
                    None
                }
            };
            if held.as_ref().is_some_and(|held| {
                sent.iter()
                    .all(|(p, o)| held.get(p).is_some_and(|h| h >= o))
            }) {
                return true;
            }
            // Not held, or not known: sent again (a commit of offsets the group holds already
            // changes nothing).
            if held.is_some() {
                tracing::warn!(
                    worker = self.index,
                    "the group does not hold the last offset commit; it is sent again"
                );
            }
            if let Err(e) = input.commit(&again, CommitMode::Async) {
                tracing::warn!(worker = self.index, error = %e, "sending the last offset commit again failed");
            }
            if Instant::now() + CONFIRM_RETRY >= deadline {
                self.unconfirmed = Some(sent);
                return false;
            }
            std::thread::sleep(CONFIRM_RETRY);
        }
    }

    pub(crate) fn restoring_any(&self) -> bool {
        !self.slots.restoring_ids().is_empty()
    }

    pub(crate) fn commit_requested(&self) -> bool {
        self.path.producer().commit_requested()
    }
}

/// How long a worker waits before it asks again where its tasks' inputs start, while the
/// cluster is in motion.
const START_RETRY: Duration = Duration::from_millis(500);

/// Whether `error` is a request to the cluster that failed only because the cluster is in
/// motion ([`kstate_kafka::error_in_motion`]).
fn in_motion(error: &TaskError) -> bool {
    matches!(error, TaskError::Input { source, .. } if kstate_kafka::error_in_motion(source))
}
