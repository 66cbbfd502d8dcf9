//! Torture: writers in every durability mode are SIGKILLed at random moments (while opening and
//! restoring too), and now and then their directory is deleted; after every kill the store must
//! be a prefix of the mutations issued, containing every acknowledged one.
//!
//! Mutation `s` (a sequence number) is fully determined by `s`: key `s % KEYS`, and either a put of
//! value `s` or, for every seventh, a delete. A child (this test binary run again with
//! `KSTATE_TORTURE_DIR` set) issues mutations `base, base + 1, ...` and appends a sequence number
//! to `acked` once everything up to it is acknowledged: after each put in `sync` mode, after each
//! `commit` (every 100 mutations) in `async` and `group` mode; in `group` mode with 64 KiB
//! memtables, so that RocksDB's own atomic flushes are killed too. So the check needs no guessing:
//! after a kill, the parent reopens the store and looks for a prefix length `L` of the history
//! such that the store equals the fold of the first `L` mutations, with `L` covering the last
//! acknowledged one. No such `L` means a lost acknowledged write or a phantom one.
//!
//! On the three-node cluster (`*_on_a_cluster`: replication 3, `min.insync.replicas=2`), the
//! changelog partition's **leader** is SIGKILLed too, at a random moment of some generations:
//! while the child opens or writes, or while the parent restores. It comes back (and catches up)
//! before the next generation. A child may then fail on its own (a write that reached no quorum
//! in time is an error it sees); the check is the same: nothing acknowledged lost, nothing
//! unissued kept.
//!
//! CI runs a short run (`KSTATE_TORTURE_KILLS`, default 17 per mode, about 50 in all; on the
//! cluster `KSTATE_TORTURE_CLUSTER_KILLS`, default 6 per mode, with
//! `KSTATE_TORTURE_LEADER_KILLS`, default 1); `scripts/torture --kills 1000` runs the long one
//! whose results are in RELIABILITY.md.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kstate::kstate_core::{Error, KeyValueStore};
use kstate::kstate_kafka::{ClientProperties, Durability, LoggedStore, OpenHooks};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::{Cluster, unique_topic};
use rand::{Rng, SeedableRng};

const DIR_ENV: &str = "KSTATE_TORTURE_DIR";
const TOPIC_ENV: &str = "KSTATE_TORTURE_TOPIC";
const MODE_ENV: &str = "KSTATE_TORTURE_MODE";
const BASE_ENV: &str = "KSTATE_TORTURE_BASE";
const BOOTSTRAP_ENV: &str = "KSTATE_TORTURE_BOOTSTRAP";
const KILLS_ENV: &str = "KSTATE_TORTURE_KILLS";
const CLUSTER_KILLS_ENV: &str = "KSTATE_TORTURE_CLUSTER_KILLS";
const LEADER_KILLS_ENV: &str = "KSTATE_TORTURE_LEADER_KILLS";
const KEYS: u64 = 500;
/// Sequence numbers of generation `g` start at `(g + 1) * GENERATION`.
const GENERATION: u64 = 1_000_000_000;
/// The exit code of a child whose store was poisoned (e.g. a killed predecessor's last record
/// landed after this child's restore ended): a clean refusal, not a failure.
const POISONED_EXIT: i32 = 3;

/// Mutation `s`: its key and, unless it is a delete, its value.
fn mutation(s: u64) -> (u64, Option<u64>) {
    (s % KEYS, (s % 7 != 3).then_some(s))
}

fn parse_mode(text: &str) -> Result<Durability> {
    Ok(text.parse()?)
}

/// Where a run's changelog lives.
#[derive(Clone, Copy)]
enum Target {
    /// The tests' broker (one node, one replica).
    Broker,
    /// The shared three-node cluster, whose changelog leader the run also kills.
    Cluster(&'static Cluster),
}

impl Target {
    fn client(self) -> Result<ClientProperties> {
        match self {
            Target::Broker => common::client(),
            Target::Cluster(cluster) => Ok(ClientProperties::new(cluster.bootstrap_servers())),
        }
    }
}

fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(n) => n.parse().context(name.to_string()),
        Err(_) => Ok(default),
    }
}

