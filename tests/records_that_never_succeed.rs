//! Exactly-once: a record whose output always fails the same way fails the application; it is
//! not aborted and processed again forever.
//!
//! Two such outputs, each with the default error policy:
//! - count_by_key over an input of 2 partitions and an output of 1: the one record of input
//!   partition 1 sends its count to output partition 1, which does not exist;
//! - a processor that counts like count_by_key and sends, for each record, an output larger than
//!   the producer's `message.max.bytes` (1,000,000 bytes by default).
//!
//! Guaranteed for both: the application reaches `AppState::Failed` (within a generous limit),
//! `Running::wait` returns an error whose text names the output topic and partition, and the
//! changelog stops growing: once the application has ended and no transaction is open on the
//! task's changelog partition, its high watermark stays where it is (an aborted round whose
//! changelog record reached the broker leaves that record and an abort marker).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use kstate_bench::topology::count_by_key as count;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::failures::{has_open_transaction, names_partition, wait_within};
use common::streams::{produce, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, AppBuilder, AppState, Context, ProcessingGuarantee, Processor, Record, Running,
    StoreHandle, StoreOptions,
};
use kstate_test_broker::unique_topic;

/// How long the application has to fail: generous.
const LIMIT: Duration = Duration::from_secs(90);
/// How long the changelog is watched after the application ended.
const WATCH: Duration = Duration::from_secs(10);

/// The changelog partition's high watermark, or `None` while the topic does not exist yet.
fn watermark(changelog: &str, partition: i32) -> Option<i64> {
    common::high_watermark(changelog, partition).ok()
}

struct Case {
    servers: String,
    app_id: String,
    input: String,
    output: String,
    /// The task, and the output partition its record is sent to.
    partition: i32,
    output_partition: i32,
}

async fn case(
    name: &str,
    input_partitions: i32,
    output_partitions: i32,
    partition: i32,
    output_partition: i32,
) -> anyhow::Result<Case> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let case = Case {
        servers,
        app_id: unique_topic(name),
        input: unique_topic(&format!("{name}-in")),
        output: unique_topic(&format!("{name}-out")),
        partition,
        output_partition,
    };
    common::create_topic(&case.servers, &case.input, input_partitions, "delete").await?;
    common::create_topic(&case.servers, &case.output, output_partitions, "delete").await?;
    Ok(case)
}

fn builder(case: &Case, state_dir: &std::path::Path) -> AppBuilder {
    let mut builder = App::builder(case.app_id.clone(), case.servers.clone());
    builder
        .input(case.input.clone())
        .state_dir(state_dir)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce);
    builder
}

/// Writes the one record, then checks the guarantee on `running`.
fn check(case: &Case, running: Running) -> anyhow::Result<()> {
    let running = Arc::new(running);
    produce(
        &case.servers,
        &case.input,
        &[(case.partition, b"key".to_vec(), b"value".to_vec())],
    )?;
    let changelog = format!("{}-counts-changelog", case.app_id);
    let started = Instant::now();
    let mut first = None;
    // Polled here rather than with `failed_within`, to watch the changelog meanwhile.
    let state = loop {
        if first.is_none() {
            first = watermark(&changelog, case.partition).map(|w| (w, started.elapsed()));
        }
        let state = running.state();
        if matches!(state, AppState::Failed(_)) || started.elapsed() >= LIMIT {
            break state;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !matches!(state, AppState::Failed(_)) {
        let last = watermark(&changelog, case.partition);
        let first = first.map_or("none".to_string(), |(w, at)| format!("{w} (at {at:?})"));
        panic!(
            "{LIMIT:?} after the record was written the application reports {state:?}; \
             the high watermark of changelog {changelog}/{} was {first}, and is {last:?}",
            case.partition
        );
    }
    let text = match wait_within(&running, LIMIT) {
        Some(Err(text)) => text,
        Some(Ok(())) => panic!("the application failed ({state:?}), and wait() returned Ok"),
        None => panic!("wait() had not returned {LIMIT:?} after the application failed"),
    };
    assert!(
        names_partition(&text, &case.output, case.output_partition),
        "the error does not name output {}/{}: {text}",
        case.output,
        case.output_partition
    );
    // The changelog stops growing once nothing runs: no open transaction left (the broker
    // aborts one left open after the transaction timeout), then a steady high watermark.
    if watermark(&changelog, case.partition).is_some() {
        wait_for("no open transaction on the changelog", LIMIT, || {
            has_open_transaction(&case.servers, &changelog, case.partition)
                .map(|open| !open)
                .or(Ok(false))
        })?;
        let before = watermark(&changelog, case.partition);
        std::thread::sleep(WATCH);
        let after = watermark(&changelog, case.partition);
        assert_eq!(
            before, after,
            "changelog {changelog}/{} grew after the application failed",
            case.partition
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_to_a_missing_partition_fails_the_application() -> anyhow::Result<()> {
    // Input partition 1's output goes to partition 1 of an output that has only partition 0.
    let case = case("missing-partition", 2, 1, 1, 1).await?;
    let dir = tempfile::tempdir()?;
    let mut builder = builder(&case, dir.path());
    let (app, _) = count::build(&mut builder, &case.output, false)?;
    check(&case, app.start()?)
}

/// Counts per key, and sends an output of `SIZE` bytes for every record.
struct Oversized {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
}

/// Over librdkafka's default `message.max.bytes` (1,000,000), and over the broker's default
/// `max.message.bytes` (1 MiB).
const SIZE: usize = 1_100_000;

impl Processor for Oversized {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.counts);
        let count = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &count)?;
        ctx.send(&self.output, &key, Some(&vec![b'x'; SIZE]))?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_over_the_size_limit_fails_the_application() -> anyhow::Result<()> {
    let case = case("oversized-output", 1, 1, 0, 0).await?;
    let dir = tempfile::tempdir()?;
    let mut builder = builder(&case, dir.path());
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let output = case.output.clone();
    let app = builder.build(move |_| {
        Box::new(Oversized {
            counts: counts.clone(),
            output: output.clone(),
        })
    })?;
    check(&case, app.start()?)
}
