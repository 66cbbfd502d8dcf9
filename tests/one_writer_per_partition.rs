//! One writer per changelog partition: a second writer (another store on the same topic
//! partition, or a zombie producer) is detected, and the store never commits an offset past
//! records it did not apply. After a reopen, every store equals the fold of its changelog.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::path::Path;

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::{Error, KeyValueStore};
use kstate::kstate_kafka::{Durability, LoggedStore, RestoreReport};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::unique_topic;

fn open(path: &Path, topic: &str, mode: Durability) -> Result<LoggedStore> {
    Ok(LoggedStore::open(
        path,
        &RocksDbOptions::default(),
        common::changelog(topic)?.durability(mode),
    )?)
}

/// Reopens the store at `path` and returns it with its restore report.
fn reopen(path: &Path, topic: &str) -> Result<(LoggedStore, RestoreReport)> {
    common::open_reporting(
        path,
        common::changelog(topic)?.durability(Durability::Async),
    )
}

/// Commits and closes, reporting whether the store had been poisoned.
fn finish(store: LoggedStore) -> bool {
    let committed = store.commit();
    let closed = store.close();
    matches!(committed, Err(Error::Poisoned { .. }))
        || matches!(closed, Err(Error::Poisoned { .. }))
}

/// After the reopen, the store holds exactly the changelog folded up to the restore's end.
fn assert_equals_fold(path: &Path, topic: &str, who: &str) -> Result<()> {
    let (store, report) = reopen(path, topic)?;
    ensure!(
        report.start.rebuild_reason.is_none(),
        "{who}: rebuilt: {:?}",
        report.start
    );
    let folded = common::fold_changelog(topic, 0, report.start.end_offset)?;
    let held = common::contents(&store)?;
    let missing: Vec<String> = folded
        .keys()
        .filter(|k| !held.contains_key(*k))
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    ensure!(
        held == folded,
        "{who}: the reopened store differs from its changelog (missing {missing:?}; holds {} keys, the changelog {})",
        held.len(),
        folded.len()
    );
    store.close()?;
    Ok(())
}

#[test]
fn two_stores_writing_one_partition_alternately_poison_and_reopen_to_the_changelog() -> Result<()> {
    let topic = unique_topic("two-writers");
    let dir = tempfile::tempdir()?;
    let (path_a, path_b) = (dir.path().join("a"), dir.path().join("b"));
    let a = open(&path_a, &topic, Durability::Sync)?;
    let b = open(&path_b, &topic, Durability::Sync)?;
    let mut poisoned_puts = Vec::new();
    for round in 0..5 {
        for (name, store) in [("a", &a), ("b", &b)] {
            match store.put(format!("{name}-{round}").as_bytes(), b"v") {
                Ok(()) => {}
                Err(e @ Error::Poisoned { .. }) => poisoned_puts.push(e.to_string()),
                Err(e) => return Err(e).context(format!("{name} round {round}")),
            }
        }
    }
    let (a_poisoned, b_poisoned) = (finish(a), finish(b));
    ensure!(
        a_poisoned && b_poisoned,
        "both stores saw the other's records between their own: poisoned a={a_poisoned} b={b_poisoned}"
    );
    // The reason names the offset expected and the one the record got.
    let first = poisoned_puts.first().context("no put was refused")?;
    ensure!(
        first.contains("expected") && first.contains("another writer"),
        "{first}"
    );
    assert_equals_fold(&path_a, &topic, "a")?;
    assert_equals_fold(&path_b, &topic, "b")?;
    Ok(())
}

#[test]
fn a_foreign_record_before_the_first_write_is_detected() -> Result<()> {
    let topic = unique_topic("zombie");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    let store = open(&path, &topic, Durability::Async)?;
    for i in 0..100u32 {
        store.put(format!("mine-{i:03}").as_bytes(), b"v")?;
    }
    store.commit()?;
    // A zombie appends after this store's restore ended and before its next write.
    let zombie = open(&dir.path().join("zombie"), &topic, Durability::Sync)?;
    zombie.put(b"zombie-key", b"z")?;
    zombie.close()?;
    drop(zombie);
    for i in 100..200u32 {
        // Async: a put returns before its acknowledgement shows the gap.
        let _ = store.put(format!("mine-{i:03}").as_bytes(), b"v");
    }
    let committed = store.commit();
    ensure!(
        matches!(committed, Err(Error::Poisoned { .. })),
        "the commit after a foreign record must be refused, got {committed:?}"
    );
    let _ = store.close();
    drop(store);
    assert_equals_fold(&path, &topic, "store")
}
