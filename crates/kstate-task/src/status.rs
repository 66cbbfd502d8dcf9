//! What the application reports about its tasks: state, restore progress, records processed,
//! position and lag in the inputs; and the registry the query API routes through.
//!
//! The registry is written only by the worker's task-state transitions (`worker::slots`) and
//! its consumer's statistics (the inputs' lag), and keyed by worker and partition: a worker
//! that loses a task after another worker of the process took it over removes its own entry,
//! never the other's. Each transition also sets the gauge `kstate_task_tasks{role}`: how many
//! of the process's tasks restore, run or close (the standby manager sets `role="standby"`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kstate_core::sync::lock;
use std::time::{Duration, Instant};

use kstate_kafka::{BatchRestored, LoggedStore, RestoreListener, RestoreStart};

use crate::ids::TaskId;

/// Where a task is: the role of an active task. A standby's is in
/// [`Running::standbys`](crate::Running::standbys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Its stores are being restored; its input partitions are paused.
    Restoring,
    /// Processing.
    Running,
    /// Revoked: its last commit is under way, then its stores close.
    Closing,
}

/// How far a task's restore is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestoreProgress {
    /// Records replayed so far, over all the task's stores.
    pub records: u64,
    /// Records the restore has to replay at most (offsets between start and end; compaction and
    /// transaction markers make the real count lower).
    pub records_total: u64,
    /// Since the restore started.
    pub elapsed: Duration,
    /// Records per second so far.
    pub rate: f64,
    /// At this rate, the time left.
    pub eta: Option<Duration>,
}

/// One task of this process.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStatus {
    /// Which task.
    pub task: TaskId,
    /// The worker thread that owns it.
    pub worker: usize,
    /// Restoring or running.
    pub state: TaskState,
    /// Its (last) restore.
    pub restore: RestoreProgress,
    /// Input records processed and committed since it started here.
    pub processed: u64,
    /// Per input topic, the next offset the task processes as of its last commit: where it
    /// starts again if it moves (empty until it runs).
    pub position: BTreeMap<String, i64>,
    /// Input records the task has yet to process, summed over its inputs, from librdkafka's
    /// statistics (every 5 s; `None` until they first came, or while it restores).
    pub lag: Option<i64>,
}

/// What a running task shares with the registry, brought up to date at each of its commits.
#[derive(Debug, Default)]
pub(crate) struct CommittedSoFar {
    processed: AtomicU64,
    position: Mutex<BTreeMap<String, i64>>,
}

impl CommittedSoFar {
    /// A commit covered `processed` more records and left the task at `position`.
    /// A topic's name is copied only the first time (commits run every commit interval).
    pub(crate) fn add<'a>(&self, processed: u64, position: impl Iterator<Item = (&'a str, i64)>) {
        self.processed.fetch_add(processed, Ordering::Relaxed);
        let mut stored = lock(&self.position);
        for (topic, next) in position {
            match stored.get_mut(topic) {
                Some(at) => *at = next,
                None => {
                    stored.insert(topic.to_string(), next);
                }
            }
        }
    }
}

/// Counts a task's restore; a [`RestoreListener`] for each of its stores.
#[derive(Debug)]
pub(crate) struct Progress {
    started: Instant,
    records: AtomicU64,
    total: AtomicI64,
    finished_after: Mutex<Option<Duration>>,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Progress {
            started: Instant::now(),
            records: AtomicU64::new(0),
            total: AtomicI64::new(0),
            finished_after: Mutex::new(None),
        }
    }

    pub(crate) fn finish(&self) {
        *lock(&self.finished_after) = Some(self.started.elapsed());
    }

    pub(crate) fn snapshot(&self) -> RestoreProgress {
        let records = self.records.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed).max(0) as u64;
        let elapsed = lock(&self.finished_after).unwrap_or_else(|| self.started.elapsed());
        let rate = records as f64 / elapsed.as_secs_f64().max(1e-3);
        let eta = (rate > 0.0)
            .then(|| Duration::from_secs_f64(total.saturating_sub(records) as f64 / rate));
        RestoreProgress {
            records,
            records_total: total,
            elapsed,
            rate,
            eta,
        }
    }
}

impl RestoreListener for Progress {
    fn on_restore_start(&self, start: &RestoreStart) {
        self.total.fetch_add(
            (start.end_offset - start.start_offset).max(0),
            Ordering::Relaxed,
        );
    }

    fn on_batch_restored(&self, batch: &BatchRestored) {
        self.records
            .fetch_add(batch.records as u64, Ordering::Relaxed);
        metrics::counter!("kstate_task_restored_records").increment(batch.records as u64);
    }
}

