//! The standby manager's thread: reads the group's members, works out which tasks would come
//! to this process after a single process's failure, and starts and stops followers to match;
//! measures their lag. It runs on the application's shared state, which holds the
//! [`Standbys`](super::Standbys) it keeps.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate_core::sync::lock;
use kstate_kafka::{
    CancelToken, ChangelogConfig, ConnectionWatch, FollowerGroup, Following, RestoreListener,
    StoreLocation,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::groups::GroupList;
use rdkafka::{Offset, TopicPartitionList};

use super::{FollowState, Follower, Stage, Standbys};
use crate::ids::TaskId;
use crate::placement::{RangePlacement, process_of};
use crate::restorer::{SharedCluster, ThreadClients, shared_cluster};
use crate::shared::AppShared;
use crate::status::TaskState;

/// How often the manager reads the group when nothing wakes it.
const REFRESH: Duration = Duration::from_secs(2);
/// How long one DescribeGroups may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many standby tasks restore to their changelogs' ends at once, each with a consumer of
/// its own; the rest start as these hand their stores to the follower group.
const STARTING_AT_ONCE: usize = 2;

impl Standbys {
    /// The follower group for `changelog`'s cluster.
    #[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
    fn group(
        &self,
        cluster: &SharedCluster,
        changelog: &ChangelogConfig,
    ) -> Result<Arc<FollowerGroup>, kstate_kafka::ChangelogError> {
        let mut group = lock(&self.group);
        group.take_if(|g| !g.suits(changelog));
        Ok(match &*group {
            Some(g) => g.clone(),
            None => group
                .insert(Arc::new(FollowerGroup::new(shared_cluster(
                    cluster, changelog,
                )?)))
                .clone(),
        })
    }

    /// Follows exactly the tasks of `wanted` that no worker of this process holds now, starting
    /// at most [`STARTING_AT_ONCE`] at a time.
    fn reconcile(
        self: &Arc<Self>,
        wanted: &BTreeSet<TaskId>,
        app: &Arc<AppShared>,
        cluster: &SharedCluster,
    ) {
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
        let mut starting = followers
            .by_task
            .values()
            .filter(|f| matches!(f.stage, Stage::Starting(_)))
            .count();
        for &task in wanted.iter().filter(|t| keep(t)) {
            if followers.by_task.contains_key(&task) {
                continue;
            }
            if starting >= STARTING_AT_ONCE {
                break;
            }
            starting += 1;
            match start_follower(task, app, cluster, self) {
                Ok(f) => {
                    tracing::info!(%task, "standby starting");
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

    /// Moves finished starts to following, and forgets the followers that ended (cancelled,
    /// or failed: a failed one starts again at the next look, if still wanted).
    fn reap(&self) {
        let mut followers = lock(&self.followers);
        for (task, f) in &mut followers.by_task {
            f.started(*task);
        }
        followers.by_task.retain(|task, f| {
            let ended = f.ended();
            if ended {
                tracing::info!(%task, "standby stopped");
            }
            !ended
        });
    }

    /// Stops every follower, waits for them, then stops the follower group.
    fn stop_all(&self) {
        let all = std::mem::take(&mut lock(&self.followers).by_task);
        for f in all.values() {
            f.cancel.cancel();
        }
        for (task, f) in all {
            f.join(task);
            tracing::info!(%task, "standby stopped");
        }
        lock(&self.group).take();
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

/// Starts a standby of `task`: a starter thread restores its stores and hands them to the
/// follower group.
fn start_follower(
    task: TaskId,
    app: &Arc<AppShared>,
    cluster: &SharedCluster,
    standbys: &Arc<Standbys>,
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
    let (cluster, standbys) = (cluster.clone(), standbys.clone());
    let thread = std::thread::Builder::new()
        .name(format!("kstate-standby-{}", task.partition))
        .spawn(move || {
            let following = start(task, &app, &cluster, &standbys, &stores, &token, listener);
            standbys.nudge();
            following
        })?;
    Ok(Follower {
        cancel,
        stage: Stage::Starting(thread),
        state,
        changelogs,
    })
}

/// A starter's thread: opens the task, restores each store to its changelog's end and hands it
/// to the follower group. One failing store stops the others (they share `cancel`): the task is
/// followed whole or not at all. Returns the handles of the stores followed.
#[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
fn start(
    task: TaskId,
    app: &AppShared,
    cluster: &SharedCluster,
    standbys: &Standbys,
    stores: &[(String, ChangelogConfig)],
    cancel: &CancelToken,
    listener: Arc<FollowState>,
) -> Vec<Following> {
    // Its restores' log lines say they are a standby's.
    let _span = tracing::info_span!("standby", task = task.partition).entered();
    let mut following = Vec::new();
    let Some(db) = app.state_db() else {
        return following;
    };
    let options = &app.config.rocksdb;
    let wait = crate::restorer::task_wait(stores);
    let task_db = match crate::restorer::open_task_db(&db, task, stores, cancel, wait) {
        Ok(t) => t,
        Err(e) => {
            if !cancel.is_cancelled() {
                tracing::warn!(%task, error = %e, "a standby could not open its task");
            }
            return following;
        }
    };
    let mut clients = ThreadClients::new(cluster.clone());
    for (name, changelog) in stores {
        if cancel.is_cancelled() {
            break;
        }
        let location = StoreLocation::InTask {
            db: task_db.clone(),
            name: name.clone(),
        };
        let reports: Arc<dyn RestoreListener> = listener.clone();
        let followed = standbys.group(cluster, changelog).and_then(|group| {
            let clients = clients.for_config(changelog)?;
            group.follow(location, options, changelog, Some(reports), cancel, clients)
        });
        match followed {
            Ok(f) => {
                // A store already at the end replayed no batch: its position is where the
                // restore left it.
                let mut positions = lock(&listener.positions);
                let at = positions.entry(changelog.topic().to_string()).or_insert(-1);
                *at = (*at).max(f.restored_to());
                drop(positions);
                following.push(f);
            }
            Err(e) => {
                if !cancel.is_cancelled() {
                    tracing::warn!(%task, store = %name, error = %e, "a standby stopped");
                }
                cancel.cancel();
                break;
            }
        }
    }
    if !cancel.is_cancelled() {
        tracing::info!(%task, stores = following.len(), "standby following");
    }
    following
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
