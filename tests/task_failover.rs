//! The task runtime across processes, under SIGKILL: copies of kstate-bench's `count_by_key`
//! service share a 12-partition input while a producer writes keyed records; copies are killed
//! and restarted at random, one is added and one stopped gracefully mid-run. At the end:
//! - no input record's effect is missing: every key's final count ≥ its true count (kills make
//!   at-least-once replay some records twice; the in-process tests check equality without kills);
//! - every partition was processed;
//! - no restore rebuilt a store, and a restore in a directory that had restored that task
//!   before started at or after that earlier restore's end: only the tail is replayed;
//! - the copy stopped gracefully exited 0.
//!
//! The same chaos under `--guarantee exactly-once` (at least 10 kills) checks more: a
//! `read_committed` reader of the output sees, for every key, exactly `1, 2, ..., n` (its count
//! after each of its records, in order: no duplicate, no gap) with `n` its true count.
//!
//! The zombie test pauses a copy (SIGSTOP) past its session timeout while its transaction holds
//! processed records, lets another copy take its partitions, then resumes it: nothing of the
//! paused copy's transaction may become visible (the sequences above stay exact), and every store
//! it left holds exactly its committed changelog up to its stored offset.
//!
//! CI runs about 25 seconds of the at-least-once chaos and 10 kills of the exactly-once one;
//! `KSTATE_FAILOVER_SECONDS` and `KSTATE_EOS_KILLS` run longer (`scripts/eos-kills`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use common::streams::{
    check_exact_sequences, env_number, last_counts, produce, read_topic, wait_for,
};
use kstate::kstate_kafka::ChangelogPosition;
use kstate::kstate_rocksdb::{RocksDbOptions, StateDir};
use kstate_test_broker::unique_topic;
use rand::{Rng, SeedableRng};

const PARTITIONS: i32 = 12;
const KEYS: usize = 240;

/// One copy of the example: a slot with its own state directory, restarted in place.
struct Copy {
    slot: usize,
    state_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: usize,
}

impl Copy {
    /// `n` copies, not running yet, each with its state directory and log under `dir`.
    fn slots(dir: &Path, n: usize) -> Vec<Copy> {
        (0..n)
            .map(|slot| Copy {
                slot,
                state_dir: dir.join(format!("copy-{slot}")),
                log: dir.join(format!("copy-{slot}.log")),
                child: None,
                starts: 0,
            })
            .collect()
    }
}

struct Run {
    binary: PathBuf,
    servers: String,
    app_id: String,
    input: String,
    output: String,
    guarantee: &'static str,
    commit_interval_ms: u64,
}

impl Run {
    fn spawn(&self, copy: &mut Copy) -> anyhow::Result<()> {
        copy.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&copy.log)?;
        let child = Command::new(&self.binary)
            .args([
                "--bootstrap-servers",
                &self.servers,
                "--application-id",
                &self.app_id,
                "--input",
                &self.input,
                "--output",
                &self.output,
                "--threads",
                "2",
                "--commit-interval-ms",
                &self.commit_interval_ms.to_string(),
                "--guarantee",
                self.guarantee,
                // A restarted copy fences its previous incarnation's transactions at once.
                "--instance-id",
                &format!("copy-{}", copy.slot),
                "--consumer-property",
                "session.timeout.ms=6000",
                "--consumer-property",
                "heartbeat.interval.ms=1000",
            ])
            .arg("--state-dir")
            .arg(&copy.state_dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        copy.child = Some(child);
        Ok(())
    }
}

/// The restore lines of the example: `restore <topic>/<p> from <start> to <end> (rebuild: <r>)`
/// when one starts, `restored <topic>/<p> to <end> (<n> records)` when it completed.
#[derive(Debug)]
enum RestoreLine {
    Started {
        partition: i32,
        start: i64,
        rebuild: String,
    },
    Completed {
        partition: i32,
        end: i64,
    },
}

