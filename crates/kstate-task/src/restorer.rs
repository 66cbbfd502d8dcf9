//! The restorer threads of a worker: they restore the stores of newly assigned tasks while the
//! worker keeps polling and processing its ready tasks (Kafka Streams' state updater). A restore
//! that takes minutes never holds up the consumer's poll loop, so it never costs the group
//! membership (`max.poll.interval.ms`).
//!
//! One job per task, in assignment order; a revoked task's job is cancelled through its token.
//! A worker has [`AppBuilder::restore_threads`](crate::AppBuilder::restore_threads) restorer
//! threads (default 2) on one job channel, so that the tasks of a new assignment restore side by
//! side: a restore with nothing to replay is mostly waiting for the broker (its topic check and
//! end offsets), and a failover that moves several tasks no longer readies them one after
//! another.
//! A job that panics (a user's [`RestoreListener`] can) answers with [`TaskError::Thread`]: the
//! worker never waits for an answer that cannot come.
//! Each thread keeps one set of Kafka clients for all its restores ([`RestoreClients`]): a cold
//! set costs about a second per store, which a failover that moves many tasks would pay for each.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kstate_kafka::{
    BatchRestored, CancelToken, ChangelogConfig, ChangelogError, OpenHooks, RestoreClients,
    RestoreListener, RestoreReport, RestoreStart, RestoredStore,
};
use kstate_rocksdb::RocksDbOptions;

use crate::error::{TaskError, panic_message};
use crate::ids::TaskId;
use crate::status::Progress;

/// Restore the stores of one task.
pub(crate) struct Job {
    /// Tells this job's result from an earlier, cancelled job of the same task.
    pub(crate) id: u64,
    pub(crate) task: TaskId,
    /// Each store's directory and changelog, in declaration order.
    pub(crate) stores: Vec<(PathBuf, ChangelogConfig)>,
    pub(crate) cancel: CancelToken,
    pub(crate) progress: Arc<Progress>,
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

/// How long a restore waits for a store directory another task of this process still holds
/// (a task moved between two workers of the process, or revoked while restoring, is closing).
const DIRECTORY_WAIT: Duration = Duration::from_secs(60);

/// Whether an open failed because the store's directory is open (RocksDB's LOCK is held):
/// another task of this process is still closing it.
fn directory_held(error: &ChangelogError) -> bool {
    matches!(
        error,
        ChangelogError::Open(kstate_rocksdb::OpenError::AlreadyOpen { .. })
    )
}

/// Restores one store; waits while RocksDB's lock on its directory is still held here.
#[allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is (see its lib.rs)
fn restore_one(
    path: &Path,
    options: &RocksDbOptions,
    config: ChangelogConfig,
    hooks: &OpenHooks,
    clients: &mut Option<RestoreClients>,
) -> Result<RestoredStore, ChangelogError> {
    let clients = match clients {
        Some(c) if c.suits(&config) => c,
        _ => clients.insert(RestoreClients::new(&config)?),
    };
    let deadline = Instant::now() + DIRECTORY_WAIT;
    loop {
        match RestoredStore::restore_with(path, options, config.clone(), hooks, clients) {
            Err(e) if directory_held(&e) && Instant::now() < deadline => {
                if hooks.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

/// Runs jobs until the job channel closes. Several restorer threads of one worker share its
/// channel: each takes the next job when it is free.
pub(crate) fn run(
    jobs: Arc<Mutex<Receiver<Job>>>,
    done: Sender<Done>,
    options: RocksDbOptions,
    listener: Option<Arc<dyn RestoreListener>>,
) {
    let mut clients = None;
    loop {
        // The lock is held only while waiting for a job, never while restoring.
        let next = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = next else {
            return;
        };
        if job.cancel.is_cancelled() {
            continue;
        }
        let (id, task) = (job.id, job.task);
        let restored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            restore_job(job, &options, listener.as_ref(), &mut clients)
        }));
        let result = restored.unwrap_or_else(|payload| {
            // The clients may be in any state: the next job makes new ones.
            clients = None;
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
        if done.send(Done { id, task, result }).is_err() {
            return;
        }
    }
}

/// Restores every store of one task, in declaration order.
fn restore_job(
    job: Job,
    options: &RocksDbOptions,
    listener: Option<&Arc<dyn RestoreListener>>,
    clients: &mut Option<RestoreClients>,
) -> Result<Vec<RestoredStore>, TaskError> {
    let span = tracing::info_span!("restore_task", partition = job.task.partition);
    let _entered = span.enter();
    let hooks = OpenHooks {
        listener: Some(match listener {
            Some(l) => Arc::new(Both(job.progress.clone(), l.clone())),
            None => job.progress.clone(),
        }),
        record_check: None,
        cancel: Some(job.cancel.clone()),
    };
    let mut restored = Vec::with_capacity(job.stores.len());
    let mut result = Ok(());
    for (path, config) in job.stores {
        if let Err(e) = std::fs::create_dir_all(path.parent().unwrap_or(&path)) {
            result = Err(ChangelogError::Store(kstate_core::Error::backend(
                path.display().to_string(),
                "create the task's state directory",
                e,
            )));
            break;
        }
        match restore_one(&path, options, config, &hooks, clients) {
            Ok(store) => restored.push(store),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    job.progress.finish();
    result
        .map(|()| restored)
        .map_err(|source| TaskError::restore(job.task, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kstate_rocksdb::RocksDbStore;

    /// Only RocksDB's own "already open" is waited out: an error that merely mentions a lock
    /// (an application id `CLOCK`, a path through `/srv/BLOCKS`) is reported at once, not
    /// retried for a minute.
    #[test]
    fn only_a_held_directory_is_waited_for_not_an_error_that_mentions_a_lock() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("CLOCK");
        let _held = RocksDbStore::open(&path, &RocksDbOptions::default()).expect("opens");
        let Err(again) = RocksDbStore::open(&path, &RocksDbOptions::default()) else {
            panic!("the directory is held, a second open must fail");
        };
        assert!(directory_held(&ChangelogError::Open(again)));
        let mentions_lock = ChangelogError::InvalidConfig {
            topic: "CLOCK-counts-changelog".into(),
            message: "LOCK appears in this text".into(),
        };
        assert!(!directory_held(&mentions_lock));
    }
}
