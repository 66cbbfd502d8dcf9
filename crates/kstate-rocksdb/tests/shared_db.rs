//! The RocksDB a process's tasks share ([`SharedDb`]), its tasks opened as the runtime opens
//! them ([`StateDir::open_task`]): tasks are separate key spaces with separate metadata, a
//! task's stores are too, a task is held once, one task's rebuild leaves the others alone, the
//! layouts are never mistaken for each other, a flush covers every task once, and a SIGKILL in
//! the middle of many tasks' writes and flushes leaves every task's stores at one consistent
//! point of the write order.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::time::Duration;

use kstate_core::{KeyRange, KeyValueStore, Order};
use kstate_rocksdb::{
    Layout, MemoryBudget, OpenError, RocksDbOptions, RocksDbStore, SharedDb, StateDir, TaskDb,
};

const STORES: [&str; 3] = ["counts", "totals", "last-seen"];
const TASKS: u32 = 4;
const CHILD_ENV: &str = "KSTATE_SHARED_DB_CRASH_CHILD_DIR";
const POSITION: &[u8] = b"position";

fn all(store: &RocksDbStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    store.all().unwrap().collect::<Result<_, _>>().unwrap()
}

fn open(dir: &std::path::Path) -> StateDir {
    StateDir::open(dir, &STORES, &RocksDbOptions::default()).unwrap()
}

#[test]
fn the_tasks_of_a_shared_rocksdb_are_separate_key_spaces_with_separate_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path());
    let db = state.db();
    assert_eq!(db.stores(), vec!["counts", "last-seen", "totals"]);
    let (one, two) = (
        state.open_task(1, &STORES).unwrap(),
        state.open_task(2, &STORES).unwrap(),
    );
    assert_eq!(one.stores(), vec!["counts", "last-seen", "totals"]);
    let (a, b) = (one.store("counts").unwrap(), two.store("counts").unwrap());
    a.write_with_metadata(
        [
            (&b"k"[..], Some(&b"1"[..])),
            (&b"\xff"[..], Some(&b"3"[..])),
        ],
        &[(POSITION, Some(&b"7"[..]))],
    )
    .unwrap();
    b.put(b"k", b"2").unwrap();
    b.ingest_sorted([(&b"a"[..], Some(&b"9"[..]))]).unwrap();
    assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(a.get(b"a").unwrap(), None, "ingested into task 2 only");
    assert_eq!(
        a.multi_get(&[b"k", b"a"]).unwrap(),
        vec![Some(b"1".to_vec()), None]
    );
    assert_eq!(
        all(&a),
        vec![
            (b"k".to_vec(), b"1".to_vec()),
            (b"\xff".to_vec(), b"3".to_vec())
        ]
    );
    let reversed: Vec<Vec<u8>> = a
        .scan(&KeyRange::all(), Order::Reverse)
        .unwrap()
        .map(|e| e.unwrap().0)
        .collect();
    assert_eq!(reversed, vec![b"\xff".to_vec(), b"k".to_vec()]);
    assert_eq!(all(&b).len(), 2);
    assert_eq!(a.approximate_len().unwrap(), 2);
    assert_eq!(a.metadata(POSITION).unwrap().as_deref(), Some(&b"7"[..]));
    assert_eq!(b.metadata(POSITION).unwrap(), None);
    assert_eq!(
        a.name(),
        dir.path().join("1").join("counts").display().to_string()
    );
    assert!(db.has_state(1).unwrap());
    assert!(!db.has_state(2).unwrap(), "task 2 stored no position");
    assert_eq!(db.tasks().unwrap(), vec![1]);

    // Clearing one task's store for a rebuild leaves the other tasks alone.
    b.write_with_metadata(std::iter::empty(), &[(POSITION, Some(&b"3"[..]))])
        .unwrap();
    assert_eq!(db.tasks().unwrap(), vec![1, 2]);
    a.clear().unwrap();
    assert!(all(&a).is_empty());
    assert!(a.metadata_entries().unwrap().is_empty());
    assert_eq!(all(&b).len(), 2, "task 2 kept its entries");
    assert_eq!(b.metadata(POSITION).unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(db.tasks().unwrap(), vec![2]);

    // A task's stores are separate key spaces too, and the position of one is its own.
    let totals = one.store("totals").unwrap();
    totals.put(b"k", b"100").unwrap();
    a.write_with_metadata(
        [(&b"k"[..], Some(&b"1"[..]))],
        &[(POSITION, Some(&b"8"[..]))],
    )
    .unwrap();
    assert_eq!(totals.get(b"k").unwrap().as_deref(), Some(&b"100"[..]));
    assert_eq!(totals.metadata(POSITION).unwrap(), None);
    totals.clear().unwrap();
    assert_eq!(all(&a), vec![(b"k".to_vec(), b"1".to_vec())]);
    assert_eq!(a.metadata(POSITION).unwrap().as_deref(), Some(&b"8"[..]));
}