fn restore_lines(log: &Path) -> anyhow::Result<Vec<RestoreLine>> {
    let text = std::fs::read_to_string(log)?;
    let mut lines = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("count_by_key: restored ") {
            let parse = || -> Option<RestoreLine> {
                let (topic_partition, rest) = rest.split_once(" to ")?;
                Some(RestoreLine::Completed {
                    partition: topic_partition.rsplit_once('/')?.1.parse().ok()?,
                    end: rest.split_once(' ')?.0.parse().ok()?,
                })
            };
            lines.push(parse().with_context(|| format!("unparsable restore line: {line}"))?);
            continue;
        }
        let Some(rest) = line.strip_prefix("count_by_key: restore ") else {
            continue;
        };
        let parse = || -> Option<RestoreLine> {
            let (topic_partition, rest) = rest.split_once(" from ")?;
            let (start, rest) = rest.split_once(" to ")?;
            let (_end, rest) = rest.split_once(" (rebuild: ")?;
            Some(RestoreLine::Started {
                partition: topic_partition.rsplit_once('/')?.1.parse().ok()?,
                start: start.parse().ok()?,
                rebuild: rest.trim_end_matches(')').to_string(),
            })
        };
        lines.push(parse().with_context(|| format!("unparsable restore line: {line}"))?);
    }
    Ok(lines)
}

/// What a chaos run leaves for its checks.
struct Chaos {
    servers: String,
    run: Run,
    copies: Vec<Copy>,
    /// Records written per key.
    truth: BTreeMap<Vec<u8>, u64>,
    kills: usize,
    stopped_gracefully: Option<std::process::ExitStatus>,
    final_exits: Vec<(usize, std::process::ExitStatus)>,
    _dir: tempfile::TempDir,
}

