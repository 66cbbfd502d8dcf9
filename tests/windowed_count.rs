//! The windowed count (`kstate_bench::topology::windowed_count`: per key, counts in tumbling
//! windows, each window's final count sent once when stream time passes its end plus the grace)
//! under SIGKILL, in child processes of this test binary (`child_windowed`; `common::child`).
//!
//! - **Exactly-once through random kills**: three copies run the application while a producer
//!   writes timestamped records (some of them late: behind their partition's stream time by more
//!   than the window and grace), and are killed and restarted at random. Then a record far ahead
//!   in every partition closes every window. A `read_committed` reader of the output must see
//!   every window's final count exactly once, and correct: the count of the records of that key
//!   and window that were not late, late records refused as the partition's order says.
//! - **A late record after a kill and restart** is refused as it would have been without the
//!   restart: window [0, 60 s) closes at 70 s; a record at 75 s closes it (its count, 1, is sent);
//!   the copy is killed and restarted; a record at 30 s arrives first. It is late. A store that
//!   does not keep stream time across the restart takes it (its stream time starts over at 30 s),
//!   counts it and sends window 0 again when a record at 200 s passes its close.
//!
//! - **Exactly-once through backlogs, time jumps and skipped records**: the same check on the
//!   paths where stream time does not move smoothly. Hopping windows (each time in two); input
//!   produced ahead (a backlog before the copies start, and more while all three are down);
//!   event time jumping past whole segments (a minute or two at once, so that every segment
//!   behind expires and is dropped); and records the processor fails on after it has done all
//!   it would (sent the windows their time closes, observed a time minutes ahead and dropped
//!   segments), which the error policy skips: the transaction aborts, and none of it may show,
//!   in the output or in the windows counted later.
//!
//! - **The same on the three-node cluster through broker faults**: the backlog run, its
//!   changelog's leader killed and every node restarted in turn besides (`common::broker_faults`;
//!   `KSTATE_BROKER_FAULTS` asks for more, of every kind), while segments drop and transactions
//!   abort.
//!
//! CI runs at least 6 kills and 15 s of each chaos run; `KSTATE_WINDOWED_KILLS` and
//! `KSTATE_WINDOWED_SECONDS` run longer, `KSTATE_WINDOWED_SEED` repeats a run's kills.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use kstate_bench::topology::windowed_count as windowed;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::broker_faults::{Targets, broker_faults};
use common::child::{self, ChildEnv, Copies};
use common::streams::{env_number, read_topic, wait_for};
use kstate::kstate_core::{BoxError, WindowOptions};
use kstate::kstate_task::{App, Context, ErrorPolicy, ProcessingGuarantee, Processor, Record};
use kstate_test_broker::{Cluster, unique_topic};
use rand::{Rng, SeedableRng};

const PARTITIONS: i32 = 4;
const KEYS: usize = 40;
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_secs(180);
/// How long the output may take after a chaos run of `chaos`: [`WAIT`], plus as long again as
/// the run (a long run leaves a backlog that the copies, each restarted many times, catch up).
fn wait_after(chaos: Duration) -> Duration {
    WAIT + chaos
}
/// Between two records of the chaos input, event time.
const STEP_MS: i64 = 5;
/// Every this many records, one is late by [`LATE_BY_MS`].
const LATE_EVERY: usize = 37;
const LATE_BY_MS: i64 = 3_000;

/// The chaos run's windows: 1 s, grace 200 ms.
fn chaos_windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_secs(1)).grace(Duration::from_millis(200))
}

/// The backlog chaos run's windows: 1 s every 500 ms (each time in two windows), grace 200 ms.
/// Segments are a minute (Kafka Streams' least).
fn backlog_windows() -> WindowOptions {
    WindowOptions::hopping(Duration::from_secs(1), Duration::from_millis(500))
        .grace(Duration::from_millis(200))
}

/// The payload of a record the backlog run's processor fails on.
const BAD: &[u8] = b"bad";

/// The windowed count, failing each record whose value is [`BAD`] after it has done all it
/// would with it (sent the windows its time closes, observed its time, dropped the segments
/// that expires, counted it): an error the policy skips, whose effects the aborted
/// transaction takes back.
struct FailsOnBad(windowed::WindowedCount);

impl Processor for FailsOnBad {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        self.0.process(ctx, record)?;
        if record.value == Some(BAD) {
            return Err("a bad record: failed after all its effects".into());
        }
        Ok(())
    }
}

