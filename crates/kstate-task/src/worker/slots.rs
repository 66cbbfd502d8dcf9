//! Where each of a worker's tasks is: one [`Slot`] per partition number, and the only code that
//! changes a slot or writes the status registry.
//!
//! ```text
//!              all inputs held            restored
//!  (none) ──▶ Incomplete ─────────▶ Restoring ─────────▶ Running
//!    ▲           │  ▲                   │                   │
//!    └───────────┘  └──── an input ─────┴───── revoked ─────┘ (Running: committed, then closed)
//!    last input          revoked                              corrupted: Running ─▶ Restoring
//!    revoked
//! ```
//!
//! A task runs only while its worker holds partition *p* of every input: a slot that holds
//! some of them is [`Slot::Incomplete`], its partitions paused; nothing is restored, processed
//! or committed for it. An input partition is fetched only while its slot is
//! [`Slot::Running`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use kstate_kafka::CancelToken;
use rdkafka::TopicPartitionList;

use crate::ids::{InputPartition, Record, TaskId};
use crate::shared::AppShared;
use crate::status::Progress;
use crate::task::Task;

/// A record fetched for a task that is not running yet.
pub(crate) struct Buffered {
    topic: String,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

impl Buffered {
    /// The record, as it came, of task `partition`.
    pub(crate) fn record(&self, partition: i32) -> Record<'_> {
        Record {
            topic: &self.topic,
            partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
        }
    }
}

/// A task whose stores are being restored.
pub(crate) struct Restoring {
    pub(crate) job: u64,
    pub(crate) cancel: CancelToken,
    /// Records the consumer handed over before the pause took hold.
    pub(crate) buffered: Vec<Buffered>,
    /// The task is restored again after its work since the last commit was dropped: its inputs
    /// were consumed past the committed offsets, so they are sought back to them when it
    /// starts, and `buffered` is dropped (it comes again).
    pub(crate) reread: bool,
}

impl Restoring {
    /// `record` was handed over before the pause took hold: kept for when the task is ready.
    pub(crate) fn buffer(&mut self, record: &Record<'_>) {
        self.buffered.push(Buffered {
            topic: record.topic.to_string(),
            offset: record.offset,
            timestamp: record.timestamp,
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.map(<[u8]>::to_vec),
        });
    }
}

/// One task of the worker.
pub(crate) enum Slot {
    /// Some of the task's input partitions are assigned here, not all: paused, nothing runs.
    Incomplete { held: BTreeSet<String> },
    /// Every input is held; the stores are restoring; the inputs are paused.
    Restoring(Restoring),
    /// Processing.
    Running(Box<Task>),
}

/// What releasing an input partition ended.
enum Released {
    /// Nothing was running or restoring.
    Nothing,
    /// A restore, cancelled.
    Restore,
    /// A task; the caller commits (or not) and closes (or drops) it.
    Task(Box<Task>),
}

/// The worker's tasks, by partition.
pub(crate) struct Slots {
    worker: usize,
    app: Arc<AppShared>,
    slots: BTreeMap<i32, Slot>,
}

impl Slots {
    pub(crate) fn new(worker: usize, app: Arc<AppShared>) -> Self {
        Slots {
            worker,
            app,
            slots: BTreeMap::new(),
        }
    }

    pub(crate) fn worker(&self) -> usize {
        self.worker
    }

    fn inputs(&self) -> &[String] {
        &self.app.config.inputs
    }