/// A task as the registry knows it.
pub(crate) struct Entry {
    pub(crate) worker: usize,
    pub(crate) state: TaskState,
    pub(crate) progress: Arc<Progress>,
    pub(crate) committed: Arc<CommittedSoFar>,
    /// Per input topic, from the consumer's statistics.
    pub(crate) lag: BTreeMap<String, i64>,
    pub(crate) stores: Vec<(String, Arc<LoggedStore>)>,
}

/// Every task of this process, by worker and partition.
#[derive(Default)]
pub(crate) struct Registry {
    tasks: Mutex<BTreeMap<(usize, i32), Entry>>,
    /// The workers that have had an assignment from the group (possibly empty).
    joined: Mutex<BTreeSet<usize>>,
}

impl Registry {
    /// `worker` had an assignment from the group.
    pub(crate) fn joined(&self, worker: usize) {
        lock(&self.joined).insert(worker);
    }

    /// How many workers have had an assignment from the group.
    pub(crate) fn workers_joined(&self) -> usize {
        lock(&self.joined).len()
    }

    /// Active tasks restoring, and all active tasks.
    pub(crate) fn restoring_of_all(&self) -> (usize, usize) {
        let tasks = lock(&self.tasks);
        let restoring = tasks
            .values()
            .filter(|e| e.state == TaskState::Restoring)
            .count();
        (restoring, tasks.len())
    }

    pub(crate) fn restoring(&self, worker: usize, partition: i32, progress: Arc<Progress>) {
        let mut tasks = lock(&self.tasks);
        tasks.insert(
            (worker, partition),
            Entry {
                worker,
                state: TaskState::Restoring,
                progress,
                committed: Arc::default(),
                lag: BTreeMap::new(),
                stores: Vec::new(),
            },
        );
        count_roles(&tasks);
    }

    pub(crate) fn running(
        &self,
        worker: usize,
        partition: i32,
        committed: Arc<CommittedSoFar>,
        stores: Vec<(String, Arc<LoggedStore>)>,
    ) {
        let mut tasks = lock(&self.tasks);
        if let Some(entry) = tasks.get_mut(&(worker, partition)) {
            entry.state = TaskState::Running;
            entry.committed = committed;
            entry.stores = stores;
        }
        count_roles(&tasks);
    }

    pub(crate) fn closing(&self, worker: usize, partition: i32) {
        let mut tasks = lock(&self.tasks);
        if let Some(entry) = tasks.get_mut(&(worker, partition)) {
            entry.state = TaskState::Closing;
        }
        count_roles(&tasks);
    }

    pub(crate) fn remove(&self, worker: usize, partition: i32) {
        let mut tasks = lock(&self.tasks);
        tasks.remove(&(worker, partition));
        count_roles(&tasks);
    }

    /// The consumer's statistics measured `lag` records past the position of the running task
    /// `partition` of `worker` in input `topic`.
    pub(crate) fn input_lag(&self, worker: usize, topic: &str, partition: i32, lag: i64) {
        if let Some(entry) = lock(&self.tasks).get_mut(&(worker, partition))
            && entry.state == TaskState::Running
        {
            entry.lag.insert(topic.to_string(), lag);
        }
    }

    pub(crate) fn statuses(&self) -> Vec<TaskStatus> {
        lock(&self.tasks)
            .iter()
            .map(|(&(_, partition), e)| TaskStatus {
                task: TaskId { partition },
                worker: e.worker,
                state: e.state,
                restore: e.progress.snapshot(),
                processed: e.committed.processed.load(Ordering::Relaxed),
                position: lock(&e.committed.position).clone(),
                lag: (!e.lag.is_empty()).then(|| e.lag.values().sum()),
            })
            .collect()
    }

    /// The logged store `name` of task `partition`, if it runs here.
    pub(crate) fn store(&self, partition: i32, name: &str) -> Option<Arc<LoggedStore>> {
        lock(&self.tasks)
            .iter()
            .filter(|((_, p), e)| *p == partition && e.state == TaskState::Running)
            .find_map(|(_, e)| {
                e.stores
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, s)| s.clone())
            })
    }
}

/// Sets `kstate_task_tasks{role}` for the active roles from the registry's entries.
fn count_roles(tasks: &BTreeMap<(usize, i32), Entry>) {
    for (role, state) in [
        ("restoring", TaskState::Restoring),
        ("running", TaskState::Running),
        ("closing", TaskState::Closing),
    ] {
        let n = tasks.values().filter(|e| e.state == state).count();
        metrics::gauge!("kstate_task_tasks", "role" => role).set(n as f64);
    }
}
