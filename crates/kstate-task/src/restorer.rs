//! The restorer threads of a process: they restore the stores of newly assigned tasks while the
//! workers keep polling and processing their ready tasks (Kafka Streams' state updater). A
//! restore that takes minutes never holds up a consumer's poll loop, so it never costs the group
//! membership (`max.poll.interval.ms`).
//!
//! One job per task, in assignment order; a revoked task's job is cancelled through its token.
//! The process has [`AppBuilder::restore_threads`](crate::AppBuilder::restore_threads) restorer
//! threads (default: as many as workers, at least 2) on one job channel that every worker sends
//! to, each job carrying the channel its answer goes back on. So the tasks of a new assignment
//! restore side by side (a restore with nothing to replay is mostly waiting for the broker: its
//! topic check and end offsets), a failover that moves several tasks to one worker readies them
//! on every restorer, and the threads and Kafka clients restores cost do not grow with the
//! workers beyond that default.
//! A job that panics (a user's [`RestoreListener`] can) answers with [`TaskError::Thread`]: the
//! worker never waits for an answer that cannot come. The answer to a worker that has ended is
//! dropped; the pool ends when every worker has (the job channel closes).
//! Each thread keeps one set of Kafka clients for all its restores ([`RestoreClients`]): a cold
//! set costs about a second per store, which a failover that moves many tasks would pay for each.
//! The threads' sets share one metadata and one admin client ([`RestoreCluster`]), so each
//! thread adds one replaying consumer, and the ends one thread prefetched serve them all.
//! A job opens the task's part of the RocksDB the process's tasks share
//! ([`StateDir::open_task`], which first moves in what an older kstate left at the task's
//! directory) once and restores its stores into it one after another.
//! The jobs of one assignment share a [`Batch`]: before the first of them, one thread asks for
//! the ends of all the batch's changelogs in three requests (the others wait for it) ([`RestoreClients::prefetch_ends`]), so
//! that a task with nothing to replay opens with no broker round trip of its own (four per store
//! before: most of a 1,000-task restart's broker time, BENCHMARKS.md). First it creates the
//! missing changelog topics of the batch's new tasks (no local state, so no stored position),
//! all in one request ([`RestoreClients::create_missing_topics`]); a fresh start's restores
//! otherwise created them one after another.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate_core::sync::lock;
use kstate_kafka::{
    BatchRestored, CancelToken, ChangelogConfig, ChangelogError, OpenHooks, RestoreClients,
    RestoreCluster, RestoreListener, RestoreReport, RestoreStart, RestoredStore, StoreLocation,
};
use kstate_rocksdb::{OpenError, RocksDbOptions, StateDir, TaskDb};

use crate::error::{TaskError, panic_message};
use crate::ids::TaskId;
use crate::status::Progress;

/// Restore the stores of one task.
pub(crate) struct Job {
    /// Tells this job's result from an earlier, cancelled job of the same task.
    pub(crate) id: u64,
    pub(crate) task: TaskId,
    /// Each store's name and changelog, in declaration order.
    pub(crate) stores: Vec<(String, ChangelogConfig)>,
    /// The tasks assigned with this one.
    pub(crate) batch: Arc<Batch>,
    pub(crate) cancel: CancelToken,
    pub(crate) progress: Arc<Progress>,
    /// Where the answer goes: the worker that sent the job.
    pub(crate) reply: Sender<Done>,
}

/// The tasks one assignment handed a worker: before a restorer thread restores the first of them
/// it asks for the ends of all their changelogs at once ([`RestoreClients::prefetch_ends`]), so
/// that a task with nothing to replay opens without a round trip to the broker of its own.
pub(crate) struct Batch {
    /// The changelog of every store of every task of the batch.
    pub(crate) changelogs: Vec<ChangelogConfig>,
    /// The changelogs of the batch's tasks that have no local state (no position stored):
    /// their stores hold no position, so their missing topics are created before the restores,
    /// all in one request ([`RestoreClients::create_missing_topics`]).
    pub(crate) of_new_tasks: Vec<ChangelogConfig>,
    /// Whether the ends were prefetched (held while one thread prefetches them).
    pub(crate) prefetched: Mutex<bool>,
}

