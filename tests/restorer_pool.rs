//! The restorer threads are one pool for the whole process, shared by its workers: a process of
//! three workers with `restore_threads(2)` runs two restorer threads, not two per worker, and
//! every task's restore runs on one of them. They end with the application.
//!
//! Before the pool each worker kept `restore_threads` restorers of its own (six here, each with
//! three Kafka clients: most of a process's threads, BENCHMARKS.md "Where the threads go").
//! This test runs alone in its binary, because it counts the process's threads by name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use kstate_bench::topology::count_by_key as count;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate::kstate_kafka::{RestoreListener, RestoreReport};
use kstate::kstate_task::{App, TaskState};
use kstate_test_broker::unique_topic;

const PARTITIONS: i32 = 6;
const WAIT: Duration = Duration::from_secs(120);

/// The names of the threads each store's restore ended on.
#[derive(Default)]
struct Threads(Mutex<Vec<String>>);

impl RestoreListener for Threads {
    fn on_restore_end(&self, _report: &RestoreReport) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.0.lock().unwrap().push(name);
    }
}

/// This process's threads whose name starts with `prefix`.
fn threads_named(prefix: &str) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        let comm = std::fs::read_to_string(entry?.path().join("comm")).unwrap_or_default();
        if comm.starts_with(prefix) {
            names.push(comm.trim().to_string());
        }
    }
    Ok(names)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_restorers_are_one_pool_for_every_worker() -> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let input = unique_topic("in");
    let output = unique_topic("out");
    common::create_topic(&servers, &input, PARTITIONS, "delete").await?;
    common::create_topic(&servers, &output, PARTITIONS, "delete").await?;
    let state = tempfile::tempdir()?;
    let restores = Arc::new(Threads::default());

    let mut builder = App::builder(unique_topic("app"), servers.clone());
    builder
        .input(input.clone())
        .state_dir(state.path())
        .threads(3)
        .restore_threads(2)
        .restore_listener(restores.clone());
    let (app, _) = count::build(&mut builder, &output, false)?;
    let running = app.start()?;
    let deadline = Instant::now() + WAIT;
    loop {
        let tasks = running.tasks();
        if tasks.len() == PARTITIONS as usize && tasks.iter().all(|t| t.state == TaskState::Running)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every task running in {WAIT:?}: {tasks:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Linux keeps 15 bytes of a thread's name: "kstate-restorer-1" reads "kstate-restorer".
    let restorers = threads_named("kstate-restor")?;
    assert_eq!(
        restorers.len(),
        2,
        "three workers with restore_threads(2) run two restorer threads, found {restorers:?}"
    );
    let used = restores.0.lock().unwrap().clone();
    // A task restores again where a rebalance moves it while the workers join.
    assert!(
        used.len() >= PARTITIONS as usize,
        "every task's store restored: {used:?}"
    );
    let pool: BTreeSet<String> = ["kstate-restorer-0", "kstate-restorer-1"]
        .map(String::from)
        .into();
    let used: BTreeSet<String> = used.into_iter().collect();
    assert!(
        used.is_subset(&pool),
        "every restore ran on the pool's threads {pool:?}, they ran on {used:?}"
    );

    running.shutdown();
    running.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut left = threads_named("kstate-worker")?;
    left.extend(threads_named("kstate-restor")?);
    assert!(
        left.is_empty(),
        "no worker or restorer thread outlives wait(): {left:?}"
    );
    Ok(())
}
