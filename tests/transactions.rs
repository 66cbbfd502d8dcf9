//! Stores under a transactional producer (exactly-once), against a real broker:
//! - a commit applies the overlay with its last offset, an abort drops it, and the offset
//!   bookkeeping follows the transaction markers;
//! - a producer fenced by a newer one with the same transactional id applies nothing, and an
//!   abort it cannot complete poisons its stores;
//! - an idle store is never rebuilt for its idleness: after a commit only a marker follows its
//!   stored position;
//! - a `Batch` is atomic through SIGKILL: after any kill the restored store holds every batch
//!   whole or not at all, and exactly the committed transactions.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::{Batch, Error, KeyValueStore};
use kstate::kstate_kafka::{
    ChangelogPosition, LoggedStore, OpenHooks, RestoredStore, SharedProducer, TransactionError,
};
use kstate::kstate_rocksdb::{RocksDbOptions, RocksDbStore};
use rand::{Rng, SeedableRng};

const TIMEOUT: Duration = Duration::from_secs(30);
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

fn attach(
    path: &Path,
    topic: &str,
    producer: &SharedProducer,
    hooks: &OpenHooks,
) -> Result<LoggedStore> {
    let restored = RestoredStore::restore(
        path,
        &RocksDbOptions::default(),
        common::changelog(topic)?,
        hooks,
    )?;
    Ok(LoggedStore::attach(restored, producer)?)
}

fn stored(store: &LoggedStore) -> Result<i64> {
    Ok(store
        .committed_position()?
        .context("no stored position")?
        .offset)
}

#[test]
fn a_commit_applies_the_overlay_and_an_abort_drops_it() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-commit-abort");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?;
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let store = attach(
        &dir.path().join("s"),
        &topic,
        &producer,
        &OpenHooks::default(),
    )?;

    store.put(b"a", b"1")?;
    ensure!(
        matches!(store.commit(), Err(Error::InvalidArgument { .. })),
        "a store under a transaction must refuse a commit of its own"
    );
    producer.commit_transaction(None, TIMEOUT)?;
    // 0 a=1, 1 commit marker: the position is the marker.
    ensure!(
        stored(&store)? == 1,
        "the commit stored offset {}",
        stored(&store)?
    );

    store.put(b"a", b"2")?;
    store.put(b"b", b"1")?;
    ensure!(
        store.get(b"a")?.as_deref() == Some(&b"2"[..]),
        "reads see the open transaction"
    );
    // Let the aborted records reach the log, so that the abort leaves them and a marker there.
    common::streams::wait_for("the records to be acknowledged", TIMEOUT, || {
        Ok(store.unacknowledged() == 0)
    })?;
    producer.abort_transaction("test", TIMEOUT)?;
    ensure!(
        store.get(b"a")?.as_deref() == Some(&b"1"[..]),
        "the abort kept a=2"
    );
    ensure!(store.get(b"b")?.is_none(), "the abort kept b");
    ensure!(stored(&store)? == 1, "the abort moved the stored offset");

    let mut batch = Batch::new();
    batch.put(b"c".to_vec(), b"1".to_vec());
    batch.delete(b"a".to_vec());
    store.write(batch)?;
    producer.commit_transaction(None, TIMEOUT)?;
    // 0 a=1, 1 commit marker, 2-3 aborted, 4 abort marker, 5 c=1, 6 delete a, 7 commit marker.
    ensure!(
        stored(&store)? == 7,
        "stored offset {} after the third transaction",
        stored(&store)?
    );
    store.put(b"d", b"1")?;
    producer.commit_transaction(None, TIMEOUT)?;
    // 8 d=1, 9 commit marker.
    ensure!(
        stored(&store)? == 9,
        "the record after a commit marker landed before {} (one writer, markers counted)",
        stored(&store)?
    );
    let end = common::high_watermark(&topic, 0)?;
    let folded = common::fold_changelog(&topic, 0, end)?;
    let held = common::contents(&store)?;
    ensure!(
        held == folded,
        "store {held:?} != committed changelog {folded:?}"
    );
    store.close()?;
    drop(store);

    // What RocksDB holds is exactly that, and a reopen replays nothing but markers.
    let (reopened, report) = common::open_reporting(&dir.path().join("s"), config)?;
    ensure!(
        report.records == 0,
        "reopen replayed {} records",
        report.records
    );
    ensure!(
        common::contents(&reopened)? == folded,
        "reopened store differs"
    );
    Ok(())
}

