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
//! **How.** One thread per standby task opens the task's part of the process's RocksDB and
//! follows each store's changelog ([`follow_changelog_sharing`], `read_committed`: under exactly-once a
//! standby applies committed data only, and it never writes to Kafka). When a worker of this
//! process is assigned the task, [`Standbys::activate`] cancels the follower before the restore
//! job is sent; the follower closes the stores at their position, and the restore, which waits
//! for the task to be free, replays only what came after.
//!
//! A standby that is no longer wanted stops and leaves its data, as a revoked task does: if the
//! task comes back, its restore starts from there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kstate_core::sync::lock;
use kstate_kafka::{
    BatchRestored, CancelToken, ChangelogConfig, ConnectionWatch, RestoreListener, StoreLocation,
    follow_changelog_sharing,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::groups::GroupList;
use rdkafka::{Offset, TopicPartitionList};

use crate::ids::TaskId;
use crate::placement::{RangePlacement, process_of};
use crate::restorer::{SharedCluster, shared_cluster};
use crate::shared::AppShared;
use crate::status::TaskState;

/// How often the manager reads the group when nothing wakes it.
const REFRESH: Duration = Duration::from_secs(2);
/// How long one DescribeGroups may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// A running follower: its thread, and the token that stops it.
struct Follower {
    cancel: CancelToken,
    thread: JoinHandle<()>,
    state: Arc<FollowState>,
    changelogs: Vec<ChangelogConfig>,
}

#[derive(Default)]
struct Followers {
    by_task: BTreeMap<TaskId, Follower>,
    /// A worker was assigned or lost tasks: look at the group again now.
    nudged: bool,
}

/// The process's standby tasks.
#[derive(Default)]
pub(crate) struct Standbys {
    followers: Mutex<Followers>,
    wake: Condvar,
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

    /// Follows exactly the tasks of `wanted` that no worker of this process holds now.
    fn reconcile(&self, wanted: &BTreeSet<TaskId>, app: &Arc<AppShared>, cluster: &SharedCluster) {
        let mut followers = lock(&self.followers);
        // Read under the followers' lock: a worker marks a task in the registry before it
        // activates it, so either the task is seen here, or its activation comes after.
        let active: BTreeSet<TaskId> = app.registry.statuses().iter().map(|s| s.task).collect();
        let keep = |task: &TaskId| wanted.contains(task) && !active.contains(task);
        for (task, f) in &followers.by_task {
            if !keep(task) && !f.cancel.is_cancelled() {
                tracing::info!(%task, "standby no longer wanted here; stopping it");
                f.cancel.cancel();
            }
        }
        for &task in wanted.iter().filter(|t| keep(t)) {
            if followers.by_task.contains_key(&task) {
                continue;
            }
            match start_follower(task, app, cluster) {
                Ok(f) => {
                    tracing::info!(%task, "standby following");
                    followers.by_task.insert(task, f);
                }
                Err(e) => tracing::warn!(%task, error = %e, "could not start a standby"),
            }
        }
        metrics::gauge!("kstate_task_tasks", "role" => "standby").set(
            followers
                .by_task
                .values()
                .filter(|f| !f.cancel.is_cancelled())
                .count() as f64,
        );
    }

    /// Joins the followers that ended (cancelled, or failed: a failed one starts again at the
    /// next look, if still wanted).
    fn reap(&self) {
        let ended: Vec<(TaskId, Follower)> = {
            let mut followers = lock(&self.followers);
            let done: Vec<TaskId> = followers
                .by_task
                .iter()
                .filter(|(_, f)| f.thread.is_finished())
                .map(|(t, _)| *t)
                .collect();
            done.into_iter()
                .filter_map(|t| followers.by_task.remove(&t).map(|f| (t, f)))
                .collect()
        };
        for (task, f) in ended {
            if f.thread.join().is_err() {
                tracing::warn!(%task, "a standby's thread panicked");
            }
        }
    }

    /// Stops every follower and waits for them.
    fn stop_all(&self) {
        let all = std::mem::take(&mut lock(&self.followers).by_task);
        for f in all.values() {
            f.cancel.cancel();
        }
        for (task, f) in all {
            if f.thread.join().is_err() {
                tracing::warn!(%task, "a standby's thread panicked");
            }
        }
    }

    /// Measures each standby's lag: its changelogs' ends against its positions. One
    /// `ListOffsets` request for every changelog (bounded by `DESCRIBE_TIMEOUT` however many
    /// standbys there are), and none once the application is stopping: with the broker gone,
    /// a probe per changelog would hold the shutdown for minutes.
    fn measure_lag(&self, app: &AppShared, client: &BaseConsumer<ConnectionWatch>) {
        if app.stopping() {
            return;
        }
        let probes: Vec<(TaskId, Arc<FollowState>, Vec<ChangelogConfig>)> = lock(&self.followers)
            .by_task
            .iter()
            .map(|(task, f)| (*task, f.state.clone(), f.changelogs.clone()))
            .collect();
        let mut ends = TopicPartitionList::new();
        for c in probes.iter().flat_map(|(_, _, changelogs)| changelogs) {
            if ends
                .add_partition_offset(c.topic(), c.partition(), Offset::End)
                .is_err()
            {
                return;
            }
        }
        if ends.count() == 0 {
            return;
        }
        let Ok(ends) = client.offsets_for_times(ends, DESCRIBE_TIMEOUT) else {
            return;
        };
        for (task, state, changelogs) in probes {
            let lag: Option<i64> = changelogs
                .iter()
                .map(|c| {
                    let end = ends.find_partition(c.topic(), c.partition())?;
                    let high = match (end.error(), end.offset()) {
                        (Ok(()), Offset::Offset(high)) => high,
                        _ => return None,
                    };
                    let applied = lock(&state.positions).get(c.topic()).map_or(0, |p| p + 1);
                    Some((high - applied).max(0))
                })
                .sum();
            if let Some(lag) = lag {
                *lock(&state.lag) = Some(lag);
                metrics::gauge!("kstate_task_standby_lag", "partition" => task.partition.to_string())
                    .set(lag as f64);
            }
        }
    }
}

/// Starts following every store of `task`.
fn start_follower(
    task: TaskId,
    app: &Arc<AppShared>,
    cluster: &SharedCluster,
) -> std::io::Result<Follower> {
    let config = &app.config;
    let stores: Vec<(String, ChangelogConfig)> = config
        .stores
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                config.changelog(s, task.partition, app.partitions),
            )
        })
        .collect();
    let changelogs = stores.iter().map(|(_, c)| c.clone()).collect();
    let cancel = CancelToken::new();
    let state = Arc::new(FollowState {
        started: Instant::now(),
        records: AtomicU64::new(0),
        positions: Mutex::default(),
        lag: Mutex::default(),
    });
    let (app, token, listener) = (app.clone(), cancel.clone(), state.clone());
    let cluster = cluster.clone();
    let thread = std::thread::Builder::new()
        .name(format!("kstate-standby-{}", task.partition))
        .spawn(move || follow(task, &app, &cluster, stores, &token, listener))?;
    Ok(Follower {
        cancel,
        thread,
        state,
        changelogs,
    })
}

