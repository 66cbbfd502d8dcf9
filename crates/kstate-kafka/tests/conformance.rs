//! The conformance kit and the BTreeMap model test, run against `LoggedStore` on a real broker:
//! the overlay merge must be indistinguishable from a plain store, before and after commits and
//! reopens: clean ones, ones without `close` (the uncommitted tail is replayed), and ones from a
//! deleted directory (the whole store is rebuilt from the changelog).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kstate_core::testkit::Harness;
use kstate_core::{ChangelogKeys, KeyValueStore as _};
use kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate_rocksdb::RocksDbOptions;

/// How the harness reopens a store.
#[derive(Clone, Copy)]
enum Reopen {
    /// `close`, then open: nothing to replay.
    Close,
    /// Drop without `close`, as a crash would: uncommitted writes are replayed from the
    /// changelog (use with `sync`, so every write was acknowledged before the drop).
    DropWithoutClose,
    /// `close`, delete the directory, open: the whole store comes back from the changelog.
    WipeDirectory,
}

/// A store the harness opened: its directory, changelog topic and key mapping.
type OpenStore = (PathBuf, String, Option<Arc<dyn ChangelogKeys>>);

struct LoggedHarness {
    dir: tempfile::TempDir,
    opened: usize,
    mode: Durability,
    reopen: Reopen,
    open_stores: Vec<OpenStore>,
}

impl LoggedHarness {
    fn new(mode: Durability, reopen: Reopen) -> Self {
        LoggedHarness {
            dir: tempfile::tempdir().unwrap(),
            opened: 0,
            mode,
            reopen,
            open_stores: Vec::new(),
        }
    }

    fn config(&self, topic: &str, keys: Option<Arc<dyn ChangelogKeys>>) -> ChangelogConfig {
        let servers = kstate_test_broker::bootstrap_servers().unwrap();
        let config = ChangelogConfig::new(servers, topic, 0);
        let config = match keys {
            Some(keys) => config.keys(keys).retention(Duration::from_secs(86_400)),
            None => config,
        };
        config
            .partitions(1)
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
        self.open_keyed(None)
    }

    fn open_mapped(&mut self, keys: Arc<dyn ChangelogKeys>) -> LoggedStore {
        self.open_keyed(Some(keys))
    }

    fn reopen(&mut self, store: LoggedStore) -> LoggedStore {
        let name = store.name().to_string();
        let (path, topic, keys) = self
            .open_stores
            .iter()
            .find(|(p, _, _)| name.starts_with(&format!("{} (", p.display())))
            .cloned()
            .unwrap();
        match self.reopen {
            Reopen::Close => store.close().unwrap(),
            Reopen::DropWithoutClose => {}
            Reopen::WipeDirectory => store.close().unwrap(),
        }
        drop(store);
        if let Reopen::WipeDirectory = self.reopen {
            std::fs::remove_dir_all(&path).unwrap();
        }
        LoggedStore::open(&path, &RocksDbOptions::default(), self.config(&topic, keys)).unwrap()
    }
}

impl LoggedHarness {
    fn open_keyed(&mut self, keys: Option<Arc<dyn ChangelogKeys>>) -> LoggedStore {
        self.opened += 1;
        let path = self.dir.path().join(format!("store-{}", self.opened));
        let topic = kstate_test_broker::unique_topic("conformance");
        self.open_stores
            .push((path.clone(), topic.clone(), keys.clone()));
        LoggedStore::open(&path, &RocksDbOptions::default(), self.config(&topic, keys)).unwrap()
    }
}

mod async_mode {
    use super::*;
    kstate_core::conformance_tests!(LoggedHarness::new(Durability::Async, Reopen::Close));
    kstate_core::model_tests!(
        LoggedHarness::new(Durability::Async, Reopen::Close),
        cases = 24
    );
    kstate_core::window_tests!(
        LoggedHarness::new(Durability::Async, Reopen::Close),
        cases = 16
    );
    kstate_core::session_tests!(
        LoggedHarness::new(Durability::Async, Reopen::Close),
        cases = 12
    );
    kstate_core::ttl_tests!(
        LoggedHarness::new(Durability::Async, Reopen::Close),
        cases = 12
    );
}

mod group_mode_rebuilt_from_the_changelog {
    use super::*;
    kstate_core::model_tests!(
        LoggedHarness::new(
            Durability::Group(Duration::from_millis(1)),
            Reopen::WipeDirectory
        ),
        cases = 16
    );
    kstate_core::window_tests!(
        LoggedHarness::new(
            Durability::Group(Duration::from_millis(1)),
            Reopen::WipeDirectory
        ),
        cases = 12
    );
    kstate_core::session_tests!(
        LoggedHarness::new(
            Durability::Group(Duration::from_millis(1)),
            Reopen::WipeDirectory
        ),
        cases = 12
    );
    kstate_core::ttl_tests!(
        LoggedHarness::new(
            Durability::Group(Duration::from_millis(1)),
            Reopen::WipeDirectory
        ),
        cases = 12
    );
}

mod sync_mode_dropped_without_close {
    use super::*;
    kstate_core::model_tests!(
        LoggedHarness::new(Durability::Sync, Reopen::DropWithoutClose),
        cases = 16
    );
    kstate_core::window_tests!(
        LoggedHarness::new(Durability::Sync, Reopen::DropWithoutClose),
        cases = 12
    );
    kstate_core::session_tests!(
        LoggedHarness::new(Durability::Sync, Reopen::DropWithoutClose),
        cases = 12
    );
    kstate_core::ttl_tests!(
        LoggedHarness::new(Durability::Sync, Reopen::DropWithoutClose),
        cases = 12
    );
}