#[test]
fn a_full_overlay_asks_for_a_commit_and_applies_nothing_itself() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-full-overlay");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?.overlay_bounds(1 << 20, 10);
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let restored = RestoredStore::restore(
        dir.path().join("s"),
        &RocksDbOptions::default(),
        config,
        &OpenHooks::default(),
    )?;
    let store = LoggedStore::attach(restored, &producer)?;
    for i in 0..25u32 {
        store.put(&i.to_be_bytes(), b"v")?;
    }
    ensure!(
        producer.commit_requested(),
        "25 writes over a bound of 10 did not ask for a commit"
    );
    // The restore of the empty changelog stored the position before its end; no write moved it.
    ensure!(
        stored(&store)? == -1,
        "a full overlay was applied to RocksDB under a transaction"
    );
    producer.commit_transaction(None, TIMEOUT)?;
    ensure!(
        !producer.commit_requested(),
        "the request outlived the commit"
    );
    // 0-24 the writes, 25 the commit marker.
    ensure!(stored(&store)? == 25, "stored offset {}", stored(&store)?);
    Ok(())
}

#[test]
fn a_fenced_producer_applies_nothing() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-fenced");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?;
    let id = format!("{topic}-w");
    let zombie = SharedProducer::transactional(&config, &id, TRANSACTION_TIMEOUT)?;
    let path = dir.path().join("zombie");
    let store = attach(&path, &topic, &zombie, &OpenHooks::default())?;
    store.put(b"k", b"1")?;
    zombie.commit_transaction(None, TIMEOUT)?;
    store.put(b"k", b"2")?;
    store.put(b"other", b"x")?;

    // A new incarnation with the same transactional id fences the zombie and aborts its open
    // transaction.
    let _successor = SharedProducer::transactional(&config, &id, TRANSACTION_TIMEOUT)?;
    let committed = zombie.commit_transaction(None, TIMEOUT);
    ensure!(
        matches!(committed, Err(TransactionError::Fatal { .. })),
        "the fenced producer's commit returned {committed:?}"
    );
    ensure!(
        matches!(store.get(b"k"), Err(Error::Poisoned { .. })),
        "the fenced store still serves values"
    );
    drop(store);
    drop(zombie);

    let raw = RocksDbStore::open(&path, &RocksDbOptions::default())?;
    ensure!(
        raw.get(b"k")?.as_deref() == Some(&b"1"[..]),
        "RocksDB holds k={:?}, not the committed 1",
        raw.get(b"k")?
    );
    ensure!(
        raw.get(b"other")?.is_none(),
        "RocksDB holds the fenced write"
    );
    let position = ChangelogPosition::read(&raw)?.context("no position")?;
    // 0 k=1, 1 its commit marker.
    ensure!(position.offset == 1, "stored offset {}", position.offset);
    let end = common::high_watermark(&topic, 0)?;
    let folded = common::fold_changelog(&topic, 0, end)?;
    ensure!(
        folded.len() == 1 && folded.get(&b"k"[..]).map(Vec::as_slice) == Some(&b"1"[..]),
        "read_committed sees {folded:?}"
    );
    Ok(())
}