/// A follower's thread: opens the task, follows each store in a thread of its own until
/// cancelled (one failing store stops the others: the task is followed whole or not at all).
/// Every follower shares the process's metadata and admin clients with the restorers
/// (`cluster`): a followed store costs one replaying consumer.
fn follow(
    task: TaskId,
    app: &AppShared,
    cluster: &SharedCluster,
    stores: Vec<(String, ChangelogConfig)>,
    cancel: &CancelToken,
    listener: Arc<FollowState>,
) {
    let Some(db) = app.state_db() else {
        return;
    };
    let options = &app.config.rocksdb;
    let dir = app.config.task_dir(task.partition);
    let wait = crate::restorer::task_wait(&stores);
    let task_db = match crate::restorer::open_task_db(&db, task, &dir, options, cancel, wait) {
        Ok(t) => t,
        Err(e) => {
            if !cancel.is_cancelled() {
                tracing::warn!(%task, error = %e, "a standby could not open its task");
            }
            return;
        }
    };
    std::thread::scope(|scope| {
        for (name, changelog) in &stores {
            let location = StoreLocation::InTask {
                db: task_db.clone(),
                name: name.clone(),
            };
            let listener: Arc<dyn RestoreListener> = listener.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("kstate-standby-{}-{name}", task.partition))
                .spawn_scoped(scope, move || {
                    // Its restore's log lines say they are a standby's.
                    let _span = tracing::info_span!("standby", task = task.partition).entered();
                    let followed = match shared_cluster(cluster, changelog) {
                        Ok(cluster) => follow_changelog_sharing(
                            cluster,
                            location,
                            options,
                            changelog,
                            Some(listener),
                            cancel,
                        ),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = followed {
                        if !cancel.is_cancelled() {
                            tracing::warn!(%task, store = %name, error = %e, "a standby stopped");
                        }
                        cancel.cancel();
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(%task, store = %name, error = %e, "could not start a standby's thread");
                cancel.cancel();
            }
        }
    });
    drop(task_db);
    tracing::info!(%task, "standby stopped");
}

/// The tasks this process should keep standbys of, if the group is settled and its assignment
/// is the model's; `None` otherwise.
fn wanted(
    client: &BaseConsumer<ConnectionWatch>,
    app: &AppShared,
) -> Result<Option<BTreeSet<TaskId>>, String> {
    let config = &app.config;
    let groups: GroupList = client
        .fetch_group_list(Some(&config.application_id), DESCRIBE_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let Some(group) = groups
        .groups()
        .iter()
        .find(|g| g.name() == config.application_id)
    else {
        return Ok(None);
    };
    if group.state() != "Stable" {
        return Ok(None);
    }
    let members: Vec<&str> = group.members().iter().map(|m| m.client_id()).collect();
    let placement = RangePlacement::new(members, app.partitions);
    let statuses = app.registry.statuses();
    for worker in 0..config.threads {
        let Some(id) = config.group_instance_id(worker) else {
            return Err("standbys need static membership".into());
        };
        let model: BTreeSet<i32> = placement.tasks_of(&id).collect();
        let actual: BTreeSet<i32> = statuses
            .iter()
            .filter(|s| s.worker == worker && s.state != TaskState::Closing)
            .map(|s| s.task.partition)
            .collect();
        if model != actual {
            tracing::debug!(
                worker,
                ?model,
                ?actual,
                "the group's assignment is not the model's yet"
            );
            return Ok(None);
        }
    }
    let Some(first) = config.group_instance_id(0) else {
        return Err("standbys need static membership".into());
    };
    Ok(Some(placement.standbys_of(
        process_of(&first),
        config.standby_replicas as usize,
    )))
}

/// The manager thread: looks at the group every [`REFRESH`] or when a worker's assignment
/// changes, and keeps the followers to what it finds; stops them all when the application
/// stops.
pub(crate) fn run(standbys: Arc<Standbys>, app: Arc<AppShared>, cluster: SharedCluster) {
    let client: BaseConsumer<ConnectionWatch> = match app
        .config
        .client
        .client_config()
        .create_with_context(ConnectionWatch::default())
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %app.config.client.redact_error(e), "no standbys: could not create the group reader");
            return;
        }
    };
    let mut mismatched_since: Option<Instant> = None;
    while !app.stopping() {
        standbys.wait(REFRESH);
        if app.stopping() {
            break;
        }
        standbys.reap();
        match wanted(&client, &app) {
            Ok(Some(wanted)) => {
                mismatched_since = None;
                standbys.reconcile(&wanted, &app, &cluster);
            }
            Ok(None) => {
                let since = *mismatched_since.get_or_insert_with(Instant::now);
                if since.elapsed() > REFRESH * 15 {
                    tracing::warn!(
                        "for 30 s the group's assignment has not been the range assignor's over its static members: standbys cannot be placed"
                    );
                    mismatched_since = Some(Instant::now());
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not read the group's members"),
        }
        standbys.measure_lag(&app, &client);
    }
    standbys.stop_all();
}
