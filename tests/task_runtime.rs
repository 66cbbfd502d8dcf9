//! The task runtime against a real broker: counting per key through a consumer group of tasks,
//! restarts that replay nothing, partitions moving between members, timers on idle tasks,
//! coalescing, and the errors a bad setup gets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use kstate_bench::topology::count_by_key as count;

use std::collections::BTreeMap;
use std::time::Duration;

use common::streams::{last_counts, produce, read_topic, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, AppState, Context, GroupProtocol, Processor, Record, Running, StoreHandle, TaskError,
    TaskState, TimeKind, Timer,
};
use kstate_test_broker::unique_topic;

const WAIT: Duration = Duration::from_secs(120);

struct Setup {
    servers: String,
    app_id: String,
    input: String,
    output: String,
    partitions: i32,
}

async fn setup(partitions: i32) -> anyhow::Result<Setup> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let app_id = unique_topic("app");
    let input = unique_topic("in");
    let output = unique_topic("out");
    common::create_topic(&servers, &input, partitions, "delete").await?;
    common::create_topic(&servers, &output, partitions, "delete").await?;
    Ok(Setup {
        servers,
        app_id,
        input,
        output,
        partitions,
    })
}

fn start(
    s: &Setup,
    state_dir: &std::path::Path,
    threads: usize,
    coalesce: bool,
) -> anyhow::Result<(Running, StoreHandle<Vec<u8>, u64>)> {
    start_with(s, state_dir, threads, coalesce, None)
}

fn start_with(
    s: &Setup,
    state_dir: &std::path::Path,
    threads: usize,
    coalesce: bool,
    protocol: Option<GroupProtocol>,
) -> anyhow::Result<(Running, StoreHandle<Vec<u8>, u64>)> {
    let mut builder = App::builder(s.app_id.clone(), s.servers.clone());
    if let Some(protocol) = protocol {
        builder.group_protocol(protocol);
    }
    builder
        .input(s.input.clone())
        .state_dir(state_dir)
        .threads(threads)
        .commit_interval(Duration::from_millis(50));
    let (app, counts) = count::build(&mut builder, &s.output, coalesce)?;
    Ok((app.start()?, counts))
}

/// `n` records over `keys` keys; key `k` always goes to partition `k % partitions`.
fn input(n: usize, keys: usize, partitions: i32) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let k = (i * 7 + i / 3) % keys;
            (
                (k as i32) % partitions,
                format!("key-{k}").into_bytes(),
                i.to_string().into_bytes(),
            )
        })
        .collect()
}

/// The partition [`input`] sends `key` (`key-<k>`) to.
fn partition_of(key: &[u8], partitions: i32) -> anyhow::Result<i32> {
    let k: usize = std::str::from_utf8(&key[4..])?.parse()?;
    Ok((k as i32) % partitions)
}

fn true_counts(records: &[(i32, Vec<u8>, Vec<u8>)]) -> BTreeMap<Vec<u8>, u64> {
    let mut counts = BTreeMap::new();
    for (_, key, _) in records {
        *counts.entry(key.clone()).or_insert(0) += 1;
    }
    counts
}

fn all_running(running: &Running, partitions: usize) -> bool {
    let tasks = running.tasks();
    tasks.len() == partitions && tasks.iter().all(|t| t.state == TaskState::Running)
}

