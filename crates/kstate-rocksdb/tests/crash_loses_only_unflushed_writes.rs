//! With the WAL off, a crash keeps exactly what was flushed.
//!
//! The test re-runs its own binary as a child (selected by an environment variable), which writes
//! rows, flushes, writes more rows, reports that it is done and waits. The parent kills it with
//! SIGKILL, reopens the store, and finds exactly the flushed rows: the unflushed ones were only in
//! the memtable, and there was no WAL to replay them from. The changelog (kstate-kafka) is what
//! brings such writes back; this test pins down the engine behaviour it relies on.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use kstate_core::KeyValueStore;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

const CHILD_ENV: &str = "KSTATE_CRASH_CHILD_DIR";
const FLUSHED: u32 = 5_000;
const UNFLUSHED: u32 = 3_000;

fn key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

/// The child's part: only does anything when run by the parent below.
#[test]
fn crash_child_writes_then_waits() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = RocksDbStore::open(&dir, &RocksDbOptions::default()).unwrap();
    for i in 0..FLUSHED {
        store.put(&key(i), b"flushed").unwrap();
    }
    store.flush().unwrap();
    for i in FLUSHED..FLUSHED + UNFLUSHED {
        store.put(&key(i), b"unflushed").unwrap();
    }
    // Overwrite some flushed rows too: the crash must bring back their flushed values.
    for i in 0..100 {
        store.put(&key(i), b"overwritten-unflushed").unwrap();
    }
    println!("{}", common::READY);
    std::thread::sleep(std::time::Duration::from_secs(300));
    panic!("the parent should have killed this process");
}

#[test]
fn sigkill_after_flush_keeps_exactly_the_flushed_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut child =
        common::spawn_until_ready("crash_child_writes_then_waits", CHILD_ENV, dir.path());
    child.kill().unwrap(); // SIGKILL on Unix: no destructor, no RocksDB shutdown flush
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the child must have been killed, not exited: {status:?}"
    );

    let store = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
    let rows: Vec<_> = store.all().unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        rows.len(),
        FLUSHED as usize,
        "exactly the flushed rows survive"
    );
    for (i, (k, v)) in rows.iter().enumerate() {
        assert_eq!(k.as_slice(), key(i as u32));
        assert_eq!(
            v.as_slice(),
            b"flushed",
            "row {i} must hold its flushed value"
        );
    }
}