/// A finished job: the restored stores, or why not.
pub(crate) struct Done {
    pub(crate) id: u64,
    pub(crate) task: TaskId,
    pub(crate) result: Result<Vec<RestoredStore>, TaskError>,
}

/// Hears about restores for both the task's progress and the application's listener.
struct Both(Arc<Progress>, Arc<dyn RestoreListener>);

impl RestoreListener for Both {
    fn on_restore_start(&self, start: &RestoreStart) {
        self.0.on_restore_start(start);
        self.1.on_restore_start(start);
    }
    fn on_batch_restored(&self, batch: &BatchRestored) {
        self.0.on_batch_restored(batch);
        self.1.on_batch_restored(batch);
    }
    fn on_restore_end(&self, report: &RestoreReport) {
        self.0.on_restore_end(report);
        self.1.on_restore_end(report);
    }
}

/// The least a restore waits for a task another handle of this process still holds (a task
/// moved between two workers of the process, or revoked while restoring, is closing).
const TASK_WAIT: Duration = Duration::from_secs(60);

/// How long a restore of `stores` waits for its task while another handle of this process
/// holds it: the holder may be a restore or a follower of the same stores that is waiting, up
/// to its open timeout, for an open transaction to end (cancelled, it lets go within a poll;
/// not every step of it can be cancelled), so the wait is at least that timeout and a margin.
pub(crate) fn task_wait(stores: &[(String, ChangelogConfig)]) -> Duration {
    let longest_open = stores
        .iter()
        .map(|(_, config)| config.opens_within())
        .max()
        .unwrap_or_default();
    TASK_WAIT.max(longest_open + Duration::from_secs(30))
}

/// Whether an open failed because the task, or the RocksDB directory of its own an older kstate
/// left (its LOCK), is still held: another task of this process is still closing it.
fn held(error: &OpenError) -> bool {
    matches!(
        error,
        OpenError::AlreadyOpen { .. } | OpenError::TaskHeld { .. }
    )
}

/// Opens task `task`'s stores ([`StateDir::open_task`], which first moves in what an older
/// kstate left for them); waits while the task is still held here.
#[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
pub(crate) fn open_task_db(
    state: &StateDir,
    task: TaskId,
    stores: &[(String, ChangelogConfig)],
    cancel: &CancelToken,
    wait: Duration,
) -> Result<TaskDb, ChangelogError> {
    let deadline = Instant::now() + wait;
    let number = u32::try_from(task.partition).map_err(|_| {
        ChangelogError::Open(OpenError::Layout {
            path: state.root().to_path_buf(),
            message: format!("{task}: a partition number cannot be negative"),
        })
    })?;
    let names: Vec<&str> = stores.iter().map(|(name, _)| name.as_str()).collect();
    loop {
        match state.open_task(number, &names) {
            Err(e) if held(&e) && Instant::now() < deadline && !cancel.is_cancelled() => {
                std::thread::sleep(Duration::from_millis(50));
            }
            result => return Ok(result?),
        }
    }
}

/// What a process's restorer threads share: the clients of their cluster, made by the first
/// thread that needs them.
pub(crate) type SharedCluster = Arc<Mutex<Option<Arc<RestoreCluster>>>>;

/// A restorer thread's (or a standby starter's) Kafka clients: its own replaying consumer,
/// with the clients every thread shares.
pub(crate) struct ThreadClients {
    own: Option<RestoreClients>,
    shared: SharedCluster,
}

impl ThreadClients {
    /// None of its own yet, sharing `shared`'s.
    pub(crate) fn new(shared: SharedCluster) -> Self {
        ThreadClients { own: None, shared }
    }