/// An abort that fails for good (the producer was fenced) poisons the stores: they must not go
/// on serving the writes of the transaction that was to be aborted.
#[test]
fn a_failed_abort_poisons_the_stores() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-failed-abort");
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?;
    let id = format!("{topic}-w");
    let zombie = SharedProducer::transactional(&config, &id, TRANSACTION_TIMEOUT)?;
    let store = attach(
        &dir.path().join("zombie"),
        &topic,
        &zombie,
        &OpenHooks::default(),
    )?;
    store.put(b"k", b"1")?;
    zombie.commit_transaction(None, TIMEOUT)?;
    store.put(b"k", b"2")?;
    common::streams::wait_for("the record to be acknowledged", TIMEOUT, || {
        Ok(store.unacknowledged() == 0)
    })?;

    let _successor = SharedProducer::transactional(&config, &id, TRANSACTION_TIMEOUT)?;
    let aborted = zombie.abort_transaction("test", TIMEOUT);
    ensure!(
        matches!(aborted, Err(TransactionError::Fatal { .. })),
        "the fenced producer's abort returned {aborted:?}"
    );
    let got = store
        .get(b"k")
        .map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned()));
    ensure!(
        matches!(got, Err(Error::Poisoned { .. })),
        "after a failed abort the store serves {got:?}"
    );
    Ok(())
}

/// A store under a transaction that writes nothing for longer than its changelog's
/// `delete.retention.ms` is not rebuilt on its next open: after a commit only the commit marker
/// follows its stored position, so no tombstone after it can have been compacted away.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_store_past_delete_retention_is_not_rebuilt() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-idle");
    common::create_compacted_topic(&topic, &[("delete.retention.ms", "1000")]).await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s");
    let config = common::changelog(&topic)?;
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let store = attach(&path, &topic, &producer, &OpenHooks::default())?;
    store.put(b"k", b"1")?;
    producer.commit_transaction(None, TIMEOUT)?;
    store.close()?;
    drop(store);
    tokio::time::sleep(Duration::from_millis(1500)).await; // idle past delete.retention.ms

    let restored = RestoredStore::restore(
        &path,
        &RocksDbOptions::default(),
        config.clone(),
        &OpenHooks::default(),
    )?;
    let start = restored.report().start.clone();
    ensure!(
        start.rebuild_reason.is_none(),
        "the idle store was rebuilt: {start:?}"
    );
    ensure!(
        start.start_offset == start.end_offset && restored.report().records == 0,
        "the idle store replayed records: {:?}",
        restored.report()
    );

    restored.close()?;
    Ok(())
}

/// The other half: after a commit the reopen resumes right after the stored position, so the
/// records written while the store was closed are replayed, all of them and only them.
#[test]
fn a_reopen_after_a_commit_replays_exactly_the_later_records() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-resume");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s");
    let config = common::changelog(&topic)?;
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let store = attach(&path, &topic, &producer, &OpenHooks::default())?;
    store.put(b"k", b"1")?;
    producer.commit_transaction(None, TIMEOUT)?;
    store.put(b"k", b"2")?;
    producer.commit_transaction(None, TIMEOUT)?;
    let position = stored(&store)?;
    store.close()?;
    drop(store);
    // The producer's next transaction, without the store: two records it never applied.
    producer.send_output(&topic, 0, b"k", Some(b"3"), TIMEOUT)?;
    producer.send_output(&topic, 0, b"l", Some(b"1"), TIMEOUT)?;
    producer.commit_transaction(None, TIMEOUT)?;

    let (reopened, report) = common::open_reporting(&path, config)?;
    ensure!(
        report.start.rebuild_reason.is_none() && report.start.start_offset == position + 1,
        "the reopen did not resume right after the stored offset {position}: {:?}",
        report.start
    );
    ensure!(
        report.records == 2,
        "the reopen replayed {} records, not the 2 written while the store was closed",
        report.records
    );
    let folded = common::fold_changelog(&topic, 0, report.start.end_offset)?;
    ensure!(
        common::contents(&reopened)? == folded,
        "the reopened store differs from its committed changelog"
    );
    reopened.close()?;
    Ok(())
}

const DIR_ENV: &str = "KSTATE_TXN_DIR";
const TOPIC_ENV: &str = "KSTATE_TXN_TOPIC";
const BATCH_KEYS: u32 = 20;
const BATCHES_PER_TRANSACTION: u64 = 5;
const KILLS: usize = 8;