/// Writes keyed records (key k always in partition k % 12) until `stop` is set; returns how many
/// records each key got.
fn keyed_producer(
    servers: String,
    input: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<anyhow::Result<BTreeMap<Vec<u8>, u64>>> {
    std::thread::spawn(move || {
        let mut truth = BTreeMap::new();
        let mut i = 0usize;
        while !stop.load(Ordering::Acquire) {
            let batch: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..200)
                .map(|j| {
                    let k = (i + j) * 31 % KEYS;
                    (
                        (k as i32) % PARTITIONS,
                        format!("key-{k}").into_bytes(),
                        vec![b'v'],
                    )
                })
                .collect();
            produce(&servers, &input, &batch)?;
            for (_, key, _) in &batch {
                *truth.entry(key.clone()).or_insert(0) += 1;
            }
            i += batch.len();
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(truth)
    })
}

/// Three copies (a fourth added a third of the way in, copy 1 stopped with SIGTERM at two
/// thirds) share a 12-partition input while a producer writes; copies are SIGKILLed and
/// restarted at random for at least `seconds` and `min_kills` kills. Then waits until every
/// key's last output count reaches its true count, and stops the copies with SIGTERM.
async fn chaos(
    name: &str,
    guarantee: &'static str,
    seconds: u64,
    min_kills: usize,
) -> anyhow::Result<Chaos> {
    let seed: u64 = env_number("KSTATE_FAILOVER_SEED").unwrap_or_else(|| rand::rng().random());
    eprintln!(
        "{name}: {guarantee}, at least {seconds} s and {min_kills} kills, seed {seed} \
         (KSTATE_FAILOVER_SEED to repeat)"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let servers = kstate_test_broker::bootstrap_servers()?;
    let run = Run {
        binary: common::service_binary("count_by_key")?,
        servers: servers.clone(),
        app_id: unique_topic(name),
        input: unique_topic(&format!("{name}-in")),
        output: unique_topic(&format!("{name}-out")),
        guarantee,
        commit_interval_ms: 100,
    };
    common::create_topic(&servers, &run.input, PARTITIONS, "delete").await?;
    common::create_topic(&servers, &run.output, PARTITIONS, "delete").await?;
    let dir = tempfile::tempdir()?;
    let mut copies = Copy::slots(dir.path(), 4);
    for copy in copies.iter_mut().take(3) {
        run.spawn(copy)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producer = keyed_producer(servers.clone(), run.input.clone(), stop.clone());

    // Chaos: kill and restart copies at random; add the fourth copy a third of the way in, and
    // stop one gracefully at two thirds.
    let started = Instant::now();
    let (mut added, mut stopped_gracefully, mut kills) = (false, None, 0);
    while started.elapsed() < Duration::from_secs(seconds) || kills < min_kills {
        std::thread::sleep(Duration::from_millis(rng.random_range(1_000..3_000)));
        let elapsed = started.elapsed().as_secs_f64() / seconds as f64;
        if !added && elapsed > 0.33 {
            run.spawn(&mut copies[3])?;
            added = true;
            continue;
        }
        if stopped_gracefully.is_none() && elapsed > 0.66 {
            let copy = &mut copies[1];
            let mut child = copy.child.take().context("copy 1 not running")?;
            let pid = child.id().to_string();
            Command::new("kill").args(["-TERM", &pid]).status()?;
            let status = child.wait()?;
            stopped_gracefully = Some(status);
            continue;
        }
        // Kill a running copy (never the one stopped gracefully) and restart it.
        let candidates: Vec<usize> = copies
            .iter()
            .filter(|c| c.child.is_some())
            .map(|c| c.slot)
            .collect();
        let slot = candidates[rng.random_range(0..candidates.len())];
        let copy = &mut copies[slot];
        if let Some(mut child) = copy.child.take() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "copy {slot} exited by itself ({status}); its log:\n{}",
                    std::fs::read_to_string(&copy.log)?
                );
            }
            child.kill()?; // SIGKILL
            child.wait()?;
            kills += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1_000)));
        run.spawn(copy)?;
    }
    stop.store(true, Ordering::Release);
    let truth = producer.join().expect("producer thread")?;
    let total: u64 = truth.values().sum();
    eprintln!("{name}: {total} records, {kills} kills");

    // Everything the producer wrote gets processed by the copies still running.
    let outcome = wait_for(
        "every key's count to reach its true count",
        Duration::from_secs(180),
        || {
            let counts = last_counts(&read_topic(&servers, &run.output, PARTITIONS)?);
            Ok(truth
                .iter()
                .all(|(k, n)| counts.get(k).is_some_and(|c| c >= n)))
        },
    );
    let mut final_exits = Vec::new();
    for copy in &mut copies {
        if let Some(mut child) = copy.child.take() {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            final_exits.push((copy.slot, child.wait()?));
        }
    }
    if let Err(e) = outcome {
        let counts = last_counts(&read_topic(&servers, &run.output, PARTITIONS)?);
        let short: Vec<_> = truth
            .iter()
            .filter(|(k, n)| counts.get(*k).is_none_or(|c| c < *n))
            .take(10)
            .map(|(k, n)| {
                (
                    String::from_utf8_lossy(k).to_string(),
                    *n,
                    counts.get(k).copied(),
                )
            })
            .collect();
        bail!(
            "{e}; keys short (key, true, counted): {short:?}\n{}",
            logs(&copies)
        );
    }
    Ok(Chaos {
        servers,
        run,
        copies,
        truth,
        kills,
        stopped_gracefully,
        final_exits,
        _dir: dir,
    })
}

fn logs(copies: &[Copy]) -> String {
    let mut logs = String::new();
    for copy in copies {
        logs += &format!(
            "--- copy {} ---\n{}\n",
            copy.slot,
            std::fs::read_to_string(&copy.log).unwrap_or_default()
        );
    }
    logs
}