    /// Task `p`'s input partitions.
    pub(crate) fn inputs_of(&self, partition: i32) -> Vec<InputPartition> {
        self.inputs()
            .iter()
            .map(|t| InputPartition::new(t.clone(), partition))
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn get(&self, partition: i32) -> Option<&Slot> {
        self.slots.get(&partition)
    }

    pub(crate) fn task_mut(&mut self, partition: i32) -> Option<&mut Task> {
        match self.slots.get_mut(&partition) {
            Some(Slot::Running(task)) => Some(task),
            _ => None,
        }
    }

    pub(crate) fn restoring_mut(&mut self, partition: i32) -> Option<&mut Restoring> {
        match self.slots.get_mut(&partition) {
            Some(Slot::Restoring(r)) => Some(r),
            _ => None,
        }
    }

    /// Every running task.
    pub(crate) fn running(&mut self) -> Vec<&mut Task> {
        self.slots
            .values_mut()
            .filter_map(|s| match s {
                Slot::Running(task) => Some(&mut **task),
                _ => None,
            })
            .collect()
    }

    /// When the running tasks' next wall-clock timer is due.
    pub(crate) fn next_timer(&mut self) -> Option<Instant> {
        self.running()
            .into_iter()
            .filter_map(|t| t.next_timer())
            .min()
    }

    pub(crate) fn running_ids(&self) -> Vec<i32> {
        self.ids(|s| matches!(s, Slot::Running(_)))
    }

    pub(crate) fn restoring_ids(&self) -> Vec<i32> {
        self.ids(|s| matches!(s, Slot::Restoring(_)))
    }

    fn ids(&self, which: impl Fn(&Slot) -> bool) -> Vec<i32> {
        self.slots
            .iter()
            .filter(|(_, s)| which(s))
            .map(|(p, _)| *p)
            .collect()
    }

    /// Every input partition held, whatever its slot's state.
    pub(crate) fn held(&self) -> Vec<InputPartition> {
        let mut held = Vec::new();
        for (p, slot) in &self.slots {
            match slot {
                Slot::Incomplete { held: topics } => {
                    held.extend(topics.iter().map(|t| InputPartition::new(t.clone(), *p)));
                }
                Slot::Restoring(_) | Slot::Running(_) => held.extend(self.inputs_of(*p)),
            }
        }
        held
    }

    /// The tasks whose every input partition is held, neither restoring nor running (as
    /// [`drop_all`](Self::drop_all) leaves them).
    pub(crate) fn held_whole(&self) -> Vec<i32> {
        let n_inputs = self.inputs().len();
        self.slots
            .iter()
            .filter_map(|(&p, slot)| match slot {
                Slot::Incomplete { held } if held.len() == n_inputs => Some(p),
                _ => None,
            })
            .collect()
    }

    /// Of `partitions`' tasks, those that hold only some of their inputs, with the inputs they
    /// hold.
    pub(crate) fn incomplete_among(
        &self,
        partitions: &[InputPartition],
    ) -> BTreeMap<i32, BTreeSet<String>> {
        // A task that holds every input is `Incomplete` too until its restore begins.
        let n_inputs = self.inputs().len();
        partitions
            .iter()
            .filter_map(|ip| match self.slots.get(&ip.partition) {
                Some(Slot::Incomplete { held }) if held.len() < n_inputs => {
                    Some((ip.partition, held.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The running task with a store of this name (as its logged store names itself).
    pub(crate) fn task_with_store(&self, store: &str) -> Option<i32> {
        self.slots.iter().find_map(|(p, s)| match s {
            Slot::Running(task) => task
                .logged_stores()
                .iter()
                .any(|(_, logged)| kstate_core::KeyValueStore::name(&**logged) == store)
                .then_some(*p),
            _ => None,
        })
    }

    /// Input `partitions` are assigned (the caller pauses them): returns the tasks they complete
    /// (every input now held), sorted. Tasks left holding only some inputs are warned about once
    /// the whole assignment is held (a task's inputs come in one event, one partition after
    /// another), not at each partition.
    pub(crate) fn hold_all(&mut self, partitions: &[InputPartition]) -> Vec<i32> {
        let mut complete: Vec<i32> = partitions.iter().filter_map(|ip| self.hold(ip)).collect();
        complete.sort_unstable();
        complete.dedup();
        if !complete.is_empty() {
            tracing::info!(worker = self.worker, tasks = ?complete, "assigned; restoring");
        }
        let incomplete = self.incomplete_among(partitions);
        if !incomplete.is_empty() {
            tracing::warn!(
                worker = self.worker,
                tasks = ?incomplete,
                inputs = ?self.inputs(),
                "holds only some of these tasks' input partitions: they stay paused and a task does not start until every input's partition is assigned here"
            );
        }
        complete
    }

    /// The group's answer (`committed`) to an asynchronous commit of `offsets`, for every
    /// running task: on success the tasks know the group holds their offsets; on failure the
    /// offsets stay pending and the next commit sends them again.
    pub(crate) fn offsets_committed(&mut self, committed: bool, offsets: &TopicPartitionList) {
        for task in self.running() {
            if committed {
                task.offsets_committed(offsets);
            } else {
                task.offsets_commit_failed(offsets);
            }
        }
    }

    /// Input partition `ip` is assigned: returns the task it completes (every input now held),
    /// if any. Either way the caller pauses `ip`.
    pub(crate) fn hold(&mut self, ip: &InputPartition) -> Option<i32> {
        let n_inputs = self.inputs().len();
        let slot = self
            .slots
            .entry(ip.partition)
            .or_insert_with(|| Slot::Incomplete {
                held: BTreeSet::new(),
            });
        match slot {
            Slot::Incomplete { held } => {
                held.insert(ip.topic.clone());
                (held.len() == n_inputs).then_some(ip.partition)
            }
            // Assigned again while held (a duplicate event): nothing changes.
            Slot::Restoring(_) | Slot::Running(_) => None,
        }
    }

    /// Incomplete, every input held → Restoring.
    pub(crate) fn begin_restore(
        &mut self,
        partition: i32,
        job: u64,
        cancel: CancelToken,
        progress: Arc<Progress>,
        reread: bool,
    ) {
        self.app
            .registry
            .restoring(self.worker, partition, progress);
        // After the registry has it: a standby manager looking now either sees the task here
        // or sees this activation (the `standby` module).
        if let Some(standbys) = &self.app.standbys {
            standbys.activate(TaskId { partition });
        }
        self.slots.insert(
            partition,
            Slot::Restoring(Restoring {
                job,
                cancel,
                buffered: Vec::new(),
                reread,
            }),
        );
    }

    /// Restoring with job `job` → out of its slot, for the caller to start (see
    /// [`run`](Self::run)); `None` if that job was cancelled meanwhile.
    pub(crate) fn finish_restore(&mut self, partition: i32, job: u64) -> Option<Restoring> {
        match self.slots.get(&partition) {
            Some(Slot::Restoring(r)) if r.job == job => {}
            _ => return None,
        }
        match self.slots.remove(&partition) {
            Some(Slot::Restoring(r)) => Some(r),
            _ => None,
        }
    }

    /// A restore finished but its task could not start: the slot holds every input, paused.
    pub(crate) fn restore_failed(&mut self, partition: i32) {
        self.app.registry.remove(self.worker, partition);
        self.slots.insert(partition, self.all_held(partition));
    }

    fn all_held(&self, _partition: i32) -> Slot {
        Slot::Incomplete {
            held: self.inputs().iter().cloned().collect(),
        }
    }

    /// [`restore_failed`](Self::restore_failed) for each of `partitions`.
    pub(crate) fn restore_failed_all(&mut self, partitions: &[i32]) {
        for &p in partitions {
            self.restore_failed(p);
        }
    }

    /// → Running.
    pub(crate) fn run(&mut self, task: Box<Task>) {
        let partition = task.id.partition;
        self.app.registry.running(
            self.worker,
            partition,
            task.committed.clone(),
            task.logged_stores(),
        );
        self.slots.insert(partition, Slot::Running(task));
    }

    /// Running → its last commit is under way (shown as closing).
    pub(crate) fn closing(&self, partition: i32) {
        if matches!(self.slots.get(&partition), Some(Slot::Running(_))) {
            self.app.registry.closing(self.worker, partition);
        }
    }

    /// Input partition `ip` is no longer assigned: a restore of its task is cancelled, a
    /// running task is taken out for the caller to end; the slot keeps the inputs still held
    /// (the caller pauses them), or goes.
    fn release(&mut self, ip: &InputPartition) -> Released {
        let Some(slot) = self.slots.remove(&ip.partition) else {
            return Released::Nothing;
        };
        let mut held: BTreeSet<String> = match &slot {
            Slot::Incomplete { held } => held.clone(),
            Slot::Restoring(_) | Slot::Running(_) => self.inputs().iter().cloned().collect(),
        };
        held.remove(&ip.topic);
        if !held.is_empty() {
            self.slots.insert(ip.partition, Slot::Incomplete { held });
        }
        match slot {
            Slot::Incomplete { .. } => Released::Nothing,
            Slot::Restoring(r) => {
                r.cancel.cancel();
                self.app.registry.remove(self.worker, ip.partition);
                Released::Restore
            }
            Slot::Running(task) => {
                self.app.registry.remove(self.worker, ip.partition);
                Released::Task(task)
            }
        }
    }

    /// Input partitions `partitions` are no longer assigned ([`release`](Self::release)): a
    /// running task they end is closed if `close` (its last commit succeeded), else dropped
    /// uncommitted. Returns the tasks they touched, and the input partitions of those this
    /// worker still holds (the caller pauses them: the tasks no longer run).
    pub(crate) fn release_all(
        &mut self,
        partitions: &[InputPartition],
        close: bool,
    ) -> (Vec<i32>, Vec<InputPartition>) {
        let mut touched: Vec<i32> = Vec::new();
        for ip in partitions {
            touched.push(ip.partition);
            if let Released::Task(task) = self.release(ip) {
                if close {
                    if let Err(e) = task.close() {
                        tracing::warn!(worker = self.worker, error = %e, "closing a task failed");
                    }
                } else {
                    drop(task);
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        let still_held = self
            .held()
            .into_iter()
            .filter(|ip| touched.contains(&ip.partition))
            .collect();
        (touched, still_held)
    }

    /// Every restore and task is dropped; the slots keep the partitions they hold (the producer
    /// was lost: the worker rejoins, and the group hands them out again).
    pub(crate) fn drop_all(&mut self) {
        let partitions: Vec<i32> = self.slots.keys().copied().collect();
        for p in partitions {
            let slot = self.slots.remove(&p);
            match slot {
                Some(Slot::Incomplete { held }) => {
                    self.slots.insert(p, Slot::Incomplete { held });
                }
                Some(Slot::Restoring(r)) => {
                    r.cancel.cancel();
                    self.app.registry.remove(self.worker, p);
                    self.slots.insert(p, self.all_held(p));
                }
                Some(Slot::Running(task)) => {
                    self.app.registry.remove(self.worker, p);
                    // Its stores close here: nothing of the lost transaction is applied.
                    drop(task);
                    self.slots.insert(p, self.all_held(p));
                }
                None => {}
            }
        }
    }

    /// Running → out of its slot (its stores disagree with their changelogs): the caller drops
    /// it and restores it again ([`begin_restore`](Self::begin_restore)).
    pub(crate) fn take_for_restore(&mut self, partition: i32) -> Option<Box<Task>> {
        match self.slots.remove(&partition) {
            Some(Slot::Running(task)) => {
                self.app.registry.remove(self.worker, partition);
                self.slots.insert(partition, self.all_held(partition));
                Some(task)
            }
            other => {
                if let Some(slot) = other {
                    self.slots.insert(partition, slot);
                }
                None
            }
        }
    }

    /// No slot at all: the worker holds nothing.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}
