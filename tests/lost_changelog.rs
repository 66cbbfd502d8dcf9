//! Never delete the only copy: a store whose changelog is missing, empty, or named differently
//! (a deleted topic, a typo, the wrong cluster) is refused with an error that says what to do,
//! and its directory keeps every key. Rebuilding or reseeding are explicit opt-ins.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;
use kstate_bench::topology::count_by_key as count;

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use common::streams::{produce, read_topic, wait_for};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{Durability, LoggedStore, LostChangelog};
use kstate::kstate_rocksdb::{RocksDbOptions, RocksDbStore};
use kstate::kstate_task::{App, AppState};
use kstate_test_broker::{bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

const KEYS: u32 = 50;

/// A store at `path` holding `KEYS` keys, committed and closed, on changelog `topic`.
fn written_store(path: &Path, topic: &str) -> Result<()> {
    let store = LoggedStore::open(
        path,
        &RocksDbOptions::default(),
        common::changelog(topic)?.durability(Durability::Async),
    )?;
    for i in 0..KEYS {
        store.put(format!("key-{i:03}").as_bytes(), b"only copy")?;
    }
    store.close()?;
    Ok(())
}

/// The keys the directory holds, read with RocksDB alone.
fn local_keys(path: &Path) -> Result<usize> {
    let raw = RocksDbStore::open(path, &RocksDbOptions::default())?;
    let n = raw.all()?.count();
    raw.close()?;
    Ok(n)
}

fn reopen(path: &Path, topic: &str) -> Result<LoggedStore> {
    let config = common::changelog(topic)?
        .durability(Durability::Async)
        .open_timeout(Duration::from_secs(10));
    Ok(LoggedStore::open(path, &RocksDbOptions::default(), config)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_changelog_is_neither_recreated_nor_the_store_wiped() -> Result<()> {
    let topic = unique_topic("deleted-topic");
    let dir = tempfile::tempdir()?;
    written_store(dir.path(), &topic)?;
    common::delete_topic(&topic).await?;

    let err = match reopen(dir.path(), &topic) {
        Ok(store) => anyhow::bail!(
            "opened without its changelog: {:?}",
            store.restore_report().start
        ),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&topic), "the error names the topic: {err}");
    assert_eq!(
        local_keys(dir.path())?,
        KEYS as usize,
        "the local copy is kept"
    );
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?;
    let metadata = probe.fetch_metadata(None, Duration::from_secs(10))?;
    assert!(
        !metadata.topics().iter().any(|t| t.name() == topic),
        "the topic was created again"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_recreated_changelog_does_not_wipe_the_store() -> Result<()> {
    let topic = unique_topic("emptied-topic");
    let dir = tempfile::tempdir()?;
    written_store(dir.path(), &topic)?;
    common::delete_topic(&topic).await?;
    common::recreate_topic(&topic).await?;

    let err = match reopen(dir.path(), &topic) {
        Ok(store) => anyhow::bail!(
            "opened on an empty changelog: {:?}",
            store.restore_report().start
        ),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&topic), "{err}");
    assert_eq!(
        local_keys(dir.path())?,
        KEYS as usize,
        "the local copy is kept"
    );
    Ok(())
}

#[test]
fn a_store_of_another_changelog_is_refused_not_wiped() -> Result<()> {
    let (topic, typo) = (unique_topic("right-name"), unique_topic("typo-name"));
    let dir = tempfile::tempdir()?;
    written_store(dir.path(), &topic)?;
    let err = match reopen(dir.path(), &typo) {
        Ok(store) => anyhow::bail!(
            "opened with another changelog: {:?}",
            store.restore_report().start
        ),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&topic) && err.contains(&typo), "{err}");
    assert_eq!(
        local_keys(dir.path())?,
        KEYS as usize,
        "the local copy is kept"
    );
    Ok(())
}

fn reopen_choosing(path: &Path, topic: &str, choice: LostChangelog) -> Result<LoggedStore> {
    let config = common::changelog(topic)?
        .durability(Durability::Async)
        .lost_changelog(choice);
    Ok(LoggedStore::open(path, &RocksDbOptions::default(), config)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn reseed_writes_the_local_store_into_a_new_changelog() -> Result<()> {
    let topic = unique_topic("reseed");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    written_store(&path, &topic)?;
    common::delete_topic(&topic).await?;

    let store = reopen_choosing(&path, &topic, LostChangelog::Reseed)?;
    let held = common::contents(&store)?;
    assert_eq!(held.len(), KEYS as usize);
    let end = common::high_watermark(&topic, 0)?;
    assert_eq!(end, i64::from(KEYS), "one record per key");
    assert_eq!(common::fold_changelog(&topic, 0, end)?, held);
    store.put(b"after-reseed", b"x")?; // lands right after the reseeded records
    store.close()?;
    drop(store);

    // The changelog is whole again: a plain open resumes, and a lost directory rebuilds from it.
    let store = reopen(&path, &topic)?;
    assert_eq!(store.restore_report().records, 0);
    assert!(store.restore_report().start.rebuild_reason.is_none());
    store.close()?;
    drop(store);
    std::fs::remove_dir_all(&path)?;
    let store = reopen(&path, &topic)?;
    assert_eq!(common::contents(&store)?.len(), KEYS as usize + 1);
    store.close()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rebuild_on_a_lost_changelog_is_an_explicit_choice() -> Result<()> {
    let topic = unique_topic("rebuild-choice");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    written_store(&path, &topic)?;
    common::delete_topic(&topic).await?;

    let store = reopen_choosing(&path, &topic, LostChangelog::Rebuild)?;
    let reason = store.restore_report().start.rebuild_reason.clone();
    assert!(reason.is_some(), "the rebuild is reported");
    assert!(
        common::contents(&store)?.is_empty(),
        "rebuilt from an empty changelog"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n != "store")
        .collect();
    assert!(
        leftovers.is_empty(),
        "the wiped copy is gone: {leftovers:?}"
    );
    store.close()?;
    Ok(())
}

#[test]
fn a_plain_rocksdb_directory_is_not_taken_for_a_stale_store() -> Result<()> {
    let topic = unique_topic("plain-rocksdb");
    let dir = tempfile::tempdir()?;
    let raw = RocksDbStore::open(dir.path(), &RocksDbOptions::default())?;
    raw.put(b"precious", b"data")?;
    raw.close()?;
    drop(raw);
    let err = match reopen(dir.path(), &topic) {
        Ok(store) => anyhow::bail!(
            "opened a plain RocksDB directory: {:?}",
            store.restore_report()
        ),
        Err(e) => e,
    };
    assert!(
        matches!(
            err.downcast_ref(),
            Some(kstate::kstate_kafka::ChangelogError::NotAChangelogStore { .. })
        ),
        "{err}"
    );
    assert_eq!(local_keys(dir.path())?, 1);
    Ok(())
}

fn topic_exists(topic: &str) -> Result<bool> {
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?;
    let metadata = probe.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(metadata.topics().iter().any(|t| t.name() == topic))
}

/// The runtime creates the missing changelog topics of the tasks it has no local state for
/// before their restores, all at once; a task that has local state is not one of them: when its
/// changelog was deleted, its restore refuses, the application fails saying so, and the topic is
/// not created again.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_changelog_was_deleted_fails_and_the_runtime_does_not_recreate_it()
-> Result<()> {
    let servers = bootstrap_servers()?;
    let (app_id, input, output) = (
        unique_topic("lost-app"),
        unique_topic("lost-in"),
        unique_topic("lost-out"),
    );
    for topic in [&input, &output] {
        common::create_topic(&servers, topic, 2, "delete").await?;
    }
    let changelog = format!("{app_id}-counts-changelog");
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..40)
        .map(|i| (i % 2, format!("key-{i}").into_bytes(), b"v".to_vec()))
        .collect();
    produce(&servers, &input, &records)?;
    let dir = tempfile::tempdir()?;
    let start = || -> Result<kstate::kstate_task::Running> {
        let mut builder = App::builder(app_id.clone(), servers.clone());
        builder
            .input(input.clone())
            .state_dir(dir.path())
            .commit_interval(Duration::from_millis(50));
        let (app, _) = count::build(&mut builder, &output, false)?;
        Ok(app.start()?)
    };
    let running = start()?;
    wait_for("every output", Duration::from_secs(120), || {
        Ok(read_topic(&servers, &output, 2)?.len() >= records.len())
    })?;
    running.shutdown();
    running.wait()?;
    drop(running);
    assert!(
        topic_exists(&changelog)?,
        "the first run created {changelog}"
    );
    common::delete_topic(&changelog).await?;

    let running = start()?;
    let mut failure = None;
    wait_for("the application to fail", Duration::from_secs(120), || {
        if let AppState::Failed(e) = running.state() {
            failure = Some(e.to_string());
        }
        Ok(failure.is_some())
    })?;
    let failure = failure.unwrap_or_default();
    running.shutdown();
    let _ = running.wait();
    assert!(
        failure.contains(&changelog) && failure.contains("does not exist"),
        "the failure names the missing changelog: {failure}"
    );
    assert!(
        !topic_exists(&changelog)?,
        "{changelog} was created again for tasks that hold positions of the deleted one"
    );
    Ok(())
}