/// The late-record test's windows: 1 minute, grace 10 s (the example's defaults).
fn minute_windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10))
}

/// The application in a child process: `KSTATE_CHILD_*` carry the cluster, application id,
/// topics and window size and grace; exactly-once; instance id `copy-<slot>`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of the tests of this file, which start it; fails alone"]
async fn child_windowed() -> anyhow::Result<()> {
    let env = ChildEnv::get("child_windowed")?;
    child::init_logging();
    let slot: usize = env.parse("SLOT")?;
    let windows = WindowOptions::hopping(
        Duration::from_millis(env.parse("WINDOW_MS")?),
        Duration::from_millis(env.parse("ADVANCE_MS")?),
    )
    .grace(Duration::from_millis(env.parse("GRACE_MS")?));
    let fails_on_bad: bool = env.parse("FAILS_ON_BAD")?;
    let mut builder = App::builder(env.var("APP_ID")?, env.var("SERVERS")?);
    builder
        .input(env.var("INPUT")?)
        .state_dir(env.var("STATE_DIR")?)
        .commit_interval(COMMIT_INTERVAL)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .instance_id(format!("copy-{slot}"))
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    let output = env.var("OUTPUT")?;
    let app = if fails_on_bad {
        builder.error_policy(ErrorPolicy::LogAndContinue);
        let counts = builder.window_store("counts", windows);
        builder.build(move |_| {
            Box::new(FailsOnBad(windowed::WindowedCount::new(
                counts.clone(),
                windows,
                &output,
            )))
        })?
    } else {
        windowed::build(&mut builder, windows, &output)?.0
    };
    let running = app.start()?;
    child::run_until_sigterm(running, &format!("{}: copy {slot}", env.parent())).await
}

/// One input record: partition, key, timestamp.
type Input = (i32, Vec<u8>, i64);

fn send_all(servers: &str, topic: &str, records: &[Input]) -> anyhow::Result<()> {
    send_values(servers, topic, records.iter().map(|r| (r, &b"x"[..])))
}

/// Sends each record with its value, in order.
fn send_values<'a>(
    servers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (&'a Input, &'a [u8])>,
) -> anyhow::Result<()> {
    let records = records
        .into_iter()
        .map(|((partition, key, time), value)| (*partition, key.as_slice(), value, *time));
    common::streams::produce_timed(servers, topic, records)
}

/// The final counts a correct run sends, `<key>@<start>` → count: each partition's records in
/// order, a record late when its window closed by the partition's stream time, every window
/// closed by the end.
fn expected_finals(records: &[Input], windows: &WindowOptions) -> BTreeMap<Vec<u8>, u64> {
    let mut counts: BTreeMap<(Vec<u8>, i64), u64> = BTreeMap::new();
    let mut stream: BTreeMap<i32, i64> = BTreeMap::new();
    let mut closing: BTreeMap<i32, i64> = BTreeMap::new();
    for (partition, key, time) in records {
        let now = stream.entry(*partition).or_insert(*time);
        *now = (*now).max(*time);
        closing.insert(*partition, *now);
        for start in windows.windows_containing(*time) {
            if windows.closes_at(start) > *now {
                *counts.entry((key.clone(), start)).or_default() += 1;
            }
        }
    }
    counts
        .into_iter()
        .filter(|((key, start), _)| {
            let partition = partition_of(key);
            closing
                .get(&partition)
                .is_some_and(|now| windows.closes_at(*start) <= *now)
        })
        .map(|((key, start), n)| {
            let mut out = key;
            out.extend_from_slice(format!("@{start}").as_bytes());
            (out, n)
        })
        .collect()
}

fn key(k: usize) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

fn partition_of(key: &[u8]) -> i32 {
    let k: usize = std::str::from_utf8(&key[4..]).unwrap().parse().unwrap();
    (k % PARTITIONS as usize) as i32
}

/// Every output record, `<key>@<start>` → every count sent for it.
fn outputs(servers: &str, topic: &str) -> anyhow::Result<BTreeMap<Vec<u8>, Vec<u64>>> {
    let mut sent: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
    for (_, _, key, value) in read_topic(servers, topic, PARTITIONS)? {
        let count = std::str::from_utf8(&value.context("an output without a value")?)?.parse()?;
        sent.entry(key).or_default().push(count);
    }
    Ok(sent)
}

