//! The conformance kit and the BTreeMap model test, run against `RocksDbStore`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use kstate_core::KeyValueStore as _;
use kstate_core::testkit::Harness;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

struct RocksHarness {
    dir: tempfile::TempDir,
    opened: usize,
}

impl RocksHarness {
    fn new() -> Self {
        RocksHarness {
            dir: tempfile::tempdir().unwrap(),
            opened: 0,
        }
    }
}

impl Harness for RocksHarness {
    type Store = RocksDbStore;

    fn open(&mut self) -> RocksDbStore {
        self.opened += 1;
        let path = self.dir.path().join(format!("store-{}", self.opened));
        RocksDbStore::open(path, &RocksDbOptions::default()).unwrap()
    }

    fn reopen(&mut self, store: RocksDbStore) -> RocksDbStore {
        let path = store.path().to_path_buf();
        store.close().unwrap();
        drop(store);
        RocksDbStore::open(path, &RocksDbOptions::default()).unwrap()
    }
}

kstate_core::conformance_tests!(RocksHarness::new());
kstate_core::model_tests!(RocksHarness::new(), cases = 64);
