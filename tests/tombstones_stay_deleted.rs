//! Tombstones must not come back: a key deleted (and committed, but never explicitly flushed)
//! stays deleted after a SIGKILL, even once compaction has removed its tombstone from the
//! changelog. RocksDB has no age-based memtable flush, so without the store's flush timer the
//! durable position stays where the last explicit flush left it, before the delete, and a replay
//! from there no longer sees the tombstone.
//!
//! The child is this test binary run again with `KSTATE_TOMBSTONE_DIR` set: it puts the key,
//! flushes, deletes it, commits, then writes other keys until killed. The parent waits until
//! compaction has removed every record of the key from the changelog, kills the child, reopens.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{Durability, LoggedStore};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::{bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

const DIR_ENV: &str = "KSTATE_TOMBSTONE_DIR";
const TOPIC_ENV: &str = "KSTATE_TOMBSTONE_TOPIC";
const DELETED: &[u8] = b"deleted-key";
/// The first test's tombstone retention. Short, so that compaction removes the tombstone within
/// seconds, but long enough that the reopen still finds the stored position younger than it:
/// the age rule counts from the killed child's last timer flush to the reopen, and on a loaded
/// machine (CI runs many tests at once) that took over a second with a retention of one second.
const DELETE_RETENTION_MS: &str = "4000";

/// The flush timer every 100 ms (its default would be a quarter of the topic's
/// `delete.retention.ms`): well inside the first test's retention ([`DELETE_RETENTION_MS`]), so
/// its reopen resumes from a fresh position instead of rebuilding for age, and it shows the
/// timer, not the age rule.
fn config(topic: &str) -> Result<kstate::kstate_kafka::ChangelogConfig> {
    Ok(common::changelog(topic)?
        .durability(Durability::Group(Duration::from_millis(10)))
        .flush_interval(Duration::from_millis(100)))
}

/// The child's part: does nothing unless run by the parent below.
#[test]
fn tombstone_child_deletes_then_writes_until_killed() -> Result<()> {
    let (Ok(dir), Ok(topic)) = (std::env::var(DIR_ENV), std::env::var(TOPIC_ENV)) else {
        return Ok(());
    };
    let store = LoggedStore::open(
        Path::new(&dir).join("store"),
        &RocksDbOptions::default(),
        config(&topic)?,
    )?;
    store.put(DELETED, b"must not come back")?;
    store.flush()?; // the durable position now holds the key
    store.delete(DELETED)?;
    store.commit()?; // in RocksDB's memtable only: no explicit flush from here on
    println!("KSTATE-CHILD-DELETED");
    for n in 0u64.. {
        // Overwrites of a few keys: dirty records for the cleaner, segments rolled by time.
        store.put(format!("filler-{}", n % 50).as_bytes(), &n.to_be_bytes())?;
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Whether any record of `key` is still in the changelog.
fn key_in_changelog(topic: &str, key: &[u8]) -> Result<bool> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .set("group.id", "kstate-tombstone-check")
        .set("enable.auto.commit", "false")
        .create()?;
    let (_, high) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if m.key() == Some(key) {
                    return Ok(true);
                }
                if m.offset() + 1 >= high {
                    return Ok(false);
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    anyhow::bail!("reading {topic} timed out")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compacted_tombstone_does_not_bring_its_key_back_after_sigkill() -> Result<()> {
    let topic = unique_topic("tombstone");
    // Compaction as eager as the broker allows: segments roll every 100 ms of writes, any dirty
    // data is worth cleaning, and tombstones live DELETE_RETENTION_MS once cleaned.
    common::create_compacted_topic(
        &topic,
        &[
            ("delete.retention.ms", DELETE_RETENTION_MS),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("min.compaction.lag.ms", "0"),
        ],
    )
    .await?;

    let dir = tempfile::tempdir()?;
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "tombstone_child_deletes_then_writes_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir.path())
        .env(TOPIC_ENV, &topic)
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let deleted = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("KSTATE-CHILD-DELETED"));
    ensure!(deleted, "the child exited before it deleted the key");

    let deadline = Instant::now() + Duration::from_secs(180);
    while key_in_changelog(&topic, DELETED)? {
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("compaction did not remove the tombstone within 180 s");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    child.kill()?; // SIGKILL
    let status = child.wait()?;
    ensure!(!status.success(), "the child exited by itself: {status:?}");

    let store = LoggedStore::open(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        config(&topic)?,
    )?;
    let value = store.get(DELETED)?;
    let start = store.restore_report().start.clone();
    println!("restore after the kill: {start:?}");
    assert_eq!(
        value, None,
        "the deleted key came back after its tombstone was compacted away"
    );
    assert!(
        start.rebuild_reason.is_none(),
        "resumed from a position the flush timer kept fresh: {start:?}"
    );
    store.close()?;
    Ok(())
}

/// The other half: a store whose durable position is older than `delete.retention.ms`, with
/// records after it, is rebuilt rather than resumed (a tombstone among them may be gone).
#[tokio::test(flavor = "multi_thread")]
async fn a_position_older_than_delete_retention_is_rebuilt() -> Result<()> {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let topic = unique_topic("old-position");
    common::create_compacted_topic(&topic, &[("delete.retention.ms", "1000")]).await?;
    let dir = tempfile::tempdir()?;
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config(&topic)?)?;
    store.put(b"kept", b"1")?;
    store.close()?;
    drop(store);
    // Records after the stored position, written while the store was away.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?;
    producer
        .send(
            BaseRecord::to(&topic)
                .partition(0)
                .key("later")
                .payload("2"),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(20))?;
    tokio::time::sleep(Duration::from_secs(2)).await; // past delete.retention.ms

    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config(&topic)?)?;
    let reason = store.restore_report().start.rebuild_reason.clone();
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("delete.retention.ms")),
        "{reason:?}"
    );
    assert_eq!(common::contents(&store)?.len(), 2);
    store.close()?;
    Ok(())
}