/// Waits until the output holds every expected window, then checks it holds nothing else and
/// each once.
fn check_output(
    servers: &str,
    topic: &str,
    expected: &BTreeMap<Vec<u8>, u64>,
    copies: &mut Copies,
    wait: Duration,
) -> anyhow::Result<()> {
    let waited = wait_for("every window's final count", wait, || {
        copies.check_alive()?;
        Ok(outputs(servers, topic)?.len() >= expected.len())
    });
    let mut problems = Vec::new();
    match waited {
        // A late duplicate would show within a few commit intervals.
        Ok(()) => std::thread::sleep(COMMIT_INTERVAL * 5 + Duration::from_secs(1)),
        // Say which windows are missing or wrong, not only that the wait ended.
        Err(e) => problems.push(e.to_string()),
    }
    let sent = outputs(servers, topic)?;
    for (window, counts) in &sent {
        let name = String::from_utf8_lossy(window);
        match expected.get(window) {
            None => problems.push(format!("{name}: sent {counts:?}, expected nothing")),
            Some(n) if counts != &[*n] => {
                problems.push(format!("{name}: sent {counts:?}, expected [{n}]"))
            }
            Some(_) => {}
        }
    }
    for window in expected.keys().filter(|w| !sent.contains_key(*w)) {
        problems.push(format!("{}: never sent", String::from_utf8_lossy(window)));
    }
    anyhow::ensure!(
        problems.is_empty(),
        "{} of {} windows wrong: {}\n{}",
        problems.len(),
        expected.len(),
        problems
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("; "),
        copies.logs()
    );
    Ok(())
}

/// The chaos runs of this binary take turns: each has three copies and a producer, those on the
/// cluster three nodes more; two at once on two cores starve the brokers.
static ONE_CHAOS_RUN_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A chaos run's bounds and kills, from the environment: at least `KSTATE_WINDOWED_KILLS`
/// kills (6) and `KSTATE_WINDOWED_SECONDS` (15), a random source seeded by
/// `KSTATE_WINDOWED_SEED` (random, and printed so that a run can be repeated).
fn chaos_settings(name: &str) -> (usize, u64, rand::rngs::StdRng) {
    let min_kills = env_number("KSTATE_WINDOWED_KILLS").unwrap_or(6) as usize;
    let seconds = env_number("KSTATE_WINDOWED_SECONDS").unwrap_or(15);
    let seed = env_number("KSTATE_WINDOWED_SEED").unwrap_or_else(|| rand::rng().random());
    eprintln!("{name}: at least {seconds} s and {min_kills} kills, seed {seed}");
    (min_kills, seconds, rand::rngs::StdRng::seed_from_u64(seed))
}

