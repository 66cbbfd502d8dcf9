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
//!     [--window-secs 60] [--hop-secs N] [--grace-secs 10]  # --help lists the rest
//! ```
//!
//! The task is [`kstate_bench::topology::windowed_count`]
//! (`crates/kstate-bench/src/topology/windowed_count.rs`: how "sent once" holds through crashes),
//! the very task the runtime's tests check and the benchmarks measure against Kafka Streams. Its
//! counts live in a window store named `counts` as Kafka Streams' `windowedBy(...).count()` keeps
//! them, so its changelog is Kafka Streams' window changelog; the store keeps its stream time
//! with its data, so a record that was late before a crash is late after it. Under
//! `--guarantee exactly-once` a `read_committed` reader of the output sees each window's final
//! count exactly once, through any crash.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use kstate::kstate_core::WindowOptions;
use kstate::kstate_task::{App, ProcessingGuarantee};
use kstate_bench::cli::ClusterArgs;
use kstate_bench::topology::windowed_count;

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

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
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
    // The task: the `counts` window store, and a `WindowedCount` per task, sending to `--output`.
    let (app, _counts) = windowed_count::build(&mut builder, windows, &args.output)?;
    let running = Arc::new(app.start()?);
    eprintln!(
        "windowed_count: {} running ({} partitions, windows of {} ms every {} ms, grace {} ms, {})",
        args.application_id,
        running.partitions(),
        windows.size_ms(),
        windows.advance_ms(),
        windows.grace_ms(),
        args.guarantee
    );
    running
        .run_until_signal()
        .await
        .context("windowed_count failed")?;
    eprintln!("windowed_count: stopped");
    Ok(())
}
