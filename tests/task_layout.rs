//! A task's stores in one RocksDB, against a real broker: a store the older
//! one-directory-per-store layout left is moved by the one opener
//! ([`StateDir::open_task`](kstate::kstate_rocksdb::StateDir::open_task)) into the RocksDB a
//! process's tasks share with its data and its position (nothing replayed, nothing lost); a
//! task's RocksDB of its own (the layout before the shared one, as an older kstate wrote it: a
//! fixture) is moved the same way, its positions read back as kstate-kafka reads them; and a
//! rebuild of one store of a task (records deleted below its position) wipes that store alone.
//! Every layout's bytes as older kstate versions wrote them are tested from the fixtures
//! (`crates/kstate-rocksdb/tests/layout_fixtures.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::path::Path;

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{
    ChangelogConfig, ChangelogPosition, Durability, LoggedStore, OpenHooks, RestoredStore,
    StoreLocation,
};
use kstate::kstate_rocksdb::{RocksDbOptions, StateDir, TaskDb};
use kstate_test_broker::{bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::{Offset, TopicPartitionList};

fn config(topic: &str) -> Result<ChangelogConfig> {
    Ok(common::changelog(topic)?.durability(Durability::Async))
}

fn keys(store: &dyn KeyValueStore) -> Result<Vec<String>> {
    store.all()?.map(|e| Ok(String::from_utf8(e?.0)?)).collect()
}

fn in_task(db: &TaskDb, name: &str) -> StoreLocation {
    StoreLocation::InTask {
        db: db.clone(),
        name: name.into(),
    }
}

#[test]
fn a_store_of_the_oldest_layout_moves_into_the_shared_rocksdb_with_its_position() -> Result<()> {
    let (counts, totals) = (unique_topic("adopt-counts"), unique_topic("adopt-totals"));
    let dir = tempfile::tempdir()?;
    let task = dir.path().join("0");
    // What kstate wrote before: <task>/<store>, one RocksDB each.
    for (name, topic, n) in [("counts", &counts, 120), ("totals", &totals, 30)] {
        let store = LoggedStore::open(task.join(name), &RocksDbOptions::default(), config(topic)?)?;
        common::write_keys(&store, 0..n)?;
        store.close()?;
    }

    let stores = ["counts", "totals"];
    let state = StateDir::open(dir.path(), &stores, &RocksDbOptions::default())?;
    let db = state.open_task(0, &stores)?;
    for (name, topic, n) in [("counts", &counts, 120), ("totals", &totals, 30)] {
        let restored = RestoredStore::restore(
            in_task(&db, name),
            &RocksDbOptions::default(),
            config(topic)?,
            &OpenHooks::default(),
        )?;
        let report = restored.report().clone();
        ensure!(
            report.start.rebuild_reason.is_none() && report.records == 0,
            "store {name} was replayed instead of moved: {report:?}"
        );
        ensure!(
            report.start.start_offset == n as i64,
            "store {name} resumed at {} instead of after its position {}",
            report.start.start_offset,
            n - 1
        );
        restored.close()?;
        ensure!(
            !task.join(name).exists(),
            "the old directory of {name} is still there"
        );
        let store = db.store(name)?;
        let want: Vec<String> = (0..n).map(|i| format!("key-{i:04}")).collect();
        ensure!(
            keys(&store)? == want,
            "store {name} lost entries in the move"
        );
    }
    ensure!(
        !task.exists(),
        "the task's emptied directory is still there"
    );
    // Written to after the move, and reopened: the new layout holds.
    drop((db, state));
    let state = StateDir::open(dir.path(), &stores, &RocksDbOptions::default())?;
    let db = state.open_task(0, &stores)?;
    let store = LoggedStore::open(
        in_task(&db, "counts"),
        &RocksDbOptions::default(),
        config(&counts)?,
    )?;
    ensure!(
        store.restore_report().records == 0,
        "{:?}",
        store.restore_report()
    );
    common::write_keys(&store, 120..130)?;
    store.close()?;
    drop(store);
    let store = db.store("counts")?;
    ensure!(keys(&store)?.len() == 130);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rebuild_of_one_store_of_a_task_leaves_its_other_stores_alone() -> Result<()> {
    let (counts, totals) = (
        unique_topic("rebuild-counts"),
        unique_topic("rebuild-totals"),
    );
    common::create_topic(&bootstrap_servers()?, &counts, 1, "compact,delete").await?;
    let dir = tempfile::tempdir()?;
    let stores = ["counts", "totals"];
    let state = StateDir::open(dir.path(), &stores, &RocksDbOptions::default())?;
    let db = state.open_task(0, &stores)?;
    for (name, topic) in [("counts", &counts), ("totals", &totals)] {
        let store = LoggedStore::open(
            in_task(&db, name),
            &RocksDbOptions::default(),
            config(topic)?,
        )?;
        common::write_keys(&store, 0..100)?; // offsets 0..=99
        store.close()?;
    }
    // Another writer moves the changelog on (offsets 100..=149), and the records up to 119 are
    // deleted: the counts store's position (99) is below what the log still has, so it must
    // rebuild.
    let other = LoggedStore::open(
        dir.path().join("elsewhere"),
        &RocksDbOptions::default(),
        config(&counts)?,
    )?;
    common::write_keys(&other, 100..150)?;
    other.close()?;
    drop(other);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?;
    let mut before = TopicPartitionList::new();
    before.add_partition_offset(&counts, 0, Offset::Offset(120))?;
    admin.delete_records(&before, &AdminOptions::new()).await?;

    let store = LoggedStore::open(
        in_task(&db, "counts"),
        &RocksDbOptions::default(),
        config(&counts)?,
    )?;
    let report = store.restore_report();
    ensure!(
        report.start.rebuild_reason.is_some() && report.start.start_offset == 120,
        "expected a rebuild from offset 120: {report:?}"
    );
    let want: Vec<String> = (120..150).map(|i| format!("key-{i:04}")).collect();
    ensure!(
        keys(&store)? == want,
        "the rebuilt store holds what the log still has"
    );
    store.close()?;
    drop(store);
    let totals_store = db.store("totals")?;
    ensure!(
        keys(&totals_store)?.len() == 100,
        "the rebuild of counts touched totals"
    );
    let position = ChangelogPosition::read(&totals_store)?.context("totals kept its position")?;
    ensure!(position.offset == 99, "{position:?}");
    Ok(())
}

/// A copy of directory `from` (a storage layout fixture) at `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// A task's own RocksDB (layout 2, as an older kstate wrote it: the `v2_task_dir` fixture of
/// `crates/kstate-rocksdb/tests/fixtures/layouts`) moves into the shared RocksDB with each
/// store's changelog position, read back as kstate-kafka reads it, and its entries.
#[test]
fn a_tasks_own_rocksdb_moves_into_the_shared_one_with_its_positions() -> Result<()> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/kstate-rocksdb/tests/fixtures/layouts/v2_task_dir");
    let dir = tempfile::tempdir()?;
    copy_tree(&fixture, dir.path())?;
    let declared = ["counts", "events"];
    let state = StateDir::open(dir.path(), &declared, &RocksDbOptions::default())?;
    for task in [0u32, 1] {
        let db = state.open_task(task, &declared)?;
        ensure!(
            !dir.path().join(task.to_string()).exists(),
            "task {task}'s old RocksDB is still there"
        );
        for (name, topic) in [
            ("counts", "app-counts-changelog"),
            ("events", "app-events-changelog"),
        ] {
            let store = db.store(name)?;
            let position = ChangelogPosition::read(&store)?
                .with_context(|| format!("task {task}'s {name} lost its position"))?;
            // In the fixtures a store's offset is its generation * 100 + 41 (generation 20).
            let offset = 2041 + 100 * i64::from(task);
            ensure!(
                position.topic == topic
                    && position.partition == task as i32
                    && position.offset == offset,
                "task {task}'s {name}: {position:?}"
            );
            ensure!(
                !keys(&store)?.is_empty(),
                "task {task}'s {name} lost its entries"
            );
        }
    }
    Ok(())
}
