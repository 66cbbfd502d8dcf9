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
kstate_core::window_tests!(RocksHarness::new(), cases = 64);
kstate_core::session_tests!(RocksHarness::new(), cases = 64);
kstate_core::ttl_tests!(RocksHarness::new(), cases = 64);

/// The same kit against a task's store in a RocksDB many tasks share: each store the kit opens
/// is a task whose neighbours on both sides (the task numbers just below and above) hold keys
/// at the edges of the key space, so a scan, a count or a clear that strays past the task's
/// prefix shows up as entries the kit never wrote.
mod shared {
    use super::*;
    use kstate_rocksdb::StateDir;

    struct SharedHarness {
        _dir: tempfile::TempDir,
        state: StateDir,
        opened: u32,
    }

    impl SharedHarness {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let state = StateDir::open(dir.path(), &["s"], &RocksDbOptions::default()).unwrap();
            SharedHarness {
                _dir: dir,
                state,
                opened: 0,
            }
        }

        fn neighbour(&self, task: u32) {
            let task_db = self.state.open_task(task, &["s"]).unwrap();
            let store = task_db.store("s").unwrap();
            for key in [
                &b""[..],
                b"\x00",
                b"\x00\x00\x00\x00",
                b"m",
                b"\xff",
                b"\xff\xff\xff\xff\xff",
            ] {
                store.put(key, b"neighbour").unwrap();
            }
            store
                .write_with_metadata(std::iter::empty(), &[(b"position", Some(b"1"))])
                .unwrap();
        }
    }

    impl Harness for SharedHarness {
        type Store = RocksDbStore;

        fn open(&mut self) -> RocksDbStore {
            self.opened += 3;
            let task = self.opened;
            self.neighbour(task - 1);
            self.neighbour(task + 1);
            let task_db = self.state.open_task(task, &["s"]).unwrap();
            task_db.store("s").unwrap()
        }

        fn reopen(&mut self, store: RocksDbStore) -> RocksDbStore {
            let name = store.name().to_string();
            store.close().unwrap();
            drop(store);
            let task: u32 = std::path::Path::new(&name)
                .parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
                .unwrap();
            let task_db = self.state.open_task(task, &["s"]).unwrap();
            task_db.store("s").unwrap()
        }
    }

    kstate_core::conformance_tests!(SharedHarness::new());
    kstate_core::model_tests!(SharedHarness::new(), cases = 64);
}
