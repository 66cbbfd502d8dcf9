//! A zombie's writes without input are fenced, against a real broker: a process paused past
//! its session timeout holds a key in a wall-clock TTL store that expires while it is paused;
//! another copy takes the tasks, restores and stops before the key expires; the first is
//! resumed once its copy of the key expired. Its sweep's tombstone (a transaction whose only
//! records are the sweep's) must not commit before it has rejoined the group: such a commit
//! carries the input offsets, so the broker's generation check refuses it.
//!
//! A file of its own, so that its copies never share the machine with the chaos tests of
//! `tests/topologies.rs` (test binaries run one after another).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use common::child::{self, ChildEnv, Copies};
use common::streams::{read_topic, wait_for};
use kstate::kstate_core::{BoxError, TtlClock, TtlOptions};
use kstate::kstate_task::{App, Context, ProcessingGuarantee, Processor, Record, TtlHandle};
use kstate_test_broker::unique_topic;

const PARTITIONS: i32 = 2;
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_secs(180);

/// Whether no transaction is open on any partition of `topic`: its last stable offsets
/// (`read_committed`) equal its high watermarks.
struct Quiet {
    uncommitted: rdkafka::consumer::BaseConsumer,
    committed: rdkafka::consumer::BaseConsumer,
}

impl Quiet {
    fn new(servers: &str) -> anyhow::Result<Quiet> {
        let client = |isolation| -> anyhow::Result<rdkafka::consumer::BaseConsumer> {
            Ok(rdkafka::ClientConfig::new()
                .set("bootstrap.servers", servers)
                .set("isolation.level", isolation)
                .create()?)
        };
        Ok(Quiet {
            uncommitted: client("read_uncommitted")?,
            committed: client("read_committed")?,
        })
    }