#[test]
fn a_store_not_named_at_open_is_a_typed_error_naming_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open(dir.path(), &["counts"], &RocksDbOptions::default()).unwrap();
    let task = state.open_task(0, &["counts"]).unwrap();
    let Err(e) = task.store("totals") else {
        panic!("totals was not named at open");
    };
    assert!(
        matches!(&e, OpenError::NoSuchStore { store, held, .. } if store == "totals" && held == &["counts"]),
        "{e}"
    );
}

#[test]
fn a_task_is_held_until_its_last_handle_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path());
    let task = state.open_task(5, &STORES).unwrap();
    let store = task.store("counts").unwrap();
    let Err(e) = state.open_task(5, &STORES) else {
        panic!("task 5 opened twice");
    };
    assert!(matches!(e, OpenError::TaskHeld { task: 5, .. }), "{e}");
    assert!(e.to_string().contains("task 5"), "{e}");
    assert!(state.open_task(6, &STORES).is_ok(), "another task is free");
    drop(task);
    assert!(
        state.open_task(5, &STORES).is_err(),
        "a store handle still holds the task"
    );
    drop(store);
    state.open_task(5, &STORES).unwrap();
}

#[test]
fn the_layouts_are_never_mistaken_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let shared = dir.path().join("rocksdb");
    let Err(e) = RocksDbStore::open(&shared, &RocksDbOptions::default()) else {
        panic!("a shared RocksDB opened as a single store");
    };
    assert!(
        matches!(
            e,
            OpenError::WrongLayout {
                found: Layout::Shared,
                wanted: Layout::Store,
                ..
            }
        ),
        "{e}"
    );

    // A single store, and one that holds only its position (every key deleted).
    let single = dir.path().join("single");
    let store = RocksDbStore::open(&single, &RocksDbOptions::default()).unwrap();
    store.put(b"k", b"v").unwrap();
    store.close().unwrap();
    drop(store);
    let emptied = dir.path().join("emptied");
    let store = RocksDbStore::open(&emptied, &RocksDbOptions::default()).unwrap();
    store
        .write_with_metadata(std::iter::empty(), &[(POSITION, Some(&b"9"[..]))])
        .unwrap();
    store.close().unwrap();
    drop(store);
    for path in [&single, &emptied] {
        let Err(e) = SharedDb::open(path, &["counts"], &RocksDbOptions::default()) else {
            panic!("a single store's directory opened as a shared RocksDB");
        };
        assert!(
            matches!(
                e,
                OpenError::WrongLayout {
                    found: Layout::Store,
                    wanted: Layout::Shared,
                    ..
                }
            ),
            "{e}"
        );
    }

    // A task's RocksDB of the older layout (a fixture an older kstate wrote).
    let task = dir.path().join("task");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/layouts/v2_task_dir/0");
    copy_dir(&fixture, &task);
    let Err(e) = SharedDb::open(&task, &["counts"], &RocksDbOptions::default()) else {
        panic!("a task's RocksDB opened as a shared one");
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
    let Err(e) = RocksDbStore::open(&task, &RocksDbOptions::default()) else {
        panic!("a task's RocksDB opened as a single store");
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
    let Err(e) = SharedDb::open_existing(dir.path().join("typo"), &RocksDbOptions::default())
    else {
        panic!("a mistyped path opened");
    };
    assert!(matches!(e, OpenError::NotFound { .. }), "{e}");
    assert!(!dir.path().join("typo").exists(), "nothing created");
}

/// A copy of the files of directory `from` (a RocksDB fixture) in `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A flush covers every task: a store whose writes are all in a completed flush returns at
/// once, whichever store's flush it was, and a write through any handle of a store counts.
#[test]
fn a_flush_covers_every_task_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = open(dir.path());
    let (one, two) = (
        state.open_task(1, &STORES).unwrap(),
        state.open_task(2, &STORES).unwrap(),
    );
    let (a, b) = (one.store("counts").unwrap(), two.store("totals").unwrap());
    a.put(b"k", b"1").unwrap();
    b.put(b"k", b"2").unwrap();
    let opened = a.flushed_at();
    std::thread::sleep(Duration::from_millis(5));
    a.flush().unwrap();
    let first = b.flushed_at();
    assert!(
        first > opened,
        "the flush was not recorded for the other task's store"
    );
    std::thread::sleep(Duration::from_millis(5));
    b.flush().unwrap();
    assert_eq!(
        b.flushed_at(),
        first,
        "task 2's write was already flushed: no second flush"
    );
    // A write through another handle of the same store is not covered by the last flush.
    let again = two.store("totals").unwrap();
    again.put(b"j", b"3").unwrap();
    b.flush().unwrap();
    assert!(
        b.flushed_at() > first,
        "a write through another handle was left unflushed"
    );
}

