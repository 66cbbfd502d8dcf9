//! What the workers of one application share: its configuration, the processor factory, the
//! task registry, and the application's state, which the workers report into.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kstate_rocksdb::SharedDb;

use crate::config::{AppConfig, ProcessorFactory};
use crate::error::TaskError;
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
    /// The RocksDB every task keeps its stores in.
    pub(crate) rocksdb: SharedDb,
    stop: AtomicBool,
    pub(crate) state: tokio::sync::watch::Sender<AppState>,
}

impl AppShared {
    pub(crate) fn new(
        config: AppConfig,
        factory: ProcessorFactory,
        partitions: i32,
        rocksdb: SharedDb,
    ) -> Self {
        AppShared {
            config,
            factory,
            partitions,
            registry: Registry::default(),
            rocksdb,
            stop: AtomicBool::new(false),
            state: tokio::sync::watch::channel(AppState::Running).0,
        }
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