/// The checks both guarantees share: every partition processed, clean exits on SIGTERM, and
/// restores that never rebuilt and replayed only the tail.
fn check_exits_and_restores(chaos: &Chaos) -> anyhow::Result<()> {
    let out = read_topic(&chaos.servers, &chaos.run.output, PARTITIONS)?;
    for p in 0..PARTITIONS {
        assert!(out.iter().any(|r| r.0 == p), "partition {p} has no output");
    }
    // Every copy still running at the end stops cleanly on SIGTERM.
    for (slot, status) in &chaos.final_exits {
        assert!(
            status.success(),
            "copy {slot} exited {status} on SIGTERM; its log:\n{}",
            std::fs::read_to_string(&chaos.copies[*slot].log)?
        );
    }
    let status = chaos
        .stopped_gracefully
        .context("no copy was stopped gracefully")?;
    assert!(
        status.success(),
        "the copy stopped with SIGTERM exited {status}"
    );
    // Restores: never a rebuild; in a directory where a restore of the task completed before,
    // the next one starts at or after that restore's end (a completed restore is flushed, so a
    // kill after it never replays it again): only the tail.
    let mut restores = 0;
    for copy in &chaos.copies {
        let mut completed: BTreeMap<i32, i64> = BTreeMap::new();
        for line in restore_lines(&copy.log)? {
            match line {
                RestoreLine::Started {
                    partition,
                    start,
                    rebuild,
                } => {
                    restores += 1;
                    assert_eq!(rebuild, "none", "copy {}, task {partition}", copy.slot);
                    if let Some(previous_end) = completed.get(&partition) {
                        assert!(
                            start >= *previous_end,
                            "copy {}: task {partition} restored from {start} though an earlier \
                             restore completed at {previous_end}; the copy's log:\n{}",
                            copy.slot,
                            std::fs::read_to_string(&copy.log)?
                        );
                    }
                }
                RestoreLine::Completed { partition, end } => {
                    completed.insert(partition, end);
                }
            }
        }
    }
    eprintln!("{restores} restores checked");
    assert!(
        restores >= PARTITIONS as usize,
        "{restores} restores logged"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_killed_at_random_lose_no_input_and_replay_only_the_tail() -> anyhow::Result<()> {
    let seconds = env_number("KSTATE_FAILOVER_SECONDS").unwrap_or(25);
    let chaos = chaos("failover", "at-least-once", seconds, 0).await?;
    // No input record's effect is missing (kills may count some twice: at-least-once).
    check_exits_and_restores(&chaos)
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_counts_every_record_once_through_random_kills() -> anyhow::Result<()> {
    let kills = env_number("KSTATE_EOS_KILLS").unwrap_or(10) as usize;
    let seconds = env_number("KSTATE_FAILOVER_SECONDS").unwrap_or(25);
    let chaos = chaos("eos", "exactly-once", seconds, kills).await?;
    assert!(chaos.kills >= kills, "only {} kills", chaos.kills);
    if let Err(e) =
        check_exact_sequences(&chaos.servers, &chaos.run.output, PARTITIONS, &chaos.truth)
    {
        panic!("{e}\n{}", logs(&chaos.copies));
    }
    check_exits_and_restores(&chaos)
}

/// Writes `n` keyed records (key k in partition k % 12) and counts them in `truth`.
fn produce_counted(
    servers: &str,
    input: &str,
    n: usize,
    truth: &mut BTreeMap<Vec<u8>, u64>,
) -> anyhow::Result<()> {
    let batch: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            let k = i * 7 % KEYS;
            (
                (k as i32) % PARTITIONS,
                format!("key-{k}").into_bytes(),
                vec![b'v'],
            )
        })
        .collect();
    produce(servers, input, &batch)?;
    for (_, key, _) in batch {
        *truth.entry(key).or_insert(0) += 1;
    }
    Ok(())
}

fn wait_for_counts(
    servers: &str,
    output: &str,
    truth: &BTreeMap<Vec<u8>, u64>,
    copies: &[Copy],
) -> anyhow::Result<()> {
    let waited = wait_for(
        "every key's count to reach its true count",
        Duration::from_secs(120),
        || {
            let counts = last_counts(&read_topic(servers, output, PARTITIONS)?);
            Ok(truth
                .iter()
                .all(|(k, n)| counts.get(k).is_some_and(|c| c >= n)))
        },
    );
    waited.map_err(|e| anyhow::anyhow!("{e}\n{}", logs(copies)))
}

/// Whether some partition of `topic` has records of an open transaction: its last stable offset
/// (what a read_committed query answers) below its high watermark.
fn has_open_transaction(servers: &str, topic: &str) -> anyhow::Result<bool> {
    for p in 0..PARTITIONS {
        if common::failures::has_open_transaction(servers, topic, p)? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_copy_that_lost_its_partitions_makes_nothing_visible() -> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let run = Run {
        binary: common::service_binary("count_by_key")?,
        servers: servers.clone(),
        app_id: unique_topic("zombie"),
        input: unique_topic("zombie-in"),
        output: unique_topic("zombie-out"),
        guarantee: "exactly-once",
        // Long, so that the paused copy surely holds processed records in its transaction.
        commit_interval_ms: 3_000,
    };
    common::create_topic(&servers, &run.input, PARTITIONS, "delete").await?;
    common::create_topic(&servers, &run.output, PARTITIONS, "delete").await?;
    let dir = tempfile::tempdir()?;
    let mut copies = Copy::slots(dir.path(), 2);
    let mut truth = BTreeMap::new();
    run.spawn(&mut copies[0])?;
    produce_counted(&servers, &run.input, 1_200, &mut truth)?;
    wait_for_counts(&servers, &run.output, &truth, &copies)?;

    // More input, processed into the zombie's open transaction; then it is paused.
    let zombie_pid = copies[0].child.as_ref().context("copy 0")?.id().to_string();
    let mut paused = false;
    for _ in 0..10 {
        produce_counted(&servers, &run.input, 600, &mut truth)?;
        std::thread::sleep(Duration::from_millis(500));
        if has_open_transaction(&servers, &run.output)? {
            Command::new("kill").args(["-STOP", &zombie_pid]).status()?;
            // Still open at the moment it stopped (it did not commit in between)?
            paused = has_open_transaction(&servers, &run.output)?;
            if paused {
                break;
            }
            Command::new("kill").args(["-CONT", &zombie_pid]).status()?;
        }
    }
    anyhow::ensure!(paused, "could not pause copy 0 inside an open transaction");

    // Its partitions move to a second copy after the session timeout; the paused transaction
    // is aborted by the broker after the transaction timeout, and the second copy restores and
    // goes on.
    run.spawn(&mut copies[1])?;
    produce_counted(&servers, &run.input, 600, &mut truth)?;
    wait_for_counts(&servers, &run.output, &truth, &copies)?;

    // The zombie resumes: its commit must fail and nothing of it may become visible. It drops
    // its tasks and rejoins, and gets some partitions back (restored from their changelogs).
    let restores_before = restore_lines(&copies[0].log)?.len();
    Command::new("kill").args(["-CONT", &zombie_pid]).status()?;
    std::thread::sleep(Duration::from_secs(8));
    produce_counted(&servers, &run.input, 600, &mut truth)?;
    wait_for_counts(&servers, &run.output, &truth, &copies)?;
    let mut exits = Vec::new();
    for copy in &mut copies {
        if let Some(mut child) = copy.child.take() {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            exits.push((copy.slot, child.wait()?));
        }
    }
    for (slot, status) in exits {
        assert!(
            status.success(),
            "copy {slot} exited {status} on SIGTERM\n{}",
            logs(&copies)
        );
    }
    assert!(
        restore_lines(&copies[0].log)?.len() > restores_before,
        "the zombie did not rejoin and restore after it was fenced\n{}",
        logs(&copies)
    );

    if let Err(e) = check_exact_sequences(&servers, &run.output, PARTITIONS, &truth) {
        panic!("{e}\n{}", logs(&copies));
    }
    // Every store the zombie left holds exactly its committed changelog up to its stored
    // offset: nothing of the paused transaction reached RocksDB.
    let changelog = format!("{}-counts-changelog", run.app_id);
    let mut checked = 0;
    let app_dir = copies[0].state_dir.join(&run.app_id);
    let state = StateDir::open_existing(&app_dir, &RocksDbOptions::default())?;
    for p in 0..PARTITIONS {
        let raw = state.open_task(p as u32, &["counts"])?.store("counts")?;
        let Some(position) = ChangelogPosition::read(&raw)? else {
            continue;
        };
        let folded = common::fold_changelog_at(&servers, &changelog, p, position.offset + 1)?;
        let held = common::contents(&raw)?;
        assert!(
            held == folded,
            "the zombie's store of task {p} ({} keys) is not its committed changelog up to \
             offset {} ({} keys)",
            held.len(),
            position.offset,
            folded.len()
        );
        checked += 1;
    }
    assert!(checked > 0, "the zombie left no store to check");
    Ok(())
}
