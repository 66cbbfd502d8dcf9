//! Restore at the changelog's awkward edges: an empty topic, transaction markers and an aborted
//! transaction, records deleted below the stored offset, a topic deleted and recreated, open
//! transactions, large values, and what a killed wipe or bulk load left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{Durability, LoggedStore, OpenHooks, RestoreReport};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::{bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

fn open(path: &std::path::Path, topic: &str) -> Result<(LoggedStore, RestoreReport)> {
    common::open_reporting(
        path,
        common::changelog(topic)?.durability(Durability::Async),
    )
}

fn contents(store: &LoggedStore) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    Ok(store.all()?.collect::<Result<_, _>>()?)
}

fn producer(transactional_id: Option<&str>) -> Result<ThreadedProducer<DefaultProducerContext>> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers()?)
        .set("enable.idempotence", "true");
    if let Some(id) = transactional_id {
        config.set("transactional.id", id);
    }
    Ok(config.create()?)
}

fn produce(topic: &str, records: impl IntoIterator<Item = (String, String)>) -> Result<()> {
    let producer = producer(None)?;
    for (k, v) in records {
        producer
            .send(BaseRecord::to(topic).partition(0).key(&k).payload(&v))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(20))?;
    Ok(())
}

fn admin() -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers()?)
        .create()?)
}

