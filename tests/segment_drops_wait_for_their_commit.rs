//! A dropped window segment, and a stream time moved by `observe` alone, reach RocksDB only
//! with the commit that made them safe, against a real broker:
//! - under a transaction, a segment dropped by a stream time that then aborts is still there
//!   after the abort, with the committed values of its windows;
//! - a stream time moved by `observe` alone (a local key, no changelog record) commits with its
//!   transaction and survives the next abort;
//! - a drop removes the writes taken before it in the same commit, and the writes after it land;
//! - without a transaction, a drop waits for the store's commit: a store dropped before it
//!   (as a crash would) keeps the range, with the stream time it is live at.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use kstate::kstate_core::{KeyRange, KeyValueStore, WindowChangelog, WindowOptions, WindowStore};
use kstate::kstate_kafka::{
    ChangelogConfig, Durability, LoggedStore, OpenHooks, RestoredStore, SharedProducer,
};
use kstate::kstate_rocksdb::RocksDbOptions;

const TIMEOUT: Duration = Duration::from_secs(30);
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);
const SECOND: i64 = 1_000;
/// Far enough ahead that every segment of the first windows expires (segments are a minute
/// wide: Kafka Streams' least segment interval).
const FAR: i64 = 600 * SECOND;

/// One-second windows kept ten seconds, in segments of a minute.
fn windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_secs(1))
        .grace(Duration::ZERO)
        .retention(Duration::from_secs(10))
}

/// Two-second windows every second, kept ten seconds: each time is in two windows.
fn hopping_windows() -> WindowOptions {
    WindowOptions::hopping(Duration::from_secs(2), Duration::from_secs(1))
        .grace(Duration::ZERO)
        .retention(Duration::from_secs(10))
}

fn config(topic: &str) -> Result<ChangelogConfig> {
    config_of(topic, &windows())
}

fn config_of(topic: &str, options: &WindowOptions) -> Result<ChangelogConfig> {
    Ok(common::changelog(topic)?
        .durability(Durability::Async)
        .keys(Arc::new(WindowChangelog::new(options)))
        .retention(options.changelog_retention()))
}

fn attach(path: &Path, topic: &str, producer: &SharedProducer) -> Result<LoggedStore> {
    attach_of(path, topic, producer, &windows())
}

fn attach_of(
    path: &Path,
    topic: &str,
    producer: &SharedProducer,
    options: &WindowOptions,
) -> Result<LoggedStore> {
    let restored = RestoredStore::restore(
        path,
        &RocksDbOptions::default(),
        config_of(topic, options)?,
        &OpenHooks::default(),
    )?;
    Ok(LoggedStore::attach(restored, producer)?)
}

fn count(n: i64) -> [u8; 8] {
    n.to_be_bytes()
}

#[test]
fn a_window_dropped_in_an_aborted_transaction_is_still_there_after_the_abort() -> Result<()> {
    dropped_in_an_aborted_transaction(windows())
}

#[test]
fn a_hopping_window_dropped_in_an_aborted_transaction_is_still_there_after_the_abort() -> Result<()>
{
    dropped_in_an_aborted_transaction(hopping_windows())
}

/// A window committed, then written again and expired by a far later put in one transaction
/// that aborts: it is there after the abort with its committed value, in memory and in RocksDB.
fn dropped_in_an_aborted_transaction(windows: WindowOptions) -> Result<()> {
    let windows = move || windows;
    let topic = kstate_test_broker::unique_topic("drop-abort");
    let dir = tempfile::tempdir()?;
    let config = config_of(&topic, &windows())?;
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let store = attach_of(&dir.path().join("w"), &topic, &producer, &windows())?;
    let base = common::recent_minute();
    {
        let counts = WindowStore::open(&store, windows())?;
        counts.put(b"k", base, Some(&count(1)))?;
    }
    producer.commit_transaction(None, TIMEOUT)?;
    {
        let counts = WindowStore::open(&store, windows())?;
        counts.put(b"k", base, Some(&count(2)))?;
        // Far ahead: the segment of `base` expires and is dropped.
        counts.put(b"later", base + FAR, Some(&count(1)))?;
        ensure!(
            counts.get(b"k", base)?.is_none(),
            "the expired window is still readable inside its transaction"
        );
    }
    producer.abort_transaction("test", TIMEOUT)?;
    let counts = WindowStore::reader(&store, windows())?;
    ensure!(
        counts.stream_time() == Some(base),
        "stream time after the abort: {:?}",
        counts.stream_time()
    );
    let after = counts.get(b"k", base)?;
    ensure!(
        after.as_deref() == Some(&count(1)[..]),
        "the committed window after the abort: {after:?}, expected count 1"
    );
    store.close()?;
    drop(store);
    // And in RocksDB, not only in memory: a reopen sees the committed window.
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let reopened = attach_of(&dir.path().join("w"), &topic, &producer, &windows())?;
    let counts = WindowStore::reader(&reopened, windows())?;
    let reread = counts.get(b"k", base)?;
    ensure!(
        reread.as_deref() == Some(&count(1)[..]),
        "the committed window after a reopen: {reread:?}"
    );
    Ok(())
}

