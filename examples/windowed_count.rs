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
//! `--help` lists every flag.
//!
//! The counts live in a window store named `counts`, as Kafka Streams' `windowedBy(...).count()`
//! keeps them (values are 8-byte big-endian counts, its `Long` serde), so its changelog is Kafka
//! Streams' window changelog; its stream time is stored with it, so a record that was late
//! before a crash is late after it. Under `--guarantee exactly-once` a `read_committed` reader of
//! the output sees each window's final count exactly once, through any crash.
//!
//! How "sent once" holds: a record that moves stream time forward first sends every window that
//! closes up to its timestamp (they are still in the store: its retention is at least size +
//! grace past their start), then advances the store's stream time. The store keeps that time
//! with its data, and under exactly-once both commit with the outputs in one transaction: every
//! window closing at or before the stored stream time has been sent, and no other. A record for a
//! window that closed is late: not counted, through restarts too.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use kstate::kstate_core::{BoxError, WindowOptions};
use kstate::kstate_task::{
    App, AppState, Context, ProcessingGuarantee, Processor, Record, WindowHandle,
};
use kstate_bench::cli::ClusterArgs;

/// windowed_count: counts records per key in time windows and sends each window's final count
/// once, when stream time passes its end plus the grace. Runs until SIGTERM or SIGINT.
#[derive(Debug, Parser)]
#[command(name = "windowed_count")]
struct Args {
    /// The application id: the consumer group, and the prefix of the changelog topics.
    #[arg(long)]
    application_id: String,
    /// The input topic (the record timestamps are the event time).
    #[arg(long, value_name = "TOPIC")]
    input: String,
    /// The output topic: `<key>@<window start ms>` → the window's final count.
    #[arg(long, value_name = "TOPIC")]
    output: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Where the stores live (default: kstate-windowed-count in the temporary directory).
    #[arg(long, value_name = "PATH")]
    state_dir: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: usize,
    /// How often the workers commit, ms.
    #[arg(long, value_name = "N", default_value_t = 100)]
    commit_interval_ms: u64,
    /// The windows' size, seconds.
    #[arg(long, value_name = "N", default_value_t = 60)]
    window_secs: u64,
    /// Hopping windows that start every N seconds (default: tumbling).
    #[arg(long, value_name = "N")]
    hop_secs: Option<u64>,
    /// How long after its end a window still takes late records, seconds.
    #[arg(long, value_name = "N", default_value_t = 10)]
    grace_secs: u64,
    /// at-least-once, or exactly-once: one Kafka transaction per worker and commit interval.
    #[arg(long, default_value_t = ProcessingGuarantee::default())]
    guarantee: ProcessingGuarantee,
    /// This copy's name in its transactional ids: a copy restarted with the same name fences its
    /// previous incarnation at once.
    #[arg(long, value_name = "NAME")]
    instance_id: Option<String>,
}

/// Counts records per key and window; sends final counts.
struct WindowedCount {
    counts: WindowHandle,
    windows: WindowOptions,
    output: String,
}

/// A stored count: 8 bytes big-endian, Kafka Streams' `Long` serde.
fn decode(count: &[u8]) -> Result<i64, BoxError> {
    Ok(i64::from_be_bytes(count.try_into().map_err(|_| {
        format!("a count of {} bytes, not 8", count.len())
    })?))
}

impl WindowedCount {
    /// Sends every window that closes after `from` and at or before `to`.
    fn send_closed(&self, ctx: &mut Context<'_>, from: i64, to: i64) -> Result<(), BoxError> {
        let w = &self.windows;
        let (after, until) = (
            from - w.size_ms() - w.grace_ms(),
            to - w.size_ms() - w.grace_ms(),
        );
        // Window starts are multiples of the advance: most records close none.
        if until.div_euclid(w.advance_ms()) == after.div_euclid(w.advance_ms()) {
            return Ok(());
        }
        let counts = ctx.window_store(&self.counts);
        let mut closed = Vec::new();
        for entry in counts.fetch_all(after + 1..=until)? {
            let entry = entry?;
            closed.push((entry.key().to_vec(), entry.start(), decode(entry.value())?));
        }
        for (key, start, count) in closed {
            let mut out = key;
            out.extend_from_slice(format!("@{start}").as_bytes());
            ctx.send(&self.output, &out, Some(count.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

impl Processor for WindowedCount {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let time = record
            .timestamp
            .ok_or("a record without a timestamp cannot be windowed")?;
        let key = record.key.unwrap_or_default();
        let before = ctx.window_store(&self.counts).stream_time();
        if let Some(before) = before
            && time > before
        {
            self.send_closed(ctx, before, time)?;
        }
        let counts = ctx.window_store(&self.counts);
        counts.observe(time)?;
        let now = counts.stream_time().unwrap_or(time);
        for start in self.windows.windows_containing(time) {
            if self.windows.closes_at(start) <= now {
                continue; // late: its window's final count was sent already
            }
            let count = match counts.get(key, start)? {
                Some(bytes) => decode(&bytes)? + 1,
                None => 1,
            };
            counts.put(key, start, Some(&count.to_be_bytes()))?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let size = Duration::from_secs(args.window_secs);
    let windows = match args.hop_secs {
        None => WindowOptions::tumbling(size),
        Some(hop) => WindowOptions::hopping(size, Duration::from_secs(hop)),
    }
    .grace(Duration::from_secs(args.grace_secs));
    windows.validate("counts")?;
    let client = args.cluster.required()?;
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("kstate-windowed-count"));
    let mut builder = App::builder(args.application_id.clone(), client);
    builder
        .input(args.input.clone())
        .state_dir(state_dir)
        .threads(args.threads)
        .commit_interval(Duration::from_millis(args.commit_interval_ms))
        .processing_guarantee(args.guarantee);
    if let Some(id) = &args.instance_id {
        builder.instance_id(id.clone());
    }
    // The task: the `counts` window store, and a `WindowedCount` per task.
    let counts = builder.window_store("counts", windows);
    let output = args.output.clone();
    let app = builder.build(move |_task| {
        Box::new(WindowedCount {
            counts: counts.clone(),
            windows,
            output: output.clone(),
        })
    })?;
    let running = app.start()?;
    eprintln!(
        "windowed_count: {} running ({} partitions, windows of {} ms every {} ms, grace {} ms, {})",
        args.application_id,
        running.partitions(),
        windows.size_ms(),
        windows.advance_ms(),
        windows.grace_ms(),
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
