//! The worker's state and the transitions the poll loop and the rebalance callbacks drive:
//! assigned, revoked (or lost), restored, a record, timers, the periodic commit, a task's
//! failure (the error policy, an abort and rewind, a restore again), the producer lost. The
//! consumer is an [`Input`] and the commit path a [`CommitPath`], so that every transition has a
//! unit test without a broker (`worker::tests`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Instant;

use rdkafka::TopicPartitionList;
use rdkafka::error::KafkaResult;

use crate::error::TaskError;
use crate::ids::{InputPartition, Record};
use crate::restorer::{Done, Job};
use crate::shared::AppShared;
use crate::task::Task;
use crate::worker::activation::{self, NotStarted, Ready, RestoreQueue, Started};
use crate::worker::commit::{CommitPath, Committed, Occasion};
use crate::worker::dead_letters::{self, DeadLetters};
use crate::worker::failure::{EndingFailed, Failure, Reaction, classify, react, react_to_ending};
use crate::worker::health::{Health, ProducerLosses};
use crate::worker::input::Input;
use crate::worker::recovery::Recovery;
use crate::worker::slots::{Buffered, Slots};

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
    dead_letters: DeadLetters,
    /// Aborts and restores in a row, start timeouts, the pause after an abort.
    recovery: Recovery,
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
            recovery: Recovery::new(index, app.config.task_timeout),
            app,
            path,
            restorers: RestoreQueue::new(index, jobs, reply),
            health: Health::Ok,
            losses: ProducerLosses::default(),
            dead_letters: DeadLetters::default(),
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
        self.recovery.take_backoff()
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
            return self.fail(e);
        }
        let complete = self.slots.hold_all(partitions);
        self.start_restores(&complete, false);
    }

    /// Starts restoring the tasks of `partitions`, as one batch ([`RestoreQueue::start`]).
    fn start_restores(&mut self, partitions: &[i32], reread: bool) {
        let started = self
            .restorers
            .start(&self.app, &mut self.slots, partitions, reread);
        if let Err(e) = started {
            self.fail(e);
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
            self.recovery.started_or_left(*p);
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
                self.recovery.committed(&[]);
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

    /// Restores finished: their tasks start from their committed input offsets, run the
    /// records buffered meanwhile, and resume ([`RestoreQueue::finished`]).
    pub(crate) fn restored(&mut self, input: &dyn Input, done: Vec<Done>) {
        let Core {
            restorers,
            app,
            slots,
            recovery,
            ..
        } = self;
        let healthy = self.health.is_ok();
        match restorers.finished(input, app, slots, recovery, done, healthy) {
            Ok(Started { ready, positions }) => {
                for ready in ready {
                    self.activate(input, ready, &positions);
                }
            }
            Err(e) => self.fail(e),
        }
    }

    /// Restored task `ready` starts at its inputs' `positions`, takes the records buffered while
    /// it restored (unless its inputs are read again), and resumes from the record after the
    /// last it took ([`activation::resume`]).
    fn activate(
        &mut self,
        input: &dyn Input,
        ready: Ready,
        positions: &BTreeMap<InputPartition, i64>,
    ) {
        let Ready {
            id,
            restoring,
            stores,
        } = ready;
        let p = id.partition;
        if !self.health.is_ok() {
            return self.slots.restore_failed(p);
        }
        let producer = self.path.producer();
        let offsets = match activation::run_restored(
            &self.app,
            &mut self.slots,
            producer,
            id,
            stores,
            positions,
        ) {
            Ok(offsets) => offsets,
            Err(NotStarted::Task(e)) => return self.task_failed(input, None, e),
            Err(NotStarted::InMotion(e) | NotStarted::Worker(e)) => return self.fail(e),
        };
        self.recovery.started_or_left(p);
        if !restoring.reread {
            self.process_buffered(input, p, restoring.buffered);
        }
        match activation::resume(input, &self.app, &mut self.slots, p, &offsets) {
            Ok(()) => {}
            Err(NotStarted::InMotion(e)) => {
                // The group rebalances (librdkafka does not fetch the partition yet): the task
                // must not run on from wherever the fetcher starts. It restores again and
                // starts over after a pause.
                tracing::warn!(worker = self.index, task = p, error = %e, "the task's input cannot be sought yet; it restores again and starts after a pause");
                match self.recovery.start_later(&[p], e, true) {
                    Ok(()) => self.restart(input, p, "an input could not be sought"),
                    Err(e) => self.fail(e),
                }
            }
            Err(NotStarted::Task(e) | NotStarted::Worker(e)) => self.fail(e),
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
                self.recovery.committed(&progressed);
                self.dead_letters.committed();
            }
            Ok(Committed::Aborted(why)) => {
                tracing::warn!(worker = self.index, reason = %why, "transaction aborted; tasks start over from their committed offsets");
                self.start_over(input, why);
            }
            Err(e) => self.task_failed(input, None, e),
        }
    }

    /// The result of an asynchronous offset commit ([`Slots::offsets_committed`]). (The commit
    /// callback that brings it is not called by rust-rdkafka 0.39, fede1024/rust-rdkafka#856;
    /// until it is, an unconfirmed offset is sent again after
    /// [`RESEND_UNCONFIRMED`](crate::task::RESEND_UNCONFIRMED).)
    pub(crate) fn offsets_committed(
        &mut self,
        result: KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        match &result {
            Ok(()) => self.path.offsets_committed(),
            Err(e) => {
                tracing::warn!(worker = self.index, error = %e, "input offset commit failed; the next commit sends the offsets again");
            }
        }
        self.slots.offsets_committed(result.is_ok(), offsets);
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
        match self.recovery.aborted(why) {
            Ok(()) => self.rewind(input),
            Err(e) => self.fail(e),
        }
    }

    /// Every running task starts over from its committed input offsets
    /// ([`activation::rewind`]).
    pub(crate) fn rewind(&mut self, input: &dyn Input) {
        // The abort dropped the dead letters of the open transaction: each comes again.
        self.dead_letters.rewound();
        let producer = self.path.producer();
        match activation::rewind(input, &self.app, &mut self.slots, producer) {
            Ok(()) => {}
            Err(NotStarted::InMotion(e)) => self.rewind_later(input, e),
            Err(NotStarted::Task(e) | NotStarted::Worker(e)) => self.fail(e),
        }
    }

    /// As at a start ([`restored`](Self::restored)): the cluster or the group is in motion (the
    /// committed offsets not known yet, or a seek refused). The tasks' stores are as at the last
    /// commit (the abort dropped the rest), so the held tasks are dropped and restore again, and
    /// their start asks again after a pause.
    fn rewind_later(&mut self, input: &dyn Input, error: TaskError) {
        tracing::warn!(worker = self.index, %error, "the tasks cannot start over yet; they restore again and start after a pause");
        if let Err(e) = self
            .recovery
            .start_later(&self.slots.running_ids(), error, true)
        {
            return self.fail(e);
        }
        self.slots.drop_all();
        self.restore_held(input);
    }

    /// Task `p`'s stores disagree with their changelogs (another writer's records, such as a
    /// paused member's aborted ones, after its restore's end): it is dropped without a commit
    /// and restored again, which replays what is committed since its stored offsets, and its
    /// inputs are read again from the committed offsets when it starts.
    fn restore_again(&mut self, input: &dyn Input, partition: i32, error: TaskError) {
        if let Err(e) = self.recovery.restore_again(partition, &error) {
            return self.fail(e);
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
    /// and skipped, as the error policy says ([`dead_letters::skip`]).
    fn skip_or_dead_letter(&mut self, record: &Record<'_>, error: &TaskError) {
        let producer = self.path.producer();
        if let Err(e) =
            dead_letters::skip(&self.app.config, producer, &mut self.slots, record, error)
        {
            self.fail(e);
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