#[test]
fn an_observed_stream_time_survives_the_next_abort_under_exactly_once() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("observe-abort");
    let dir = tempfile::tempdir()?;
    let producer =
        SharedProducer::transactional(&config(&topic)?, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let store = attach(&dir.path().join("w"), &topic, &producer)?;
    let base = common::recent_minute();
    WindowStore::open(&store, windows())?.put(b"k", base, Some(&count(1)))?;
    producer.commit_transaction(None, TIMEOUT)?;
    // A record whose processor only observes its time: no changelog record in this
    // transaction, and it commits (with its input offsets, in a task).
    WindowStore::open(&store, windows())?.observe(base + 100 * SECOND)?;
    producer.commit_transaction(None, TIMEOUT)?;
    WindowStore::open(&store, windows())?.put(b"k2", base + 100 * SECOND, Some(&count(1)))?;
    producer.abort_transaction("test", TIMEOUT)?;
    let time = WindowStore::reader(&store, windows())?.stream_time();
    ensure!(
        time == Some(base + 100 * SECOND),
        "stream time after the abort: {time:?}, expected the observed {}",
        base + 100 * SECOND
    );
    // The window the observed time expired stays expired, in RocksDB too.
    store.close()?;
    drop(store);
    let producer =
        SharedProducer::transactional(&config(&topic)?, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let reopened = attach(&dir.path().join("w"), &topic, &producer)?;
    let time = WindowStore::reader(&reopened, windows())?.stream_time();
    ensure!(
        time == Some(base + 100 * SECOND),
        "stream time after a reopen: {time:?}"
    );
    Ok(())
}

#[test]
fn a_drop_removes_the_writes_before_it_and_keeps_the_writes_after_it() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("drop-overlay");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s");
    let store = LoggedStore::open(
        &path,
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )?;
    store.put(b"a1", b"committed")?;
    store.put(b"b1", b"kept")?;
    store.commit()?;
    store.put(b"a2", b"before the drop")?;
    store.drop_range(&KeyRange::prefix(b"a"))?;
    store.put(b"a3", b"after the drop")?;
    let expected: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = [
        (b"a3".to_vec(), b"after the drop".to_vec()),
        (b"b1".to_vec(), b"kept".to_vec()),
    ]
    .into_iter()
    .collect();
    let seen = common::contents(&store)?;
    ensure!(
        seen == expected,
        "before the commit the store reads {seen:?}"
    );
    ensure!(store.get(b"a1")?.is_none(), "a1 is readable after its drop");
    store.close()?;
    drop(store);
    let reopened = LoggedStore::open(
        &path,
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )?;
    let seen = common::contents(&reopened)?;
    ensure!(seen == expected, "after a reopen the store holds {seen:?}");
    Ok(())
}

#[test]
fn a_drop_waits_for_the_commit_of_the_stream_time_that_decided_it() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("drop-uncommitted");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("w");
    let open = || -> Result<LoggedStore> {
        Ok(LoggedStore::open(
            &path,
            &RocksDbOptions::default(),
            config(&topic)?,
        )?)
    };
    let base = common::recent_minute();
    let store = open()?;
    WindowStore::open(&store, windows())?.put(b"k", base, Some(&count(3)))?;
    store.flush()?;
    // A stream time far ahead, observed (a local key: never in the changelog), drops the
    // segment of `base`; the store then goes without a commit, as in a crash.
    WindowStore::open(&store, windows())?.observe(base + FAR)?;
    drop(store);
    let reopened = open()?;
    let counts = WindowStore::reader(&reopened, windows())?;
    ensure!(
        counts.stream_time() == Some(base),
        "stream time after a close without a commit: {:?}",
        counts.stream_time()
    );
    let kept = counts.get(b"k", base)?;
    ensure!(
        kept.as_deref() == Some(&count(3)[..]),
        "the window live at the committed stream time: {kept:?}"
    );
    Ok(())
}