/// `n` copies of the application; with `fails_on_bad`, each runs [`FailsOnBad`] under
/// `ErrorPolicy::LogAndContinue`.
async fn copies_of(
    name: &str,
    servers: &str,
    windows: &WindowOptions,
    n: usize,
    fails_on_bad: bool,
) -> anyhow::Result<(Copies, String, String, String)> {
    let (input, output) = (
        unique_topic(&format!("{name}-in")),
        unique_topic(&format!("{name}-out")),
    );
    // Event time may run ahead of the wall clock (jumps): the input takes any timestamp
    // (Kafka 4 refuses those more than an hour ahead by default).
    let any_time = i64::MAX.to_string();
    let settings = [
        ("cleanup.policy", "delete"),
        ("message.timestamp.after.max.ms", any_time.as_str()),
    ];
    kstate_bench::kafka::create_topic(servers, &input, PARTITIONS, &settings).await?;
    common::create_topic(servers, &output, PARTITIONS, "delete").await?;
    let app_id = unique_topic(name);
    let env = vec![
        ("SERVERS", servers.to_string()),
        ("APP_ID", app_id.clone()),
        ("INPUT", input.clone()),
        ("OUTPUT", output.clone()),
        ("WINDOW_MS", windows.size_ms().to_string()),
        ("ADVANCE_MS", windows.advance_ms().to_string()),
        ("GRACE_MS", windows.grace_ms().to_string()),
        ("FAILS_ON_BAD", fails_on_bad.to_string()),
    ];
    Ok((
        Copies::new(name, "child_windowed", &env, n)?,
        input,
        output,
        app_id,
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_final_counts_through_random_kills_are_sent_once_and_correct()
-> anyhow::Result<()> {
    let name = "windowed-eos";
    let _turn = ONE_CHAOS_RUN_AT_A_TIME.lock().await;
    let (min_kills, seconds, mut rng) = chaos_settings(name);
    let servers = kstate_test_broker::bootstrap_servers()?;
    let windows = chaos_windows();
    let (mut copies, input, output, _) = copies_of(name, &servers, &windows, 3, false).await?;
    for slot in 0..3 {
        copies.spawn(slot)?;
    }
    // Event time starts now, so that the changelogs' retention (by record time) keeps it all.
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let mut records: Vec<Input> = Vec::new();
    let started = Instant::now();
    let mut kills = 0;
    let mut i = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) || kills < min_kills {
        let batch: Vec<Input> = (i..i + 400)
            .map(|i| {
                let k = i % KEYS;
                let mut time = base + i as i64 * STEP_MS;
                if i % LATE_EVERY == LATE_EVERY - 1 {
                    time -= LATE_BY_MS;
                }
                ((k % PARTITIONS as usize) as i32, key(k), time)
            })
            .collect();
        i += batch.len();
        send_all(&servers, &input, &batch)?;
        records.extend(batch);
        std::thread::sleep(Duration::from_millis(rng.random_range(500..1_500)));
        let slot = rng.random_range(0..3);
        copies.kill(slot)?;
        kills += 1;
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1_000)));
        copies.spawn(slot)?;
    }
    // A record far ahead in every partition closes every window so far.
    let end = base + i as i64 * STEP_MS + 10_000;
    let closers: Vec<Input> = (0..PARTITIONS as usize)
        .map(|p| (p as i32, key(p), end))
        .collect();
    send_all(&servers, &input, &closers)?;
    records.extend(closers);
    let expected = expected_finals(&records, &windows);
    eprintln!(
        "{name}: {} records, {} windows, {kills} kills in {:.0?}",
        records.len(),
        expected.len(),
        started.elapsed()
    );
    let chaos = started.elapsed();
    check_output(&servers, &output, &expected, &mut copies, wait_after(chaos))?;
    copies.stop_all()?;
    copies.check_no_foreign_writes(&copies.all())?;
    copies.finished();
    Ok(())
}

/// The backlog run's input: each partition's records in order, some late, some [`BAD`],
/// event time now and then jumping a minute or two ahead.
struct Backlog {
    /// The next record's number.
    i: usize,
    /// Event time of the next record (before it is made late).
    time: i64,
    /// Every record sent, with whether it is bad.
    sent: Vec<(Input, bool)>,
}

/// Between two jumps of event time, on average, records.
const JUMP_EVERY: u32 = 2_000;
/// Every this many records one is [`BAD`]; every other bad one is far ahead.
const BAD_EVERY: usize = 53;
/// How far ahead a far bad record is: past several segments.
const BAD_AHEAD_MS: i64 = 300_000;

impl Backlog {
    fn new(base: i64) -> Self {
        Backlog {
            i: 0,
            time: base,
            sent: Vec::new(),
        }
    }

    /// The next `n` records, remembered as sent.
    fn next(&mut self, rng: &mut impl Rng, n: usize) -> Vec<(Input, bool)> {
        let mut batch = Vec::with_capacity(n);
        for _ in 0..n {
            let i = self.i;
            self.i += 1;
            if rng.random_ratio(1, JUMP_EVERY) {
                // Past a segment or two: every segment behind expires at once.
                self.time += rng.random_range(61_000..130_000);
            }
            self.time += STEP_MS;
            let k = i % KEYS;
            let partition = (k % PARTITIONS as usize) as i32;
            let bad = i % BAD_EVERY == BAD_EVERY - 1;
            let time = if bad && (i / BAD_EVERY).is_multiple_of(2) {
                self.time + BAD_AHEAD_MS
            } else if i % LATE_EVERY == LATE_EVERY - 1 {
                self.time - LATE_BY_MS
            } else {
                self.time
            };
            batch.push(((partition, key(k), time), bad));
        }
        self.sent.extend(batch.iter().cloned());
        batch
    }

