//! The worker's state and the transitions the poll loop and the rebalance callbacks drive:
//! assigned, revoked (or lost), restored, a record, timers, the periodic commit, a task's
//! failure (the error policy, an abort and rewind, a restore again), the producer lost. The
//! consumer is an [`Input`] and the commit path a [`CommitPath`], so that every transition has a
//! unit test without a broker (`worker::tests`).

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Instant;

use rdkafka::TopicPartitionList;
use rdkafka::error::KafkaResult;

use crate::error::TaskError;
use crate::ids::{InputPartition, Record, TaskId};
use crate::restorer::{Done, Job};
use crate::shared::AppShared;
use crate::task::Task;
use crate::worker::activation::{self, RestoreQueue, START_RETRY, in_motion};
use crate::worker::commit::{CommitPath, Committed, Occasion};
use crate::worker::dead_letters::{self, DeadLetters};
use crate::worker::failure::{EndingFailed, Failure, Reaction, classify, react, react_to_ending};
use crate::worker::health::{Health, ProducerLosses};
use crate::worker::input::Input;
use crate::worker::retries::{RestoreStreaks, Retries};
use crate::worker::slots::{Buffered, Slots};
use crate::worker::start_timeouts::StartTimeouts;

/// A worker's state. Its fields are private: the poll loop and the rebalance callbacks change
/// it only through the transitions below.
pub(crate) struct Core {
    index: usize,
    app: Arc<AppShared>,
    path: Box<dyn CommitPath>,
    slots: Slots,
    restorers: RestoreQueue,
    health: Health,
    losses: ProducerLosses,
    retries: Retries,
    dead_letters: DeadLetters,
    restores: RestoreStreaks,
    /// How long each task has failed to start while the cluster is in motion.
    start_timeouts: StartTimeouts,
    /// After an abort: nothing is processed before this.
    backoff_until: Option<Instant>,
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
            start_timeouts: StartTimeouts::new(app.config.task_timeout),
            app,
            path,
            restorers: RestoreQueue::new(jobs, reply),
            health: Health::Ok,
            losses: ProducerLosses::default(),
            retries: Retries::default(),
            dead_letters: DeadLetters::default(),
            restores: RestoreStreaks::default(),
            backoff_until: None,
        }
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    #[cfg(test)]
    pub(crate) fn slots(&self) -> &Slots {
        &self.slots
    }

    #[cfg(test)]
    pub(crate) fn slots_mut(&mut self) -> &mut Slots {
        &mut self.slots
    }

    #[cfg(test)]
    pub(crate) fn awaits_confirmation(&self) -> bool {
        self.path.awaits_confirmation()
    }

    /// After an abort: until when nothing is processed (taken once).
    pub(crate) fn take_backoff(&mut self) -> Option<Instant> {
        self.backoff_until.take()
    }

    /// The consumer's statistics: `lag` records of input `topic` past the committed position in
    /// `partition`.
    pub(crate) fn input_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.app
            .registry
            .input_lag(self.index, topic, partition, lag);
    }

    /// The worker fails with `error` (unless it failed already: the first failure is the one
    /// reported).
    pub(crate) fn fail(&mut self, error: TaskError) {
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

    /// Starts restoring the tasks of `partitions`, as one batch: a restorer asks for the ends
    /// of all their changelogs at once before it restores the first of them. `reread`: their
    /// inputs were consumed past the committed offsets ([`Restoring::reread`](crate::worker::slots::Restoring::reread)).
    fn start_restores(&mut self, partitions: &[i32], reread: bool) {
        if partitions.is_empty() {
            return;
        }
        if self.restorers.is_closed() {
            // The worker is ending (its consumer closing): an assignment that arrives now is
            // left to the next owner; it is no failure.
            tracing::debug!(
                worker = self.index,
                ?partitions,
                "assigned while ending; not restored"
            );
            return;
        }
        for job in self.restorers.jobs(&self.app, partitions) {
            let (partition, id) = (job.task.partition, job.id);
            let (cancel, progress) = (job.cancel.clone(), job.progress.clone());
            self.slots
                .begin_restore(partition, id, cancel, progress, reread);
            if let Err(e) = self.restorers.send(job) {
                return self.fail(e);
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
        let (touched, still_held) = self.slots.release_all(partitions, close);
        for p in &touched {
            self.start_timeouts.stopped(*p);
        }
        // Its next owner meets its failing records on its own.
        self.dead_letters.forget(&touched);
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
        let Core { slots, path, .. } = self;
        let mut tasks: Vec<&mut Task> = slots
            .running()
            .into_iter()
            .filter(|t| path.carries(ending, t))
            .collect();
        match path.commit(&mut tasks, input, Occasion::Ending) {
            Ok(Committed::Done) => {
                self.retries.committed();
                self.dead_letters.committed();
                (true, false)
            }
            Ok(Committed::Aborted(why)) => {
                tracing::warn!(worker = self.index, reason = %why, "the last transaction of ending tasks aborted; the others start over");
                (false, true)
            }
            Err(e) => {
                tracing::warn!(worker = self.index, error = %e, "the last commit of ending tasks failed");
                match react_to_ending(classify(&e), self.path.shared_fate()) {
                    EndingFailed::Replay => (false, false),
                    EndingFailed::AbortAndStartOver => (false, self.abandon(&e.to_string())),
                    EndingFailed::ReplaceProducer | EndingFailed::Fail => {
                        self.producer_failed(e);
                        (false, false)
                    }
                }
            }
        }
    }

    /// Drops the uncommitted work of every task: under exactly-once the transaction aborts, and
    /// the result is true (every running task must start over); an abort that fails loses the
    /// producer.
    fn abandon(&mut self, why: &str) -> bool {
        match self.path.abandon(why) {
            Ok(start_over) => start_over,
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
        let mut again = Vec::new();
        for done in done {
            let p = done.task.partition;
            let Some(restoring) = self.slots.finish_restore(p, done.id) else {
                continue; // cancelled: revoked meanwhile
            };
            match done.result {
                Ok(stores) => ready.push((done.task, restoring, stores)),
                Err(e) if in_motion(&e) => {
                    tracing::warn!(worker = self.index, task = p, error = %e, "the restore's broker did not answer; the task restores again");
                    self.slots.restore_failed(p);
                    if self.may_start_later(&[p], e) {
                        again.push(p);
                    }
                }
                Err(e) => {
                    self.slots.restore_failed(p);
                    self.fail(e);
                }
            }
        }
        if self.health.is_ok() {
            // Its records since the committed offsets may have been taken into the restore's
            // buffer, now dropped: it reads them again.
            self.start_restores(&again, true);
        }
        let tasks: Vec<i32> = ready.iter().map(|(task, _, _)| task.partition).collect();
        if tasks.is_empty() || !self.health.is_ok() {
            return self.slots.restore_failed_all(&tasks);
        }
        let partitions: Vec<InputPartition> = tasks
            .iter()
            .flat_map(|p| self.slots.inputs_of(*p))
            .collect();
        let positions = match activation::start_positions(input, &self.app, &partitions) {
            Ok(c) => c,
            Err(e) if in_motion(&e) => {
                // The cluster is in motion: the tasks restore again (nothing to replay) and
                // ask again, after a pause.
                tracing::warn!(worker = self.index, error = %e, "where the inputs start is not known yet; the tasks restore again and ask again");
                self.slots.restore_failed_all(&tasks);
                if self.may_start_later(&tasks, e) {
                    self.backoff_until = Some(Instant::now() + START_RETRY);
                    self.start_restores(&tasks, true);
                }
                return;
            }
            Err(e) => {
                self.slots.restore_failed_all(&tasks);
                return self.fail(e);
            }
        };
        for (id, restoring, stores) in ready {
            let p = id.partition;
            if !self.health.is_ok() {
                self.slots.restore_failed(p);
                continue;
            }
            let offsets = match activation::start_offsets(self.slots.inputs_of(p), &positions) {
                Ok(offsets) => offsets,
                Err(e) => {
                    self.slots.restore_failed(p);
                    self.fail(e);
                    continue;
                }
            };
            let started =
                activation::start_task(&self.app, self.path.producer(), id, stores, &offsets);
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
            self.start_timeouts.stopped(p);
            if !restoring.reread {
                self.process_buffered(input, p, restoring.buffered);
            }
            // Every input reads on from the record after the last the task took, by a seek,
            // never from where librdkafka's fetcher was: records it fetched before the pause
            // took hold and did not hand over were skipped on resume (the three-node cluster's
            // chaos run: four records of each input of one task, under exactly-once, with
            // their offsets committed).
            let next = self.slots.task_mut(p).map(|t| t.next_offsets(&offsets));
            match activation::seek(input, &self.app, p, next.unwrap_or_default()) {
                Ok(()) => {}
                Err(e) if in_motion(&e) => {
                    // The group rebalances (librdkafka does not fetch the partition yet): the
                    // task must not run on from wherever the fetcher starts. It restores again
                    // and starts over after a pause.
                    tracing::warn!(worker = self.index, task = p, error = %e, "the task's input cannot be sought yet; it restores again and starts after a pause");
                    if !self.may_start_later(&[p], e) {
                        return;
                    }
                    self.backoff_until = Some(Instant::now() + START_RETRY);
                    self.restart(input, p, "an input could not be sought");
                    continue;
                }
                Err(e) => return self.fail(e),
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
            self.process(input, &b.record(p));
        }
    }

    // ----- records and timers -----

    /// A record from the consumer.
    pub(crate) fn record(&mut self, input: &dyn Input, record: &Record<'_>) {
        if self.slots.task_mut(record.partition).is_some() {
            self.process(input, record);
        } else if let Some(restoring) = self.slots.restoring_mut(record.partition) {
            restoring.buffer(record);
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
        self.slots.next_timer()
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
                self.restores.progressed(&progressed);
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
                self.path.offsets_committed();
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
        let positions = match activation::start_positions(input, &self.app, &partitions) {
            Ok(c) => c,
            Err(e) if in_motion(&e) => return self.rewind_later(input, e),
            Err(e) => return self.fail(e),
        };
        metrics::counter!("kstate_task_rewinds").increment(1);
        // The abort dropped the dead letters of the open transaction: each comes again.
        self.dead_letters.rewound();
        for p in ids {
            let offsets = match activation::start_offsets(self.slots.inputs_of(p), &positions) {
                Ok(offsets) => offsets,
                Err(e) => return self.fail(e),
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
            match activation::seek(input, &self.app, p, offsets) {
                Ok(()) => {}
                Err(e) if in_motion(&e) => return self.rewind_later(input, e),
                Err(e) => return self.fail(e),
            }
        }
    }

    /// As at a start ([`restored`](Self::restored)): the cluster or the group is in motion (the
    /// committed offsets not known yet, or a seek refused). The tasks' stores are as at the last
    /// commit (the abort dropped the rest), so the held tasks are dropped and restore again, and
    /// their start asks again after a pause.
    fn rewind_later(&mut self, input: &dyn Input, error: TaskError) {
        tracing::warn!(worker = self.index, %error, "the tasks cannot start over yet; they restore again and start after a pause");
        if !self.may_start_later(&self.slots.running_ids(), error) {
            return;
        }
        self.dead_letters.rewound();
        self.slots.drop_all();
        self.backoff_until = Some(Instant::now() + START_RETRY);
        self.restore_held(input);
    }

    /// Tasks `partitions` could not start because the cluster is in motion (`error`, logged by
    /// the caller): true while they may try again; once one of them has failed to start for the
    /// task timeout, the worker fails with `error` and the result is false
    /// ([`StartTimeouts`]).
    fn may_start_later(&mut self, partitions: &[i32], error: TaskError) -> bool {
        let now = Instant::now();
        let expired = partitions
            .iter()
            .find_map(|&p| self.start_timeouts.failed(p, now).err().map(|w| (p, w)));
        let Some((partition, waited)) = expired else {
            return true;
        };
        self.fail(TaskError::TimedOut {
            what: TaskId { partition }.to_string(),
            waited,
            timeout: self.start_timeouts.timeout(),
            last: Box::new(error),
        });
        false
    }

    /// Task `p`'s stores disagree with their changelogs (another writer's records, such as a
    /// paused member's aborted ones, after its restore's end): it is dropped without a commit
    /// and restored again, which replays what is committed since its stored offsets, and its
    /// inputs are read again from the committed offsets when it starts.
    fn restore_again(&mut self, input: &dyn Input, partition: i32, error: TaskError) {
        if let Err(restores) = self.restores.again(partition) {
            return self.fail(TaskError::Corrupted {
                task: TaskId { partition },
                restores,
                last: error.to_string(),
            });
        }
        tracing::warn!(worker = self.index, task = partition, error = %error, "a store disagrees with its changelog: restoring the task again");
        metrics::counter!("kstate_task_restored_again").increment(1);
        self.restart(input, partition, "a store disagrees with its changelog");
    }

    /// Task `partition` is dropped without a commit (under exactly-once with the open
    /// transaction, and the other tasks start over) and restored again, its inputs paused
    /// until it starts again from its committed offsets.
    fn restart(&mut self, input: &dyn Input, partition: i32, why: &str) {
        let rewind = self.abandon(why);
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
        match self.path.renew(&self.app) {
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

    /// Shutting down (or failed): every task is ended as by a revocation.
    pub(crate) fn end(&mut self, input: &dyn Input) {
        let held = self.slots.held();
        // Only the last commit is confirmed: earlier revocations' partitions are others' now.
        self.path.forget_unconfirmed();
        self.revoked(input, &held, false);
    }

    /// After [`end`](Self::end): whether the group holds the offsets of the last commit, asked
    /// until `deadline` ([`CommitPath::confirm_last`]).
    pub(crate) fn confirm_last_commit(&mut self, input: &dyn Input, deadline: Instant) -> bool {
        self.path.confirm_last(input, deadline)
    }

    /// The worker ends: no more restores (the restorer threads end after their jobs once every
    /// worker has), and its failure, if it failed.
    pub(crate) fn finish(&mut self) -> Option<TaskError> {
        self.restorers.close();
        std::mem::replace(&mut self.health, Health::Ok).into_failure()
    }

    pub(crate) fn restoring_any(&self) -> bool {
        !self.slots.restoring_ids().is_empty()
    }

    pub(crate) fn commit_requested(&self) -> bool {
        self.path.producer().commit_requested()
    }
}