    /// The clients for `config`: those kept, if they suit it, else a new replaying consumer
    /// with the shared clients (new ones too, if those do not suit it).
    #[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
    pub(crate) fn for_config(
        &mut self,
        config: &ChangelogConfig,
    ) -> Result<&RestoreClients, ChangelogError> {
        self.own.take_if(|c| !c.suits(config));
        Ok(match &mut self.own {
            Some(c) => c,
            own @ None => own.insert(RestoreClients::sharing(
                shared_cluster(&self.shared, config)?,
                config,
            )?),
        })
    }
}

/// The shared clients for `config`: those the threads share, if they suit it, else new ones
/// that the threads share from now on.
#[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
pub(crate) fn shared_cluster(
    shared: &SharedCluster,
    config: &ChangelogConfig,
) -> Result<Arc<RestoreCluster>, ChangelogError> {
    let mut shared = lock(shared);
    shared.take_if(|c| !c.suits(config));
    Ok(match &*shared {
        Some(c) => c.clone(),
        None => shared
            .insert(Arc::new(RestoreCluster::new(config)?))
            .clone(),
    })
}

/// Asks for the ends of the batch's changelogs at once. Only a shortcut: a failure leaves each
/// restore to ask for its own.
fn prefetch(batch: &Batch, clients: &mut ThreadClients, cancel: &CancelToken) {
    let Some(first) = batch.changelogs.first() else {
        return;
    };
    let started = Instant::now();
    let clients = match clients.for_config(first) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "no restore clients to prefetch with; each restore asks for its own");
            return;
        }
    };
    let cancel = Some(cancel);
    let created = match clients.create_missing_topics(&batch.of_new_tasks, cancel) {
        Ok(created) => created,
        // Each restore creates its own topic then, and reports what fails.
        Err(e) => {
            tracing::debug!(error = %e, "could not create the new tasks' changelog topics together");
            Vec::new()
        }
    };
    if created.is_empty() {
        // Every topic existed (a restart, a failover): one prefetch of them all.
        report(
            clients.prefetch_ends(&batch.changelogs, cancel),
            batch.changelogs.len(),
            started,
        );
        return;
    }
    tracing::debug!(
        topics = ?created,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "created the new tasks' changelog topics"
    );
    let (new, existing): (Vec<ChangelogConfig>, Vec<ChangelogConfig>) = batch
        .changelogs
        .iter()
        .cloned()
        .partition(|c| created.iter().any(|t| t == c.topic()));
    if !existing.is_empty() {
        report(
            clients.prefetch_ends(&existing, cancel),
            existing.len(),
            started,
        );
    }
    // A new topic's partitions have no leader for a while (10-16 s for three topics of 1,000
    // partitions here): their ends are asked for until every one has, as each restore would.
    let leaders_by = Instant::now() + NEW_TOPIC_LEADER_WAIT;
    let prefetched = loop {
        let prefetched = clients.prefetch_ends(&new, cancel);
        let complete = matches!(prefetched, Ok(found) if found == new.len());
        let stopped = cancel.is_some_and(CancelToken::is_cancelled);
        if complete || stopped || Instant::now() >= leaders_by {
            break prefetched;
        }
        std::thread::sleep(NEW_TOPIC_RETRY);
    };
    report(prefetched, new.len(), started);
}

/// Logs what a prefetch of `changelogs` ends found.
fn report(prefetched: Result<usize, ChangelogError>, changelogs: usize, started: Instant) {
    match prefetched {
        Ok(found) => tracing::debug!(
            changelogs,
            found,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "prefetched changelog ends"
        ),
        Err(e) => {
            tracing::debug!(error = %e, "could not prefetch changelog ends; each restore asks for its own")
        }
    }
}

/// How long a prefetch waits for the partitions of the topics it created to have leaders: as
/// long as a restore's end capture waits by default (`ChangelogConfig::open_timeout`).
const NEW_TOPIC_LEADER_WAIT: Duration = Duration::from_secs(30);

