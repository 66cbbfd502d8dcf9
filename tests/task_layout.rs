//! A task's stores in one RocksDB, against a real broker: a store the older
//! one-directory-per-store layout left is moved by the one opener
//! ([`StateDir::open_task`](kstate::kstate_rocksdb::StateDir::open_task)) into the RocksDB a
//! process's tasks share with its data and its position (nothing replayed, nothing lost); a
//! task's RocksDB of its own (the layout before the shared one) is moved the same way, and kept
//! while it holds a store the application no longer declares; and a rebuild of one store of a
//! task (records deleted below its position) wipes that store alone. The layouts' bytes as older
//! kstate versions wrote them are tested without a broker, from fixtures
//! (`crates/kstate-rocksdb/tests/layout_fixtures.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{
    ChangelogConfig, Durability, LoggedStore, OpenHooks, RestoredStore, StoreLocation,
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
    let db = TaskDb::open(
        dir.path(),
        &["counts", "totals"],
        &RocksDbOptions::default(),
    )?;
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
    let position = kstate::kstate_kafka::ChangelogPosition::read(&totals_store)?
        .context("totals kept its position")?;
    ensure!(position.offset == 99, "{position:?}");
    Ok(())
}

#[test]
fn a_tasks_own_rocksdb_moves_into_the_shared_one_with_its_positions() -> Result<()> {
    let (counts, totals, other_counts, gone) = (
        unique_topic("move-counts"),
        unique_topic("move-totals"),
        unique_topic("move-counts-1"),
        unique_topic("move-gone"),
    );
    let dir = tempfile::tempdir()?;
    let (first, second) = (dir.path().join("0"), dir.path().join("1"));
    // What kstate wrote before: <app>/<p>, a RocksDB per task. Task 1 also holds a store the
    // application no longer declares.
    for (task, stores) in [
        (
            &first,
            vec![("counts", &counts, 120), ("totals", &totals, 30)],
        ),
        (
            &second,
            vec![("counts", &other_counts, 10), ("gone", &gone, 5)],
        ),
    ] {
        let names: Vec<&str> = stores.iter().map(|(name, _, _)| *name).collect();
        let db = TaskDb::open(task, &names, &RocksDbOptions::default())?;
        for (name, topic, n) in stores {
            let store = LoggedStore::open(
                in_task(&db, name),
                &RocksDbOptions::default(),
                config(topic)?,
            )?;
            common::write_keys(&store, 0..n)?;
            store.close()?;
        }
    }
    let declared = ["counts", "totals"];
    let state = StateDir::open(dir.path(), &declared, &RocksDbOptions::default())?;
    let task = state.open_task(0, &declared)?;
    ensure!(!first.exists(), "the task's old RocksDB is still there");
    for (name, topic, n) in [("counts", &counts, 120), ("totals", &totals, 30)] {
        let restored = RestoredStore::restore(
            in_task(&task, name),
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
        let want: Vec<String> = (0..n).map(|i| format!("key-{i:04}")).collect();
        ensure!(
            keys(&task.store(name)?)? == want,
            "store {name} lost entries in the move"
        );
    }
    ensure!(state.db().tasks()? == vec![0], "only task 0 was moved yet");

    // Task 1's declared store moves; the directory stays, holding the undeclared one.
    let task = state.open_task(1, &declared)?;
    ensure!(
        keys(&task.store("counts")?)?.len() == 10,
        "task 1's counts did not move"
    );
    ensure!(
        second.join("CURRENT").is_file(),
        "a RocksDB holding an undeclared store was deleted"
    );
    drop(task);
    // Opened again: nothing more to move, and the directory is still kept.
    drop(state.open_task(1, &declared)?);
    let left = TaskDb::open_existing(&second, &RocksDbOptions::default())?;
    ensure!(
        keys(&left.store("gone")?)?.len() == 5,
        "the undeclared store lost entries"
    );
    Ok(())
}
