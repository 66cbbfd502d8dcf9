//! The offset a commit stores is exactly that of its last record, and a reopen resumes right
//! after it: nothing skipped, nothing replayed twice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::sync::Arc;

use anyhow::{Context, Result};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{Durability, LoggedStore, OpenHooks};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::unique_topic;

#[test]
fn a_reopen_resumes_right_after_the_committed_offset() -> Result<()> {
    let topic = unique_topic("position");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?.durability(Durability::Async);
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config.clone())?;
    for i in 0..10u8 {
        store.put(&[i], b"committed")?;
    }
    store.flush()?; // commit + memtable flush: offsets 0..=9 are in RocksDB
    let position = store.committed_position()?.context("no stored position")?;
    assert_eq!(
        (position.topic.as_str(), position.partition, position.offset),
        (topic.as_str(), 0, 9)
    );

    store.set_durability(Durability::Sync);
    store.put(&[10], b"acknowledged, not committed")?; // offset 10, in the changelog only
    store.delete(&[0])?; // offset 11: a tombstone, also only in the changelog
    drop(store); // no close: like a crash after the acknowledgement

    let recorder = Arc::new(common::Recorder::default());
    let hooks = OpenHooks {
        listener: Some(recorder.clone()),
        record_check: None,
        cancel: None,
    };
    let store = LoggedStore::open_with(dir.path(), &RocksDbOptions::default(), config, hooks)?;
    let report = store.restore_report();
    assert_eq!(
        (
            report.start.start_offset,
            report.start.end_offset,
            report.records
        ),
        (10, 12, 2)
    );
    let batches = recorder.batches.lock().unwrap().clone();
    assert_eq!(batches.last().map(|b| b.last_offset), Some(11));
    assert_eq!(
        store.get(&[10])?.as_deref(),
        Some(&b"acknowledged, not committed"[..])
    );
    assert_eq!(store.get(&[0])?, None, "the tombstone was replayed");
    assert_eq!(store.all()?.count(), 10);
    assert_eq!(store.committed_position()?.map(|p| p.offset), Some(11));
    store.close()?;
    Ok(())
}

#[test]
fn unacknowledged_counts_sends_until_the_broker_acknowledges_them() -> Result<()> {
    let topic = unique_topic("unacknowledged");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?.durability(Durability::Async);
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config)?;
    assert_eq!(store.unacknowledged(), 0, "nothing written yet");
    for i in 0..10_000u32 {
        store.put(&i.to_be_bytes(), b"value")?;
    }
    store.commit()?; // waits for the acknowledgement of the last record, so of all of them
    assert_eq!(store.unacknowledged(), 0, "after a commit");
    store.set_durability(Durability::Sync);
    store.put(b"sync", b"value")?;
    assert_eq!(
        store.unacknowledged(),
        0,
        "a sync put returns once acknowledged"
    );
    store.close()?;
    Ok(())
}

/// In `group` mode nobody calls `commit`: the store's timer does, and the stored position
/// follows the writes.
#[test]
fn the_group_timer_commits_without_being_asked() -> Result<()> {
    let topic = unique_topic("group-timer");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?
        .durability(Durability::Group(std::time::Duration::from_millis(20)));
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config)?;
    for i in 0..100u8 {
        store.put(&[i], b"timed")?; // offsets 0..=99
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let offset = store.committed_position()?.map(|p| p.offset);
        if offset == Some(99) {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the group timer never committed offset 99 (stored: {offset:?})"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    store.close()?;
    Ok(())
}
