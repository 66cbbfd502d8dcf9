//! A stalled broker:
//! - readers never wait on it: while it keeps writers blocked on a full producer queue, `get`
//!   and `scan` still answer from the overlay and RocksDB;
//! - a commit bounded by its caller's timeout gives up without poisoning the store;
//! - an application started while its broker is paused starts once it answers, within the
//!   task timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kstate::kstate_core::{Error, KeyValueStore};
use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate::kstate_rocksdb::{RocksDbOptions, RocksDbStore};
use kstate::kstate_task::{App, TaskState};
use kstate_bench::topology::count_by_key as count;
use kstate_test_broker::{PrivateBroker, unique_topic};

#[test]
fn a_get_answers_while_writers_wait_on_a_stalled_broker() -> Result<()> {
    let broker = PrivateBroker::start()?;
    let dir = tempfile::tempdir()?;
    let config = ChangelogConfig::new(broker.bootstrap_servers(), unique_topic("stalled"), 0)
        .partitions(1)
        .durability(Durability::Async)
        .delivery_timeout(Duration::from_secs(30))
        // A small producer queue, so that writers block soon after the broker stalls.
        .client_property("queue.buffering.max.messages", "1000");
    let store = Arc::new(LoggedStore::open(
        dir.path(),
        &RocksDbOptions::default(),
        config,
    )?);
    store.put(b"committed", b"1")?;
    store.commit()?;
    store.put(b"in-overlay", b"2")?;

    broker.pause()?;
    let written = Arc::new(AtomicU64::new(0));
    let writer_done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, written, done) = (store.clone(), written.clone(), writer_done.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let outcome = loop {
                if let Err(e) = store.put(format!("w-{n}").as_bytes(), b"v") {
                    break Err(e);
                }
                n += 1;
                written.store(n, Ordering::Release);
                if n == 200_000 {
                    break Ok(());
                }
            };
            done.store(true, Ordering::Release);
            outcome
        })
    };
    // Wait until the writer is stuck: no progress for half a second.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = u64::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = written.load(Ordering::Acquire);
        if now == last {
            break;
        }
        last = now;
        ensure!(
            Instant::now() < deadline,
            "the writer never blocked ({now} puts)"
        );
    }
    ensure!(
        !writer_done.load(Ordering::Acquire),
        "the writer stopped instead of blocking"
    );

    let started = Instant::now();
    let committed = store.get(b"committed")?;
    let overlay = store.get(b"in-overlay")?;
    let scanned = store.prefix_scan(b"in-")?.count();
    let waited = started.elapsed();
    let writer_still_blocked =
        !writer_done.load(Ordering::Acquire) && written.load(Ordering::Acquire) == last;
    println!("reads while the writer was blocked took {waited:?}");
    assert_eq!(committed.as_deref(), Some(&b"1"[..]));
    assert_eq!(overlay.as_deref(), Some(&b"2"[..]));
    assert_eq!(scanned, 1);
    assert!(
        writer_still_blocked,
        "the reads returned only after the writer was released ({waited:?})"
    );

    // Sent, and not acknowledged while the broker stands still.
    let waiting = store.unacknowledged();
    assert!(
        waiting > 0,
        "sends to a stalled broker count as unacknowledged"
    );

    broker.resume()?;
    let outcome = writer.join().unwrap();
    ensure!(
        outcome.is_ok(),
        "the writer failed after the broker resumed: {outcome:?}"
    );
    store.commit()?;
    assert_eq!(
        store.unacknowledged(),
        0,
        "all acknowledged after the commit"
    );
    store.close()?;
    Ok(())
}

