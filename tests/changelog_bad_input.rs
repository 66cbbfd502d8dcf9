//! Bad input gets a typed error that names what is wrong, and loses nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kstate::kstate_core::{Bincode, Error, KeyValueStore, entry_check};
use kstate::kstate_kafka::{ChangelogConfig, ChangelogError, Durability, LoggedStore, OpenHooks};
use kstate::kstate_rocksdb::{RocksDbOptions, RocksDbStore};
use kstate_test_broker::{PrivateBroker, bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

#[test]
fn an_unreachable_broker_is_an_error_within_the_open_timeout() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Port 1 on loopback: nothing listens there.
    let config = ChangelogConfig::new("127.0.0.1:1", unique_topic("unreachable"), 0)
        .open_timeout(Duration::from_secs(3));
    let started = Instant::now();
    let err = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config).unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(err, ChangelogError::BrokerUnreachable { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    // Not a timing benchmark: a guard against a hang (the timeout is 3 s).
    assert!(waited < Duration::from_secs(30), "open waited {waited:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_with_another_partition_count_is_refused() -> Result<()> {
    let topic = unique_topic("partitions");
    common::create_topic(&bootstrap_servers()?, &topic, 3, "compact").await?;
    let dir = tempfile::tempdir()?;
    let err = LoggedStore::open(
        dir.path(),
        &RocksDbOptions::default(),
        common::changelog(&topic)?.partitions(1),
    )
    .unwrap_err();
    match &err {
        ChangelogError::PartitionCountMismatch {
            topic: t,
            expected: 1,
            actual: 3,
        } if *t == topic => {}
        other => bail!("expected a partition count mismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&topic));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_that_is_not_compacted_is_refused() -> Result<()> {
    let topic = unique_topic("not-compacted");
    common::create_topic(&bootstrap_servers()?, &topic, 1, "delete").await?;
    let dir = tempfile::tempdir()?;
    let err = LoggedStore::open(
        dir.path(),
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )
    .unwrap_err();
    assert!(
        matches!(err, ChangelogError::NotCompacted { ref actual, .. } if actual == "delete"),
        "{err:?}"
    );
    Ok(())
}

/// Settings an existing topic must have for the store's guarantees: at least the configured
/// replicas, and room for every record the store accepts.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_with_too_few_replicas_or_too_small_records_is_refused() -> Result<()> {
    let small = unique_topic("small-records");
    common::create_compacted_topic(&small, &[("max.message.bytes", "100000")]).await?;
    let dir = tempfile::tempdir()?;
    let err = LoggedStore::open(
        dir.path().join("small"),
        &RocksDbOptions::default(),
        common::changelog(&small)?,
    )
    .unwrap_err();
    assert!(
        matches!(err, ChangelogError::TopicSettings { .. })
            && err.to_string().contains("max.message.bytes"),
        "{err}"
    );

    let replicated = unique_topic("replicas");
    common::create_topic(&bootstrap_servers()?, &replicated, 1, "compact").await?;
    let err = LoggedStore::open(
        dir.path().join("replicas"),
        &RocksDbOptions::default(),
        common::changelog(&replicated)?.replication_factor(3),
    )
    .unwrap_err();
    assert!(
        matches!(err, ChangelogError::TopicSettings { .. }) && err.to_string().contains("replicas"),
        "{err}"
    );
    Ok(())
}

/// The first store must not decide the topic's partition count by accident.
#[test]
fn a_missing_topic_is_created_only_with_an_explicit_partition_count() -> Result<()> {
    let topic = unique_topic("no-count");
    let dir = tempfile::tempdir()?;
    let config = ChangelogConfig::new(bootstrap_servers()?, &topic, 2);
    let err = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config).unwrap_err();
    assert!(
        matches!(err, ChangelogError::InvalidConfig { .. })
            && err.to_string().contains("partitions"),
        "{err}"
    );
    Ok(())
}

#[test]
fn invalid_durability_text_keeps_the_current_mode() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&unique_topic("mode"))?.durability(Durability::Async);
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config)?;
    for bad in ["asdfs", "group:", "group:-5ms", "sync extra"] {
        let err = store.set_durability_text(bad).unwrap_err();
        assert!(err.to_string().contains("accepted"), "{err}");
        assert_eq!(store.durability(), Durability::Async, "after {bad:?}");
    }
    assert_eq!(
        store.set_durability_text("group:20ms")?,
        Durability::Group(Duration::from_millis(20))
    );
    assert_eq!(
        store.durability(),
        Durability::Group(Duration::from_millis(20))
    );
    store.put(b"still", b"works")?;
    store.close()?;
    Ok(())
}

