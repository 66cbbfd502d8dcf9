//! A standby's follower, against a real broker:
//! - a follower that has followed for longer than the topic's `delete.retention.ms` is promoted
//!   (restored) without a rebuild: at the partition's end it stores the offset the end covers
//!   (commit markers included) and a `written_at` of that read, not of its start;
//! - a follower (or restore) waiting for an open transaction to end returns promptly when
//!   cancelled, not at its open timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic
#![allow(clippy::result_large_err)] // kstate-kafka's own error, returned as it is

mod common;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kstate::kstate_kafka::{
    CancelToken, ChangelogConfig, OpenHooks, RestoredStore, follow_changelog,
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
