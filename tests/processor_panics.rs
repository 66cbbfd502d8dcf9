//! A panic in `Processor::process` is a failure of the application, and commits nothing of the
//! record that panicked.
//!
//! The processor counts per key like count_by_key; for the key `"boom"` it sends an output and
//! writes its store, then panics. Guaranteed:
//! - exactly-once: the application reaches `AppState::Failed`, and `Running::wait` returns an
//!   error whose text names the input topic, the partition and the offset of the `"boom"` record
//!   and says that the processor panicked;
//! - exactly-once: a `read_committed` reader of the output never sees the `"boom"` output (its
//!   transaction is aborted, not committed on the way out of the panicking worker);
//! - at-least-once: the application reaches `AppState::Failed` too, and `Running::wait` returns
//!   the error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::failures::{failed_within, names_offset, names_partition, wait_within};
use common::streams::{produce, read_topic, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, AppState, Context, ProcessingGuarantee, Processor, Record, Running, StoreHandle,
    StoreOptions,
};
use kstate_test_broker::unique_topic;

const PARTITIONS: i32 = 3;
/// The `"boom"` record goes to this input partition, after `BEFORE` other records.
const BOOM_PARTITION: i32 = 2;
const BEFORE: usize = 37;
/// How long the application has to report the failure: generous.
const LIMIT: Duration = Duration::from_secs(60);

/// Counts records per key and sends each count; panics on `"boom"` after its output and its
/// store write.
struct PanicsOnBoom {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
    panicked: Arc<AtomicBool>,
}

impl Processor for PanicsOnBoom {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let count = ctx.store(&self.counts).get(&key)?.unwrap_or(0) + 1;
        ctx.send(&self.output, &key, Some(count.to_string().as_bytes()))?;
        ctx.store(&self.counts).put(&key, &count)?;
        if key == b"boom" {
            self.panicked.store(true, Ordering::Release);
            panic!("boom");
        }
        Ok(())
    }
}

struct Run {
    servers: String,
    input: String,
    output: String,
    running: Arc<Running>,
    panicked: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

/// Starts the application, lets it process `BEFORE` records of partition `BOOM_PARTITION` (their
/// outputs visible), then writes the `"boom"` record there: offset `BEFORE`.
async fn run_until_boom(guarantee: ProcessingGuarantee) -> anyhow::Result<Run> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let input = unique_topic("panic-in");
    let output = unique_topic("panic-out");
    common::create_topic(&servers, &input, PARTITIONS, "delete").await?;
    common::create_topic(&servers, &output, PARTITIONS, "delete").await?;
    let dir = tempfile::tempdir()?;
    let mut builder = App::builder(unique_topic("panic"), servers.clone());
    builder
        .input(input.clone())
        .state_dir(dir.path())
        .processing_guarantee(guarantee);
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let panicked = Arc::new(AtomicBool::new(false));
    let (out, flag) = (output.clone(), panicked.clone());
    let running = Arc::new(
        builder
            .build(move |_| {
                Box::new(PanicsOnBoom {
                    counts: counts.clone(),
                    output: out.clone(),
                    panicked: flag.clone(),
                })
            })?
            .start()?,
    );
    let before: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..BEFORE)
        .map(|i| {
            (
                BOOM_PARTITION,
                format!("key-{}", i % 5).into_bytes(),
                i.to_string().into_bytes(),
            )
        })
        .collect();
    produce(&servers, &input, &before)?;
    wait_for("the outputs of the records before boom", LIMIT, || {
        Ok(read_topic(&servers, &output, PARTITIONS)?.len() >= BEFORE)
    })?;
    produce(
        &servers,
        &input,
        &[(BOOM_PARTITION, b"boom".to_vec(), b"!".to_vec())],
    )?;
    Ok(Run {
        servers,
        input,
        output,
        running,
        panicked,
        _dir: dir,
    })
}

/// The application reached `Failed` within `LIMIT` after the panic.
fn assert_failed(run: &Run) {
    let state = failed_within(&run.running, LIMIT);
    assert!(
        run.panicked.load(Ordering::Acquire),
        "the processor never saw the boom record"
    );
    assert!(
        matches!(state, AppState::Failed(_)),
        "the processor panicked, and {LIMIT:?} later the application reports {state:?}"
    );
}

/// `wait()` returns, with an error.
fn wait_error(run: &Run) -> String {
    match wait_within(&run.running, LIMIT) {
        Some(Err(text)) => text,
        Some(Ok(())) => panic!("wait() returned Ok after the processor panicked"),
        None => panic!("wait() had not returned {LIMIT:?} after the application failed"),
    }
}

fn assert_names_the_record(run: &Run, text: &str) {
    assert!(
        text.to_lowercase().contains("panic"),
        "the error does not say that the processor panicked: {text}"
    );
    assert!(
        names_partition(text, &run.input, BOOM_PARTITION),
        "the error does not name {}/{BOOM_PARTITION}: {text}",
        run.input
    );
    assert!(
        names_offset(text, BEFORE as i64),
        "the error does not name the boom record's offset {BEFORE}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_under_exactly_once_fails_the_application_naming_the_record() -> anyhow::Result<()>
{
    let run = run_until_boom(ProcessingGuarantee::ExactlyOnce).await?;
    assert_failed(&run);
    let text = wait_error(&run);
    assert_names_the_record(&run, &text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_under_exactly_once_commits_nothing_of_the_record() -> anyhow::Result<()> {
    let run = run_until_boom(ProcessingGuarantee::ExactlyOnce).await?;
    let boom_outputs = || -> anyhow::Result<Vec<_>> {
        Ok(read_topic(&run.servers, &run.output, PARTITIONS)?
            .into_iter()
            .filter(|r| r.2 == b"boom")
            .collect())
    };
    // Until the application failed, or the boom output became visible.
    wait_for("the failure, or the boom output", LIMIT, || {
        Ok(matches!(run.running.state(), AppState::Failed(_))
            || (run.panicked.load(Ordering::Acquire) && !boom_outputs()?.is_empty()))
    })
    .ok();
    run.running.shutdown();
    let _ = wait_within(&run.running, LIMIT);
    assert!(
        run.panicked.load(Ordering::Acquire),
        "the processor never saw the boom record"
    );
    let visible: Vec<String> = boom_outputs()?
        .iter()
        .map(|(p, o, key, value)| {
            format!(
                "{}/{p}@{o}: {}={}",
                run.output,
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(value.as_deref().unwrap_or_default())
            )
        })
        .collect();
    assert!(
        visible.is_empty(),
        "a read_committed reader sees the output of the record whose processing panicked: \
         {visible:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_under_at_least_once_fails_the_application() -> anyhow::Result<()> {
    let run = run_until_boom(ProcessingGuarantee::AtLeastOnce).await?;
    assert_failed(&run);
    let text = wait_error(&run);
    assert_names_the_record(&run, &text);
    Ok(())
}
