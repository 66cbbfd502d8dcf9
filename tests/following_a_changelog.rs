//! A standby's follower, against a real broker:
//! - a follower that has followed for longer than the topic's `delete.retention.ms` is promoted
//!   (restored) without a rebuild: at the partition's end it stores the offset the end covers
//!   (commit markers included) and a `written_at` of that read, not of its start;
//! - a follower (or restore) waiting for an open transaction to end returns promptly when
//!   cancelled, not at its open timeout;
//! - one follower group follows many tasks' changelogs on as many consumers as a task has
//!   stores, and each store ends holding exactly its changelog.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic
#![allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kstate::kstate_core::KeyValueStore as _;
use kstate::kstate_kafka::{
    CancelToken, ChangelogConfig, FollowerGroup, OpenHooks, RestoreClients, RestoreCluster,
    RestoredStore, follow_changelog,
};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::{bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const TIMEOUT: Duration = Duration::from_secs(30);

fn transactional(id: &str) -> Result<ThreadedProducer<DefaultProducerContext>> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .set("transactional.id", id)
        .create()?;
    producer.init_transactions(TIMEOUT)?;
    Ok(producer)
}

/// Sends `keys` to partition 0 of `topic` in one transaction, and commits it.
fn commit_transaction(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    keys: &[&str],
) -> Result<()> {
    producer.begin_transaction()?;
    for key in keys {
        producer
            .send(BaseRecord::to(topic).partition(0).key(*key).payload("v"))
            .map_err(|(e, _)| e)?;
    }
    producer.commit_transaction(TIMEOUT)?;
    Ok(())
}