#[tokio::test(flavor = "multi_thread")]
async fn counts_every_record_once_and_a_clean_restart_replays_nothing() -> anyhow::Result<()> {
    let s = setup(4).await?;
    let dir = tempfile::tempdir()?;
    let records = input(2_000, 50, s.partitions);
    produce(&s.servers, &s.input, &records)?;
    let expected = true_counts(&records);

    let (running, counts) = start(&s, dir.path(), 2, false)?;
    wait_for("every output", WAIT, || {
        Ok(read_topic(&s.servers, &s.output, s.partitions)?.len() >= records.len())
    })?;
    let out = read_topic(&s.servers, &s.output, s.partitions)?;
    assert_eq!(
        out.len(),
        records.len(),
        "one output per input record, no crash: no duplicates"
    );
    assert_eq!(last_counts(&out), expected);
    // Outputs go to the input's partition, and every count of a key appears once.
    for (p, _, key, _) in &out {
        assert_eq!(
            *p,
            partition_of(key, s.partitions)?,
            "output partition of {}",
            String::from_utf8_lossy(key)
        );
    }
    // The query API reads the owning task's store.
    wait_for("all tasks running", WAIT, || Ok(all_running(&running, 4)))?;
    // Each task shows its committed position: together, every input record.
    wait_for("every task's position at its input's end", WAIT, || {
        let tasks = running.tasks();
        let positions: i64 = tasks.iter().filter_map(|t| t.position.get(&s.input)).sum();
        let processed: u64 = tasks.iter().map(|t| t.processed).sum();
        Ok(positions == records.len() as i64 && processed == records.len() as u64)
    })?;
    for (key, n) in &expected {
        let partition = partition_of(key, s.partitions)?;
        assert_eq!(running.query(&counts).get(partition, key)?, Some(*n));
    }
    running.shutdown();
    running.wait()?;
    assert_eq!(running.state(), AppState::Stopped);
    drop(running);

    // A graceful stop committed and closed every store: a restart replays nothing.
    let (running, counts) = start(&s, dir.path(), 1, false)?;
    wait_for("all tasks running again", WAIT, || {
        Ok(all_running(&running, 4))
    })?;
    for task in running.tasks() {
        assert_eq!(
            task.restore.records, 0,
            "{} replayed records after a clean stop",
            task.task
        );
    }
    let (key, n) = expected.iter().next().unwrap();
    assert_eq!(
        running
            .query(&counts)
            .get(partition_of(key, s.partitions)?, key)?,
        Some(*n)
    );
    running.shutdown();
    running.wait()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_move_between_members_without_losing_or_repeating_a_record() -> anyhow::Result<()>
{
    let s = setup(6).await?;
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let records = input(3_000, 60, s.partitions);
    let (first, second) = records.split_at(1_500);
    let expected = true_counts(&records);

    let (a, _) = start(&s, dir_a.path(), 1, false)?;
    produce(&s.servers, &s.input, first)?;
    wait_for("A processes the first half", WAIT, || {
        Ok(read_topic(&s.servers, &s.output, s.partitions)?.len() >= first.len())
    })?;
    // B joins: the group splits the tasks; B restores what it gets from the changelogs.
    let (b, _) = start(&s, dir_b.path(), 1, false)?;
    wait_for("both members own tasks", WAIT, || {
        let (ta, tb) = (a.tasks(), b.tasks());
        Ok(!ta.is_empty()
            && !tb.is_empty()
            && ta.len() + tb.len() == 6
            && tb.iter().all(|t| t.state == TaskState::Running))
    })?;
    produce(&s.servers, &s.input, second)?;
    // A leaves gracefully mid-stream: its tasks are committed, closed and handed to B.
    a.shutdown();
    a.wait()?;
    wait_for("B owns every task", WAIT, || Ok(all_running(&b, 6)))?;
    wait_for("every output", WAIT, || {
        Ok(read_topic(&s.servers, &s.output, s.partitions)?.len() >= records.len())
    })?;
    let out = read_topic(&s.servers, &s.output, s.partitions)?;
    assert_eq!(last_counts(&out), expected);
    assert_eq!(
        out.len(),
        records.len(),
        "graceful handovers commit first: no record processed twice"
    );
    b.shutdown();
    b.wait()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kip_848_consumer_protocol_and_the_eager_one_count_correctly() -> anyhow::Result<()> {
    for protocol in [GroupProtocol::Consumer, GroupProtocol::Eager] {
        let s = setup(3).await?;
        let dir = tempfile::tempdir()?;
        let records = input(600, 30, s.partitions);
        produce(&s.servers, &s.input, &records)?;
        let (running, _) = start_with(&s, dir.path(), 2, false, Some(protocol))?;
        wait_for("every output", WAIT, || {
            Ok(read_topic(&s.servers, &s.output, s.partitions)?.len() >= records.len())
        })?;
        let out = read_topic(&s.servers, &s.output, s.partitions)?;
        assert_eq!(out.len(), records.len(), "{protocol:?}");
        assert_eq!(last_counts(&out), true_counts(&records), "{protocol:?}");
        running.shutdown();
        running.wait()?;
    }
    Ok(())
}

struct Ticker {
    output: String,
}

impl Processor for Ticker {
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), BoxError> {
        ctx.schedule(TimeKind::WallClock, Duration::from_millis(50));
        Ok(())
    }

    fn process(&mut self, _: &mut Context<'_>, _: &Record<'_>) -> Result<(), BoxError> {
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, timer: &Timer) -> Result<(), BoxError> {
        assert_eq!(timer.kind, TimeKind::WallClock);
        ctx.send(
            &self.output,
            b"tick",
            Some(timer.time_ms.to_string().as_bytes()),
        )?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wall_clock_timers_fire_on_a_task_with_no_input() -> anyhow::Result<()> {
    let s = setup(1).await?;
    let dir = tempfile::tempdir()?;
    let mut builder = App::builder(s.app_id.clone(), s.servers.clone());
    builder.input(s.input.clone()).state_dir(dir.path());
    let output = s.output.clone();
    let running = builder
        .build(move |_| {
            Box::new(Ticker {
                output: output.clone(),
            })
        })?
        .start()?;
    wait_for("three ticks from an idle task", WAIT, || {
        Ok(read_topic(&s.servers, &s.output, 1)?.len() >= 3)
    })?;
    running.shutdown();
    running.wait()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn coalescing_sends_far_fewer_changelog_records_for_skewed_keys() -> anyhow::Result<()> {
    let s = setup(1).await?;
    let dir = tempfile::tempdir()?;
    // 5,000 records over 5 keys.
    let records = input(5_000, 5, 1);
    let expected = true_counts(&records);
    produce(&s.servers, &s.input, &records)?;
    let (running, counts) = start(&s, dir.path(), 1, true)?;
    wait_for("the last counts", WAIT, || {
        Ok(last_counts(&read_topic(&s.servers, &s.output, 1)?) == expected)
    })?;
    for (key, n) in &expected {
        assert_eq!(running.query(&counts).get(0, key)?, Some(*n));
    }
    running.shutdown();
    running.wait()?;
    let changelog = format!("{}-counts-changelog", s.app_id);
    let logged = common::high_watermark(&changelog, 0)?;
    let outputs = read_topic(&s.servers, &s.output, 1)?.len();
    assert!(
        logged < 1_000 && (outputs as i64) < 1_000,
        "coalescing: {logged} changelog records and {outputs} outputs for 5,000 updates of 5 keys"
    );
    Ok(())
}

/// A processor for applications that must not start.
fn idle(_: kstate::kstate_task::TaskId) -> Box<dyn Processor> {
    Box::new(Ticker {
        output: "unused".into(),
    })
}

/// Why `builder`'s application refused to start.
fn start_error(builder: &kstate::kstate_task::AppBuilder) -> anyhow::Result<TaskError> {
    Ok(builder.build(idle)?.start().err().expect("refused"))
}

#[tokio::test(flavor = "multi_thread")]
async fn inputs_that_are_not_co_partitioned_are_refused() -> anyhow::Result<()> {
    let s = setup(3).await?;
    let other = unique_topic("in2");
    common::create_topic(&s.servers, &other, 4, "delete").await?;
    let mut builder = App::builder(s.app_id.clone(), s.servers.clone());
    builder.input(s.input.clone()).input(other.clone());
    let err = start_error(&builder)?;
    assert!(matches!(err, TaskError::NotCoPartitioned { .. }), "{err}");
    assert!(err.to_string().contains(&format!("{other}=4")), "{err}");

    let missing = unique_topic("missing");
    let mut builder = App::builder(s.app_id.clone(), s.servers.clone());
    builder.input(missing.clone());
    let err = start_error(&builder)?;
    assert!(
        matches!(err, TaskError::MissingInput { ref topic, .. } if *topic == missing),
        "{err}"
    );

    let mut builder = App::builder("bad id/with slash", s.servers.clone());
    builder.input(s.input.clone());
    let err = builder.build(idle).err().expect("refused");
    assert!(matches!(err, TaskError::InvalidConfig(_)), "{err}");
    Ok(())
}

/// Every task of an instance keeps its stores in one RocksDB under the state directory: a
/// second instance on the same directory is refused at start, naming the directory, and the
/// first runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_instance_on_the_same_state_directory_is_refused_naming_it() -> anyhow::Result<()>
{
    let s = setup(2).await?;
    let dir = tempfile::tempdir()?;
    let (first, _) = start(&s, dir.path(), 1, false)?;
    let mut builder = App::builder(s.app_id.clone(), s.servers.clone());
    builder.input(s.input.clone()).state_dir(dir.path());
    let err = start_error(&builder)?;
    assert!(matches!(err, TaskError::StateDb { .. }), "{err}");
    let rocksdb = dir.path().join(&s.app_id).join("rocksdb");
    assert!(
        err.to_string().contains(&rocksdb.display().to_string())
            && err.to_string().contains("already open"),
        "{err}"
    );
    assert_eq!(
        first.state(),
        kstate::kstate_task::AppState::Running,
        "the first instance runs on"
    );
    first.shutdown();
    first.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// `wait` returns once the application's RocksDB is closed, not when the last handle to the
/// application goes: a new instance starts on the same state directory while the old handle
/// is still held, and resumes every task from what the old one flushed, replaying nothing.
/// (A RocksDB left to close with the last handle could close in a thread the process does not
/// wait for, while the process exits: RocksDB then aborts.)
#[tokio::test(flavor = "multi_thread")]
async fn wait_closes_the_rocksdb_before_it_returns() -> anyhow::Result<()> {
    let s = setup(2).await?;
    let dir = tempfile::tempdir()?;
    let records = input(200, 10, s.partitions);
    produce(&s.servers, &s.input, &records)?;
    let (first, _) = start(&s, dir.path(), 1, false)?;
    wait_for("every output", WAIT, || {
        Ok(read_topic(&s.servers, &s.output, s.partitions)?.len() >= records.len())
    })?;
    first.shutdown();
    first.wait()?;

    let (second, counts) = start(&s, dir.path(), 1, false)?;
    wait_for("all tasks running again", WAIT, || {
        Ok(all_running(&second, 2))
    })?;
    for task in second.tasks() {
        assert_eq!(task.restore.records, 0, "{} replayed records", task.task);
    }
    for (key, n) in true_counts(&records) {
        let partition = partition_of(&key, s.partitions)?;
        assert_eq!(second.query(&counts).get(partition, &key)?, Some(n));
    }
    second.shutdown();
    second.wait()?;
    drop(first);
    Ok(())
}