    fn send(
        &mut self,
        rng: &mut impl Rng,
        n: usize,
        servers: &str,
        topic: &str,
    ) -> anyhow::Result<()> {
        let batch = self.next(rng, n);
        send_values(
            servers,
            topic,
            batch
                .iter()
                .map(|(input, bad)| (input, if *bad { BAD } else { &b"x"[..] })),
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_final_counts_through_backlogs_time_jumps_and_skipped_records_are_sent_once_and_correct()
-> anyhow::Result<()> {
    backlog_chaos("windowed-backlog", None).await
}

/// The backlog run on the three-node cluster: besides the copies' kills and outages, its nodes
/// fail (`common::broker_faults`: CI kills a changelog leader and restarts every node in turn;
/// `KSTATE_BROKER_FAULTS` asks for more), while segments are dropped and transactions abort.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_final_counts_on_a_cluster_through_broker_faults_backlogs_and_time_jumps_are_sent_once_and_correct()
-> anyhow::Result<()> {
    let cluster = kstate_test_broker::cluster()?;
    let _only_user = cluster.exclusive()?;
    backlog_chaos("windowed-cluster", Some(cluster)).await
}

/// Three copies through kills, outages of all of them, backlogs, time jumps and skipped
/// records (see the module docs); on `cluster`, broker faults too, one at a time after the
/// second kill.
async fn backlog_chaos(name: &str, cluster: Option<&Cluster>) -> anyhow::Result<()> {
    let _turn = ONE_CHAOS_RUN_AT_A_TIME.lock().await;
    let (min_kills, seconds, mut rng) = chaos_settings(name);
    let mut faults = match cluster {
        Some(_) => broker_faults(rng.random())?,
        None => Vec::new(),
    };
    let servers = match cluster {
        Some(cluster) => cluster.bootstrap_servers().to_string(),
        None => kstate_test_broker::bootstrap_servers()?,
    };
    let windows = backlog_windows();
    let (mut copies, input, output, app_id) = copies_of(name, &servers, &windows, 3, true).await?;
    let targets = Targets {
        changelog: format!("{app_id}-counts-changelog"),
        app_id,
        inputs: vec![input.clone()],
        partitions: PARTITIONS,
        copies: 3,
    };
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let mut input_records = Backlog::new(base);
    // A backlog before any copy runs.
    input_records.send(&mut rng, 3_000, &servers, &input)?;
    for slot in 0..3 {
        copies.spawn(slot)?;
    }
    let started = Instant::now();
    let (mut kills, mut outages) = (0, 0);
    let mut inflicted = 0;
    while started.elapsed() < Duration::from_secs(seconds)
        || kills < min_kills
        || !faults.is_empty()
    {
        if kills >= 2
            && let (Some(cluster), Some(fault)) = (cluster, faults.pop())
        {
            let what = fault.inflict(cluster, &targets, &mut rng)?;
            eprintln!("{name}: {what} ({:.0?})", started.elapsed());
            inflicted += 1;
            copies.check_alive()?;
        }
        if rng.random_ratio(1, 8) {
            // Every copy down while a backlog piles up.
            for slot in 0..3 {
                copies.kill(slot)?;
                kills += 1;
            }
            outages += 1;
            input_records.send(&mut rng, 2_000, &servers, &input)?;
            for slot in 0..3 {
                copies.spawn(slot)?;
            }
            std::thread::sleep(Duration::from_millis(rng.random_range(500..1_500)));
            continue;
        }
        input_records.send(&mut rng, 400, &servers, &input)?;
        std::thread::sleep(Duration::from_millis(rng.random_range(500..1_500)));
        let slot = rng.random_range(0..3);
        copies.kill(slot)?;
        kills += 1;
        std::thread::sleep(Duration::from_millis(rng.random_range(0..1_000)));
        copies.spawn(slot)?;
    }
    // A record far ahead in every partition closes every window so far.
    let end = input_records.time + BAD_AHEAD_MS + 10_000;
    let closers: Vec<Input> = (0..PARTITIONS as usize)
        .map(|p| (p as i32, key(p), end))
        .collect();
    send_all(&servers, &input, &closers)?;
    let mut good: Vec<Input> = input_records
        .sent
        .iter()
        .filter(|(_, bad)| !bad)
        .map(|(input, _)| input.clone())
        .collect();
    good.extend(closers);
    let expected = expected_finals(&good, &windows);
    eprintln!(
        "{name}: {} records ({} bad), {} windows, {kills} kills ({outages} of all copies) and \
         {inflicted} broker faults in {:.0?}",
        input_records.sent.len() + PARTITIONS as usize,
        input_records.sent.len() + PARTITIONS as usize - good.len(),
        expected.len(),
        started.elapsed()
    );
    let chaos = started.elapsed();
    check_output(&servers, &output, &expected, &mut copies, wait_after(chaos))?;
    copies.stop_all()?;
    copies.check_no_foreign_writes(&copies.all())?;
    copies.finished();
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_record_after_a_kill_and_restart_is_refused_as_before() -> anyhow::Result<()> {
    let name = "windowed-late";
    let servers = kstate_test_broker::bootstrap_servers()?;
    let windows = minute_windows();
    let (mut copies, input, output, _) = copies_of(name, &servers, &windows, 1, false).await?;
    copies.spawn(0)?;
    let a = key(0);
    let second = 1_000i64;
    // Event times from a recent minute `t0` (`common::recent_minute`): window 0 is [t0, t0 + 60 s).
    let t0 = common::recent_minute();
    send_all(
        &servers,
        &input,
        &[
            (0, a.clone(), t0 + 10 * second),
            (0, a.clone(), t0 + 75 * second),
        ],
    )?;
    // Window 0 closed at 70 s and went out, with its count, 1.
    let window_0 = format!("key-0@{t0}").into_bytes();
    let sent = wait_for("window 0's final count", WAIT, || {
        copies.check_alive()?;
        Ok(outputs(&servers, &output)?.contains_key(&window_0))
    });
    sent.map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
    // Committed with it: the store's stream time, 75 s. Then a crash.
    std::thread::sleep(COMMIT_INTERVAL * 5);
    copies.kill(0)?;
    copies.spawn(0)?;
    // Late before the crash (window 0 closed at 70 s), so late after it.
    send_all(
        &servers,
        &input,
        &[
            (0, a.clone(), t0 + 30 * second),
            (0, a.clone(), t0 + 200 * second),
        ],
    )?;
    let window_1 = format!("key-0@{}", t0 + 60_000).into_bytes();
    let expected: BTreeMap<Vec<u8>, u64> = [(window_0, 1), (window_1, 1)].into_iter().collect();
    check_output(&servers, &output, &expected, &mut copies, WAIT)?;
    copies.stop_all()?;
    copies.finished();
    Ok(())
}

/// `Running::query` on the window store's handle reads the counts of the windows still open,
/// from the task that owns the partition, and names a partition that is not here.
#[tokio::test(flavor = "multi_thread")]
async fn open_windows_are_queryable_while_the_task_runs() -> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let (input, output) = (
        unique_topic("windowed-query-in"),
        unique_topic("windowed-query-out"),
    );
    common::create_topic(&servers, &input, PARTITIONS, "delete").await?;
    common::create_topic(&servers, &output, PARTITIONS, "delete").await?;
    let state = tempfile::tempdir()?;
    let mut builder = App::builder(unique_topic("windowed-query"), servers.clone());
    builder
        .input(input.clone())
        .state_dir(state.path())
        .commit_interval(COMMIT_INTERVAL);
    let (app, counts) = windowed::build(&mut builder, minute_windows(), &output)?;
    let running = app.start()?;
    let a = key(1);
    let p = partition_of(&a);
    let second = 1_000i64;
    let t0 = common::recent_minute();
    send_all(
        &servers,
        &input,
        &[
            (p, a.clone(), t0 + 10 * second),
            (p, a.clone(), t0 + 20 * second),
            (p, a.clone(), t0 + 65 * second),
        ],
    )?;
    let query = running.query(&counts);
    wait_for("both windows' counts", WAIT, || {
        let windows = match query.fetch(p, &a, ..) {
            Ok(windows) => windows,
            Err(kstate::kstate_task::QueryError::NotHere { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let got: Vec<(i64, i64)> = windows
            .iter()
            .map(|w| (w.start(), i64::from_be_bytes(w.value().try_into().unwrap())))
            .collect();
        Ok(got == [(t0, 2), (t0 + 60_000, 1)])
    })?;
    // Window [t0, t0 + 60 s) is open (it closes at 70 s); a time range picks windows by start.
    let first: Vec<i64> = query
        .fetch(p, &a, t0..t0 + 60_000)?
        .iter()
        .map(|w| w.start())
        .collect();
    assert_eq!(first, [t0]);
    assert_eq!(query.fetch_all(p, ..)?.len(), 2);
    assert!(matches!(
        query.fetch(PARTITIONS, &a, ..),
        Err(kstate::kstate_task::QueryError::NotHere { partition, .. }) if partition == PARTITIONS
    ));
    drop(running);
    Ok(())
}
