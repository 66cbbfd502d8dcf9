//! What the workers of one application share: its configuration, the processor factory, the
//! task registry, and the application's state, which the workers report into.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kstate_core::sync::lock;

use kstate_rocksdb::StateDir;

use crate::config::AppConfig;
use crate::error::TaskError;
use crate::processor::ProcessorFactory;
use crate::standby::Standbys;
use crate::status::Registry;

/// Where the application is.
#[derive(Debug, Clone)]
pub enum AppState {
    /// Workers are running (their tasks may be restoring: see
    /// [`Running::tasks`](crate::Running::tasks)).
    Running,
    /// Shutting down: final commits, stores closing, leaving the group.
    Stopping,
    /// Every worker ended cleanly.
    Stopped,
    /// A worker failed; the others were stopped. The first failure.
    Failed(Arc<TaskError>),
}

impl PartialEq for AppState {
    /// Two failed states are equal when they hold the same failure.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (AppState::Running, AppState::Running)
            | (AppState::Stopping, AppState::Stopping)
            | (AppState::Stopped, AppState::Stopped) => true,
            (AppState::Failed(a), AppState::Failed(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for AppState {}

/// What every worker shares.
pub(crate) struct AppShared {
    pub(crate) config: AppConfig,
    pub(crate) factory: ProcessorFactory,
    /// The input topics' (common) partition count.
    pub(crate) partitions: i32,
    pub(crate) registry: Registry,
    /// The standby tasks, when [`AppConfig::standby_replicas`] is on.
    pub(crate) standbys: Option<Arc<Standbys>>,
    /// The RocksDB every task keeps its stores in; `None` once the application has ended
    /// ([`close_state_db`](Self::close_state_db)).
    rocksdb: Mutex<Option<StateDir>>,
    stop: AtomicBool,
    pub(crate) state: tokio::sync::watch::Sender<AppState>,
}

impl AppShared {
    pub(crate) fn new(
        config: AppConfig,
        factory: ProcessorFactory,
        partitions: i32,
        rocksdb: StateDir,
    ) -> Self {
        AppShared {
            standbys: (config.standby_replicas > 0).then(Arc::default),
            config,
            factory,
            partitions,
            registry: Registry::default(),
            rocksdb: Mutex::new(Some(rocksdb)),
            stop: AtomicBool::new(false),
            state: tokio::sync::watch::channel(AppState::Running).0,
        }
    }

    /// The RocksDB every task keeps its stores in, or `None` once the application has ended.
    pub(crate) fn state_db(&self) -> Option<StateDir> {
        lock(&self.rocksdb).clone()
    }

    /// Once every worker and restorer has ended: lets the RocksDB go, so that it closes (and
    /// flushes what its memtables hold) in the thread that waited for the application, before
    /// `wait` returns. Left to the last reference to the application, it could close in a
    /// thread the process does not wait for, while the process exits and tears down what
    /// RocksDB's background threads use ("pthread lock: Invalid argument", SIGABRT).
    pub(crate) fn close_state_db(&self) {
        let db = lock(&self.rocksdb).take();
        drop(db);
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Asks every worker to stop; true the first time.
    pub(crate) fn stop(&self) -> bool {
        !self.stop.swap(true, Ordering::AcqRel)
    }

    /// A worker failed: the application fails with the first failure, and every worker stops.
    pub(crate) fn failed(&self, error: Arc<TaskError>) {
        self.state.send_if_modified(|s| {
            if matches!(s, AppState::Failed(_)) {
                false
            } else {
                *s = AppState::Failed(error);
                true
            }
        });
        self.stop();
    }
}
