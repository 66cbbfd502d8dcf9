//! A task's RocksDB ([`TaskDb`]): its stores are separate key spaces with separate metadata,
//! one store's rebuild leaves the others alone, the two layouts are never mistaken for each
//! other, and a SIGKILL in the middle of writes and flushes leaves every store at one
//! consistent point of the task's write order.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::time::Duration;

use kstate_core::KeyValueStore;
use kstate_rocksdb::{Layout, MemoryBudget, OpenError, RocksDbOptions, RocksDbStore, TaskDb};

const STORES: [&str; 3] = ["counts", "totals", "last-seen"];
const CHILD_ENV: &str = "KSTATE_TASK_DB_CRASH_CHILD_DIR";
const POSITION: &[u8] = b"position";

fn all(store: &RocksDbStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    store.all().unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn the_stores_of_a_task_are_separate_key_spaces_with_separate_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let db = TaskDb::open(dir.path(), &STORES, &RocksDbOptions::default()).unwrap();
    assert_eq!(db.stores(), vec!["counts", "last-seen", "totals"]);
    let counts = db.store("counts").unwrap();
    let totals = db.store("totals").unwrap();
    counts
        .write_with_metadata(
            [(&b"k"[..], Some(&b"1"[..]))],
            &[(POSITION, Some(&b"7"[..]))],
        )
        .unwrap();
    totals.put(b"k", b"100").unwrap();
    totals
        .ingest_sorted([(&b"a"[..], Some(&b"2"[..]))])
        .unwrap();
    assert_eq!(counts.get(b"k").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(counts.get(b"a").unwrap(), None, "ingested into totals only");
    assert_eq!(all(&totals).len(), 2);
    assert_eq!(
        counts.metadata(POSITION).unwrap().as_deref(),
        Some(&b"7"[..])
    );
    assert_eq!(totals.metadata(POSITION).unwrap(), None);
    assert_eq!(
        counts.metadata_entries().unwrap(),
        vec![(POSITION.to_vec(), b"7".to_vec())]
    );
    assert!(counts.name().ends_with("/counts"), "{}", counts.name());

    // Clearing one store for a rebuild leaves the others alone, and survives a reopen.
    totals
        .write_with_metadata(std::iter::empty(), &[(POSITION, Some(&b"3"[..]))])
        .unwrap();
    totals.clear().unwrap();
    assert!(all(&totals).is_empty());
    assert!(totals.metadata_entries().unwrap().is_empty());
    counts.close().unwrap();
    drop((counts, totals, db));
    let db = TaskDb::open(dir.path(), &STORES, &RocksDbOptions::default()).unwrap();
    assert!(all(&db.store("totals").unwrap()).is_empty());
    let counts = db.store("counts").unwrap();
    assert_eq!(all(&counts), vec![(b"k".to_vec(), b"1".to_vec())]);
    assert_eq!(
        counts.metadata(POSITION).unwrap().as_deref(),
        Some(&b"7"[..])
    );
}

#[test]
fn a_store_not_named_at_open_is_a_typed_error_naming_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let db = TaskDb::open(dir.path(), &["counts"], &RocksDbOptions::default()).unwrap();
    let Err(e) = db.store("totals") else {
        panic!("totals was not named at open");
    };
    assert!(
        matches!(&e, OpenError::NoSuchStore { store, held, .. } if store == "totals" && held == &["counts"]),
        "{e}"
    );
}

#[test]
fn the_two_layouts_are_never_mistaken_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("single");
    let task = dir.path().join("task");
    let store = RocksDbStore::open(&single, &RocksDbOptions::default()).unwrap();
    store.put(b"k", b"v").unwrap();
    store.close().unwrap();
    drop(store);
    drop(TaskDb::open(&task, &["counts"], &RocksDbOptions::default()).unwrap());

    let Err(e) = TaskDb::open(&single, &["counts"], &RocksDbOptions::default()) else {
        panic!("a single store's directory opened as a task's");
    };
    assert!(
        matches!(
            e,
            OpenError::WrongLayout {
                found: Layout::Store,
                wanted: Layout::Task,
                ..
            }
        ),
        "{e}"
    );
    let Err(e) = RocksDbStore::open(&task, &RocksDbOptions::default()) else {
        panic!("a task's directory opened as a single store");
    };
    assert!(
        matches!(
            e,
            OpenError::WrongLayout {
                found: Layout::Task,
                wanted: Layout::Store,
                ..
            }
        ),
        "{e}"
    );
    // A single store that holds only metadata (every key deleted) is still a single store.
    let emptied = dir.path().join("emptied");
    let store = RocksDbStore::open(&emptied, &RocksDbOptions::default()).unwrap();
    store
        .write_with_metadata(std::iter::empty(), &[(POSITION, Some(&b"9"[..]))])
        .unwrap();
    store.close().unwrap();
    drop(store);
    let Err(e) = TaskDb::open_existing(&emptied, &RocksDbOptions::default()) else {
        panic!("a single store holding only its position opened as a task's");
    };
    assert!(
        matches!(
            e,
            OpenError::WrongLayout {
                found: Layout::Store,
                ..
            }
        ),
        "{e}"
    );
    let Err(e) = TaskDb::open_existing(dir.path().join("typo"), &RocksDbOptions::default()) else {
        panic!("a mistyped path opened");
    };
    assert!(matches!(e, OpenError::NotFound { .. }), "{e}");
    assert!(!dir.path().join("typo").exists(), "nothing created");
}

