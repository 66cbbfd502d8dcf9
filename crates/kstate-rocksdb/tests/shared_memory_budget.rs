//! Many stores on one `MemoryBudget` stay within its memtable share: a hundred partitions must not
//! cost a hundred times the memtables.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use kstate_core::KeyValueStore;
use kstate_rocksdb::{MemoryBudget, RocksDbOptions, RocksDbStore};

const STORES: usize = 16;

/// Writes 2,000 1-KB rows into each of sixteen stores sharing a budget whose memtables may use
/// `memtable_limit` bytes; returns the peak memtable usage seen.
fn peak_memtable_usage(memtable_limit: usize) -> usize {
    let budget = MemoryBudget::new(memtable_limit.max(32 << 20), memtable_limit);
    // Each store alone may hold 3 x 1 MiB of memtables: 48 MiB for all sixteen.
    let options = RocksDbOptions::default()
        .memory_budget(budget.clone())
        .write_buffer_size(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<RocksDbStore> = (0..STORES)
        .map(|i| RocksDbStore::open(dir.path().join(format!("partition-{i}")), &options).unwrap())
        .collect();
    let value = [7u8; 1000];
    let mut peak = 0;
    for round in 0..2_000u32 {
        for store in &stores {
            store.put(&round.to_be_bytes(), &value).unwrap();
        }
        peak = peak.max(budget.memtable_usage());
    }
    for store in &stores {
        assert_eq!(store.all().unwrap().count(), 2_000);
        store.close().unwrap();
    }
    peak
}

#[test]
fn sixteen_stores_share_one_memtable_limit() {
    const LIMIT: usize = 4 << 20;
    let limited = peak_memtable_usage(LIMIT);
    // The manager flushes once usage passes its limit, so usage can overshoot by what is written
    // before a flush frees memory, not by a factor of the store count.
    assert!(
        limited < 2 * LIMIT,
        "{STORES} stores peaked at {limited} bytes against a shared limit of {LIMIT}"
    );
    // The same writes under a limit they never reach: the limit is what kept the usage down.
    let unlimited = peak_memtable_usage(1 << 30);
    assert!(
        unlimited > 2 * LIMIT,
        "without a binding limit the stores peaked at only {unlimited} bytes: the test checks nothing"
    );
}