/// Small memtables, so that RocksDB flushes on its own every few hundred rounds.
fn crash_options() -> RocksDbOptions {
    RocksDbOptions::default()
        .memory_budget(MemoryBudget::new(64 << 20, 32 << 20))
        .write_buffer_size(64 << 10)
}

/// The child's part: only does anything when run by the parent below. Round `i` writes key `i`
/// to each store of each task in turn, each with its position `i` in the same batch, and every
/// 1,000th round one task's store flushes (a commit); RocksDB flushes on its own in between.
#[test]
fn crash_child_writes_rounds_to_every_task_until_killed() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let state = StateDir::open(&dir, &STORES, &crash_options()).unwrap();
    let tasks: Vec<TaskDb> = (0..TASKS)
        .map(|t| state.open_task(t, &STORES).unwrap())
        .collect();
    let stores: Vec<RocksDbStore> = tasks
        .iter()
        .flat_map(|t| STORES.iter().map(|s| t.store(s).unwrap()))
        .collect();
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
            stores[round as usize % stores.len()].flush().unwrap();
        }
        if round == 10_000 {
            println!("{}", common::READY);
        }
    }
}

#[test]
fn a_sigkill_mid_flush_leaves_every_task_at_one_consistent_point() {
    for kill in 0..5u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut child = common::spawn_until_ready(
            "crash_child_writes_rounds_to_every_task_until_killed",
            CHILD_ENV,
            dir.path(),
        );
        std::thread::sleep(Duration::from_millis(13 * kill));
        child.kill().unwrap(); // SIGKILL: no destructor, no RocksDB shutdown flush
        assert!(!child.wait().unwrap().success());

        let state = StateDir::open(dir.path(), &STORES, &crash_options()).unwrap();
        let mut positions = Vec::new();
        for task in 0..TASKS {
            let task_db = state.open_task(task, &STORES).unwrap();
            for name in STORES {
                let store = task_db.store(name).unwrap();
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
                    "kill {kill}: task {task} store {name} at position {position} holds {} keys \
                     ({:?}..{:?}), not exactly the rounds up to its position",
                    keys.len(),
                    keys.first(),
                    keys.last()
                );
                positions.push(position);
            }
        }
        // A prefix of the write order: round i reaches the tasks' stores in order.
        let (first, last) = (positions[0], positions[positions.len() - 1]);
        assert!(
            positions.windows(2).all(|w| w[0] >= w[1]) && first - last <= 1,
            "kill {kill}: positions {positions:?} are not one point of the write order"
        );
        // Round 9,999 was flushed explicitly before the child said it was ready.
        assert!(
            first >= 9_999,
            "kill {kill}: flushed rounds were lost: {positions:?}"
        );
        println!("kill {kill}: positions {positions:?}");
    }
}
