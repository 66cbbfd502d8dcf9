//! The writes held above RocksDB count against the memory budget: every logged store's overlay
//! charges its budget's pending share ([`MemoryBudget::pending`]), and a write that finds the
//! share full commits its store, so the overlays of a process's stores together stay within it
//! however many stores there are (each store's own bound, 64 MiB by default, is no bound for a
//! thousand of them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate::kstate_rocksdb::{MemoryBudget, RocksDbOptions};
use kstate_test_broker::unique_topic;

const LIMIT: usize = 4096;

fn config(topic: &str, partition: i32) -> anyhow::Result<ChangelogConfig> {
    Ok(ChangelogConfig::new(common::client()?, topic, partition)
        .partitions(2)
        .durability(Durability::Async)
        .open_timeout(Duration::from_secs(30)))
}

/// Two stores in `async` mode (neither commits unless told) on one budget of a 4 KiB pending
/// share: A's writes are charged and stay in its overlay; B's writes, once A's and B's together
/// reach the share, commit B at the write, so the share is never exceeded after a write
/// returns. Committing gives the memory back.
#[tokio::test(flavor = "multi_thread")]
async fn overlays_together_stay_within_their_budgets_pending_share() -> anyhow::Result<()> {
    let budget = MemoryBudget::with_pending(64 << 20, 16 << 20, LIMIT);
    let options = RocksDbOptions::default().memory_budget(budget.clone());
    let topic = unique_topic("pending");
    let dir = tempfile::tempdir()?;
    let a = LoggedStore::open(dir.path().join("a"), &options, config(&topic, 0)?)?;
    let b = LoggedStore::open(dir.path().join("b"), &options, config(&topic, 1)?)?;
    let position = |s: &LoggedStore| -> anyhow::Result<Option<i64>> {
        Ok(s.committed_position()?.map(|p| p.offset))
    };
    let (a_opened, b_opened) = (position(&a)?, position(&b)?);
    let value = [b'v'; 90];
    let record = |i: u32| (format!("key-{i:06}"), value);

    for i in 0..30 {
        let (key, value) = record(i);
        a.put(key.as_bytes(), &value)?;
    }
    let held_by_a = budget.pending().usage();
    assert_eq!(held_by_a, 30 * 100, "A's overlay is charged, key and value");
    assert_eq!(position(&a)?, a_opened, "A committed nothing");

    for i in 0..100 {
        let (key, value) = record(i);
        b.put(key.as_bytes(), &value)?;
        let used = budget.pending().usage();
        assert!(
            used < LIMIT,
            "after B's write {i} the overlays hold {used} bytes, the share is {LIMIT}"
        );
    }
    let b_now = position(&b)?;
    assert!(
        b_now > b_opened,
        "B committed on its own when the share was full: {b_opened:?} -> {b_now:?}"
    );
    assert_eq!(
        position(&a)?,
        a_opened,
        "A, which did not write, was not made to commit"
    );
    assert_eq!(a.get(b"key-000029")?.as_deref(), Some(&value[..]));
    assert_eq!(b.get(b"key-000099")?.as_deref(), Some(&value[..]));

    a.commit()?;
    b.commit()?;
    assert_eq!(
        budget.pending().usage(),
        0,
        "committed overlays give their memory back"
    );
    a.close()?;
    b.close()?;
    Ok(())
}
