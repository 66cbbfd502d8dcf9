//! The conformance kit and the BTreeMap model test, run against `LoggedStore` on a real broker:
//! the overlay merge must be indistinguishable from a plain store, before and after commits and
//! reopens: clean ones, ones without `close` (the uncommitted tail is replayed), and ones from a
//! deleted directory (the whole store is rebuilt from the changelog).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kstate_core::testkit::Harness;
use kstate_core::testkit::faults::{Faults, Uncommitted};
use kstate_core::{ChangelogKeys, KeyValueStore as _};
use kstate_kafka::{
    ChangelogConfig, Durability, LoggedStore, OpenHooks, RestoredStore, SharedProducer,
};
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
        let how = self.reopen;
        self.reopen_as(store, how)
    }
}

impl Faults for LoggedHarness {
    fn commit(&mut self, store: &LoggedStore) {
        store.flush().unwrap();
    }

    fn abort(&mut self, _: &LoggedStore) -> bool {
        false
    }

    fn crash(&mut self, store: LoggedStore) -> LoggedStore {
        self.reopen_as(store, Reopen::DropWithoutClose)
    }

    fn crash_keeps(&self) -> Uncommitted {
        match self.mode {
            Durability::Sync => Uncommitted::Kept,
            _ => Uncommitted::Unknown,
        }
    }
}

impl LoggedHarness {
    fn reopen_as(&mut self, store: LoggedStore, how: Reopen) -> LoggedStore {
        let name = store.name().to_string();
        let (path, topic, keys) = self
            .open_stores
            .iter()
            .find(|(p, _, _)| name.starts_with(&format!("{} (", p.display())))
            .cloned()
            .unwrap();
        match how {
            Reopen::Close => store.close().unwrap(),
            Reopen::DropWithoutClose => {}
            Reopen::WipeDirectory => store.close().unwrap(),
        }
        drop(store);
        if let Reopen::WipeDirectory = how {
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

/// Stores written in a transaction: a commit is the transaction's, an abort undoes what the
/// store took since, a crash drops the store and its producer (the next producer of the same
/// transactional id fences it and aborts its open transaction) and restores.
struct TransactionHarness {
    dir: tempfile::TempDir,
    opened: usize,
    /// Per open store: its directory, topic, key mapping and producer.
    stores: Vec<(PathBuf, String, Arc<dyn ChangelogKeys>, SharedProducer)>,
}

/// How long a commit or abort may take.
const TRANSACTION_WAIT: Duration = Duration::from_secs(30);

impl TransactionHarness {
    fn new() -> Self {
        TransactionHarness {
            dir: tempfile::tempdir().unwrap(),
            opened: 0,
            stores: Vec::new(),
        }
    }

    fn index_of(&self, store: &LoggedStore) -> usize {
        let name = store.name();
        self.stores
            .iter()
            .position(|(p, _, _, _)| name.starts_with(&format!("{} (", p.display())))
            .unwrap()
    }

    /// Restores the store at slot `i` and attaches it to a new producer of its transactional
    /// id.
    fn attach(&mut self, i: usize) -> LoggedStore {
        let (path, topic, keys, _) = self.stores[i].clone();
        let config =
            LoggedHarness::new(Durability::Async, Reopen::Close).config(&topic, Some(keys));
        let producer =
            SharedProducer::transactional(&config, format!("{topic}-tx"), TRANSACTION_WAIT)
                .unwrap();
        let restored = RestoredStore::restore(
            &path,
            &RocksDbOptions::default(),
            config,
            &OpenHooks::default(),
        )
        .unwrap();
        let store = LoggedStore::attach(restored, &producer).unwrap();
        self.stores[i].3 = producer;
        store
    }
}

impl Harness for TransactionHarness {
    type Store = LoggedStore;

    fn open(&mut self) -> LoggedStore {
        panic!("the transaction harness opens stores of time only (open_mapped)")
    }

    fn open_mapped(&mut self, keys: Arc<dyn ChangelogKeys>) -> LoggedStore {
        self.opened += 1;
        let path = self.dir.path().join(format!("store-{}", self.opened));
        let topic = kstate_test_broker::unique_topic("conformance-tx");
        let config =
            LoggedHarness::new(Durability::Async, Reopen::Close).config(&topic, Some(keys.clone()));
        let producer =
            SharedProducer::transactional(&config, format!("{topic}-tx"), TRANSACTION_WAIT)
                .unwrap();
        self.stores.push((path, topic, keys, producer));
        self.attach(self.stores.len() - 1)
    }

    fn reopen(&mut self, store: LoggedStore) -> LoggedStore {
        let i = self.index_of(&store);
        self.commit(&store);
        store.close().unwrap();
        drop(store);
        self.attach(i)
    }
}

impl Faults for TransactionHarness {
    fn commit(&mut self, store: &LoggedStore) {
        let i = self.index_of(store);
        self.stores[i]
            .3
            .commit_transaction(None, TRANSACTION_WAIT)
            .unwrap();
    }

    fn abort(&mut self, store: &LoggedStore) -> bool {
        let i = self.index_of(store);
        self.stores[i]
            .3
            .abort_transaction("the fault model aborts", TRANSACTION_WAIT)
            .unwrap();
        true
    }

    fn crash(&mut self, store: LoggedStore) -> LoggedStore {
        let i = self.index_of(&store);
        drop(store);
        self.attach(i)
    }

    fn crash_keeps(&self) -> Uncommitted {
        Uncommitted::Lost
    }
}

/// Window and session stores under random commits, aborts and crashes, on every durability
/// mode and in a transaction.
mod faults_async {
    use super::*;
    kstate_core::fault_tests!(
        LoggedHarness::new(Durability::Async, Reopen::Close),
        cases = 10
    );
}

mod faults_group {
    use super::*;
    kstate_core::fault_tests!(
        LoggedHarness::new(Durability::Group(Duration::from_millis(1)), Reopen::Close),
        cases = 10
    );
}

mod faults_sync {
    use super::*;
    kstate_core::fault_tests!(
        LoggedHarness::new(Durability::Sync, Reopen::Close),
        cases = 10
    );
}

mod faults_in_a_transaction {
    use super::*;
    kstate_core::fault_tests!(TransactionHarness::new(), cases = 10);
}