/// How often the ends of newly created topics are asked for again while their partitions have
/// no leader yet.
const NEW_TOPIC_RETRY: Duration = Duration::from_millis(250);

/// Restores one store of the task's RocksDB.
#[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
fn restore_one(
    db: &TaskDb,
    name: &str,
    options: &RocksDbOptions,
    config: ChangelogConfig,
    hooks: &OpenHooks,
    clients: &mut ThreadClients,
) -> Result<RestoredStore, ChangelogError> {
    let clients = clients.for_config(&config)?;
    let location = StoreLocation::InTask {
        db: db.clone(),
        name: name.to_string(),
    };
    RestoredStore::restore_with(location, options, config, hooks, clients)
}

/// Runs jobs until the job channel closes. The process's restorer threads share it: each takes
/// the next job, whichever worker sent it, when it is free.
pub(crate) fn run(
    jobs: Arc<Mutex<Receiver<Job>>>,
    shared: SharedCluster,
    db: StateDir,
    options: RocksDbOptions,
    listener: Option<Arc<dyn RestoreListener>>,
) {
    let mut clients = ThreadClients::new(shared);
    loop {
        // The lock is held only while waiting for a job, never while restoring.
        let next = lock(&jobs).recv();
        let Ok(job) = next else {
            return;
        };
        if job.cancel.is_cancelled() {
            continue;
        }
        let (id, task, reply) = (job.id, job.task, job.reply.clone());
        let restored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            restore_job(job, &db, &options, listener.as_ref(), &mut clients)
        }));
        let result = restored.unwrap_or_else(|payload| {
            // The clients may be in any state: the next job makes new ones.
            clients.own = None;
            Err(TaskError::Thread {
                name: std::thread::current()
                    .name()
                    .unwrap_or("kstate-restorer")
                    .to_string(),
                message: format!(
                    "the restore of {task} panicked: {}",
                    panic_message(&*payload)
                ),
            })
        });
        if let Err(TaskError::Restore { source, .. }) = &result
            && matches!(**source, ChangelogError::BrokerUnreachable { .. })
        {
            // A client can keep asking a broker that does not answer (its connection to a
            // paused node stays up), or keep a stale view of the cluster: the task restores
            // again with new clients, and the other threads' next restores make new ones too.
            clients.own = None;
            lock(&clients.shared).take();
        }
        // A worker that has ended no longer listens: its task is the next owner's.
        let _ = reply.send(Done { id, task, result });
    }
}

/// How often a job waiting for its batch's ends looks at its cancel token.
const PREFETCH_POLL: Duration = Duration::from_millis(20);

/// Runs `prefetch` unless another thread of the batch has (`prefetched`), or waits for the
/// thread that is running it (creating topics, then waiting up to 30 s for their leaders). A
/// job cancelled meanwhile stops waiting within [`PREFETCH_POLL`]: its restore sees the token
/// at once and ends.
fn wait_for_ends(prefetched: &Mutex<bool>, cancel: &CancelToken, prefetch: impl FnOnce()) {
    loop {
        let mut done = match prefetched.try_lock() {
            Ok(done) => done,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if cancel.is_cancelled() {
                    return;
                }
                std::thread::sleep(PREFETCH_POLL);
                continue;
            }
        };
        if !*done {
            prefetch();
            *done = true;
        }
        return;
    }
}

/// Restores every store of one task.
fn restore_job(
    job: Job,
    db: &StateDir,
    options: &RocksDbOptions,
    listener: Option<&Arc<dyn RestoreListener>>,
    clients: &mut ThreadClients,
) -> Result<Vec<RestoredStore>, TaskError> {
    let span = tracing::info_span!("restore_task", partition = job.task.partition);
    let _entered = span.enter();
    wait_for_ends(&job.batch.prefetched, &job.cancel, || {
        prefetch(&job.batch, clients, &job.cancel)
    });
    let hooks = OpenHooks {
        listener: Some(match listener {
            Some(l) => Arc::new(Both(job.progress.clone(), l.clone())),
            None => job.progress.clone(),
        }),
        record_check: None,
        cancel: Some(job.cancel.clone()),
    };
    let result = restore_stores(db, job.task, job.stores, options, &hooks, clients);
    job.progress.finish();
    result.map_err(|source| TaskError::restore(job.task, source))
}

