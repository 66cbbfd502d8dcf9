//! Invariant 1: no write path of the store writes RocksDB's WAL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::path::Path;

use kstate_core::{Batch, KeyValueStore};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

/// Every `*.log` file in the store directory, with its size. RocksDB names WAL files
/// `NNNNNN.log`; the info log is `LOG` and does not match.
fn wal_files(dir: &Path) -> Vec<(String, u64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect()
}

#[test]
fn ten_thousand_rows_through_every_write_path_leave_every_wal_file_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
    let value = [7u8; 100];
    for i in 0..4_000u32 {
        store.put(&i.to_be_bytes(), &value).unwrap();
    }
    for chunk in (4_000..8_000u32).collect::<Vec<_>>().chunks(100) {
        let mut batch = Batch::new();
        for i in chunk {
            batch.put(i.to_be_bytes(), value);
        }
        store.write(batch).unwrap();
    }
    let keys: Vec<[u8; 4]> = (8_000..10_000u32).map(u32::to_be_bytes).collect();
    let entries: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &value[..])).collect();
    store.put_all(&entries).unwrap();
    store.delete(&0u32.to_be_bytes()).unwrap();
    store
        .write_with_metadata([(&b"k"[..], Some(&b"v"[..]))], &[(b"offset", Some(b"42"))])
        .unwrap();

    // Before any flush: the rows are in memtables only, and the WAL got none of them.
    let files = wal_files(dir.path());
    assert!(
        !files.is_empty(),
        "RocksDB always creates a WAL file; found none, so this test checks nothing"
    );
    assert!(
        files.iter().all(|(_, len)| *len == 0),
        "WAL files with bytes in them: {files:?}"
    );

    store.flush().unwrap();
    assert!(wal_files(dir.path()).iter().all(|(_, len)| *len == 0));
    // 10,000 rows, one deleted, one more written with the metadata.
    assert_eq!(store.all().unwrap().count(), 10_000);
}
