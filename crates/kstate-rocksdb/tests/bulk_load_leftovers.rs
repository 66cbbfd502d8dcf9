//! An SST file `ingest_sorted` wrote but did not ingest (the process was killed in between) is
//! deleted when the store is next opened; RocksDB itself never deletes it, its name not being
//! one of RocksDB's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use kstate_core::KeyValueStore;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

#[test]
fn an_sst_file_left_by_a_killed_bulk_load_is_deleted_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
    store
        .ingest_sorted([(&b"a"[..], Some(&b"1"[..])), (b"b", Some(b"2"))])
        .unwrap();
    store.close().unwrap();
    drop(store);

    let leftovers = [
        dir.path().join("kstate-ingest-0.sst"),
        dir.path().join("kstate-ingest-17.sst"),
    ];
    for file in &leftovers {
        std::fs::write(file, b"written, never ingested").unwrap();
    }
    let others = [
        dir.path().join("kstate-ingest-x.sst"),
        dir.path().join("kstate-ingest-1.sst.bak"),
    ];
    for file in &others {
        std::fs::write(file, b"not a name ingest_sorted gives").unwrap();
    }

    let store = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
    for file in &leftovers {
        assert!(!file.exists(), "{} is still there", file.display());
    }
    for file in &others {
        assert!(file.exists(), "{} was deleted", file.display());
    }
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(
        store.all().unwrap().count(),
        2,
        "the ingested data is intact"
    );
}
