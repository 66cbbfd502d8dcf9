//! windowed_count: counts per key in time windows, final results only. Reads records (key bytes,
//! any value, the record timestamp as event time) from `--input`, counts them per key in
//! tumbling 1-minute windows (`--window-secs`; `--hop-secs N` makes them hopping), accepts late
//! records for 10 s after a window ends (`--grace-secs`), and sends each window's final count
//! once, when stream time passes its end plus the grace: key `<key>@<window start ms>`, value
//! the count (Kafka Streams' `windowedBy(...).count().suppress(untilWindowCloses(...))`).
//!
//! ```text
//! cargo run --release --example windowed_count -- --application-id windows \
//!     --input events --output window-counts [--bootstrap-servers HOST:PORT] \
//!     [--client-properties FILE] [--state-dir PATH] [--threads N] [--commit-interval-ms N] \
//!     [--window-secs 60] [--hop-secs N] [--grace-secs 10] \
//!     [--guarantee at-least-once|exactly-once] [--instance-id NAME]
//! ```
//!
//! The counts live in a window store whose changelog is Kafka Streams' window changelog; its
//! stream time is stored with it, so a record that was late before a crash is late after it.
//! Under `--guarantee exactly-once` a `read_committed` reader of the output sees each window's
//! final count exactly once, through any crash. Runs until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use kstate::kstate_core::WindowOptions;
use kstate::kstate_kafka::ClientProperties;
use kstate::kstate_task::{App, AppState, ProcessingGuarantee};

#[path = "shared/windowed_count.rs"]
mod windowed;

struct Args {
    client: ClientProperties,
    application_id: String,
    input: String,
    output: String,
    state_dir: PathBuf,
    threads: usize,
    commit_interval: Duration,
    windows: WindowOptions,
    guarantee: ProcessingGuarantee,
    instance_id: Option<String>,
}

const USAGE: &str = "usage: windowed_count --application-id ID --input TOPIC --output TOPIC \
    [--bootstrap-servers HOST:PORT] [--client-properties FILE] [--state-dir PATH] [--threads N] \
    [--commit-interval-ms N] [--window-secs N] [--hop-secs N] [--grace-secs N] \
    [--guarantee at-least-once|exactly-once] [--instance-id NAME]";

fn parse_args() -> Result<Args> {
    let (mut bootstrap_servers, mut client_properties) = (None, None);
    let (mut application_id, mut input, mut output) = (None, None, None);
    let mut state_dir = None;
    let mut threads = 1;
    let mut commit_interval = Duration::from_millis(100);
    let (mut window_secs, mut hop_secs, mut grace_secs) = (60u64, None, 10u64);
    let mut guarantee = ProcessingGuarantee::default();
    let mut instance_id = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--bootstrap-servers" => bootstrap_servers = Some(value),
            "--client-properties" => client_properties = Some(PathBuf::from(value)),
            "--application-id" => application_id = Some(value),
            "--input" => input = Some(value),
            "--output" => output = Some(value),
            "--state-dir" => state_dir = Some(PathBuf::from(value)),
            "--threads" => threads = value.parse().context("--threads")?,
            "--commit-interval-ms" => {
                commit_interval =
                    Duration::from_millis(value.parse().context("--commit-interval-ms")?)
            }
            "--window-secs" => window_secs = value.parse().context("--window-secs")?,
            "--hop-secs" => hop_secs = Some(value.parse::<u64>().context("--hop-secs")?),
            "--grace-secs" => grace_secs = value.parse().context("--grace-secs")?,
            "--guarantee" => guarantee = value.parse()?,
            "--instance-id" => instance_id = Some(value),
            _ => bail!("unknown flag {flag}; {USAGE}"),
        }
    }
    let size = Duration::from_secs(window_secs);
    let windows = match hop_secs {
        None => WindowOptions::tumbling(size),
        Some(hop) => WindowOptions::hopping(size, Duration::from_secs(hop)),
    }
    .grace(Duration::from_secs(grace_secs));
    windows.validate("counts")?;
    let client = kstate_bench::cluster::required(
        client_properties.as_deref(),
        bootstrap_servers.as_deref(),
    )?;
    Ok(Args {
        client,
        application_id: application_id
            .with_context(|| format!("--application-id is required; {USAGE}"))?,
        input: input.with_context(|| format!("--input is required; {USAGE}"))?,
        output: output.with_context(|| format!("--output is required; {USAGE}"))?,
        state_dir: state_dir.unwrap_or_else(|| std::env::temp_dir().join("kstate-windowed-count")),
        threads,
        commit_interval,
        windows,
        guarantee,
        instance_id,
    })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut builder = App::builder(args.application_id.clone(), args.client.clone());
    builder
        .input(args.input.clone())
        .state_dir(args.state_dir.clone())
        .threads(args.threads)
        .commit_interval(args.commit_interval)
        .processing_guarantee(args.guarantee);
    if let Some(id) = &args.instance_id {
        builder.instance_id(id.clone());
    }
    let (app, _counts) = windowed::build(&mut builder, args.windows, &args.output)?;
    let running = app.start()?;
    eprintln!(
        "windowed_count: {} running ({} partitions, windows of {} ms every {} ms, grace {} ms, {})",
        args.application_id,
        running.partitions(),
        args.windows.size_ms(),
        args.windows.advance_ms(),
        args.windows.grace_ms(),
        args.guarantee
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let ended = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        state = running.stopped() => Some(state),
    };
    if ended.is_none() {
        eprintln!("windowed_count: stopping");
        running.shutdown();
    }
    let running = std::sync::Arc::new(running);
    let waiting = running.clone();
    tokio::task::spawn_blocking(move || waiting.wait().map_err(anyhow::Error::from)).await??;
    match running.state() {
        AppState::Failed(message) => bail!("windowed_count failed: {message}"),
        _ => {
            eprintln!("windowed_count: stopped");
            Ok(())
        }
    }
}