fn batch_key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

/// The child's part: does nothing unless run by the parent below. Writes batch after batch
/// (batch `n` sets every one of the 20 keys to `n`), commits every 5 batches, and appends `n`
/// to a file after each commit returned.
#[test]
fn txn_child_writes_batches_until_killed() -> Result<()> {
    let (Ok(dir), Ok(topic)) = (std::env::var(DIR_ENV), std::env::var(TOPIC_ENV)) else {
        return Ok(());
    };
    let dir = Path::new(&dir);
    let config = common::changelog(&topic)?;
    // Fences the previous child (killed) before the restore captures its end.
    let producer =
        SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
    let store = attach(&dir.join("store"), &topic, &producer, &OpenHooks::default())?;
    let mut n = store
        .get(&batch_key(0))?
        .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
    let mut committed = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("committed"))?;
    println!("KSTATE-CHILD-READY");
    loop {
        n += 1;
        let mut batch = Batch::new();
        for i in 0..BATCH_KEYS {
            batch.put(batch_key(i).to_vec(), n.to_be_bytes().to_vec());
        }
        store.write(batch)?;
        if n.is_multiple_of(BATCHES_PER_TRANSACTION) {
            producer.commit_transaction(None, TIMEOUT)?;
            committed.write_all(format!("{n}\n").as_bytes())?;
        }
    }
}

#[test]
fn a_batch_is_atomic_through_sigkill_under_a_transaction() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("txn-batch-crash");
    let dir = tempfile::tempdir()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for kill in 0..KILLS {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "txn_child_writes_batches_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir.path())
            .env(TOPIC_ENV, &topic)
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("child stdout")?;
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("KSTATE-CHILD-READY"));
        ensure!(ready, "kill {kill}: the child exited before it was ready");
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
        child.kill()?; // SIGKILL, most likely in the middle of a batch or a transaction
        ensure!(
            !child.wait()?.success(),
            "kill {kill}: the child exited by itself"
        );

        // As the next owner would: fence the dead writer (aborting its open transaction), then
        // restore.
        let config = common::changelog(&topic)?;
        let fence =
            SharedProducer::transactional(&config, format!("{topic}-w"), TRANSACTION_TIMEOUT)?;
        let recorder = Arc::new(common::Recorder::default());
        let hooks = OpenHooks {
            listener: Some(recorder.clone()),
            record_check: None,
            cancel: None,
        };
        let store = attach(&dir.path().join("store"), &topic, &fence, &hooks)?;
        let report = recorder.ends.lock().unwrap()[0].clone();
        ensure!(
            report.start.rebuild_reason.is_none(),
            "kill {kill}: the store was rebuilt: {:?}",
            report.start
        );
        let values: Vec<Option<Vec<u8>>> = (0..BATCH_KEYS)
            .map(|i| store.get(&batch_key(i)))
            .collect::<Result<_, _>>()?;
        ensure!(
            values.iter().all(|v| *v == values[0]),
            "kill {kill}: a torn batch: {values:?}"
        );
        let n = values[0]
            .clone()
            .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
        let acknowledged: u64 = std::fs::read_to_string(dir.path().join("committed"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .max()
            .unwrap_or(0);
        ensure!(
            n.is_multiple_of(BATCHES_PER_TRANSACTION),
            "kill {kill}: batch {n} is visible, but transactions end at multiples of {BATCHES_PER_TRANSACTION}"
        );
        ensure!(
            n == acknowledged || n == acknowledged + BATCHES_PER_TRANSACTION,
            "kill {kill}: the store holds batch {n}, the child's last acknowledged commit was {acknowledged}"
        );
        let folded = common::fold_changelog(&topic, 0, report.start.end_offset)?;
        ensure!(
            common::contents(&store)? == folded,
            "kill {kill}: the store differs from its committed changelog"
        );
        eprintln!(
            "kill {kill}: batch {n} (acknowledged {acknowledged}), replayed {} records",
            report.records
        );
        store.close()?;
    }
    Ok(())
}