#[test]
fn an_empty_topic_restores_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (store, report) = open(dir.path(), &unique_topic("empty"))?;
    assert_eq!(
        (
            report.start.start_offset,
            report.start.end_offset,
            report.records
        ),
        (0, 0, 0)
    );
    assert!(report.start.rebuild_reason.is_none());
    assert!(contents(&store)?.is_empty());
    store.close()?;
    drop(store); // releases the directory lock
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn aborted_transactions_never_appear_and_markers_do_not_hold_up_the_end() -> Result<()> {
    let topic = unique_topic("txn");
    let dir = tempfile::tempdir()?;
    open(&dir.path().join("creates-topic"), &topic)?.0.close()?;

    let producer = producer(Some(&unique_topic("txn-id")))?;
    let timeout = Duration::from_secs(20);
    producer.init_transactions(timeout)?;
    for (round, commit) in [(0, true), (1, false), (2, true), (3, false)] {
        producer.begin_transaction()?;
        for i in 0..5 {
            let (k, v) = (format!("r{round}-k{i}"), format!("v{i}"));
            producer
                .send(BaseRecord::to(&topic).partition(0).key(&k).payload(&v))
                .map_err(|(e, _)| e)?;
        }
        // Make the records reach the log before deciding, so an abort leaves them there.
        producer.flush(timeout)?;
        if commit {
            producer.commit_transaction(timeout)?;
        } else {
            producer.abort_transaction(timeout)?;
        }
    }

    let started = Instant::now();
    let (store, report) = open(&dir.path().join("restored"), &topic)?;
    let keys: Vec<String> = contents(&store)?
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect();
    let want: Vec<String> = [0, 2]
        .iter()
        .flat_map(|r| (0..5).map(move |i| format!("r{r}-k{i}")))
        .collect();
    assert_eq!(keys, want, "only committed transactions' records");
    assert_eq!(report.records, 10);
    // The partition ends in an abort marker: the end is reached by position, not by a record.
    assert!(
        report.start.end_offset > 20,
        "markers occupy offsets: end {}",
        report.start.end_offset
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "restore hung on markers"
    );
    store.close()?;
    drop(store); // releases the directory lock

    // A second open resumes after the last committed record and finds nothing more.
    let (store, report) = open(&dir.path().join("restored"), &topic)?;
    assert_eq!(report.records, 0);
    assert!(report.start.rebuild_reason.is_none());
    store.close()?;
    drop(store); // releases the directory lock
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn records_deleted_below_the_stored_offset_force_a_rebuild() -> Result<()> {
    let topic = unique_topic("deleted");
    // Kafka refuses deleteRecords on a compact-only topic; changelogs with retention (windowed
    // state) use "compact,delete", which the store accepts.
    common::create_topic(&bootstrap_servers()?, &topic, 1, "compact,delete").await?;
    let dir = tempfile::tempdir()?;
    let (store, _) = open(dir.path(), &topic)?;
    common::write_keys(&store, 0..100)?; // offsets 0..=99
    store.close()?;
    drop(store); // releases the directory lock
    produce(
        &topic,
        (100..150).map(|i| (format!("key-{i:04}"), format!("value-{i}"))),
    )?;

    let mut before = TopicPartitionList::new();
    before.add_partition_offset(&topic, 0, Offset::Offset(120))?;
    let deleted = admin()?
        .delete_records(&before, &AdminOptions::new())
        .await?;
    for p in deleted.elements() {
        ensure!(
            p.error().is_ok(),
            "deleteRecords {}: {:?}",
            p.partition(),
            p.error()
        );
    }

    let (store, report) = open(dir.path(), &topic)?;
    let reason = report
        .start
        .rebuild_reason
        .clone()
        .context("expected a rebuild")?;
    assert!(reason.contains("deleted"), "{reason}");
    assert_eq!((report.start.start_offset, report.records), (120, 30));
    let keys: Vec<Vec<u8>> = contents(&store)?.into_iter().map(|(k, _)| k).collect();
    let want: Vec<Vec<u8>> = (120..150)
        .map(|i| format!("key-{i:04}").into_bytes())
        .collect();
    assert_eq!(
        keys, want,
        "the wiped store holds exactly what the log still has"
    );
    store.close()?;
    drop(store); // releases the directory lock
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recreated_topic_written_again_is_refused_then_rebuilt_by_choice() -> Result<()> {
    let topic = unique_topic("recreated");
    let dir = tempfile::tempdir()?;
    let (store, _) = open(dir.path(), &topic)?;
    common::write_keys(&store, 0..100)?;
    store.close()?;
    drop(store); // releases the directory lock

    common::delete_topic(&topic).await?;
    common::recreate_topic(&topic).await?;
    produce(
        &topic,
        (0..10).map(|i| (format!("new-{i}"), format!("v{i}"))),
    )?;

    // The local store may be the only copy of its 100 keys: refused, nothing wiped.
    let refused = open(dir.path(), &topic);
    let err = refused
        .err()
        .context("opened a store its changelog lost records of")?;
    assert!(
        err.to_string().contains("before the stored offset"),
        "{err}"
    );
    let raw = kstate::kstate_rocksdb::RocksDbStore::open(dir.path(), &RocksDbOptions::default())?;
    assert_eq!(raw.all()?.count(), 100, "the local copy is kept");
    raw.close()?;
    drop(raw);

    // Rebuilding is an explicit choice.
    let (store, report) = common::open_reporting(
        dir.path(),
        common::changelog(&topic)?
            .durability(Durability::Async)
            .lost_changelog(kstate::kstate_kafka::LostChangelog::Rebuild),
    )?;
    let reason = report
        .start
        .rebuild_reason
        .clone()
        .context("expected a rebuild")?;
    assert!(reason.contains("recreated"), "{reason}");
    let keys: Vec<String> = contents(&store)?
        .into_iter()
        .map(|(k, _)| String::from_utf8(k).unwrap())
        .collect();
    assert_eq!(
        keys,
        (0..10).map(|i| format!("new-{i}")).collect::<Vec<_>>()
    );
    store.close()?;
    drop(store); // releases the directory lock
    Ok(())
}

/// Begins a transaction on `topic`/0 holding one record, flushed to the log and left open.
fn open_transaction(topic: &str) -> Result<ThreadedProducer<DefaultProducerContext>> {
    let producer = producer(Some(&unique_topic("open-txn")))?;
    let timeout = Duration::from_secs(20);
    producer.init_transactions(timeout)?;
    producer.begin_transaction()?;
    producer
        .send(
            BaseRecord::to(topic)
                .partition(0)
                .key("in-transaction")
                .payload("t"),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(timeout)?;
    Ok(producer)
}

fn open_with_timeout(
    path: &std::path::Path,
    topic: &str,
    timeout: Duration,
) -> Result<LoggedStore> {
    let config = common::changelog(topic)?
        .durability(Durability::Async)
        .open_timeout(timeout);
    Ok(LoggedStore::open(path, &RocksDbOptions::default(), config)?)
}

/// While a transaction is open, the last stable offset stops short of the log's end: a restore
/// must neither end there nor take the stored offset for one "beyond the end". It waits, and
/// fails clearly when the transaction stays open past the open timeout.
#[test]
fn an_open_transaction_on_the_changelog_fails_the_open_and_then_waits_for_its_commit() -> Result<()>
{
    let topic = unique_topic("open-txn");
    let dir = tempfile::tempdir()?;
    let (store, _) = open(dir.path(), &topic)?;
    common::write_keys(&store, 0..10)?; // offsets 0..=9
    store.close()?;
    drop(store);
    let transaction = open_transaction(&topic)?; // its record at offset 10

    let started = Instant::now();
    let refused = open_with_timeout(dir.path(), &topic, Duration::from_secs(3));
    let err = match refused {
        Ok(store) => anyhow::bail!(
            "opened while a transaction held the changelog: {:?}",
            store.restore_report()
        ),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        message.contains("transaction") && message.contains("10"),
        "the error names the open transaction and its offset: {message}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "not a hang");

    // A transaction that commits while the open waits lets it through, with its record.
    let committer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        transaction.commit_transaction(Duration::from_secs(20))
    });
    let store = open_with_timeout(dir.path(), &topic, Duration::from_secs(30))?;
    committer.join().unwrap()?;
    let report = store.restore_report().clone();
    assert!(report.start.rebuild_reason.is_none(), "{:?}", report.start);
    assert_eq!(
        report.start.start_offset, 10,
        "resumed after the stored offset"
    );
    let held = common::contents(&store)?;
    assert_eq!(
        held,
        common::fold_changelog(&topic, 0, report.start.end_offset)?
    );
    assert!(held.contains_key(&b"in-transaction"[..]));
    store.close()?;
    Ok(())
}

/// A store that wrote after another producer's transaction began has stored offsets past the
/// last stable offset; it must not be taken for a store of a recreated topic and wiped.
#[test]
fn a_store_written_past_an_open_transaction_is_never_wiped() -> Result<()> {
    let topic = unique_topic("past-lso");
    let dir = tempfile::tempdir()?;
    let (store, _) = open(dir.path(), &topic)?;
    common::write_keys(&store, 0..10)?;
    store.commit()?;
    let transaction = open_transaction(&topic)?;
    // These land after the transaction's record; whatever the store makes of that, it must not
    // lose them or anything before them.
    let _ = common::write_keys(&store, 10..20);
    let _ = store.commit();
    let _ = store.close();
    drop(store);

    if let Ok(store) = open_with_timeout(dir.path(), &topic, Duration::from_secs(3)) {
        let report = store.restore_report().clone();
        anyhow::bail!("opened while a transaction held the changelog: {report:?}");
    }
    transaction.abort_transaction(Duration::from_secs(20))?;
    let store = open_with_timeout(dir.path(), &topic, Duration::from_secs(30))?;
    let report = store.restore_report().clone();
    assert!(report.start.rebuild_reason.is_none(), "{:?}", report.start);
    let held = common::contents(&store)?;
    assert_eq!(
        held,
        common::fold_changelog(&topic, 0, report.start.end_offset)?
    );
    assert_eq!(held.len(), 20, "every key the store wrote");
    store.close()?;
    Ok(())
}

/// Restore holds a bounded number of bytes, not only of records: large values come in batches
/// of at most the byte limit plus the record that crossed it, on both the bulk path (an empty
/// store) and the catch-up path (a stale one).
#[test]
fn restore_batches_are_bounded_in_bytes() -> Result<()> {
    const VALUE: usize = 200_000;
    const LIMIT: usize = 1 << 20;
    let topic = unique_topic("large-values");
    let dir = tempfile::tempdir()?;
    let stale = dir.path().join("stale");
    let (store, _) = open(&stale, &topic)?;
    store.put(b"big-first", b"small")?;
    store.close()?;
    drop(store);
    let (store, _) = open(&dir.path().join("writer"), &topic)?;
    let value = vec![7u8; VALUE];
    for i in 0..40u32 {
        store.put(format!("big-{i:03}").as_bytes(), &value)?;
    }
    store.close()?;
    drop(store);

    for (path, bulk) in [(dir.path().join("restored"), true), (stale, false)] {
        let recorder = Arc::new(common::Recorder::default());
        let hooks = OpenHooks {
            listener: Some(recorder.clone()),
            record_check: None,
            cancel: None,
        };
        let config = common::changelog(&topic)?
            .bulk_chunk_bytes(LIMIT)
            .restore_batch_bytes(LIMIT);
        let store = LoggedStore::open_with(&path, &RocksDbOptions::default(), config, hooks)?;
        let batches = recorder.batches.lock().unwrap().clone();
        assert!(
            batches.len() >= 7,
            "bulk={bulk}: 8 MB came in {} batches",
            batches.len()
        );
        for batch in &batches {
            assert!(
                batch.bytes <= LIMIT + VALUE + 100,
                "bulk={bulk}: a batch of {} bytes, over the limit of {LIMIT}",
                batch.bytes
            );
        }
        assert_eq!(common::contents(&store)?.len(), 41);
        store.close()?;
    }
    Ok(())
}

/// A pid no process can have: the kernel allocates pids below `pid_max`.
fn pid_of_no_process() -> Result<u32> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/pid_max")?
        .trim()
        .parse()?)
}

