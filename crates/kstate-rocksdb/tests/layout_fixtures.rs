//! Every storage layout kstate has written, read from the bytes an older kstate left
//! (`tests/fixtures/layouts/`, written once by `write_layout_fixtures.rs` and kept; its README
//! says by which commit): each copy of a store opens as the layout it is and as no other, and
//! holds exactly the entries and metadata `expected.txt` lists. Modelled on fjall's
//! `keyspace_v1_load_fixture`, with two differences: a test reads a copy of the fixture (an open
//! writes RocksDB's MANIFEST and OPTIONS files), and it asserts the contents.
//!
//! These tests pin what the runtime's and the CLI's readers of old layouts must keep reading
//! when the layouts are read by one opener (docs/internals/storage-layouts.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

#[path = "common/layouts.rs"]
mod layouts;

use std::path::{Path, PathBuf};

use kstate_rocksdb::{Layout, OpenError, RocksDbOptions, RocksDbStore, SharedDb, TaskDb};

use layouts::{Copy, FIXTURES, Line, fixtures_dir, lines_of};

/// A copy of fixture `name` in a temporary directory, and its expected lines.
fn fixture(name: &str) -> (tempfile::TempDir, PathBuf, Vec<Line>) {
    let from = fixtures_dir().join(name);
    assert!(
        from.join("expected.txt").is_file(),
        "fixture {} is missing: scripts/write-layout-fixtures writes it",
        from.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(name);
    copy_tree(&from, &root);
    let text = std::fs::read_to_string(root.join("expected.txt")).unwrap();
    let mut expected: Vec<Line> = text.lines().map(|l| Line::parse(l).unwrap()).collect();
    expected.sort();
    (dir, root, expected)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn options() -> RocksDbOptions {
    RocksDbOptions::default()
}

fn has_rocksdb(dir: &Path) -> bool {
    dir.join("CURRENT").is_file()
}

fn task_dirs(root: &Path) -> Vec<(u32, PathBuf)> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let task = p.file_name()?.to_str()?.parse().ok()?;
            p.is_dir().then_some((task, p))
        })
        .collect();
    dirs.sort();
    dirs
}

/// Everything fixture `root` holds, read with the opener of each layout: the shared RocksDB at
/// `rocksdb/`, each task's RocksDB at `<p>/`, each store's RocksDB at `<p>/<s>/`.
fn read_all(root: &Path) -> Vec<Line> {
    let mut lines = Vec::new();
    let shared = root.join("rocksdb");
    if has_rocksdb(&shared) {
        let db = SharedDb::open_existing(&shared, &options()).unwrap();
        for task in db.tasks().unwrap() {
            let part = db.task(task, root.join(task.to_string())).unwrap();
            for store in db.stores() {
                let handle = part.store(&store).unwrap();
                lines.extend(lines_of(&Copy::Shared { task }, &store, &handle));
            }
        }
    }
    for (task, dir) in task_dirs(root) {
        if has_rocksdb(&dir) {
            let db = TaskDb::open_existing(&dir, &options()).unwrap();
            for store in db.stores() {
                let handle = db.store(&store).unwrap();
                lines.extend(lines_of(&Copy::TaskDir { task }, &store, &handle));
            }
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && has_rocksdb(&path) {
                let store = path.file_name().unwrap().to_str().unwrap().to_string();
                let handle = RocksDbStore::open(&path, &options()).unwrap();
                lines.extend(lines_of(&Copy::StoreDir { task }, &store, &handle));
            }
        }
    }
    lines.sort();
    lines
}

#[test]
fn every_fixture_reads_back_exactly_what_its_writer_held() {
    for name in FIXTURES {
        let (_dir, root, expected) = fixture(name);
        let read = read_all(&root);
        assert_eq!(
            read.iter().map(ToString::to_string).collect::<Vec<_>>(),
            expected.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "fixture {name}"
        );
        // Reading changed nothing a second read sees.
        assert_eq!(read_all(&root), read, "fixture {name}, read again");
    }
}