/// A commit bounded by its caller's timeout gives up with a typed timeout when the broker does
/// not acknowledge in time, and does not poison the store: its writes stay readable, RocksDB
/// still holds the previous commit, and a later commit makes them durable once the broker
/// answers again.
#[test]
fn a_bounded_commit_times_out_without_poisoning_the_store() -> Result<()> {
    let broker = PrivateBroker::start()?;
    let dir = tempfile::tempdir()?;
    let config = ChangelogConfig::new(broker.bootstrap_servers(), unique_topic("bounded"), 0)
        .partitions(1)
        .durability(Durability::Async)
        .delivery_timeout(Duration::from_secs(60));
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config)?;
    store.put(b"committed", b"1")?;
    store.commit()?;
    let before = store.committed_position()?.map(|p| p.offset);

    broker.pause()?;
    store.put(b"pending", b"2")?;
    let outcome = store.commit_within(Duration::from_secs(2));
    ensure!(
        matches!(outcome, Err(Error::Timeout { .. })),
        "a commit against a stalled broker returned {outcome:?}"
    );
    ensure!(
        store.get(b"pending")?.as_deref() == Some(&b"2"[..]),
        "the write is no longer readable after the timeout"
    );
    ensure!(
        store.committed_position()?.map(|p| p.offset) == before,
        "the timed-out commit moved the stored position"
    );
    store.put(b"later", b"3")?;

    broker.resume()?;
    store.commit()?;
    ensure!(
        store.committed_position()?.map(|p| p.offset) == before.map(|o| o + 2),
        "the later commit stored {:?}",
        store.committed_position()?
    );
    store.close()?;
    drop(store);
    let raw = RocksDbStore::open(dir.path(), &RocksDbOptions::default())?;
    for (key, value) in [
        (&b"committed"[..], &b"1"[..]),
        (b"pending", b"2"),
        (b"later", b"3"),
    ] {
        ensure!(
            raw.get(key)?.as_deref() == Some(value),
            "RocksDB holds {:?} for {key:?}",
            raw.get(key)?
        );
    }
    Ok(())
}

/// How long the broker stays paused while the application starts: longer than one metadata
/// client is asked (30 s).
const START_PAUSE: Duration = Duration::from_secs(35);

/// A node paused, or in a rolling restart, when an application starts (seen on the three-node
/// cluster: a member restarted after its kill): the start asks for its inputs' metadata again
/// with new clients until the task timeout, and starts once the cluster answers. It used to
/// give up after one client's 30 s ("fetch input metadata ... OperationTimedOut").
#[test]
fn an_application_started_while_its_broker_is_paused_starts_once_it_answers() -> Result<()> {
    let broker = PrivateBroker::start()?;
    let client = kstate::ClientProperties::from(broker.bootstrap_servers());
    let input = unique_topic("paused-start-in");
    let output = unique_topic("paused-start-out");
    for topic in [&input, &output] {
        kstate::create_topic_if_missing(&client, topic, 2, 1, &[], Duration::from_secs(30))?;
    }
    let state = tempfile::tempdir()?;
    let mut builder = App::builder(unique_topic("paused-start"), client);
    builder
        .input(input)
        .state_dir(state.path())
        .task_timeout(Duration::from_secs(120));
    let (app, _counts) = count::build(&mut builder, &output, false)?;

    broker.pause()?;
    let paused = Instant::now();
    let broker = std::thread::spawn(move || {
        std::thread::sleep(START_PAUSE);
        broker.resume().map(|()| broker)
    });
    let started = app.start();
    let broker = broker.join().unwrap()?;
    let running = started
        .map_err(|e| anyhow::anyhow!("the start failed after {:?}: {e}", paused.elapsed()))?;
    ensure!(
        paused.elapsed() >= START_PAUSE,
        "started before the broker resumed: the test paused nothing"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(running.tasks().len() == 2
        && running
            .tasks()
            .iter()
            .all(|t| t.state == TaskState::Running))
    {
        ensure!(
            Instant::now() < deadline,
            "tasks did not run: {:?}",
            running.tasks()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    running.shutdown();
    ensure!(running.wait().is_ok(), "{:?}", running.wait());
    drop(broker);
    Ok(())
}
