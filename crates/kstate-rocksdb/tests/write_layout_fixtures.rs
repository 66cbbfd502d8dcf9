//! Writes the layout fixtures (`tests/fixtures/layouts/`) with the code of the commit it is built
//! from: `scripts/write-layout-fixtures [COMMIT]` runs it (`KSTATE_WRITE_FIXTURES=<dir>`) and
//! copies the result into the source tree, where `layout_fixtures.rs` reads it. The fixtures are
//! written once, by the code that wrote each layout in production, and kept: a later reader is
//! tested against the bytes an older kstate left, not against what today's writer would write.
//! This file uses writers that a later kstate no longer has; when they go, it goes, and the
//! script checks out the commit that still has them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a tool run by hand: a failure is a panic

#[path = "common/layouts.rs"]
mod layouts;

use std::path::{Path, PathBuf};

use kstate_core::KeyValueStore;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore, SharedDb, TaskDb, rocksdb};

use layouts::{Copy, FIXTURES, Line, lines_of};

const OUT_ENV: &str = "KSTATE_WRITE_FIXTURES";

#[test]
#[ignore = "writes the layout fixtures: scripts/write-layout-fixtures"]
fn write_layout_fixtures() {
    let out =
        PathBuf::from(std::env::var(OUT_ENV).expect("KSTATE_WRITE_FIXTURES names a directory"));
    for name in FIXTURES {
        let root = out.join(name);
        assert!(!root.exists(), "{} exists already", root.display());
        std::fs::create_dir_all(&root).unwrap();
        let mut lines = write(name, &root);
        lines.sort();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(root.join("expected.txt"), text).unwrap();
        // What RocksDB writes for the process that held it: not part of the layout.
        for entry in walk(&root) {
            let file = entry.file_name().unwrap().to_string_lossy().into_owned();
            if file == "LOCK" || file.starts_with("LOG") {
                std::fs::remove_file(&entry).unwrap();
            }
        }
    }
}

/// Writes fixture `name` into `root` (`<state-dir>/<app-id>`); returns what it holds.
fn write(name: &str, root: &Path) -> Vec<Line> {
    let both = ["counts", "events"];
    match name {
        "v1_store_dirs" => {
            let mut lines = Vec::new();
            for task in [0, 1] {
                for store in both {
                    lines.extend(store_dir(root, task, store, 10 + task));
                }
            }
            lines
        }
        "v2_task_dir" => [0, 1]
            .into_iter()
            .flat_map(|task| task_dir(root, task, &both, &both, 20 + task))
            .collect(),
        "v2_with_v1_inside" => {
            // An older kstate's `<p>/events/` left inside the task's RocksDB, which holds only
            // `counts` (a v1 store adopted per store at its restore, the other never restored).
            let mut lines = task_dir(root, 0, &["counts"], &["counts"], 30);
            lines.extend(store_dir(root, 0, "events", 31));
            lines
        }
        "v2_undeclared_store" => {
            // `retired`: a store the application no longer declares; its data must be kept.
            task_dir(
                root,
                0,
                &["counts", "events", "retired"],
                &["counts", "retired"],
                40,
            )
        }
        "v2_cut_short" => {
            // Killed between creating the task's RocksDB (its column families) and writing its
            // layout record: no record, no data.
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let path = root.join("0");
            drop(rocksdb::DB::open_cf(&opts, &path, ["kstate_meta", "store.counts"]).unwrap());
            Vec::new()
        }
        "v3_mid_move" => {
            // Killed after copying task 0 into the shared RocksDB and before deleting `<p>/`:
            // both copies are there, the shared one newer.
            let mut lines = task_dir(root, 0, &both, &both, 50);
            lines.extend(shared(root, &[0], &both, 51));
            lines
        }
        "v3_shared" => shared(root, &[0, 1, 7], &both, 60),
        other => panic!("no fixture {other}"),
    }
}

/// Layout 1: `<root>/<task>/<store>/`.
fn store_dir(root: &Path, task: u32, store: &str, generation: u32) -> Vec<Line> {
    let db = RocksDbStore::open(root.join(task.to_string()).join(store), &options()).unwrap();
    fill(&db, store, task, generation);
    let lines = lines_of(&Copy::StoreDir { task }, store, &db);
    db.close().unwrap();
    lines
}

/// Layout 2: `<root>/<task>/` with column families for `stores`, of which `filled` hold data.
fn task_dir(
    root: &Path,
    task: u32,
    stores: &[&str],
    filled: &[&str],
    generation: u32,
) -> Vec<Line> {
    let db = TaskDb::open(root.join(task.to_string()), stores, &options()).unwrap();
    let mut lines = Vec::new();
    for store in filled {
        let handle = db.store(store).unwrap();
        fill(&handle, store, task, generation);
        lines.extend(lines_of(&Copy::TaskDir { task }, store, &handle));
        handle.close().unwrap();
    }
    lines
}

/// Layout 3: `<root>/rocksdb/`, holding `tasks`.
fn shared(root: &Path, tasks: &[u32], stores: &[&str], generation: u32) -> Vec<Line> {
    let db = SharedDb::open(root.join("rocksdb"), stores, &options()).unwrap();
    let mut lines = Vec::new();
    for &task in tasks {
        let part = db.task(task, root.join(task.to_string())).unwrap();
        for store in stores {
            let handle = part.store(store).unwrap();
            fill(&handle, store, task, generation);
            lines.extend(lines_of(&Copy::Shared { task }, store, &handle));
            handle.close().unwrap();
        }
    }
    lines
}

/// Three entries and a changelog position like the one kstate-kafka keeps (`position.rs`),
/// each naming the store, the task and `generation`, so that a reader shows which copy it read.
fn fill(store: &RocksDbStore, name: &str, task: u32, generation: u32) {
    let entries: Vec<(Vec<u8>, Vec<u8>)> = ["apple", "kiwi", "pear"]
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let value = format!("{name}/{task}/{generation}/{i}");
            (key.as_bytes().to_vec(), value.into_bytes())
        })
        .collect();
    let topic = format!("app-{name}-changelog");
    let partition = (task as i32).to_be_bytes();
    let offset = (i64::from(generation) * 100 + 41).to_be_bytes();
    let written_at = 1_764_000_000_000_i64.to_be_bytes();
    let metadata: [(&[u8], Option<&[u8]>); 5] = [
        (b"kstate.format.version", Some(&1_u32.to_be_bytes())),
        (b"kstate.changelog.topic", Some(topic.as_bytes())),
        (b"kstate.changelog.partition", Some(&partition)),
        (b"kstate.changelog.offset", Some(&offset)),
        (b"kstate.changelog.written_at_ms", Some(&written_at)),
    ];
    store
        .write_with_metadata(
            entries
                .iter()
                .map(|(k, v)| (k.as_slice(), Some(v.as_slice()))),
            &metadata,
        )
        .unwrap();
    store.flush().unwrap();
}

fn options() -> RocksDbOptions {
    RocksDbOptions::default()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
