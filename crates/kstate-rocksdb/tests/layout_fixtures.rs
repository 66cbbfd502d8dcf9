//! Every storage layout kstate has written, read from the bytes an older kstate left
//! (`tests/fixtures/layouts/`, written once and kept; its README says by which commit): each
//! copy of a store opens as the layout it is and as no other, and holds exactly the entries and
//! metadata `expected.txt` lists. Modelled on fjall's
//! `keyspace_v1_load_fixture`, with two differences: a test reads a copy of the fixture (an open
//! writes RocksDB's MANIFEST and OPTIONS files), and it asserts the contents.
//!
//! These tests pin what the runtime's and the CLI's readers of old layouts must keep reading
//! when the layouts are read by one opener (docs/internals/storage-layouts.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

#[path = "common/layouts.rs"]
mod layouts;

use std::path::{Path, PathBuf};

use kstate_rocksdb::{
    Layout, OpenError, RocksDbOptions, RocksDbStore, SharedDb, StateDir, StorePath, migrate,
};

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

/// How the fixtures' lines name task `task`'s copy in `layout`.
fn copy_of(layout: Layout, task: u32) -> Copy {
    match layout {
        Layout::Store => Copy::StoreDir { task },
        Layout::Task => Copy::TaskDir { task },
        Layout::Shared => Copy::Shared { task },
    }
}