/// Small memtables, so that RocksDB flushes on its own every few hundred rounds.
fn crash_options() -> RocksDbOptions {
    RocksDbOptions::default()
        .memory_budget(MemoryBudget::new(64 << 20, 32 << 20))
        .write_buffer_size(64 << 10)
}

/// The child's part: only does anything when run by the parent below. Round `i` writes key `i`
/// to each store in turn, each with its position `i` in the same batch, and every 1,000th round
/// flushes (a commit); RocksDB flushes on its own in between.
#[test]
fn crash_child_writes_rounds_to_every_store_until_killed() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let db = TaskDb::open(&dir, &STORES, &crash_options()).unwrap();
    let stores: Vec<RocksDbStore> = STORES.iter().map(|s| db.store(s).unwrap()).collect();
    let value = [7u8; 100];
    for round in 0u64.. {
        let key = round.to_be_bytes();
        for store in &stores {
            store
                .write_with_metadata(
                    [(&key[..], Some(&value[..]))],
                    &[(POSITION, Some(&key[..]))],
                )
                .unwrap();
        }
        if round % 1_000 == 999 {
            stores[round as usize % STORES.len()].flush().unwrap();
        }
        if round == 20_000 {
            println!("{}", common::READY);
        }
    }
}

#[test]
fn a_sigkill_mid_flush_leaves_every_store_of_the_task_at_one_consistent_point() {
    for kill in 0..5u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut child = common::spawn_until_ready(
            "crash_child_writes_rounds_to_every_store_until_killed",
            CHILD_ENV,
            dir.path(),
        );
        std::thread::sleep(Duration::from_millis(13 * kill));
        child.kill().unwrap(); // SIGKILL: no destructor, no RocksDB shutdown flush
        assert!(!child.wait().unwrap().success());

        let db = TaskDb::open(dir.path(), &STORES, &crash_options()).unwrap();
        let mut positions = Vec::new();
        for name in STORES {
            let store = db.store(name).unwrap();
            let position = store
                .metadata(POSITION)
                .unwrap()
                .map_or(-1, |p| u64::from_be_bytes(p.try_into().unwrap()) as i64);
            let keys: Vec<i64> = all(&store)
                .into_iter()
                .map(|(k, _)| u64::from_be_bytes(k.try_into().unwrap()) as i64)
                .collect();
            let expected: Vec<i64> = (0..=position).collect();
            assert!(
                keys == expected,
                "kill {kill}: store {name} at position {position} holds {} keys ({:?}..{:?}), \
                 not exactly the rounds up to its position",
                keys.len(),
                keys.first(),
                keys.last()
            );
            positions.push(position);
        }
        // A prefix of the write order: round i reaches the stores in declaration order.
        let (first, last) = (positions[0], positions[STORES.len() - 1]);
        assert!(
            positions.windows(2).all(|w| w[0] >= w[1]) && first - last <= 1,
            "kill {kill}: positions {positions:?} are not one point of the task's write order"
        );
        // Round 19,999 was flushed explicitly before the child said it was ready.
        assert!(
            first >= 19_999,
            "kill {kill}: flushed rounds were lost: {positions:?}"
        );
        println!("kill {kill}: positions {positions:?}");
    }
}

/// A kill between creating a task's RocksDB (its column families) and flushing its layout record
/// leaves column families named for stores and no record: found by the exactly-once kill test of
/// two inputs, whose restart then refused the directory as a single store's.
#[test]
fn a_task_rocksdb_whose_creation_was_cut_short_opens_as_a_tasks() {
    use kstate_rocksdb::rocksdb;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    drop(rocksdb::DB::open_cf(&opts, dir.path(), ["kstate_meta", "store.counts"]).unwrap());

    let db = TaskDb::open(dir.path(), &["counts"], &RocksDbOptions::default()).unwrap();
    assert_eq!(db.stores(), vec!["counts"]);
    drop(db);
    let Err(e) = RocksDbStore::open(dir.path(), &RocksDbOptions::default()) else {
        panic!("a task's directory opened as a single store");
    };
    assert!(
        matches!(
            e,
            OpenError::WrongLayout {
                found: Layout::Task,
                ..
            }
        ),
        "{e}"
    );
}