/// The child's part: does nothing unless run by the parent below.
#[test]
fn torture_child_writes_until_killed() -> Result<()> {
    let (Ok(dir), Ok(topic), Ok(mode), Ok(base)) = (
        std::env::var(DIR_ENV),
        std::env::var(TOPIC_ENV),
        std::env::var(MODE_ENV),
        std::env::var(BASE_ENV),
    ) else {
        return Ok(());
    };
    let mode = parse_mode(&mode)?;
    let client = match std::env::var(BOOTSTRAP_ENV) {
        Ok(servers) => ClientProperties::new(servers),
        Err(_) => common::client()?,
    };
    let dir = Path::new(&dir);
    // In group mode, memtables of 64 KiB: RocksDB flushes (atomically, both column families)
    // every couple of thousand writes on its own, so kills land during its flushes too.
    let options = match mode {
        Durability::Group(_) => RocksDbOptions::default().write_buffer_size(64 << 10),
        _ => RocksDbOptions::default(),
    };
    let store = LoggedStore::open(
        dir.join("store"),
        &options,
        common::changelog_on(client, &topic).durability(mode),
    )?;
    let mut acked = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("acked"))?;
    let poisoned = |e: &Error| {
        if matches!(e, Error::Poisoned { .. }) {
            eprintln!("poisoned: {e}");
            std::process::exit(POISONED_EXIT);
        }
    };
    let base: u64 = base.parse()?;
    for s in base.. {
        let (key, value) = mutation(s);
        let done = match value {
            Some(v) => store.put(&key.to_be_bytes(), &v.to_be_bytes()),
            None => store.delete(&key.to_be_bytes()),
        };
        done.inspect_err(poisoned)?;
        let n = s - base + 1;
        if mode == Durability::Sync {
            acked.write_all(format!("{s}\n").as_bytes())?;
        } else if n.is_multiple_of(100) {
            store.commit().inspect_err(poisoned)?;
            acked.write_all(format!("{s}\n").as_bytes())?;
        }
        if n.is_multiple_of(50) && mode != Durability::Sync {
            // About 50,000 mutations a second at most, so that a long run's changelog stays a
            // size that restores in seconds.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

/// The highest acknowledged sequence number at or above `base`.
fn acked_since(file: &Path, base: u64) -> Result<Option<u64>> {
    if !file.exists() {
        return Ok(None);
    }
    let mut max = None;
    for line in BufReader::new(std::fs::File::open(file)?).lines() {
        let s: u64 = line?.trim().parse()?;
        if s >= base {
            max = max.max(Some(s));
        }
    }
    Ok(max)
}

/// What the run saw.
#[derive(Debug, Default)]
struct Tally {
    kills: usize,
    leader_kills: usize,
    child_errors: usize,
    killed_before_first_ack: usize,
    poisoned_children: usize,
    directory_deletes: usize,
    unexpected_rebuilds: usize,
    bad_states: usize,
    mutations_kept: u64,
    replayed_records: u64,
}

/// The fold of the confirmed history, and the check of a store against it.
struct Model {
    confirmed: BTreeMap<u64, u64>,
}

impl Model {
    /// Finds the prefix length `L >= acked_len` of generation `base`'s mutations for which the
    /// store equals the confirmed fold followed by them; on success the model moves there.
    fn check(
        &mut self,
        base: u64,
        acked_len: u64,
        store: &BTreeMap<u64, u64>,
    ) -> std::result::Result<u64, String> {
        let mut folded = self.confirmed.clone();
        let apply = |folded: &mut BTreeMap<u64, u64>, s: u64| match mutation(s) {
            (k, Some(v)) => {
                folded.insert(k, v);
            }
            (k, None) => {
                folded.remove(&k);
            }
        };
        for s in base..base + acked_len {
            apply(&mut folded, s);
        }
        let at_acked = folded.clone();
        // Anything of this generation in the store bounds how far the prefix can reach.
        let newest = store.values().filter(|v| **v >= base).max().copied();
        // A child writes far fewer than a million mutations before it is killed: a store value
        // past that is itself a wrong state, reported below instead of searched for.
        let max_len =
            (newest.map_or(0, |v| v - base + 1).max(acked_len) + 8).min(acked_len + 1_000_000);
        let differs = |folded: &BTreeMap<u64, u64>, k: u64| folded.get(&k) != store.get(&k);
        let mut mismatched: usize = (0..KEYS).filter(|k| differs(&folded, *k)).count();
        let mut len = acked_len;
        while mismatched > 0 {
            if len >= max_len {
                let examples: Vec<String> = (0..KEYS)
                    .filter(|k| differs(&at_acked, *k))
                    .take(5)
                    .map(|k| {
                        format!(
                            "key {k}: holds {:?}, acknowledged state {:?}",
                            store.get(&k),
                            at_acked.get(&k)
                        )
                    })
                    .collect();
                return Err(format!(
                    "no prefix of at least {acked_len} mutations of generation {base} matches \
                     the store (newest value of this generation: {newest:?}); e.g. {examples:?}"
                ));
            }
            let s = base + len;
            let k = s % KEYS;
            let before = differs(&folded, k);
            apply(&mut folded, s);
            let after = differs(&folded, k);
            mismatched = mismatched + usize::from(after) - usize::from(before);
            len += 1;
        }
        self.confirmed = folded;
        Ok(len)
    }
}

/// Waits until the high watermark of `topic`/0 has not moved for 500 ms. On a cluster whose
/// leader was just killed the watermark cannot be read until another node leads: errors count
/// as "still moving" until the deadline.
fn wait_for_quiet_log(client: &ClientProperties, topic: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = common::high_watermark_at(client.clone(), topic, 0);
        match (&now, &last) {
            (Ok(now), Some(Ok(last))) if now == last => return Ok(()),
            _ => {}
        }
        if Instant::now() >= deadline {
            now.context(format!("the high watermark of {topic}/0"))?;
            bail!("{topic} kept growing after the kill");
        }
        last = Some(now);
    }
}

fn read_store(store: &LoggedStore) -> Result<BTreeMap<u64, u64>> {
    let mut map = BTreeMap::new();
    for entry in store.all()? {
        let (k, v) = entry?;
        let k = u64::from_be_bytes(k.try_into().map_err(|_| anyhow::anyhow!("bad key"))?);
        let v = u64::from_be_bytes(v.try_into().map_err(|_| anyhow::anyhow!("bad value"))?);
        map.insert(k, v);
    }
    Ok(map)
}

async fn torture(target: Target, mode: &str, seed: u64) -> Result<()> {
    let (kills, leader_kills) = match target {
        Target::Broker => (env_count(KILLS_ENV, 17)?, 0),
        Target::Cluster(_) => (
            env_count(CLUSTER_KILLS_ENV, 6)?,
            env_count(LEADER_KILLS_ENV, 1)?,
        ),
    };
    let client = target.client()?;
    let on = match target {
        Target::Broker => "",
        Target::Cluster(_) => "-cluster",
    };
    let topic = unique_topic(&format!("torture{on}-{}", mode.replace(':', "")));
    // Small segments, so that compaction runs during the run (and during restores) as it does
    // in production.
    kstate_bench::kafka::create_topic(
        client.clone(),
        &topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.bytes", "4194304"),
            ("min.cleanable.dirty.ratio", "0.2"),
        ],
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = Model {
        confirmed: BTreeMap::new(),
    };
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    let started = Instant::now();
    for generation in 0..kills {
        let base = (generation as u64 + 1) * GENERATION;
        let mut command = Command::new(std::env::current_exe()?);
        if let Target::Cluster(cluster) = target {
            command.env(BOOTSTRAP_ENV, cluster.bootstrap_servers());
        }
        let mut child = command
            .args([
                "--exact",
                "torture_child_writes_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir.path())
            .env(TOPIC_ENV, &topic)
            .env(MODE_ENV, mode)
            .env(BASE_ENV, base.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // The leader dies anywhere from the child's start to the parent's restore.
        let leader_killer = match target {
            Target::Cluster(cluster) if (generation * leader_kills) % kills < leader_kills => {
                let delay = Duration::from_millis(rng.random_range(0..2500));
                let topic = topic.clone();
                Some(std::thread::spawn(move || -> Result<i32> {
                    std::thread::sleep(delay);
                    let leader = cluster.leader(&topic, 0)?;
                    cluster.kill(leader)?;
                    Ok(leader)
                }))
            }
            _ => None,
        };
        // Anywhere from the child's start (opening, restoring) to well into its writes.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1500)));
        let exited = child.try_wait()?;
        if exited.is_none() {
            child.kill()?; // SIGKILL
        }
        let output = child.wait_with_output()?;
        tally.kills += 1;
        match output.status.code() {
            None => {}
            Some(POISONED_EXIT) => tally.poisoned_children += 1,
            // A write that reached no quorum in time: an error the child saw, not a state.
            Some(_) if matches!(target, Target::Cluster(_)) => {
                tally.child_errors += 1;
                let stderr = String::from_utf8_lossy(&output.stderr);
                let last = stderr
                    .lines()
                    .rev()
                    .find(|l| l.contains("Error"))
                    .unwrap_or("");
                println!("torture {mode}: generation {generation}: the child failed: {last}");
            }
            Some(code) => bail!(
                "generation {generation}: the child exited by itself ({code}): {}",
                String::from_utf8_lossy(&output.stderr)
            ),
        }
        // Requests the killed child had in flight may still be appended: wait until the log's
        // end has stood still for half a second.
        wait_for_quiet_log(&client, &topic)?;

        let acked = acked_since(&dir.path().join("acked"), base)?;
        let acked_len = acked.map_or(0, |s| s - base + 1);
        let recorder = Arc::new(common::Recorder::default());
        let hooks = OpenHooks {
            listener: Some(recorder.clone()),
            record_check: None,
            cancel: None,
        };
        let store = LoggedStore::open_with(
            dir.path().join("store"),
            &RocksDbOptions::default(),
            common::changelog_on(client.clone(), &topic).durability(Durability::Async),
            hooks,
        )?;
        let report = store.restore_report().clone();
        tally.replayed_records += report.records;
        if let Some(reason) = &report.start.rebuild_reason {
            tally.unexpected_rebuilds += 1;
            failures.push(format!("generation {generation}: rebuilt: {reason}"));
        }
        let held = read_store(&store)?;
        match model.check(base, acked_len, &held) {
            Ok(len) => {
                tally.killed_before_first_ack += usize::from(acked.is_none());
                tally.mutations_kept += len;
            }
            Err(why) => {
                tally.bad_states += 1;
                failures.push(format!("generation {generation}: {why}"));
            }
        }
        store.close()?;
        drop(store);
        if let (Some(killer), Target::Cluster(cluster)) = (leader_killer, target) {
            let node = killer
                .join()
                .map_err(|_| anyhow::anyhow!("the leader killer panicked"))??;
            tally.leader_kills += 1;
            // Back, and caught up, before the next generation: two nodes down at once would
            // leave the partition without a quorum (min.insync.replicas=2).
            cluster.restart(node)?;
            cluster.wait_for_full_isr(&topic, Duration::from_secs(120))?;
        }
        if rng.random_ratio(1, 20) {
            std::fs::remove_dir_all(dir.path().join("store"))?;
            tally.directory_deletes += 1;
        }
    }
    println!(
        "torture {mode}: {tally:?} in {:.0?} (topic {topic})",
        started.elapsed()
    );
    ensure!(
        failures.is_empty(),
        "torture {mode}: {} failures: {failures:#?}",
        failures.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn torture_sync() -> Result<()> {
    torture(Target::Broker, "sync", 1).await
}

#[tokio::test(flavor = "multi_thread")]
async fn torture_async() -> Result<()> {
    torture(Target::Broker, "async", 2).await
}

#[tokio::test(flavor = "multi_thread")]
async fn torture_group() -> Result<()> {
    torture(Target::Broker, "group:10ms", 3).await
}

/// The tortures on the cluster, one at a time (each kills nodes), each starting with every node up.
async fn torture_on_a_cluster(mode: &str, seed: u64) -> Result<()> {
    let cluster = kstate_test_broker::cluster()?;
    let _only_user = cluster.exclusive()?;
    torture(Target::Cluster(cluster), mode, seed).await
}

#[tokio::test(flavor = "multi_thread")]
async fn torture_sync_on_a_cluster() -> Result<()> {
    torture_on_a_cluster("sync", 4).await
}

#[tokio::test(flavor = "multi_thread")]
async fn torture_async_on_a_cluster() -> Result<()> {
    torture_on_a_cluster("async", 5).await
}

#[tokio::test(flavor = "multi_thread")]
async fn torture_group_on_a_cluster() -> Result<()> {
    torture_on_a_cluster("group:10ms", 6).await
}