fn config(topic: &str) -> Result<ChangelogConfig> {
    Ok(common::changelog(topic)?.open_timeout(Duration::from_secs(20)))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_older_than_delete_retention_resumes_without_a_rebuild() -> Result<()> {
    let topic = unique_topic("old-follower");
    common::create_compacted_topic(&topic, &[("delete.retention.ms", "6000")]).await?;
    let producer = transactional(&format!("{topic}-writer"))?;
    commit_transaction(&producer, &topic, &["a", "b", "c"])?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("standby");
    let stop = CancelToken::new();
    let follower = {
        let (path, config, stop) = (path.clone(), config(&topic)?, stop.clone());
        std::thread::spawn(move || {
            follow_changelog(path, &RocksDbOptions::default(), &config, None, &stop)
        })
    };
    // Past delete.retention.ms since the follower started, the active copy writes again.
    std::thread::sleep(Duration::from_secs(7));
    commit_transaction(&producer, &topic, &["d", "e"])?;
    std::thread::sleep(Duration::from_millis(1500));
    stop.cancel();
    follower.join().expect("the follower panicked")?;
    // The active copy writes once more; then the standby is promoted.
    commit_transaction(&producer, &topic, &["f"])?;
    let restored = RestoredStore::restore(
        path.as_path(),
        &RocksDbOptions::default(),
        config(&topic)?,
        &OpenHooks::default(),
    )?;
    let report = restored.report().clone();
    ensure!(
        report.start.rebuild_reason.is_none(),
        "the standby was rebuilt: {:?}",
        report.start.rebuild_reason
    );
    ensure!(
        report.records == 1,
        "the promotion replayed {} records, expected only f",
        report.records
    );
    restored.close()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_restore_waiting_for_an_open_transaction_returns_promptly() -> Result<()> {
    let topic = unique_topic("held-follower");
    common::create_compacted_topic(&topic, &[]).await?;
    let producer = transactional(&format!("{topic}-writer"))?;
    commit_transaction(&producer, &topic, &["a"])?;
    // An open transaction holds the last stable offset below the end.
    producer.begin_transaction()?;
    producer
        .send(BaseRecord::to(&topic).partition(0).key("open").payload("v"))
        .map_err(|(e, _)| e)?;
    producer.flush(TIMEOUT)?;
    let dir = tempfile::tempdir()?;
    let stop = CancelToken::new();
    let follower = {
        let (path, config, stop) = (dir.path().join("standby"), config(&topic)?, stop.clone());
        std::thread::spawn(move || {
            follow_changelog(path, &RocksDbOptions::default(), &config, None, &stop)
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let cancelled = Instant::now();
    stop.cancel();
    while !follower.is_finished() && cancelled.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = cancelled.elapsed();
    let outcome = follower.join().expect("the follower panicked");
    producer.abort_transaction(TIMEOUT)?;
    ensure!(
        took < Duration::from_millis(1500),
        "a cancelled follower returned {took:?} after the cancel ({outcome:?}); its open \
         timeout is 20 s"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn one_group_follows_many_tasks_on_as_many_consumers_as_a_task_has_stores() -> Result<()> {
    const TASKS: i32 = 12;
    const STORES: usize = 3;
    let topics: Vec<String> = (0..STORES)
        .map(|s| unique_topic(&format!("group-follow-{s}")))
        .collect();
    for topic in &topics {
        common::create_topic(common::client()?, topic, TASKS, "compact").await?;
    }
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?;
    // What each changelog partition holds, key by key (the last value wins).
    let mut expected: BTreeMap<(usize, i32), BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    let mut send = |round: u32| -> Result<()> {
        for (s, topic) in topics.iter().enumerate() {
            for task in 0..TASKS {
                for k in 0..5u32 {
                    let (key, value) = (format!("k{k}"), format!("{round}-{s}-{task}-{k}"));
                    producer
                        .send(
                            BaseRecord::to(topic)
                                .partition(task)
                                .key(&key)
                                .payload(&value),
                        )
                        .map_err(|(e, _)| e)?;
                    expected
                        .entry((s, task))
                        .or_default()
                        .insert(key.into_bytes(), value.into_bytes());
                }
            }
        }
        producer.flush(TIMEOUT)?;
        Ok(())
    };
    // Half the records before the stores restore, half while they are followed.
    send(0)?;
    let configs = |s: usize, task: i32| -> Result<ChangelogConfig> {
        Ok(
            ChangelogConfig::new(bootstrap_servers()?, topics[s].clone(), task)
                .partitions(TASKS)
                .open_timeout(Duration::from_secs(20)),
        )
    };
    let first = configs(0, 0)?;
    let cluster = Arc::new(RestoreCluster::new(&first)?);
    let group = FollowerGroup::new(cluster.clone());
    let clients = RestoreClients::sharing(cluster, &first)?;
    let dir = tempfile::tempdir()?;
    let stop = CancelToken::new();
    let mut following = Vec::new();
    for task in 0..TASKS {
        for s in 0..STORES {
            let path = dir.path().join(format!("store-{s}-{task}"));
            following.push(group.follow(
                path,
                &RocksDbOptions::default(),
                &configs(s, task)?,
                None,
                &stop,
                &clients,
            )?);
        }
    }
    ensure!(
        group.lanes() == STORES,
        "{} tasks of {STORES} stores were followed on {} consumers",
        TASKS,
        group.lanes()
    );
    send(1)?;
    // The followers apply within a sweep; give them time, then stop them.
    std::thread::sleep(Duration::from_secs(3));
    stop.cancel();
    for f in following {
        f.wait()?;
    }
    drop(group);
    for task in 0..TASKS {
        for s in 0..STORES {
            let path = dir.path().join(format!("store-{s}-{task}"));
            let (store, report) = common::open_reporting(&path, configs(s, task)?)?;
            ensure!(
                report.records == 0,
                "store {s} of task {task} replayed {} records on open: the follower missed them",
                report.records
            );
            ensure!(
                common::contents(&store)? == expected[&(s, task)],
                "store {s} of task {task} differs from its changelog"
            );
            store.close()?;
        }
    }
    Ok(())
}
