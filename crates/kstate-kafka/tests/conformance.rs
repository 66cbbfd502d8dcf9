//! The conformance kit and the BTreeMap model test, run against `LoggedStore` on a real broker:
//! the overlay merge must be indistinguishable from a plain store, before and after commits and
//! reopens (a reopen restores from the changelog).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::path::PathBuf;
use std::time::Duration;

use kstate_core::KeyValueStore as _;
use kstate_core::testkit::Harness;
use kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate_rocksdb::RocksDbOptions;

struct LoggedHarness {
    dir: tempfile::TempDir,
    opened: usize,
    mode: Durability,
    open_stores: Vec<(PathBuf, String)>,
}

impl LoggedHarness {
    fn new(mode: Durability) -> Self {
        LoggedHarness {
            dir: tempfile::tempdir().unwrap(),
            opened: 0,
            mode,
            open_stores: Vec::new(),
        }
    }

    fn config(&self, topic: &str) -> ChangelogConfig {
        let servers = kstate_test_broker::bootstrap_servers().unwrap();
        ChangelogConfig::new(servers, topic, 0)
            .durability(self.mode)
            .delivery_timeout(Duration::from_secs(20))
            // Small bounds, so scenarios also cross early commits.
            .overlay_bounds(64 << 10, 300)
            // The kit writes 1 MiB values; Kafka's default record limit is just below that.
            .max_record_bytes(2 << 20)
    }
}

impl Harness for LoggedHarness {
    type Store = LoggedStore;

    fn open(&mut self) -> LoggedStore {
        self.opened += 1;
        let path = self.dir.path().join(format!("store-{}", self.opened));
        let topic = kstate_test_broker::unique_topic("conformance");
        self.open_stores.push((path.clone(), topic.clone()));
        LoggedStore::open(&path, &RocksDbOptions::default(), self.config(&topic)).unwrap()
    }

    fn reopen(&mut self, store: LoggedStore) -> LoggedStore {
        let name = store.name().to_string();
        let (path, topic) = self
            .open_stores
            .iter()
            .find(|(p, _)| name.starts_with(&format!("{} (", p.display())))
            .cloned()
            .unwrap();
        store.close().unwrap();
        drop(store);
        LoggedStore::open(&path, &RocksDbOptions::default(), self.config(&topic)).unwrap()
    }
}

mod async_mode {
    use super::*;
    kstate_core::conformance_tests!(LoggedHarness::new(Durability::Async));
    kstate_core::model_tests!(LoggedHarness::new(Durability::Async), cases = 24);
}

mod group_mode {
    use super::*;
    kstate_core::model_tests!(
        LoggedHarness::new(Durability::Group(Duration::from_millis(1))),
        cases = 24
    );
}
