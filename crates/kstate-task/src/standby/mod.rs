//! Standby replicas ([`AppBuilder::standby_replicas`](crate::AppBuilder::standby_replicas)):
//! warm copies of the tasks this process would receive if another process failed, kept current
//! by following their changelogs, so that a failover replays only the tail.
//!
//! **Where.** librdkafka has no pluggable assignor, so a standby cannot be *placed*; it is put
//! where the group's own assignor will send the task ([`placement`](crate::placement)). Under
//! static membership and the eager `range` assignor, the manager thread reads the group's
//! members (DescribeGroups: each worker's `client.id` is its `group.instance.id`), computes the
//! assignment after each single process failure, and follows every task that would come to
//! this process and does not run here now. The model is checked against what the process runs:
//! while its own workers' tasks differ from the model's (a rebalance under way, members of
//! another kind), the standbys stay as they are.
//!
//! **How.** A starter thread (at most `STARTING_AT_ONCE` at a time) opens the task's part of
//! the process's RocksDB, restores each store to its changelog's end and hands it to the
//! process's [`FollowerGroup`], whose few consumers (one per store of a task, whatever the number
//! of tasks) follow every standby store, `read_committed`: under exactly-once a standby applies
//! committed data only, and it never writes to Kafka. The group shares the restorers' metadata
//! and admin clients. When a worker of this process is assigned the task,
//! [`Standbys::activate`] cancels the follower before the restore job is sent; the group closes
//! the stores at their position, and the restore, which waits for the task to be free, replays
//! only what came after.
//!
//! A standby that is no longer wanted stops and leaves its data, as a revoked task does: if the
//! task comes back, its restore starts from there.
//!
//! This module holds the standbys' data, which the application's shared state keeps and the
//! workers touch ([`Standbys::activate`]); [`manager`] holds the thread that reads the group and
//! starts and stops the followers, which runs on the application's shared state.

mod manager;

pub(crate) use manager::run;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kstate_core::sync::lock;
use kstate_kafka::{
    BatchRestored, CancelToken, ChangelogConfig, FollowerGroup, Following, RestoreListener,
};

use crate::ids::TaskId;

/// One standby task of this process, as [`Running::standbys`](crate::Running::standbys) shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyStatus {
    /// Which task.
    pub task: TaskId,
    /// Changelog records applied since the standby started.
    pub records: u64,
    /// Per changelog topic, the offset of the last record applied (none yet: absent).
    pub positions: BTreeMap<String, i64>,
    /// Records its changelogs hold beyond those positions, at the manager's last look (`None`:
    /// not measured yet). Under exactly-once, transaction markers count too.
    pub lag: Option<i64>,
    /// Since the standby started.
    pub since: Duration,
}

/// What a follower tells of itself; the listener of each of its stores' follows.
#[derive(Debug)]
struct FollowState {
    started: Instant,
    records: AtomicU64,
    positions: Mutex<BTreeMap<String, i64>>,
    lag: Mutex<Option<i64>>,
}

impl RestoreListener for FollowState {
    fn on_batch_restored(&self, batch: &BatchRestored) {
        self.records
            .fetch_add(batch.records as u64, Ordering::Relaxed);
        lock(&self.positions).insert(batch.topic.clone(), batch.last_offset);
        metrics::counter!("kstate_task_standby_records").increment(batch.records as u64);
    }
}

/// A standby task: the token that stops it, where it is, and what it tells of itself.
struct Follower {
    cancel: CancelToken,
    stage: Stage,
    state: Arc<FollowState>,
    changelogs: Vec<ChangelogConfig>,
}

/// Where a standby task is.
enum Stage {
    /// Its starter thread restores its stores and hands them to the follower group; it returns
    /// their handles (none if it failed or was cancelled).
    Starting(JoinHandle<Vec<Following>>),
    /// The follower group follows its stores.
    Following(Vec<Following>),
}

impl Follower {
    /// Whether it starts no more and follows nothing: its stores are closed.
    fn ended(&self) -> bool {
        match &self.stage {
            Stage::Starting(_) => false,
            Stage::Following(stores) => stores.iter().all(Following::is_done),
        }
    }

    /// Moves a finished start to following.
    fn started(&mut self, task: TaskId) {
        if let Stage::Starting(thread) = &self.stage
            && thread.is_finished()
        {
            let stage = std::mem::replace(&mut self.stage, Stage::Following(Vec::new()));
            if let Stage::Starting(thread) = stage {
                self.stage = Stage::Following(thread.join().unwrap_or_else(|_| {
                    tracing::warn!(%task, "a standby's starter thread panicked");
                    Vec::new()
                }));
            }
        }
    }

    /// Waits until it ended (its token cancelled first).
    fn join(self, task: TaskId) {
        let stores = match self.stage {
            Stage::Starting(thread) => thread.join().unwrap_or_else(|_| {
                tracing::warn!(%task, "a standby's starter thread panicked");
                Vec::new()
            }),
            Stage::Following(stores) => stores,
        };
        for store in stores {
            // Its failure, if any, was logged where it happened.
            let _ = store.wait();
        }
    }
}

#[derive(Default)]
struct Followers {
    by_task: BTreeMap<TaskId, Follower>,
    /// A worker was assigned or lost tasks, or a standby started: look at the group again now.
    nudged: bool,
}

/// The process's standby tasks.
#[derive(Default)]
pub(crate) struct Standbys {
    followers: Mutex<Followers>,
    wake: Condvar,
    /// Follows every standby store; made with the first standby.
    group: Mutex<Option<Arc<FollowerGroup>>>,
}

impl Standbys {
    /// Task `task` is about to restore on a worker of this process: its follower, if any, stops
    /// (the restore waits for the task to be free and replays from the follower's position).
    pub(crate) fn activate(&self, task: TaskId) {
        let mut followers = lock(&self.followers);
        if let Some(f) = followers.by_task.get(&task) {
            f.cancel.cancel();
        }
        followers.nudged = true;
        self.wake.notify_all();
    }

    /// The standbys' statuses, by task.
    pub(crate) fn statuses(&self) -> Vec<StandbyStatus> {
        lock(&self.followers)
            .by_task
            .iter()
            .filter(|(_, f)| !f.cancel.is_cancelled())
            .map(|(&task, f)| StandbyStatus {
                task,
                records: f.state.records.load(Ordering::Relaxed),
                positions: lock(&f.state.positions).clone(),
                lag: *lock(&f.state.lag),
                since: f.state.started.elapsed(),
            })
            .collect()
    }

    /// Waits for a nudge, at most `timeout`.
    fn wait(&self, timeout: Duration) {
        let followers = lock(&self.followers);
        let (mut followers, _) = self
            .wake
            .wait_timeout_while(followers, timeout, |f| !f.nudged)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        followers.nudged = false;
    }

    /// Looks at the group again soon.
    fn nudge(&self) {
        lock(&self.followers).nudged = true;
        self.wake.notify_all();
    }
}