/// Everything fixture `root` holds: every copy of every store of every task
/// ([`StateDir::copies`]), in the shared RocksDB at `rocksdb/`, each task's RocksDB at `<p>/`,
/// each store's RocksDB at `<p>/<s>/`.
fn read_all(root: &Path) -> Vec<Line> {
    let mut tasks = std::collections::BTreeMap::<u32, Vec<String>>::new();
    let shared = root.join("rocksdb");
    if has_rocksdb(&shared) {
        let db = SharedDb::open_existing(&shared, &options()).unwrap();
        for task in db.tasks().unwrap() {
            tasks.entry(task).or_default().extend(db.stores());
        }
    }
    for (task, dir) in task_dirs(root) {
        let stores = tasks.entry(task).or_default();
        stores.extend(migrate::task_dir_stores(&dir, &options()).unwrap());
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && has_rocksdb(&path) {
                stores.push(path.file_name().unwrap().to_str().unwrap().to_string());
            }
        }
    }
    let mut lines = Vec::new();
    for (task, mut stores) in tasks {
        stores.sort();
        stores.dedup();
        for store in stores {
            let at = StorePath {
                root: root.to_path_buf(),
                task,
                store: store.clone(),
            };
            for copy in StateDir::copies(&at, &options()).unwrap() {
                lines.extend(lines_of(&copy_of(copy.layout, task), &store, &copy.store));
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

/// Opens `path` with the public opener of `layout` (layout 2 has none: it is only read, to be
/// moved); the layout an error says it found, if any.
fn open_as(layout: Layout, path: &Path) -> Result<(), OpenError> {
    match layout {
        Layout::Store => RocksDbStore::open(path, &options()).map(drop),
        Layout::Shared => SharedDb::open_existing(path, &options()).map(drop),
        Layout::Task => unreachable!("no public opener of layout 2"),
    }
}

#[test]
fn each_old_layout_opens_as_itself_and_as_no_other() {
    let openers = [Layout::Store, Layout::Shared];
    for (name, at, layout) in [
        ("v1_store_dirs", "0/counts", Layout::Store),
        ("v2_task_dir", "0", Layout::Task),
        ("v3_shared", "rocksdb", Layout::Shared),
    ] {
        let (_dir, root, _) = fixture(name);
        for other in openers.into_iter().filter(|l| *l != layout) {
            assert_eq!(
                wrong_layout(open_as(other, &root.join(at))),
                (layout, other),
                "fixture {name} opened as {other}"
            );
        }
        if openers.contains(&layout) {
            open_as(layout, &root.join(at)).unwrap();
        }
    }
}

/// The copies of task `task`'s store `store` in fixture `root`, by layout, with their lines.
fn copies(root: &Path, task: u32, store: &str) -> Vec<(Layout, Vec<String>)> {
    let at = StorePath {
        root: root.to_path_buf(),
        task,
        store: store.to_string(),
    };
    StateDir::copies(&at, &options())
        .unwrap()
        .into_iter()
        .map(|copy| {
            let mut lines: Vec<String> = lines_of(&copy_of(copy.layout, task), store, &copy.store)
                .iter()
                .map(ToString::to_string)
                .collect();
            lines.sort();
            (copy.layout, lines)
        })
        .collect()
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
    assert_eq!(
        migrate::task_dir_stores(&task_dir, &options()).unwrap(),
        vec!["counts"]
    );
    assert_eq!(copies(&root, 0, "counts"), vec![(Layout::Task, vec![])]);
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
    assert_eq!(
        migrate::task_dir_stores(&root.join("0"), &options()).unwrap(),
        vec!["counts", "events", "retired"]
    );
    assert!(expected.iter().any(|l| l.store == "retired" && !l.meta));
    assert!(
        expected.iter().all(|l| l.store != "events"),
        "events has a column family and nothing in it"
    );
}

// ----- the one opener: every layout moved into the shared RocksDB -----

const DECLARED: [&str; 2] = ["counts", "events"];

/// The lines of `expected` of `copy`, as they read once moved into task `task` of the shared
/// RocksDB.
fn moved(expected: &[Line], copy: Copy, store: &str) -> Vec<String> {
    let task = match copy {
        Copy::StoreDir { task } | Copy::TaskDir { task } | Copy::Shared { task } => task,
    };
    let mut lines: Vec<String> = expected
        .iter()
        .filter(|l| l.copy == copy && l.store == store)
        .map(|l| {
            Line {
                copy: Copy::Shared { task },
                ..l.clone()
            }
            .to_string()
        })
        .collect();
    lines.sort();
    lines
}

/// Opens task `task` of fixture `root` with the one opener; returns each declared store's lines.
fn open_task(state: &StateDir, task: u32, store: &str) -> Vec<String> {
    let part = state.open_task(task, &DECLARED).unwrap();
    let lines = lines_of(&Copy::Shared { task }, store, &part.store(store).unwrap());
    let mut lines: Vec<String> = lines.iter().map(ToString::to_string).collect();
    lines.sort();
    lines
}

/// Which copy of task `t`'s store `s` the opener keeps, for the fixtures with older copies:
/// (fixture, its tasks, the copy for (t, s)).
type Kept = (&'static str, &'static [u32], fn(u32, &str) -> Copy);
const KEPT: [Kept; 4] = [
    ("v1_store_dirs", &[0, 1], |task, _| Copy::StoreDir { task }),
    ("v2_task_dir", &[0, 1], |task, _| Copy::TaskDir { task }),
    ("v2_with_v1_inside", &[0], |task, store| match store {
        "counts" => Copy::TaskDir { task },
        _ => Copy::StoreDir { task },
    }),
    ("v3_mid_move", &[0], |task, _| Copy::Shared { task }),
];

#[test]
fn the_opener_moves_every_older_layout_into_the_shared_rocksdb_and_deletes_the_older_copies() {
    for (name, tasks, source) in KEPT {
        let (_dir, root, expected) = fixture(name);
        // The second open finds nothing more to move, and changes nothing.
        for round in ["opened", "opened again"] {
            let state = StateDir::open(&root, &DECLARED, &options()).unwrap();
            for &task in tasks {
                for store in DECLARED {
                    assert_eq!(
                        open_task(&state, task, store),
                        moved(&expected, source(task, store), store),
                        "fixture {name} {round}, task {task}, store {store}"
                    );
                }
                assert!(
                    !root.join(task.to_string()).exists(),
                    "fixture {name} {round}: task {task}'s older directory is gone"
                );
            }
        }
    }
}

#[test]
fn a_move_cut_short_keeps_the_shared_copy_and_deletes_the_older_one() {
    let (_dir, root, expected) = fixture("v3_mid_move");
    let state = StateDir::open(&root, &DECLARED, &options()).unwrap();
    for store in DECLARED {
        assert_eq!(
            open_task(&state, 0, store),
            moved(&expected, Copy::Shared { task: 0 }, store),
            "{store}: the shared copy, not the older directory's"
        );
    }
    assert!(!root.join("0").exists());
}

#[test]
fn a_task_directory_holding_an_undeclared_store_is_kept_after_its_declared_stores_moved() {
    let (_dir, root, expected) = fixture("v2_undeclared_store");
    let state = StateDir::open(&root, &DECLARED, &options()).unwrap();
    assert_eq!(
        open_task(&state, 0, "counts"),
        moved(&expected, Copy::TaskDir { task: 0 }, "counts")
    );
    assert!(open_task(&state, 0, "events").is_empty());
    drop(state);
    assert_eq!(
        migrate::task_dir_stores(&root.join("0"), &options()).unwrap(),
        vec!["counts", "events", "retired"]
    );
    let retired = {
        let mut lines: Vec<String> = expected
            .iter()
            .filter(|l| l.store == "retired")
            .map(ToString::to_string)
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(copies(&root, 0, "retired"), vec![(Layout::Task, retired)]);
}

#[test]
fn a_task_rocksdb_cut_short_is_moved_as_empty_stores_and_deleted() {
    let (_dir, root, _) = fixture("v2_cut_short");
    let state = StateDir::open(&root, &DECLARED, &options()).unwrap();
    assert!(
        state.has_state(0),
        "its directory counts as state until moved"
    );
    for store in DECLARED {
        assert!(open_task(&state, 0, store).is_empty());
    }
    assert!(!root.join("0").exists());
    assert!(!state.has_state(0));
}

#[test]
fn a_shared_rocksdb_of_today_opens_each_task_unchanged() {
    let (_dir, root, expected) = fixture("v3_shared");
    let state = StateDir::open(&root, &DECLARED, &options()).unwrap();
    for task in [0, 1, 7] {
        assert!(state.has_state(task));
        for store in DECLARED {
            assert_eq!(
                open_task(&state, task, store),
                moved(&expected, Copy::Shared { task }, store)
            );
        }
    }
    assert!(!state.has_state(2));
}

#[test]
fn a_store_of_the_oldest_layout_left_undeclared_inside_a_task_directory_keeps_it() {
    // `events` is not declared: its layout 1 directory inside `0/` is not ours to delete, so
    // `0/` stays too (with a warning), after `counts` moved.
    let (_dir, root, expected) = fixture("v2_with_v1_inside");
    let state = StateDir::open(&root, &["counts"], &options()).unwrap();
    let part = state.open_task(0, &["counts"]).unwrap();
    let counts = lines_of(
        &Copy::Shared { task: 0 },
        "counts",
        &part.store("counts").unwrap(),
    );
    let mut counts: Vec<String> = counts.iter().map(ToString::to_string).collect();
    counts.sort();
    assert_eq!(
        counts,
        moved(&expected, Copy::TaskDir { task: 0 }, "counts")
    );
    drop(part);
    assert!(root.join("0").join("CURRENT").is_file(), "0/ was kept");
    assert!(
        root.join("0").join("events").join("CURRENT").is_file(),
        "the undeclared store was kept"
    );
    // Opened again: kept again, not an error.
    drop(state.open_task(0, &["counts"]).unwrap());
}

// ----- reading a store for operators: the copy the opener keeps, nothing moved -----

fn read_store(root: &Path, task: u32, store: &str) -> Result<Vec<String>, OpenError> {
    let at = StorePath {
        root: root.to_path_buf(),
        task,
        store: store.to_string(),
    };
    let read = StateDir::read_store(&at, &options())?;
    let mut lines: Vec<String> = lines_of(&Copy::Shared { task }, store, &read)
        .iter()
        .map(ToString::to_string)
        .collect();
    lines.sort();
    Ok(lines)
}

#[test]
fn reading_a_store_finds_the_copy_the_opener_keeps_and_moves_nothing() {
    for (name, tasks, source) in KEPT {
        let (_dir, root, expected) = fixture(name);
        for &task in tasks {
            for store in DECLARED {
                assert_eq!(
                    read_store(&root, task, store).unwrap(),
                    moved(&expected, source(task, store), store),
                    "fixture {name}, task {task}, store {store}"
                );
            }
        }
        assert_eq!(
            read_all(&root)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            expected.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "fixture {name}: reading moved or changed nothing"
        );
    }
}

#[test]
fn a_store_no_layout_holds_is_an_error_naming_what_the_task_holds() {
    let (_dir, root, _) = fixture("v2_task_dir");
    let error = read_store(&root, 0, "nope").unwrap_err();
    assert!(
        matches!(&error, OpenError::NoSuchStore { store, held, .. } if store == "nope" && held == &["counts", "events"]),
        "{error}"
    );
}

#[test]
fn a_path_names_a_store_of_a_task_only_where_a_layout_holds_task_stores() {
    let (_dir, root, _) = fixture("v3_shared");
    assert_eq!(
        StateDir::parse_store_path(&root.join("7").join("counts")),
        Some(StorePath {
            root: root.clone(),
            task: 7,
            store: "counts".into(),
        })
    );
    assert_eq!(
        StateDir::parse_store_path(&root.join("x").join("counts")),
        None
    );
    let (_dir, root, _) = fixture("v1_store_dirs");
    assert_eq!(
        StateDir::parse_store_path(&root.join("0").join("counts")),
        None,
        "layout 1 alone: a store directory of its own"
    );
    let (_dir, root, _) = fixture("v2_task_dir");
    assert!(StateDir::parse_store_path(&root.join("1").join("events")).is_some());
}