fn wrong_layout(result: Result<impl Sized, OpenError>) -> (Layout, Layout) {
    match result {
        Err(OpenError::WrongLayout { found, wanted, .. }) => (found, wanted),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("opened as another layout"),
    }
}

#[test]
fn each_old_layout_opens_as_itself_and_as_no_other() {
    let (_dir, root, _) = fixture("v1_store_dirs");
    let store_dir = root.join("0").join("counts");
    assert_eq!(
        wrong_layout(TaskDb::open_existing(&store_dir, &options())),
        (Layout::Store, Layout::Task)
    );
    assert_eq!(
        wrong_layout(SharedDb::open_existing(&store_dir, &options())),
        (Layout::Store, Layout::Shared)
    );

    let (_dir, root, _) = fixture("v2_task_dir");
    let task_dir = root.join("0");
    assert_eq!(
        wrong_layout(RocksDbStore::open(&task_dir, &options())),
        (Layout::Task, Layout::Store)
    );
    assert_eq!(
        wrong_layout(SharedDb::open_existing(&task_dir, &options())),
        (Layout::Task, Layout::Shared)
    );

    let (_dir, root, _) = fixture("v3_shared");
    let shared = root.join("rocksdb");
    assert_eq!(
        wrong_layout(RocksDbStore::open(&shared, &options())),
        (Layout::Shared, Layout::Store)
    );
    assert_eq!(
        wrong_layout(TaskDb::open_existing(&shared, &options())),
        (Layout::Shared, Layout::Task)
    );
}

#[test]
fn a_task_rocksdb_cut_short_before_its_layout_record_opens_as_a_tasks_with_nothing_in_it() {
    let (_dir, root, expected) = fixture("v2_cut_short");
    assert!(expected.is_empty());
    let task_dir = root.join("0");
    assert_eq!(
        wrong_layout(RocksDbStore::open(&task_dir, &options())),
        (Layout::Task, Layout::Store)
    );
    let db = TaskDb::open_existing(&task_dir, &options()).unwrap();
    assert_eq!(db.stores(), vec!["counts"]);
    assert!(
        lines_of(
            &Copy::TaskDir { task: 0 },
            "counts",
            &db.store("counts").unwrap()
        )
        .is_empty()
    );
}

#[test]
fn a_move_cut_short_leaves_both_copies_and_the_shared_one_is_the_newer() {
    let (_dir, root, expected) = fixture("v3_mid_move");
    let of = |copy: Copy| -> Vec<&Line> { expected.iter().filter(|l| l.copy == copy).collect() };
    let (old, new) = (of(Copy::TaskDir { task: 0 }), of(Copy::Shared { task: 0 }));
    assert_eq!(old.len(), new.len());
    assert!(!new.is_empty());
    let offset = |lines: &[&Line]| {
        lines
            .iter()
            .find(|l| l.meta && l.store == "counts" && l.key == b"kstate.changelog.offset")
            .map(|l| i64::from_be_bytes(l.value.clone().try_into().unwrap()))
            .unwrap()
    };
    assert!(offset(&new) > offset(&old));
    let shared = SharedDb::open_existing(root.join("rocksdb"), &options()).unwrap();
    assert_eq!(shared.tasks().unwrap(), vec![0]);
    assert!(shared.has_state(0).unwrap());
}

#[test]
fn a_store_the_application_no_longer_declares_is_still_in_its_task_rocksdb() {
    let (_dir, root, expected) = fixture("v2_undeclared_store");
    let db = TaskDb::open_existing(root.join("0"), &options()).unwrap();
    assert_eq!(db.stores(), vec!["counts", "events", "retired"]);
    assert!(expected.iter().any(|l| l.store == "retired" && !l.meta));
    assert!(
        expected.iter().all(|l| l.store != "events"),
        "events has a column family and nothing in it"
    );
}