    fn quiet(&self, topic: &str) -> anyhow::Result<bool> {
        use rdkafka::consumer::Consumer;
        let timeout = Duration::from_secs(10);
        for p in 0..PARTITIONS {
            let high = self.uncommitted.fetch_watermarks(topic, p, timeout)?.1;
            let stable = self.committed.fetch_watermarks(topic, p, timeout)?.1;
            if stable != high {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// How long a key of the zombie TTL test lives, by the wall clock.
const SWEPT_TTL: Duration = Duration::from_secs(15);

/// Puts each record's key in a wall-clock TTL store (value: this copy's slot) and sends
/// `"<slot>"` under the key to the output.
struct Keeper {
    slot: usize,
    seen: TtlHandle,
    output: String,
}

impl Processor for Keeper {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.ok_or("no key")?;
        let slot = self.slot.to_string();
        ctx.ttl_store(&self.seen).put(
            key,
            slot.as_bytes(),
            record.timestamp.unwrap_or_default(),
        )?;
        ctx.send(&self.output, key, Some(slot.as_bytes()))?;
        Ok(())
    }
}

/// The keeping application in a child process (exactly-once, instance id `copy-<slot>`,
/// session timeout 6 s).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of the zombie TTL sweep test of this file, which starts it; fails alone"]
async fn child_keeper() -> anyhow::Result<()> {
    let env = ChildEnv::get("child_keeper")?;
    child::init_logging();
    let slot: usize = env.parse("SLOT")?;
    let mut builder = App::builder(env.var("APP_ID")?, env.var("SERVERS")?);
    builder
        .input(env.var("INPUT")?)
        .state_dir(env.var("STATE_DIR")?)
        .commit_interval(COMMIT_INTERVAL)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .instance_id(format!("copy-{slot}"))
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    let seen = builder.ttl_store(
        "seen",
        TtlOptions::new(SWEPT_TTL).clock(TtlClock::WallClock),
    );
    let output = env.var("OUTPUT")?;
    let app = builder.build(move |_| {
        Box::new(Keeper {
            slot,
            seen: seen.clone(),
            output: output.clone(),
        })
    })?;
    child::run_until_sigterm(app.start()?, &format!("{}: copy {slot}", env.parent())).await
}

/// A process paused past its session timeout while holding a key that then expires by the wall
/// clock must not commit the sweep's tombstone once it resumes: a commit whose only records are
/// a sweep carries the input offsets, so the broker's generation check fences it. (Had another
/// copy written to the partition meanwhile, the zombie's record would land past the offset it
/// expects and poison its store first.)
#[tokio::test(flavor = "multi_thread")]
async fn a_zombies_ttl_sweep_does_not_commit_into_the_new_owners_changelog() -> anyhow::Result<()> {
    let name = "topo-zombie-ttl";
    let servers = kstate_test_broker::bootstrap_servers()?;
    let app_id = unique_topic(name);
    let (input, output) = (
        unique_topic("zombie-ttl-in"),
        unique_topic("zombie-ttl-out"),
    );
    common::create_topic(&servers, &input, PARTITIONS, "delete").await?;
    common::create_topic(&servers, &output, PARTITIONS, "delete").await?;
    let changelog = format!("{app_id}-seen-changelog");
    let env = [
        ("SERVERS", servers.clone()),
        ("APP_ID", app_id),
        ("INPUT", input.clone()),
        ("OUTPUT", output.clone()),
    ];
    let mut copies = Copies::new(name, "child_keeper", &env, 2)?;
    let (a, b) = (0, 1);
    copies.spawn(a)?;
    common::streams::produce(&servers, &input, &[(0, b"k".to_vec(), b"a".to_vec())])?;
    let waited = wait_for("copy A's put of k", WAIT, || {
        copies.check_alive()?;
        Ok(read_topic(&servers, &output, PARTITIONS)?
            .iter()
            .any(|(p, _, k, _)| *p == 0 && k == b"k"))
    });
    waited.map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
    let put_by_a = Instant::now();

    // Pause A with nothing open in its transaction: k is committed, and expires in A's store
    // while A is paused.
    let marks = Quiet::new(&servers)?;
    let mut paused = false;
    for _ in 0..50 {
        if marks.quiet(&output)? && marks.quiet(&changelog)? {
            copies.pause(a)?;
            if marks.quiet(&output)? && marks.quiet(&changelog)? {
                paused = true;
                break;
            }
            copies.resume(a)?;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::ensure!(
        paused,
        "could not pause copy A with nothing open in its transaction\n{}",
        copies.logs()
    );

    // B takes the tasks once A's session times out, restores k, and stops cleanly before k
    // expires (so it sweeps nothing): A is no member of the group any more.
    copies.spawn(b)?;
    let waited = wait_for("copy B's restore of task 0", WAIT, || {
        copies.check_alive()?;
        Ok(!copies
            .grep_logs(&[b], &["restored; running worker=0 task=task 0"])
            .is_empty())
    });
    waited.map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
    let status = copies.stop(b)?;
    anyhow::ensure!(
        status.success(),
        "copy B exited {status} on SIGTERM\n{}",
        copies.logs()
    );
    let stopped_b = Instant::now();
    anyhow::ensure!(
        stopped_b < put_by_a + SWEPT_TTL,
        "copy B stopped after k expired ({:?} after A's put): the test's timing does not hold",
        stopped_b - put_by_a
    );
    let end_before = common::high_watermark(&changelog, 0)?;
    // A's copy of k is past its time to live now: A's first commit after it resumes sweeps it,
    // at once (its commit interval is overdue); it learns that it lost its tasks, rejoins and
    // restores only later (about a second here).
    let expired = put_by_a + SWEPT_TTL + Duration::from_secs(1);
    std::thread::sleep(expired.saturating_duration_since(Instant::now()));
    copies.resume(a)?;

    // A learns that it lost its tasks, rejoins, gets them back (B is gone) and restores them up
    // to the end it captures then. Every record committed below that end and at or after the
    // end B restored to was written before A owned the task again: by A's sweep while it owned
    // nothing.
    let restores_of_0 = |copies: &Copies| -> Vec<i64> {
        let topic = format!("{changelog}\" partition=0");
        copies
            .grep_logs(&[a], &["restore starting"])
            .iter()
            .filter(|line| line.contains(&topic))
            .filter_map(|line| {
                let end = line.split("end_offset=").nth(1)?;
                end.split(' ').next()?.parse().ok()
            })
            .collect()
    };
    let waited = wait_for("copy A's restore after it rejoined", WAIT, || {
        Ok(restores_of_0(&copies).len() >= 2)
    });
    waited.map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
    let rejoined_end = *restores_of_0(&copies).last().context("no restore")?;
    let mut problems = Vec::new();
    let committed: Vec<(i64, Option<Vec<u8>>)> = read_topic(&servers, &changelog, PARTITIONS)?
        .into_iter()
        .filter(|(p, offset, _, _)| *p == 0 && (end_before..rejoined_end).contains(offset))
        .map(|(_, offset, _, value)| (offset, value))
        .collect();
    if !committed.is_empty() {
        problems.push(format!(
            "copy A committed {committed:?} into the changelog between the end B restored to \
             ({end_before}) and the end A restored to when it owned the task again \
             ({rejoined_end}): its sweep, while it owned no task"
        ));
    }
    match copies.check_slot_alive(a) {
        Ok(()) => eprintln!("{name}: copy A is running"),
        Err(e) => eprintln!("{name}: {e}"),
    }
    if !problems.is_empty() {
        bail!("{}\n{}", problems.join("\n"), copies.logs());
    }
    if copies.copies[a].is_running() {
        eprintln!("{name}: copy A exited {} on SIGTERM", copies.stop(a)?);
    }
    copies.finished();
    Ok(())
}
