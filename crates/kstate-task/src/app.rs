//! [`App`] and [`Running`]: start an application, watch its tasks, query its stores, stop it.
//!
//! Everything here returns at once or is `async`, so a tokio program can hold a [`Running`]
//! (the workers are plain threads: processing is synchronous).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kstate_core::sync::lock;
use kstate_rocksdb::StateDir;

use crate::config::AppConfig;
use crate::error::{TaskError, panic_message};
use crate::processor::ProcessorFactory;
use crate::readiness::Readiness;
use crate::shared::{AppShared, AppState};
use crate::standby::StandbyStatus;
use crate::status::TaskStatus;

/// An application, ready to start.
pub struct App {
    config: AppConfig,
    factory: ProcessorFactory,
}

impl App {
    pub(crate) fn new(config: AppConfig, factory: ProcessorFactory) -> Self {
        App { config, factory }
    }

    /// Checks the inputs (they exist and are co-partitioned) and starts the workers.
    pub fn start(self) -> Result<Running, TaskError> {
        let partitions = crate::input_check::input_partitions(&self.config)?;
        // The RocksDB holds files open: make room for as many as the hard limit allows.
        crate::open_files::raise_for(crate::open_files::needed(
            partitions,
            self.config.stores.len(),
            self.config.rocksdb.open_files_cap(),
        ));
        let names: Vec<&str> = self.config.stores.iter().map(|s| s.name.as_str()).collect();
        let rocksdb = StateDir::open(self.config.state_root(), &names, &self.config.rocksdb)
            .map_err(|source| TaskError::StateDb {
                source: Box::new(source),
            })?;
        let shared = Arc::new(AppShared::new(
            self.config,
            self.factory,
            partitions,
            rocksdb.clone(),
        ));
        let state = shared.state.subscribe();
        let mut handles = Vec::new();
        if let Err(e) = start_threads(&shared, &rocksdb, &mut handles) {
            // Nothing may run on without a handle to stop it: the workers already started
            // would join the group and hold the RocksDB's lock, and a retry would fail on it.
            shared.stop();
            for handle in handles {
                let _ = handle.join();
            }
            shared.close_state_db();
            return Err(e);
        }
        tracing::info!(
            application_id = %shared.config.application_id,
            threads = shared.config.threads,
            partitions,
            protocol = shared.config.group_protocol.name(),
            "application started"
        );
        Ok(Running {
            shared,
            threads: Mutex::new(handles),
            state,
        })
    }
}

fn thread_error(name: String, e: std::io::Error) -> TaskError {
    TaskError::Thread {
        name,
        message: e.to_string(),
    }
}

/// Starts the restorers, the liveness thread, the workers and the standby manager, pushing
/// each handle as it starts: on an error the caller stops and joins those in `handles`.
fn start_threads(
    shared: &Arc<AppShared>,
    rocksdb: &StateDir,
    handles: &mut Vec<JoinHandle<()>>,
) -> Result<(), TaskError> {
    // One pool of restorer threads for every worker; it ends when every worker's job
    // sender is gone.
    let (jobs, job_rx) = std::sync::mpsc::channel();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let cluster = crate::restorer::SharedCluster::default();
    for r in 0..shared.config.restore_threads() {
        let options = shared.config.rocksdb.clone();
        let rocksdb = rocksdb.clone();
        let listener = shared.config.restore_listener.clone();
        let (job_rx, cluster) = (job_rx.clone(), cluster.clone());
        let name = format!("kstate-restorer-{r}");
        handles.push(spawn_thread(name, move || {
            crate::restorer::run(job_rx, cluster, rocksdb, options, listener)
        })?);
    }
    if let Some(timeout) = shared.config.failure_detection {
        // Before the workers join, so that its beacons announce their members soon after they
        // have joined.
        let app = shared.clone();
        handles.push(spawn_thread("kstate-liveness".into(), move || {
            crate::liveness::run(app, timeout)
        })?);
    }
    for index in 0..shared.config.threads {
        let app = shared.clone();
        let jobs = jobs.clone();
        let worker = spawn_thread(format!("kstate-worker-{index}"), move || {
            // A processor's panic is caught where it is called; this is for the
            // runtime's own.
            let run = std::panic::AssertUnwindSafe(|| crate::worker::run(index, app.clone(), jobs));
            let result = std::panic::catch_unwind(run).unwrap_or_else(|payload| {
                Err(TaskError::Thread {
                    name: format!("kstate-worker-{index}"),
                    message: format!("panicked: {}", panic_message(&*payload)),
                })
            });
            if let Err(e) = result {
                // One failed worker stops the application: a restart restores.
                app.failed(Arc::new(e));
            }
        })?;
        handles.push(worker);
    }
    drop(jobs);
    if let Some(standbys) = shared.standbys.clone() {
        let app = shared.clone();
        handles.push(spawn_thread("kstate-standbys".into(), move || {
            crate::standby::run(standbys, app, cluster)
        })?);
    }
    Ok(())
}

