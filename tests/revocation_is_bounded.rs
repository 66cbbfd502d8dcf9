//! At-least-once: a revocation (here the one `shutdown` makes) is bounded by the revocation
//! timeout, even when the broker stands still.
//!
//! With `revocation_timeout(2 s)`, a private broker is paused (SIGSTOP) while the application
//! holds work it has not committed, then the application is shut down. Guaranteed: `wait()`
//! returns within a generous 30 s, committing what it can and dropping the stores without a
//! commit otherwise (their input is then replayed by the next owner). `wait()` runs on a thread
//! of its own and the test waits on a channel, so that a hang is reported, not waited out. The
//! work held at the pause:
//! - processed records whose outputs and changelog records the broker acknowledged, with their
//!   input offsets not committed yet (the commit interval is an hour);
//! - store writes the broker has not acknowledged: the processor writes its store only and is
//!   slow, so it goes on with records fetched before the pause, whose changelog records cannot
//!   be delivered;
//! - standbys: two processes follow each other's tasks (eight tasks of three stores, twelve
//!   followed changelogs each). The standby manager's lag probe once cost up to 5 s per
//!   changelog against a broker that does not answer, and its followers are joined: shutdown
//!   must not wait on either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use kstate_bench::topology::count_by_key as count;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::failures::wait_within;
use common::streams::{produce, read_topic, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, AppBuilder, Context, GroupProtocol, Processor, Record, Running, StoreHandle, StoreOptions,
};
use kstate_test_broker::{PrivateBroker, unique_topic};

const REVOCATION: Duration = Duration::from_secs(2);
/// How long `wait()` may take after `shutdown()`: generous.
const LIMIT: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(60);

fn builder(servers: &str, app_id: &str, input: &str, dir: &std::path::Path) -> AppBuilder {
    let mut builder = App::builder(app_id, servers);
    builder
        .input(input)
        .state_dir(dir)
        // No periodic commit during the test: what the application holds stays uncommitted.
        .commit_interval(Duration::from_secs(3600))
        .revocation_timeout(REVOCATION);
    builder
}

fn records(n: usize) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| (0, format!("key-{}", i % 10).into_bytes(), b"v".to_vec()))
        .collect()
}

/// Shuts `running` down and checks that `wait()` returns within `LIMIT`.
fn assert_shutdown_is_bounded(running: &Arc<Running>) {
    running.shutdown();
    let outcome = wait_within(running, LIMIT);
    assert!(
        outcome.is_some(),
        "wait() had not returned {LIMIT:?} after shutdown() with the broker paused \
         (revocation timeout {REVOCATION:?})"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_with_uncommitted_offsets_ends_while_the_broker_stands_still() -> anyhow::Result<()>
{
    let broker = PrivateBroker::start()?;
    let servers = broker.bootstrap_servers().to_string();
    let (app_id, input, output) = (
        unique_topic("bounded"),
        unique_topic("bounded-in"),
        unique_topic("bounded-out"),
    );
    common::create_topic(servers.as_str(), &input, 1, "delete").await?;
    common::create_topic(servers.as_str(), &output, 1, "delete").await?;
    let dir = tempfile::tempdir()?;
    let mut builder = builder(&servers, &app_id, &input, dir.path());
    let (app, _) = count::build(&mut builder, &output, false)?;
    let running = Arc::new(app.start()?);
    produce(&servers, &input, &records(100))?;
    wait_for("the outputs of the records", WAIT, || {
        Ok(read_topic(&servers, &output, 1)?.len() >= 100)
    })?;
    anyhow::ensure!(
        common::failures::committed_offset(&servers, &app_id, &input)?.is_none(),
        "the input offsets were committed before the pause"
    );
    broker.pause()?;
    assert_shutdown_is_bounded(&running);
    Ok(())
}

/// Counts per key in its store and sends nothing; slow, so that it is still working through
/// fetched records when the broker stops.
struct SlowTally {
    counts: StoreHandle<Vec<u8>, u64>,
    processed: Arc<AtomicU64>,
}

impl Processor for SlowTally {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.counts);
        let count = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &count)?;
        self.processed.fetch_add(1, Ordering::AcqRel);
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_with_unacknowledged_store_writes_ends_while_the_broker_stands_still()
-> anyhow::Result<()> {
    let broker = PrivateBroker::start()?;
    let servers = broker.bootstrap_servers().to_string();
    let (app_id, input) = (unique_topic("bounded"), unique_topic("bounded-in"));
    common::create_topic(servers.as_str(), &input, 1, "delete").await?;
    let dir = tempfile::tempdir()?;
    let mut builder = builder(&servers, &app_id, &input, dir.path());
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let processed = Arc::new(AtomicU64::new(0));
    let seen = processed.clone();
    let running = Arc::new(
        builder
            .build(move |_| {
                Box::new(SlowTally {
                    counts: counts.clone(),
                    processed: seen.clone(),
                })
            })?
            .start()?,
    );
    // 5,000 records take the processor about 10 s; they are fetched long before that.
    produce(&servers, &input, &records(5_000))?;
    wait_for("the first records processed", WAIT, || {
        Ok(processed.load(Ordering::Acquire) >= 200)
    })?;
    broker.pause()?;
    let at_pause = processed.load(Ordering::Acquire);
    wait_for(
        "records processed while the broker stands still",
        WAIT,
        || Ok(processed.load(Ordering::Acquire) >= at_pause + 100),
    )?;
    assert_shutdown_is_bounded(&running);
    Ok(())
}

/// Takes records and does nothing with them.
struct Idle;

impl Processor for Idle {
    fn process(&mut self, _: &mut Context<'_>, _: &Record<'_>) -> Result<(), BoxError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_with_standbys_ends_while_the_broker_stands_still() -> anyhow::Result<()> {
    const PARTITIONS: i32 = 8;
    let broker = PrivateBroker::start()?;
    let servers = broker.bootstrap_servers().to_string();
    let (app_id, input) = (unique_topic("bounded"), unique_topic("bounded-in"));
    common::create_topic(servers.as_str(), &input, PARTITIONS, "delete").await?;
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let mut processes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let mut builder = builder(&servers, &app_id, &input, dir.path());
        builder
            .group_protocol(GroupProtocol::Eager)
            .instance_id(format!("p{i}"))
            .static_membership(true)
            .standby_replicas(1)
            .consumer_property("session.timeout.ms", "6000")
            .consumer_property("heartbeat.interval.ms", "1000");
        for store in ["a", "b", "c"] {
            builder.store::<Vec<u8>, u64>(store, StoreOptions::default());
        }
        processes.push(Arc::new(builder.build(|_| Box::new(Idle))?.start()?));
    }
    let half = (PARTITIONS / 2) as usize;
    wait_for("each process following the other's tasks", WAIT, || {
        Ok(processes.iter().all(|p| {
            let standbys = p.standbys();
            standbys.len() == half && standbys.iter().all(|s| s.lag.is_some())
        }))
    })?;
    broker.pause()?;
    for p in &processes {
        p.shutdown();
    }
    for (i, p) in processes.iter().enumerate() {
        assert!(
            wait_within(p, LIMIT).is_some(),
            "process {i}: wait() had not returned {LIMIT:?} after shutdown() with the broker \
             paused and {half} standby tasks of three stores"
        );
    }
    Ok(())
}
