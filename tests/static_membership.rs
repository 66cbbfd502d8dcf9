//! Static membership (`AppBuilder::static_membership`): a process SIGKILLed and started again
//! with the same instance id, within the session timeout, gets its tasks back **without a
//! rebalance** — the other process never stops its tasks — and its stores replay only their
//! tail.
//!
//! Two copies of this test binary (`child_counter`, `common::child`) count keys over two
//! co-partitioned inputs, exactly-once, with the eager protocol (every rebalance revokes every
//! task of every member, so a rebalance cannot pass unseen in the survivor's log) and a session
//! timeout of 30 s. Each copy in turn is SIGKILLed and started again at once, and the producer
//! writes more; then:
//! - the survivor logged no revocation and no new assignment after the kill;
//! - the restarted copy's assignment is the one it had before the kill;
//! - every restore of the restarted copy starts at or after the end of that task's previous
//!   restore in its directory (the tail only, no rebuild);
//! - a `read_committed` reader of the output sees each key's counts `1, 2, ..., n`, exactly.
//!
//! With `static_membership(false)` the first restart makes the group rebalance and the test
//! fails on the survivor's log.
//!
//! **Standby replicas** (`AppBuilder::standby_replicas(1)`): three copies, six partitions, each
//! copy follows the tasks the placement model (`kstate_task::placement`) says it would receive
//! if another copy failed. With the input quiet and the standbys caught up, each copy in turn
//! is SIGKILLed; after the session timeout (6 s) every task it ran is restored by the copy the
//! model predicted, **with nothing to replay** (the standby's position is the changelog's end):
//! 100 % hits. The killed copy comes back, and the next is killed. Then the producer writes
//! while a random copy is killed, stays away past the session timeout and is started again
//! (`KSTATE_STANDBY_KILLS` times, 1 in CI; `KSTATE_STANDBY_SEED` repeats a run), and a
//! `read_committed` reader sees each key's counts `1, 2, ..., n` exactly: promoted standbys
//! hold exactly the committed state.
//! Without standbys (`KSTATE_STANDBY_REPLICAS=0`) a moved task replays what it missed, and the
//! test fails on the replay count.
//!
//! **Failure detection** (`AppBuilder::failure_detection`, 1 s): the same test with a session
//! timeout of 60 s. Each killed copy's tasks restore on the predicted standbys within 30 s,
//! which only the survivors' removal of its members (they log it) can have done; then, after
//! the kills under traffic, a copy is SIGSTOPped under traffic until another copy removes it,
//! and resumed (`KSTATE_STANDBY_PAUSES` times, 1 in CI): it is fenced, rejoins, and the counts
//! stay exact; a changelog write it made before learning of its removal is aborted, and the
//! new owner, finding it after its restore's end, restores the task again. `KSTATE_PAUSE_MS` pauses for that long instead and reports how many pauses were
//! taken for deaths (the false-positive measurement in RELIABILITY.md).
//!
//! **Failure detection on the three-node cluster**: the beacons' partition's leader and the
//! group coordinator are killed, and every node restarts in turn, under traffic: no copy may
//! take the stall for another's silence, the counts stay exact, and a copy killed afterwards is
//! still removed by a survivor within 30 s (session timeout 60 s).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::child::{self, ChildEnv, Copies};
use common::streams::{
    check_exact_sequences, env_number, last_counts, produce, read_topic, wait_for,
};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::placement::{RangePlacement, process_of};
use kstate::kstate_task::{
    App, Context, GroupProtocol, ProcessingGuarantee, Processor, Record, StoreHandle, StoreOptions,
    TaskId,
};
use kstate_test_broker::unique_topic;
use rand::{Rng, SeedableRng};

const PARTITIONS: i32 = 6;
const KEYS: usize = 40;
const COMMIT_INTERVAL: Duration = Duration::from_millis(200);
/// What the survivor's worker logs when a rebalance reaches it.
const REBALANCE_WORDS: [&str; 3] = [
    "committing and closing tasks",
    "dropping tasks without a commit",
    "assigned; restoring",
];

/// Counts each key over every input; sends `(key, count)` to the output.
struct Count {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
}

impl Processor for Count {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.counts);
        let n = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &n)?;
        ctx.send(&self.output, &key, Some(n.to_string().as_bytes()))?;
        Ok(())
    }
}