/// Spawns the thread `name`.
fn spawn_thread(
    name: String,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, TaskError> {
    #[cfg(test)]
    if tests::spawn_fails(&name) {
        return Err(thread_error(
            name,
            std::io::Error::new(std::io::ErrorKind::WouldBlock, "a test failed this spawn"),
        ));
    }
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(body)
        .map_err(|e| thread_error(name, e))
}

/// A running application.
pub struct Running {
    pub(crate) shared: Arc<AppShared>,
    /// The workers' and the restorers' threads.
    threads: Mutex<Vec<JoinHandle<()>>>,
    state: tokio::sync::watch::Receiver<AppState>,
}

impl Running {
    /// Asks every worker to commit, close its stores and leave the group; returns at once.
    pub fn shutdown(&self) {
        if self.shared.stop() {
            self.shared.state.send_if_modified(|s| {
                if *s == AppState::Running {
                    *s = AppState::Stopping;
                    true
                } else {
                    false
                }
            });
        }
    }

    /// Where the application is now.
    pub fn state(&self) -> AppState {
        self.state.borrow().clone()
    }

    /// Waits until the application stops or fails (async: for tokio programs).
    pub async fn stopped(&self) -> AppState {
        let mut rx = self.state.clone();
        loop {
            let state = rx.borrow_and_update().clone();
            if matches!(state, AppState::Stopped | AppState::Failed(_)) {
                return state;
            }
            if rx.changed().await.is_err() {
                return self.state();
            }
        }
    }

    /// Blocks until every worker ended; returns the first failure (the one
    /// [`AppState::Failed`] holds). Call after [`shutdown`](Self::shutdown), or to run until a
    /// failure. When it returns, the application's RocksDB is closed: another instance may open
    /// the state directory, and the process may exit, while this handle is still held.
    pub fn wait(&self) -> Result<(), Arc<TaskError>> {
        let handles = std::mem::take(&mut *lock(&self.threads));
        for handle in handles {
            // A worker reports its failure into the state before it ends; a panic outside
            // the worker's own code cannot happen (the thread's body catches it). A restorer
            // catches its jobs' panics, and ends after its job once every worker has.
            if handle.join().is_err() {
                tracing::error!("a restorer thread panicked");
            }
        }
        self.shared.close_state_db();
        let mut failure = None;
        self.shared.state.send_if_modified(|s| match s {
            AppState::Failed(e) => {
                failure = Some(e.clone());
                false
            }
            _ => {
                *s = AppState::Stopped;
                true
            }
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every task of this process: state, restore progress, records processed.
    pub fn tasks(&self) -> Vec<TaskStatus> {
        self.shared.registry.statuses()
    }

    /// Whether this process is ready to be counted on (every worker joined, no task restoring):
    /// what a readiness probe should serve.
    pub fn readiness(&self) -> Readiness {
        match self.state() {
            AppState::Failed(e) => Readiness::Failed(e),
            AppState::Stopping | AppState::Stopped => Readiness::Stopping,
            AppState::Running => {
                let registry = &self.shared.registry;
                if registry.workers_joined() < self.shared.config.threads {
                    return Readiness::Joining;
                }
                match registry.restoring_of_all() {
                    (0, tasks) => Readiness::Ready { tasks },
                    (restoring, tasks) => Readiness::Restoring { restoring, tasks },
                }
            }
        }
    }

    /// This process's standby tasks ([`AppBuilder::standby_replicas`](crate::AppBuilder::standby_replicas)):
    /// the tasks it follows, how far, and how far behind.
    pub fn standbys(&self) -> Vec<StandbyStatus> {
        self.shared
            .standbys
            .as_ref()
            .map(|s| s.statuses())
            .unwrap_or_default()
    }

    /// The input topics' partition count.
    pub fn partitions(&self) -> i32 {
        self.shared.partitions
    }

    /// The task that owns records with this key, for inputs partitioned by Kafka's default
    /// partitioner ([`partition_for`](crate::partition_for)).
    pub fn partition_for(&self, key: &[u8]) -> i32 {
        crate::partitioner::partition_for(key, self.shared.partitions)
    }
}

impl Drop for Running {
    /// Stops the workers and waits for them: a dropped handle never leaves threads behind.
    fn drop(&mut self) {
        self.shutdown();
        if let Err(e) = self.wait() {
            tracing::warn!(error = %e, "the application ended with an error");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::time::{Duration, Instant};

    use kstate_kafka::{ClientProperties, create_topic_if_missing};

    use crate::{Context, Processor, Record, TaskId};

    thread_local! {
        /// The thread name whose spawn fails, on this (the test's) thread.
        static FAILING_SPAWN: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    pub(super) fn spawn_fails(name: &str) -> bool {
        FAILING_SPAWN.with(|f| f.borrow().as_deref() == Some(name))
    }

    struct Nothing;

    impl Processor for Nothing {
        fn process(
            &mut self,
            _: &mut Context<'_>,
            _: &Record<'_>,
        ) -> Result<(), kstate_core::BoxError> {
            Ok(())
        }
    }

    fn live_threads(prefix: &str) -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .map(|comm| comm.trim().to_string())
                    .filter(|comm| comm.starts_with(prefix))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_start_that_fails_partway_leaves_no_thread_running() {
        let servers = kstate_test_broker::bootstrap_servers().expect("a broker");
        let input = kstate_test_broker::unique_topic("start-fails");
        let client = ClientProperties::new(servers.clone());
        create_topic_if_missing(&client, &input, 2, 1, &[], Duration::from_secs(30))
            .expect("input topic");
        let dir = tempfile::tempdir().expect("state dir");
        let mut builder = crate::App::builder(format!("{input}-app"), servers);
        builder.input(&input).threads(2).state_dir(dir.path());
        let app = builder
            .build(|_: TaskId| Box::new(Nothing) as Box<dyn Processor>)
            .expect("builds");
        FAILING_SPAWN.with(|f| *f.borrow_mut() = Some("kstate-worker-1".into()));
        let started = app.start();
        FAILING_SPAWN.with(|f| *f.borrow_mut() = None);
        assert!(started.is_err(), "start succeeded with a failed spawn");
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut left = live_threads("kstate-");
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = live_threads("kstate-");
        }
        assert!(left.is_empty(), "threads left running: {left:?}");
    }
}