/// What a kill leaves of a wipe (the store's copy renamed aside, its deletion cut short) and of
/// a bulk load (an SST file written, not yet ingested) is deleted on the store's next open,
/// and nothing else is touched: not another store's copy, not a copy whose wiping process
/// still runs, not a directory that only looks like a copy.
#[test]
fn leftovers_of_a_killed_wipe_or_bulk_load_are_deleted_on_the_next_open() -> Result<()> {
    let topic = unique_topic("leftovers");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s");
    let (store, _) = open(&path, &topic)?;
    common::write_keys(&store, 0..10)?;
    store.close()?;
    drop(store);

    let gone_pid = pid_of_no_process()?;
    let fill = |copy: &std::path::Path| -> Result<()> {
        std::fs::create_dir(copy)?;
        std::fs::write(copy.join("CURRENT"), b"MANIFEST-000001\n")?;
        std::fs::write(copy.join("000007.sst"), b"x")?;
        Ok(())
    };
    let leftovers = [
        // Its process is gone.
        dir.path()
            .join(format!(".s.kstate-wiped-{gone_pid}-1700000000000000000")),
        // This process's pid, but no wipe of this process: an earlier process had the pid.
        dir.path()
            .join(format!(".s.kstate-wiped-{}-1", std::process::id())),
    ];
    for copy in &leftovers {
        fill(copy)?;
    }
    let ingest = path.join("kstate-ingest-3.sst");
    std::fs::write(&ingest, b"an SST file that was never ingested")?;
    let kept = [
        // Process 1 is alive: its wipe may still be deleting the copy.
        dir.path().join(".s.kstate-wiped-1-2"),
        // Another store's copy.
        dir.path().join(format!(".other.kstate-wiped-{gone_pid}-1")),
        // Names that only look like a copy's.
        dir.path().join(".s.kstate-wiped-notes"),
        dir.path().join(format!("s.kstate-wiped-{gone_pid}-1")),
        dir.path().join(format!(".s.kstate-wiped-{gone_pid}-1-old")),
    ];
    for other in &kept {
        fill(other)?;
    }
    let user_file = path.join("kstate-ingest-notes.sst");
    std::fs::write(&user_file, b"not a name the bulk load gives")?;

    let (store, report) = open(&path, &topic)?;
    ensure!(
        report.start.rebuild_reason.is_none(),
        "the store was rebuilt: {:?}",
        report.start
    );
    ensure!(
        contents(&store)?.len() == 10,
        "the store lost entries: {:?}",
        contents(&store)?
    );
    for copy in &leftovers {
        ensure!(!copy.exists(), "{} is still there", copy.display());
    }
    ensure!(!ingest.exists(), "{} is still there", ingest.display());
    for other in &kept {
        ensure!(
            other.join("CURRENT").exists() && other.join("000007.sst").exists(),
            "{} was touched",
            other.display()
        );
    }
    ensure!(user_file.exists(), "{} was deleted", user_file.display());
    store.close()?;
    Ok(())
}
