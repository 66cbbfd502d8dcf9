//! A window store's changelog is Kafka Streams' format, byte for byte, both ways: what kstate
//! logs reads as Kafka Streams' `WindowKeySchema` records, and records in that format (written
//! here by a bare producer, as a Kafka Streams application writes them) restore into a kstate
//! window store, windows already past retention skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use kstate::kstate_core::{
    KeyRange, KeyValueStore, Order, WindowChangelog, WindowOptions, WindowStore,
};
use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::unique_topic;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const MINUTE: i64 = 60_000;

fn minute_windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_secs(60))
        .grace(Duration::from_secs(10))
        .retention(Duration::from_secs(600))
}

fn config(topic: &str, options: &WindowOptions) -> Result<ChangelogConfig> {
    Ok(common::changelog(topic)?
        .durability(Durability::Async)
        .keys(Arc::new(WindowChangelog::new(options)))
        .retention(options.changelog_retention()))
}

/// Kafka Streams' window changelog key: `key ‖ start (i64 BE) ‖ seq (i32 BE)`.
fn ks_key(key: &[u8], start: i64, seq: i32) -> Vec<u8> {
    let mut k = key.to_vec();
    k.extend_from_slice(&start.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn count(n: i64) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

#[test]
fn what_a_window_store_logs_is_kafka_streams_window_changelog() -> Result<()> {
    let topic = unique_topic("window-format");
    let dir = tempfile::tempdir()?;
    let options = minute_windows();
    let store = LoggedStore::open(
        dir.path().join("counts"),
        &RocksDbOptions::default(),
        config(&topic, &options)?,
    )?;
    let counts = WindowStore::open(store, options)?;
    counts.put(b"page-1", MINUTE, Some(&count(3)))?;
    counts.put(b"page-1", 2 * MINUTE, Some(&count(5)))?;
    // A key with a zero byte: escaped locally, raw in the changelog.
    counts.put(b"a\x00b", 2 * MINUTE, Some(&count(1)))?;
    counts.put(b"gone", 2 * MINUTE, Some(&count(9)))?;
    counts.put(b"gone", 2 * MINUTE, None)?;
    counts.inner().commit()?;
    let end = common::high_watermark(&topic, 0)?;
    // One record per write, no local keys (stream time) among them.
    assert_eq!(end, 5);
    let logged = common::fold_changelog(&topic, 0, end)?;
    let expected: BTreeMap<Vec<u8>, Vec<u8>> = [
        (ks_key(b"page-1", MINUTE, 0), count(3)),
        (ks_key(b"page-1", 2 * MINUTE, 0), count(5)),
        (ks_key(b"a\x00b", 2 * MINUTE, 0), count(1)),
    ]
    .into_iter()
    .collect();
    assert_eq!(logged, expected);
    counts.into_inner().close()?;
    Ok(())
}

#[test]
fn a_kafka_streams_window_changelog_restores_into_a_window_store() -> Result<()> {
    let topic = unique_topic("window-from-ks");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("counts");
    let options = minute_windows();
    // Creates the topic (compact,delete), then goes away.
    LoggedStore::open(&path, &RocksDbOptions::default(), config(&topic, &options)?)?.close()?;
    std::fs::remove_dir_all(&path)?;

    // Records as a Kafka Streams `windowedBy(1 min).count()` logs them (value: the count as a
    // serialized Long; record timestamp: the record's time, here a second into its window),
    // with overwrites, a tombstone, and a window that is past the 10-minute retention by the
    // time the later records arrive. Times from now on, so that the topic's retention by
    // record time keeps them.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let base = now_ms - now_ms % MINUTE;
    let at = |minute: i64| base + minute * MINUTE;
    let producer: BaseProducer = common::client()?.client_config().create()?;
    let records: Vec<(Vec<u8>, Option<Vec<u8>>, i64)> = vec![
        (ks_key(b"old", at(0), 0), Some(count(7)), at(0)),
        (ks_key(b"page-1", at(20), 0), Some(count(1)), at(20)),
        (ks_key(b"page-1", at(20), 0), Some(count(2)), at(20)),
        (ks_key(b"page-2", at(21), 0), Some(count(1)), at(21)),
        (ks_key(b"page-3", at(21), 0), Some(count(4)), at(21)),
        (ks_key(b"page-3", at(21), 0), None, at(21)),
        (ks_key(b"page-1", at(22), 0), Some(count(1)), at(22)),
    ];
    for (key, value, start) in &records {
        let mut record = BaseRecord::<Vec<u8>, Vec<u8>>::to(&topic)
            .key(key)
            .partition(0)
            .timestamp(start + 1_000);
        if let Some(value) = value {
            record = record.payload(value);
        }
        producer.send(record).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;

    let store = LoggedStore::open(&path, &RocksDbOptions::default(), config(&topic, &options)?)?;
    let counts = WindowStore::open(store, options)?;
    // Stream time is the latest window start, as Kafka Streams' store observes it (its records
    // carry no kstate.time header): the two keep the same windows.
    assert_eq!(counts.stream_time(), Some(at(22)));
    let all: Vec<(Vec<u8>, i64, Vec<u8>)> = counts
        .fetch_all(..)?
        .map(|e| e.map(|e| (e.key().to_vec(), e.start(), e.value().to_vec())))
        .collect::<Result<_, _>>()?;
    let all: BTreeMap<(Vec<u8>, i64), Vec<u8>> =
        all.into_iter().map(|(k, t, v)| ((k, t), v)).collect();
    let expected: BTreeMap<(Vec<u8>, i64), Vec<u8>> = [
        ((b"page-1".to_vec(), at(20)), count(2)),
        ((b"page-1".to_vec(), at(22)), count(1)),
        ((b"page-2".to_vec(), at(21)), count(1)),
    ]
    .into_iter()
    .collect();
    assert_eq!(all, expected);
    // The window past retention is not in the store at all, not merely invisible.
    let stored = counts
        .inner()
        .scan(&KeyRange::prefix(&[0x01]), Order::Forward)?
        .count();
    assert_eq!(stored, 3);
    // Late by the restored stream time, as it was for the application that wrote it.
    assert!(matches!(
        counts.put(b"page-1", at(11), Some(&count(1)))?,
        kstate::kstate_core::WindowPut::Expired { .. }
    ));
    counts.into_inner().close()?;
    Ok(())
}