/// The counting application, in a child process: `KSTATE_CHILD_*` carry the cluster,
/// application id, inputs, output, whether membership is static, the standby replicas and the
/// session timeout; the instance id is `copy-<slot>`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of the static membership test, which starts it; fails alone"]
async fn child_counter() -> anyhow::Result<()> {
    let env = ChildEnv::get("child_counter")?;
    child::init_logging();
    let slot: usize = env.parse("SLOT")?;
    let mut builder = App::builder(env.var("APP_ID")?, env.var("SERVERS")?);
    for input in env.list("INPUTS")? {
        builder.input(input);
    }
    builder
        .state_dir(env.var("STATE_DIR")?)
        .commit_interval(COMMIT_INTERVAL)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .group_protocol(GroupProtocol::Eager)
        .instance_id(format!("copy-{slot}"))
        .static_membership(env.parse("STATIC")?)
        .standby_replicas(env.parse("STANDBYS")?)
        .consumer_property("session.timeout.ms", env.var("SESSION_TIMEOUT_MS")?);
    match env.parse::<u64>("FAILURE_DETECTION_MS")? {
        0 => builder.consumer_property("heartbeat.interval.ms", "1000"),
        ms => builder.failure_detection(Duration::from_millis(ms)),
    };
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let output = env.var("OUTPUT")?;
    let app = builder.build(move |_| {
        Box::new(Count {
            counts: counts.clone(),
            output: output.clone(),
        })
    })?;
    child::run_until_sigterm(app.start()?, &format!("{}: copy {slot}", env.parent())).await
}

/// A copy's log from byte `from` on.
fn log_since(copies: &Copies, slot: usize, from: usize) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&copies.copies[slot].log)?;
    Ok(text.get(from..).unwrap_or_default().to_string())
}

fn log_len(copies: &Copies, slot: usize) -> anyhow::Result<usize> {
    Ok(std::fs::metadata(&copies.copies[slot].log)?.len() as usize)
}

/// The `tasks = [...]` of the last "assigned; restoring" line of `log`.
fn last_assignment(log: &str) -> Option<String> {
    log.lines()
        .filter(|l| l.contains("assigned; restoring"))
        .filter_map(|l| l.split_once("tasks=").map(|(_, t)| t.trim().to_string()))
        .next_back()
}