#[test]
fn an_undecodable_changelog_value_names_topic_partition_and_offset() -> Result<()> {
    let topic = unique_topic("undecodable");
    let dir = tempfile::tempdir()?;
    let store = LoggedStore::open(
        dir.path().join("a"),
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )?;
    let typed: kstate::kstate_core::Store<u64, String, _> = kstate::kstate_core::Store::new(store);
    typed.put(&1, &"fine".to_string())?;
    typed.put(&2, &"fine too".to_string())?;
    typed.close()?;
    // Someone else writes a value that is no bincode String to the changelog: offset 2.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?;
    producer
        .send(
            BaseRecord::to(&topic)
                .partition(0)
                .key(&3u64.to_be_bytes()[..])
                .payload(&[0xffu8, 0xff, 0xff, 0xff][..]),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(20))?;

    let hooks = OpenHooks {
        listener: None,
        record_check: Some(Arc::new(entry_check::<u64, String, _>(Bincode))),
        cancel: None,
    };
    let err = LoggedStore::open_with(
        dir.path().join("b"),
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
        hooks,
    )
    .unwrap_err();
    match &err {
        ChangelogError::BadRecord {
            topic: t,
            partition: 0,
            offset: 2,
            ..
        } if *t == topic => {}
        other => bail!("expected a bad record at offset 2, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&topic) && text.contains("offset 2"), "{text}");
    Ok(())
}

/// Needs a broker it can kill: a [`PrivateBroker`].
#[test]
fn a_failed_send_poisons_the_store_and_never_reaches_rocksdb() -> Result<()> {
    let broker = PrivateBroker::start()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    let config = ChangelogConfig::new(broker.bootstrap_servers(), unique_topic("poison"), 0)
        .partitions(1)
        .durability(Durability::Sync)
        .delivery_timeout(Duration::from_secs(3));
    let store = LoggedStore::open(&path, &RocksDbOptions::default(), config)?;
    store.put(b"acknowledged", b"1")?;
    store.commit()?;
    broker.kill()?;

    let err = store.put(b"lost", b"2").unwrap_err();
    assert!(matches!(err, Error::Poisoned { .. }), "{err:?}");
    let again = store.put(b"later", b"3").unwrap_err();
    assert!(
        matches!(again, Error::Poisoned { .. }),
        "later writes are refused: {again:?}"
    );
    assert!(matches!(store.commit(), Err(Error::Poisoned { .. })));
    // A poisoned store serves nothing: the failed put's value may be lost on reopen, and even
    // committed keys are refused rather than served from a store that stopped making sense.
    let read = store.get(b"lost");
    assert!(
        matches!(read, Err(Error::Poisoned { .. })),
        "a failed put's value is not served: {read:?}"
    );
    assert!(matches!(
        store.get(b"acknowledged"),
        Err(Error::Poisoned { .. })
    ));
    assert!(matches!(
        store.all().map(|_| ()),
        Err(Error::Poisoned { .. })
    ));
    let closed = store.close();
    assert!(matches!(closed, Err(Error::Poisoned { .. })), "{closed:?}");
    let again = store.close();
    assert!(
        matches!(again, Err(Error::Poisoned { .. })),
        "a second close reports the failure again: {again:?}"
    );
    drop(store);

    let raw = RocksDbStore::open(&path, &RocksDbOptions::default())?;
    assert_eq!(raw.get(b"acknowledged")?.as_deref(), Some(&b"1"[..]));
    assert_eq!(
        raw.get(b"lost")?,
        None,
        "an unacknowledged write reached RocksDB"
    );
    assert_eq!(raw.get(b"later")?, None);
    Ok(())
}

/// In `async` and `group` mode a put returns before its record is acknowledged, so a failed
/// delivery surfaces later: the commit (the caller's or the timer's) and every later call report
/// the poison, and RocksDB never gets the lost writes.
#[test]
fn a_failed_delivery_poisons_async_and_group_stores_too() -> Result<()> {
    for mode in [
        Durability::Async,
        Durability::Group(Duration::from_millis(20)),
    ] {
        let broker = PrivateBroker::start()?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("store");
        let config =
            ChangelogConfig::new(broker.bootstrap_servers(), unique_topic("poison-later"), 0)
                .partitions(1)
                .durability(mode)
                .delivery_timeout(Duration::from_secs(3));
        let store = LoggedStore::open(&path, &RocksDbOptions::default(), config)?;
        store.put(b"acknowledged", b"1")?;
        store.commit()?;
        broker.kill()?;
        store.put(b"lost", b"2")?; // queued: the failure comes later
        let committed = store.commit();
        assert!(
            matches!(committed, Err(Error::Poisoned { .. })),
            "{mode}: the commit reports the failed delivery: {committed:?}"
        );
        let read = store.get(b"acknowledged");
        assert!(
            matches!(read, Err(Error::Poisoned { .. })),
            "{mode}: {read:?}"
        );
        let write = store.put(b"later", b"3");
        assert!(
            matches!(write, Err(Error::Poisoned { .. })),
            "{mode}: {write:?}"
        );
        let _ = store.close();
        drop(store);
        let raw = RocksDbStore::open(&path, &RocksDbOptions::default())?;
        assert_eq!(
            raw.get(b"acknowledged")?.as_deref(),
            Some(&b"1"[..]),
            "{mode}"
        );
        assert_eq!(
            raw.get(b"lost")?,
            None,
            "{mode}: an unacknowledged write reached RocksDB"
        );
        raw.close()?;
    }
    Ok(())
}

#[test]
fn an_oversized_record_is_refused_without_poisoning_the_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&unique_topic("oversized"))?.max_record_bytes(1_000);
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config)?;
    let err = store.put(b"big", &[0u8; 2_000]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("limit of 1000 bytes"), "{err}");
    store.put(b"small", b"fits")?;
    assert_eq!(store.get(b"big")?, None);
    assert_eq!(store.get(b"small")?.as_deref(), Some(&b"fits"[..]));
    store.close()?;
    Ok(())
}
