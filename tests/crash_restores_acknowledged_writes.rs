//! A task writing in `sync` mode is killed with SIGKILL at random moments, 20 times; after each
//! kill the store reopens with every acknowledged write (its value or a later one), holding
//! exactly its changelog folded up to the restore's end, after a restore of only the tail since
//! the stored offset.
//!
//! The child is this test binary run again with `KSTATE_CRASH_DIR` set: it opens the store, writes
//! `key = n % 500, value = n` for increasing `n`, and appends `key value` to a file after each put
//! returns (one `write` call per line, so a SIGKILL cannot tear a line). It commits every 200
//! writes and also flushes every 1,000, so restores resume from stored offsets the child wrote
//! as well as from those the parent's clean close wrote.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{Durability, LoggedStore, OpenHooks};
use kstate::kstate_rocksdb::RocksDbOptions;
use rand::{Rng, SeedableRng};

const DIR_ENV: &str = "KSTATE_CRASH_DIR";
const TOPIC_ENV: &str = "KSTATE_CRASH_TOPIC";
const BASE_ENV: &str = "KSTATE_CRASH_BASE";
const KEYS: u64 = 500;
const KILLS: usize = 20;

/// The child's part: does nothing unless run by the parent below.
#[test]
fn crash_child_writes_until_killed() -> Result<()> {
    let (Ok(dir), Ok(topic), Ok(base)) = (
        std::env::var(DIR_ENV),
        std::env::var(TOPIC_ENV),
        std::env::var(BASE_ENV),
    ) else {
        return Ok(());
    };
    let dir = Path::new(&dir);
    let config = common::changelog(&topic)?.durability(Durability::Sync);
    let store = LoggedStore::open(dir.join("store"), &RocksDbOptions::default(), config)?;
    let mut acked = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("acked"))?;
    println!("KSTATE-CHILD-READY");
    let mut n: u64 = base.parse()?;
    loop {
        let key = n % KEYS;
        store.put(&key.to_be_bytes(), &n.to_be_bytes())?;
        acked.write_all(format!("{key} {n}\n").as_bytes())?;
        n += 1;
        if n.is_multiple_of(1_000) {
            // Commit and flush the memtables, so the stored offset survives the kill: reopens
            // then resume from a position this child wrote. Plain commits (below) live in the
            // memtable only and are lost with it, which restore must also survive.
            store.flush()?;
        } else if n.is_multiple_of(200) {
            store.commit()?;
        }
    }
}

fn acked_writes(file: &Path) -> Result<BTreeMap<u64, u64>> {
    let mut latest = BTreeMap::new();
    if !file.exists() {
        return Ok(latest);
    }
    for line in BufReader::new(std::fs::File::open(file)?).lines() {
        let line = line?;
        let (k, v) = line.split_once(' ').context("bad acked line")?;
        latest.insert(k.parse()?, v.parse()?);
    }
    Ok(latest)
}

#[test]
fn sigkill_in_sync_mode_loses_no_acknowledged_write() -> Result<()> {
    let topic = kstate_test_broker::unique_topic("crash");
    let dir = tempfile::tempdir()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20);
    let mut resumed = 0;
    for kill in 0..KILLS {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "crash_child_writes_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir.path())
            .env(TOPIC_ENV, &topic)
            .env(BASE_ENV, ((kill as u64 + 1) * 10_000_000).to_string())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("child stdout")?;
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("KSTATE-CHILD-READY"));
        ensure!(ready, "kill {kill}: the child exited before it was ready");
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
        child.kill()?; // SIGKILL
        let status = child.wait()?;
        ensure!(
            !status.success(),
            "kill {kill}: the child exited by itself: {status:?}"
        );

        let recorder = Arc::new(common::Recorder::default());
        let hooks = OpenHooks {
            listener: Some(recorder.clone()),
            record_check: None,
            cancel: None,
        };
        let config = common::changelog(&topic)?.durability(Durability::Async);
        let store = LoggedStore::open_with(
            dir.path().join("store"),
            &RocksDbOptions::default(),
            config,
            hooks,
        )?;

        let report = recorder.ends.lock().unwrap()[0].clone();
        ensure!(
            report.start.rebuild_reason.is_none(),
            "kill {kill}: the store was rebuilt: {:?}",
            report.start
        );
        if report.start.start_offset > 0 {
            resumed += 1;
            ensure!(
                report.records < report.start.end_offset as u64,
                "kill {kill}: restored {} records, the whole topic",
                report.records
            );
        }
        ensure!(
            report.records == (report.start.end_offset - report.start.start_offset) as u64,
            "kill {kill}: the listener counted {} records for offsets {}..{}",
            report.records,
            report.start.start_offset,
            report.start.end_offset
        );

        let acked = acked_writes(&dir.path().join("acked"))?;
        ensure!(
            !acked.is_empty() || kill > 0,
            "the first child acknowledged nothing"
        );
        for (key, value) in &acked {
            let stored = store
                .get(&key.to_be_bytes())?
                .with_context(|| format!("kill {kill}: acknowledged key {key} is missing"))?;
            let stored = u64::from_be_bytes(
                stored
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("bad value"))?,
            );
            ensure!(
                stored >= *value,
                "kill {kill}: key {key} holds {stored}, older than the acknowledged {value}"
            );
        }
        // Not just "nothing foreign": the store is exactly its changelog up to the restore's end.
        let folded = common::fold_changelog(&topic, 0, report.start.end_offset)?;
        let held = common::contents(&store)?;
        ensure!(
            held == folded,
            "kill {kill}: the store ({} keys) differs from its changelog folded up to offset {} ({} keys)",
            held.len(),
            report.start.end_offset,
            folded.len()
        );
        store.close()?;
    }
    ensure!(
        resumed >= KILLS - 1,
        "only {resumed} of {KILLS} reopens resumed from a stored offset"
    );
    Ok(())
}