/// The partitions of an assignment's `[0, 1]`.
fn partitions_in(tasks: &str) -> Vec<i32> {
    tasks
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Each "restore starting" line of `log` as (partition, start offset, end offset), the partition
/// read from the restore span's fields.
fn restores(log: &str) -> Vec<(String, i64, i64)> {
    let field = |line: &str, name: &str| -> Option<String> {
        let (_, rest) = line.split_once(&format!("{name}="))?;
        Some(rest.split([' ', '}', ':', ',']).next()?.to_string())
    };
    log.lines()
        .filter(|l| l.contains("restore starting"))
        .filter_map(|l| {
            Some((
                format!("{}/{}", field(l, "topic")?, field(l, "partition")?),
                field(l, "start_offset")?.parse().ok()?,
                field(l, "end_offset")?.parse().ok()?,
            ))
        })
        .collect()
}

/// A record to write: partition, key, value.
type Keyed = (i32, Vec<u8>, Vec<u8>);

/// Writes `per_key` records of every key, spread over both inputs, and adds them to `truth`.
fn write_round(
    servers: &str,
    inputs: &[String],
    per_key: usize,
    truth: &mut BTreeMap<Vec<u8>, u64>,
) -> anyhow::Result<()> {
    let mut by_input: Vec<Vec<Keyed>> = vec![Vec::new(); inputs.len()];
    for round in 0..per_key {
        for k in 0..KEYS {
            let key = format!("key-{k}").into_bytes();
            by_input[(k + round) % inputs.len()].push((
                (k % PARTITIONS as usize) as i32,
                key.clone(),
                b"x".to_vec(),
            ));
            *truth.entry(key).or_default() += 1;
        }
    }
    for (input, records) in inputs.iter().zip(&by_input) {
        produce(servers, input, records)?;
    }
    Ok(())
}

/// A thread writing a round of two records per key every 500 ms until stopped.
struct Traffic {
    writing: Arc<AtomicBool>,
    writer: std::thread::JoinHandle<anyhow::Result<BTreeMap<Vec<u8>, u64>>>,
}

impl Traffic {
    fn start(servers: &str, inputs: &[String]) -> Traffic {
        let writing = Arc::new(AtomicBool::new(true));
        let (servers, inputs, on) = (servers.to_string(), inputs.to_vec(), writing.clone());
        let writer = std::thread::spawn(move || {
            let mut more = BTreeMap::new();
            while on.load(Ordering::Relaxed) {
                write_round(&servers, &inputs, 2, &mut more)?;
                std::thread::sleep(Duration::from_millis(500));
            }
            Ok(more)
        });
        Traffic { writing, writer }
    }

    /// Stops the writer; what it wrote, per key.
    fn stop(self) -> anyhow::Result<BTreeMap<Vec<u8>, u64>> {
        self.writing.store(false, Ordering::Relaxed);
        self.writer.join().expect("the writer panicked")
    }
}

fn wait_for_counts(
    servers: &str,
    output: &str,
    truth: &BTreeMap<Vec<u8>, u64>,
    copies: &mut Copies,
) -> anyhow::Result<()> {
    wait_for("the counts to catch up", Duration::from_secs(90), || {
        copies.check_alive()?;
        Ok(&last_counts(&read_topic(servers, output, PARTITIONS)?) == truth)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_static_member_gets_its_tasks_back_without_a_rebalance() -> anyhow::Result<()> {
    let name = "static-restart";
    let servers = kstate_test_broker::bootstrap_servers()?;
    let inputs = vec![unique_topic("static-a"), unique_topic("static-b")];
    let output = unique_topic("static-out");
    for topic in inputs.iter().chain([&output]) {
        common::create_topic(servers.as_str(), topic, PARTITIONS, "delete").await?;
    }
    let stat = std::env::var("KSTATE_STATIC_MEMBERSHIP").unwrap_or_else(|_| "true".into());
    let env = vec![
        ("SERVERS", servers.clone()),
        ("APP_ID", unique_topic(name)),
        ("INPUTS", inputs.join(",")),
        ("OUTPUT", output.clone()),
        ("STATIC", stat),
        ("STANDBYS", "0".into()),
        ("SESSION_TIMEOUT_MS", "30000".into()),
        ("FAILURE_DETECTION_MS", "0".into()),
    ];
    let mut copies = Copies::new(name, "child_counter", &env, 2)?;
    copies.spawn(0)?;
    copies.spawn(1)?;
    let mut truth = BTreeMap::new();
    write_round(&servers, &inputs, 5, &mut truth)?;
    wait_for_counts(&servers, &output, &truth, &mut copies)?;
    // Let the group settle: the copies' last assignments split the tasks between them (the
    // first copy may have run everything alone before the second joined).
    wait_for(
        "the copies to split the tasks",
        Duration::from_secs(60),
        || {
            copies.check_alive()?;
            let mut all = Vec::new();
            for slot in 0..2 {
                match last_assignment(&log_since(&copies, slot, 0)?) {
                    Some(tasks) if !partitions_in(&tasks).is_empty() => {
                        all.extend(partitions_in(&tasks))
                    }
                    _ => return Ok(false),
                }
            }
            all.sort();
            Ok(all == (0..PARTITIONS).collect::<Vec<_>>())
        },
    )?;
    std::thread::sleep(Duration::from_secs(2));

    for victim in [0usize, 1] {
        let survivor = 1 - victim;
        let before = log_since(&copies, victim, 0)?;
        let assigned_before = last_assignment(&before)
            .with_context(|| format!("copy {victim} logged no assignment"))?;
        let previous_restores = restores(&before);
        let survivor_mark = log_len(&copies, survivor)?;
        let victim_mark = log_len(&copies, victim)?;

        copies.kill(victim)?;
        let restarted = Instant::now();
        copies.spawn(victim)?;
        write_round(&servers, &inputs, 3, &mut truth)?;
        wait_for_counts(&servers, &output, &truth, &mut copies)?;
        let after = log_since(&copies, victim, victim_mark)?;
        wait_for(
            "the restarted copy to run its tasks",
            Duration::from_secs(30),
            || Ok(log_since(&copies, victim, victim_mark)?.contains("restored; running")),
        )?;
        eprintln!(
            "copy {victim}: killed and started again; counts caught up {:.1} s later",
            restarted.elapsed().as_secs_f64()
        );

        let survivor_log = log_since(&copies, survivor, survivor_mark)?;
        let rebalance: Vec<&str> = survivor_log
            .lines()
            .filter(|l| REBALANCE_WORDS.iter().any(|w| l.contains(w)))
            .collect();
        anyhow::ensure!(
            rebalance.is_empty(),
            "copy {victim}'s restart made the group rebalance: copy {survivor} logged {rebalance:#?}\n{}",
            copies.logs()
        );
        let assigned_after = last_assignment(&after)
            .with_context(|| format!("copy {victim} logged no assignment after its restart"))?;
        anyhow::ensure!(
            assigned_after == assigned_before,
            "copy {victim} had {assigned_before} before the kill and {assigned_after} after"
        );
        for (changelog, start, _) in restores(&after) {
            let previous_end = previous_restores
                .iter()
                .filter(|(c, _, _)| *c == changelog)
                .map(|(_, _, end)| *end)
                .max()
                .with_context(|| {
                    format!("copy {victim} restored {changelog} for the first time")
                })?;
            anyhow::ensure!(
                start >= previous_end,
                "copy {victim} restored {changelog} from {start}, before the end of its previous \
                 restore ({previous_end}): more than the tail"
            );
        }
    }
    check_exact_sequences(&servers, &output, PARTITIONS, &truth)?;
    copies.stop_all()?;
    copies.finished();
    for topic in inputs.iter().chain([&output]) {
        common::delete_topic(topic).await?;
    }
    Ok(())
}

/// The tasks a copy's log says it follows now: in its current run (after the log's last start
/// line), "standby following" lines less "standby stopped".
fn followed(log: &str) -> BTreeSet<i32> {
    let log = log.rsplit_once("\n=== ").map_or(log, |(_, run)| run);
    let task_of = |line: &str| -> Option<i32> {
        line.rsplit_once("task=task ")?
            .1
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let mut now = BTreeSet::new();
    for line in log.lines() {
        if line.contains("standby following") {
            now.extend(task_of(line));
        } else if line.contains("standby stopped")
            && let Some(t) = task_of(line)
        {
            now.remove(&t);
        }
    }
    now
}

/// Whether a copy other than `victim` logged, after its mark in `marks`, that it removed a
/// silent process's members (with `removed` above zero: the first to ask removes them).
fn removed_by_a_survivor(copies: &Copies, victim: usize, marks: &[usize]) -> bool {
    (0..marks.len()).filter(|&s| s != victim).any(|s| {
        log_since(copies, s, marks[s]).is_ok_and(|log| {
            log.lines().any(|l| {
                l.contains("process silent: removed its members") && !l.contains("removed=0")
            })
        })
    })
}

/// (partition, records) of each "restore done" line of `log` that is not a standby's.
fn active_restores_done(log: &str) -> Vec<(i32, u64)> {
    let field = |line: &str, name: &str| -> Option<String> {
        let (_, rest) = line.split_once(&format!(" {name}="))?;
        Some(rest.split([' ', '}', ':']).next()?.to_string())
    };
    log.lines()
        .filter(|l| l.contains("restore done") && !l.contains("standby{"))
        .filter_map(|l| {
            let partition = l
                .split_once("partition=")?
                .1
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?;
            Some((partition, field(l, "records")?.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_copys_tasks_restore_from_the_predicted_standbys_with_nothing_to_replay()
-> anyhow::Result<()> {
    standby_failover("standby-failover", None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_copy_is_removed_from_the_group_before_its_session_expires() -> anyhow::Result<()>
{
    standby_failover("silent-copy", Some(Duration::from_secs(1))).await
}

/// The standby failover test, with the session timeout of 6 s, or with failure detection by
/// liveness beacons after `detection` and a session timeout of 60 s (a task that moves within
/// 30 s of a kill was moved by the detector), then also copies paused past `detection`.
async fn standby_failover(name: &str, detection: Option<Duration>) -> anyhow::Result<()> {
    let copies_n = 3;
    let (session, move_deadline) = match detection {
        Some(_) => (Duration::from_secs(60), Duration::from_secs(30)),
        None => (Duration::from_secs(6), Duration::from_secs(60)),
    };
    let standbys: u32 = std::env::var("KSTATE_STANDBY_REPLICAS")
        .ok()
        .map_or(Ok(1), |s| s.parse())?;
    let Setup {
        servers,
        inputs,
        output,
        app_id,
        mut copies,
    } = start_copies(name, copies_n, standbys, session, detection).await?;
    let member = |slot: usize| format!("{app_id}-copy-{slot}-0");
    let process = |slot: usize| process_of(&member(slot)).to_string();
    let placement = RangePlacement::new((0..copies_n).map(member), PARTITIONS);
    let mut truth = BTreeMap::new();
    let mut hits = 0;
    for victim in 0..copies_n {
        // Every copy runs its tasks and follows its predicted standbys, caught up.
        write_round(&servers, &inputs, 4, &mut truth)?;
        wait_for_counts(&servers, &output, &truth, &mut copies)?;
        wait_for("the standbys to be placed", Duration::from_secs(60), || {
            copies.check_alive()?;
            for slot in 0..copies_n {
                let expected: BTreeSet<i32> = placement
                    .standbys_of(&process(slot), standbys as usize)
                    .iter()
                    .map(|t| t.partition)
                    .collect();
                if followed(&log_since(&copies, slot, 0)?) != expected {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        // Quiet input: a follower applies what it has whenever its changelog goes quiet.
        std::thread::sleep(Duration::from_secs(3));

        let marks: Vec<usize> = (0..copies_n)
            .map(|s| log_len(&copies, s))
            .collect::<anyhow::Result<_>>()?;
        copies.kill(victim)?;
        let killed = Instant::now();
        let after = placement.without(|m| process_of(m) == process(victim));
        let moved: Vec<(i32, usize)> = placement
            .tasks_of(&member(victim))
            .map(|t| {
                let to = after.owner(TaskId { partition: t }).unwrap();
                let slot = (0..copies_n).find(|&s| member(s) == to).unwrap();
                (t, slot)
            })
            .collect();
        for &(task, slot) in &moved {
            wait_for(
                &format!("task {task} to restore on copy {slot}"),
                move_deadline,
                || {
                    copies.check_alive()?;
                    let log = log_since(&copies, slot, marks[slot])?;
                    Ok(active_restores_done(&log).iter().any(|(p, _)| *p == task))
                },
            )?;
            let log = log_since(&copies, slot, marks[slot])?;
            let replayed: Vec<u64> = active_restores_done(&log)
                .into_iter()
                .filter(|(p, _)| *p == task)
                .map(|(_, records)| records)
                .collect();
            anyhow::ensure!(
                replayed.iter().all(|&r| r == 0),
                "copy {victim} killed: task {task} restored on copy {slot} replaying {replayed:?} \
                 records: its standby was not there, or not caught up\n{}",
                copies.logs()
            );
            hits += 1;
        }
        eprintln!(
            "copy {victim} killed: its {} tasks restored on the predicted copies with nothing to \
             replay, {:.1} s after the kill (session timeout {session:?}, failure detection \
             {detection:?})",
            moved.len(),
            killed.elapsed().as_secs_f64()
        );
        if detection.is_some() {
            // Whichever survivor asks first removes the members; the other finds them gone.
            anyhow::ensure!(
                removed_by_a_survivor(&copies, victim, &marks),
                "no copy removed killed copy {victim}'s members\n{}",
                copies.logs()
            );
        }
        copies.spawn(victim)?;
    }
    assert_eq!(hits, PARTITIONS as usize, "every task moved once");

    // Promotion under traffic: a random copy is killed, stays away past the session timeout
    // (its tasks go to their standbys) and comes back, `KSTATE_STANDBY_KILLS` times (1).
    let kills = env_number("KSTATE_STANDBY_KILLS").unwrap_or(1);
    let seed = env_number("KSTATE_STANDBY_SEED").unwrap_or_else(|| rand::rng().random());
    eprintln!("{kills} kills under traffic, seed {seed} (KSTATE_STANDBY_SEED to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let traffic = Traffic::start(&servers, &inputs);
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..3000)));
        copies.check_alive()?;
        let victim = rng.random_range(0..copies_n);
        copies.kill(victim)?;
        std::thread::sleep(Duration::from_millis(rng.random_range(7000..9000)));
        copies.spawn(victim)?;
    }
    // A copy paused past the detection timeout is removed like a dead one; when it resumes it
    // is fenced (its transaction and offsets carry the old generation) and rejoins.
    let pauses = detection.map_or(0, |_| env_number("KSTATE_STANDBY_PAUSES").unwrap_or(1));
    if pauses > 0 {
        // Kills alone leave no zombie writer.
        copies.check_no_foreign_writes(&copies.all())?;
    }
    // `KSTATE_PAUSE_MS` pauses for that long instead, removed or not, and counts removals:
    // the false-positive measurement (RELIABILITY.md).
    let pause_ms = env_number("KSTATE_PAUSE_MS");
    let mut removed_pauses = 0;
    for _ in 0..pauses {
        std::thread::sleep(Duration::from_millis(rng.random_range(3000..5000)));
        copies.check_alive()?;
        let victim = rng.random_range(0..copies_n);
        let marks: Vec<usize> = (0..copies_n)
            .map(|s| log_len(&copies, s))
            .collect::<anyhow::Result<_>>()?;
        copies.pause(victim)?;
        let paused = Instant::now();
        match pause_ms {
            Some(ms) => {
                std::thread::sleep(Duration::from_millis(ms));
                copies.resume(victim)?;
                // A removal decided during the pause is logged within a beacon round.
                std::thread::sleep(Duration::from_secs(1));
                let removed = removed_by_a_survivor(&copies, victim, &marks);
                removed_pauses += usize::from(removed);
                eprintln!("copy {victim} paused {ms} ms: removed {removed}");
            }
            None => {
                wait_for(
                    &format!("paused copy {victim}'s members to be removed"),
                    session / 2,
                    || Ok(removed_by_a_survivor(&copies, victim, &marks)),
                )?;
                removed_pauses += 1;
                eprintln!(
                    "paused copy {victim} removed from the group {:.1} s after its pause",
                    paused.elapsed().as_secs_f64()
                );
                std::thread::sleep(Duration::from_secs(2));
                copies.resume(victim)?;
            }
        }
        // Nobody but the paused copy was taken for dead: not by the others, and not by the
        // paused copy itself, which resumes to a backlog of beacons it has not read.
        std::thread::sleep(Duration::from_secs(2));
        let victim_process = process(victim);
        for (slot, &mark) in marks.iter().enumerate() {
            let log = log_since(&copies, slot, mark)?;
            let wrong: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("process silent: removed its members"))
                .filter(|l| !l.contains(&format!("process={victim_process} ")))
                .collect();
            anyhow::ensure!(
                wrong.is_empty(),
                "copy {victim} was paused, and copy {slot} removed another process:\n{}\n{}",
                wrong.join("\n"),
                copies.where_logs_are()
            );
        }
    }
    if pauses > 0 {
        eprintln!(
            "pauses: {pauses} of {} ms, {removed_pauses} removed, detection {detection:?}",
            pause_ms.map_or("until removed".to_string(), |ms| ms.to_string())
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let more = traffic.stop()?;
    for (key, n) in more {
        *truth.entry(key).or_default() += n;
    }
    wait_for_counts(&servers, &output, &truth, &mut copies)?;
    check_exact_sequences(&servers, &output, PARTITIONS, &truth)?;
    // A copy that resumes after its removal may still write in a transaction that is then
    // refused: its aborted changelog records land after the new owner's restore, which takes
    // them for another writer's and restores the task again (counts stay exact, as checked).
    if pauses > 0 {
        copies.check_foreign_writes_recovered(&copies.all())?;
    } else {
        copies.check_no_foreign_writes(&copies.all())?;
    }
    Setup {
        servers,
        inputs,
        output,
        app_id,
        copies,
    }
    .finish()
    .await
}

/// Copies of the counter on fresh topics, running.
struct Setup {
    servers: String,
    inputs: Vec<String>,
    output: String,
    app_id: String,
    copies: Copies,
}

/// Two co-partitioned inputs and an output of [`PARTITIONS`], and `copies_n` static copies
/// with `standbys` replicas, the `session` timeout and failure detection after `detection`.
async fn start_copies(
    name: &str,
    copies_n: usize,
    standbys: u32,
    session: Duration,
    detection: Option<Duration>,
) -> anyhow::Result<Setup> {
    start_copies_on(
        kstate_test_broker::bootstrap_servers()?,
        name,
        copies_n,
        standbys,
        session,
        detection,
    )
    .await
}

/// [`start_copies`] on the cluster `servers`.
async fn start_copies_on(
    servers: String,
    name: &str,
    copies_n: usize,
    standbys: u32,
    session: Duration,
    detection: Option<Duration>,
) -> anyhow::Result<Setup> {
    let inputs = vec![unique_topic("standby-a"), unique_topic("standby-b")];
    let output = unique_topic("standby-out");
    for topic in inputs.iter().chain([&output]) {
        common::create_topic(servers.as_str(), topic, PARTITIONS, "delete").await?;
    }
    let app_id = unique_topic(name);
    let env = vec![
        ("SERVERS", servers.clone()),
        ("APP_ID", app_id.clone()),
        ("INPUTS", inputs.join(",")),
        ("OUTPUT", output.clone()),
        ("STATIC", "true".into()),
        ("STANDBYS", standbys.to_string()),
        ("SESSION_TIMEOUT_MS", session.as_millis().to_string()),
        (
            "FAILURE_DETECTION_MS",
            detection.map_or(0, |d| d.as_millis()).to_string(),
        ),
    ];
    let mut copies = Copies::new(name, "child_counter", &env, copies_n)?;
    for slot in 0..copies_n {
        copies.spawn(slot)?;
    }
    Ok(Setup {
        servers,
        inputs,
        output,
        app_id,
        copies,
    })
}

impl Setup {
    /// Stops the copies and deletes the topics.
    async fn finish(mut self) -> anyhow::Result<()> {
        self.copies.stop_all()?;
        self.copies.finished();
        for topic in self.inputs.iter().chain([&self.output]) {
            common::delete_topic(topic).await?;
        }
        Ok(())
    }
}

/// Failure detection on the three-node cluster (replication 3, min.insync.replicas=2): while
/// the producer writes, the leader of the beacons' partition (`<app-id>-liveness`) is killed
/// and restarted, then the group coordinator, then every node restarts in turn. A stall of the
/// beacons' partition is no silence: no copy may remove another (each is alive throughout),
/// and the counts stay exact. Then a copy is killed, and the detector still works: a survivor
/// removes its members long before the 60 s session timeout would.
#[tokio::test(flavor = "multi_thread")]
async fn failure_detection_on_a_cluster_takes_no_broker_fault_for_silence() -> anyhow::Result<()> {
    let cluster = kstate_test_broker::cluster()?;
    let _only_user = cluster.exclusive()?;
    let copies_n = 3;
    let mut s = start_copies_on(
        cluster.bootstrap_servers().to_string(),
        "detect-cluster",
        copies_n,
        1,
        Duration::from_secs(60),
        Some(Duration::from_secs(1)),
    )
    .await?;
    let mut truth = BTreeMap::new();
    write_round(&s.servers, &s.inputs, 4, &mut truth)?;
    wait_for_counts(&s.servers, &s.output, &truth, &mut s.copies)?;
    let liveness = format!("{}-liveness", s.app_id);
    wait_for("the copies' beacons", Duration::from_secs(60), || {
        s.copies.check_alive()?;
        Ok(cluster.leader(&liveness, 0).is_ok())
    })?;

    let traffic = Traffic::start(&s.servers, &s.inputs);
    let faults = (|| -> anyhow::Result<()> {
        let back_in_sync = Duration::from_secs(180);
        for (what, node) in [
            ("the beacons' leader", cluster.leader(&liveness, 0)?),
            (
                "the group coordinator",
                cluster.group_coordinator(&s.app_id)?,
            ),
        ] {
            cluster.kill(node)?;
            std::thread::sleep(Duration::from_secs(5));
            cluster.restart(node)?;
            cluster.wait_until_in_sync(back_in_sync)?;
            eprintln!("detect-cluster: {what}, node {node}, killed and back");
            s.copies.check_alive()?;
        }
        for node in cluster.nodes() {
            cluster.restart(node)?;
            cluster.wait_until_in_sync(back_in_sync)?;
        }
        eprintln!("detect-cluster: every node restarted in turn");
        // A removal decided late is logged within a few beacon rounds.
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    })();
    let more = traffic.stop()?;
    faults?;
    s.copies.check_alive()?;
    let wrong: Vec<String> = (0..copies_n)
        .flat_map(|slot| {
            log_since(&s.copies, slot, 0)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("process silent: removed its members"))
                .map(|l| format!("copy {slot}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    anyhow::ensure!(
        wrong.is_empty(),
        "broker faults were taken for a copy's silence:\n{}\n{}",
        wrong.join("\n"),
        s.copies.where_logs_are()
    );
    for (key, n) in more {
        *truth.entry(key).or_default() += n;
    }
    wait_for_counts(&s.servers, &s.output, &truth, &mut s.copies)?;
    check_exact_sequences(&s.servers, &s.output, PARTITIONS, &truth)?;

    // The detector still works after the faults.
    let victim = 1;
    let marks: Vec<usize> = (0..copies_n)
        .map(|slot| log_len(&s.copies, slot))
        .collect::<anyhow::Result<_>>()?;
    s.copies.kill(victim)?;
    let killed = Instant::now();
    wait_for(
        "a survivor to remove the killed copy's members",
        Duration::from_secs(30),
        || Ok(removed_by_a_survivor(&s.copies, victim, &marks)),
    )
    .map_err(|e| anyhow::anyhow!("{e}\n{}", s.copies.logs()))?;
    eprintln!(
        "detect-cluster: killed copy {victim} removed {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    s.copies.spawn(victim)?;
    write_round(&s.servers, &s.inputs, 2, &mut truth)?;
    wait_for_counts(&s.servers, &s.output, &truth, &mut s.copies)?;
    check_exact_sequences(&s.servers, &s.output, PARTITIONS, &truth)?;
    s.copies.stop_all()?;
    s.copies.finished();
    Ok(())
}

/// With two replicas each of three copies follows every task it does not run, so when two
/// copies die at once, the third restores all their tasks from its standbys.
#[tokio::test(flavor = "multi_thread")]
async fn with_two_replicas_two_copies_killed_at_once_restore_on_the_third_with_nothing_to_replay()
-> anyhow::Result<()> {
    let copies_n = 3;
    let mut s = start_copies("two-replicas", copies_n, 2, Duration::from_secs(6), None).await?;
    let member = |slot: usize| format!("{}-copy-{slot}-0", s.app_id);
    let placement = RangePlacement::new((0..copies_n).map(member), PARTITIONS);
    let mut truth = BTreeMap::new();
    write_round(&s.servers, &s.inputs, 4, &mut truth)?;
    wait_for_counts(&s.servers, &s.output, &truth, &mut s.copies)?;
    wait_for("the standbys to be placed", Duration::from_secs(60), || {
        s.copies.check_alive()?;
        for slot in 0..copies_n {
            let own: BTreeSet<i32> = placement.tasks_of(&member(slot)).collect();
            let every_other: BTreeSet<i32> = (0..PARTITIONS).filter(|t| !own.contains(t)).collect();
            let model: BTreeSet<i32> = placement
                .standbys_of(process_of(&member(slot)), 2)
                .iter()
                .map(|t| t.partition)
                .collect();
            anyhow::ensure!(
                model == every_other,
                "copy {slot}: the model's standbys {model:?}"
            );
            if followed(&log_since(&s.copies, slot, 0)?) != model {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    // Quiet input: a follower applies what it has whenever its changelog goes quiet.
    std::thread::sleep(Duration::from_secs(3));
    let mark = log_len(&s.copies, 2)?;
    s.copies.kill(0)?;
    s.copies.kill(1)?;
    let moved: Vec<i32> = placement
        .tasks_of(&member(0))
        .chain(placement.tasks_of(&member(1)))
        .collect();
    wait_for(
        "the killed copies' tasks to restore on copy 2",
        Duration::from_secs(60),
        || {
            s.copies.check_alive()?;
            let done = active_restores_done(&log_since(&s.copies, 2, mark)?);
            Ok(moved.iter().all(|t| done.iter().any(|(p, _)| p == t)))
        },
    )?;
    let replayed: Vec<(i32, u64)> = active_restores_done(&log_since(&s.copies, 2, mark)?)
        .into_iter()
        .filter(|(p, records)| moved.contains(p) && *records > 0)
        .collect();
    anyhow::ensure!(
        replayed.is_empty(),
        "tasks restored on copy 2 replaying records (task, records): {replayed:?}\n{}",
        s.copies.logs()
    );
    write_round(&s.servers, &s.inputs, 2, &mut truth)?;
    wait_for_counts(&s.servers, &s.output, &truth, &mut s.copies)?;
    s.copies.spawn(0)?;
    s.copies.spawn(1)?;
    write_round(&s.servers, &s.inputs, 2, &mut truth)?;
    wait_for_counts(&s.servers, &s.output, &truth, &mut s.copies)?;
    check_exact_sequences(&s.servers, &s.output, PARTITIONS, &truth)?;
    s.copies.check_no_foreign_writes(&s.copies.all())?;
    s.finish().await
}