/// Opens the task's part of the shared RocksDB and restores its stores, in declaration order.
#[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
fn restore_stores(
    state: &StateDir,
    task: TaskId,
    stores: Vec<(String, ChangelogConfig)>,
    options: &RocksDbOptions,
    hooks: &OpenHooks,
    clients: &mut ThreadClients,
) -> Result<Vec<RestoredStore>, ChangelogError> {
    let cancel = hooks.cancel.clone().unwrap_or_default();
    let db = open_task_db(state, task, &stores, &cancel, task_wait(&stores))?;
    stores
        .into_iter()
        .map(|(name, config)| restore_one(&db, &name, options, config, hooks, clients))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kstate_rocksdb::RocksDbStore;

    /// A job whose batch's ends another thread is still prefetching stops waiting when it is
    /// cancelled, instead of waiting out the prefetch (up to 30 s for leaders); an uncancelled
    /// one waits, and then does not prefetch again.
    #[test]
    fn a_job_waiting_for_its_batchs_ends_sees_its_cancel_token() {
        let prefetched = Arc::new(Mutex::new(false));
        let (started, running) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let slow = {
            let prefetched = prefetched.clone();
            std::thread::spawn(move || {
                wait_for_ends(&prefetched, &CancelToken::new(), || {
                    started.send(()).expect("the test listens");
                    // The prefetch lasts until the test ends it.
                    released.recv().expect("the test releases it");
                })
            })
        };
        running.recv().expect("the prefetch started");
        let (returned, returns) = std::sync::mpsc::channel();
        let cancelled = {
            let prefetched = prefetched.clone();
            std::thread::spawn(move || {
                let cancel = CancelToken::new();
                cancel.cancel();
                wait_for_ends(&prefetched, &cancel, || panic!("prefetched twice"));
                returned.send(()).expect("the test listens");
            })
        };
        // Still prefetching: only a job that sees its token can return now.
        let seen = returns.recv_timeout(Duration::from_secs(30));
        release.send(()).expect("the prefetch waits");
        assert!(
            seen.is_ok(),
            "a cancelled job kept waiting for another thread's prefetch"
        );
        wait_for_ends(&prefetched, &CancelToken::new(), || {
            panic!("prefetched twice")
        });
        assert!(*lock(&prefetched));
        slow.join().expect("the prefetching thread");
        cancelled.join().expect("the cancelled job");
    }

    /// Only RocksDB's own "already open" and a task held in the shared RocksDB are waited out:
    /// an error that merely mentions a lock (an application id `CLOCK`, a path through
    /// `/srv/BLOCKS`) is reported at once, not retried for a minute.
    #[test]
    fn only_a_held_directory_or_task_is_waited_for_not_an_error_that_mentions_a_lock() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("CLOCK");
        let _held = RocksDbStore::open(&path, &RocksDbOptions::default()).expect("opens");
        let Err(again) = RocksDbStore::open(&path, &RocksDbOptions::default()) else {
            panic!("the directory is held, a second open must fail");
        };
        assert!(held(&again));
        let state = StateDir::open(dir.path().join("app"), &["s"], &RocksDbOptions::default())
            .expect("opens");
        let _task = state.open_task(7, &["s"]).expect("free");
        let Err(again) = state.open_task(7, &["s"]) else {
            panic!("the task is held, a second open must fail");
        };
        assert!(held(&again));
        let mentions_lock = OpenError::Layout {
            path: path.join("BLOCKS"),
            message: "LOCK appears in this text".into(),
        };
        assert!(!held(&mentions_lock));
    }
}
