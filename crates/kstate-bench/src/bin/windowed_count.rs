//! windowed_count: counts per key in time windows, final results only, as a service
//! (`tests/services.rs` runs it as its own process). Reads records (key bytes,
//! any value, the record timestamp as event time) from `--input`, counts them per key in
//! tumbling 1-minute windows (`--window-secs`; `--hop-secs N` makes them hopping), accepts late
//! records for 10 s after a window ends (`--grace-secs`), and sends each window's final count
//! once, when stream time passes its end plus the grace: key `<key>@<window start ms>`, value
//! the count (Kafka Streams' `windowedBy(...).count().suppress(untilWindowCloses(...))`).
//!
//! ```text
//! cargo build --release --workspace --bin windowed_count
//! $CARGO_TARGET_DIR/release/windowed_count --application-id windows \
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

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use kstate_bench::cli::AppArgs;
use kstate_bench::topology::windowed_count;
use kstate_core::WindowOptions;

/// windowed_count: counts records per key in time windows and sends each window's final count
/// once, when stream time passes its end plus the grace. Runs until SIGTERM or SIGINT.
#[derive(Debug, Parser)]
#[command(name = "windowed_count")]
struct Args {
    #[command(flatten)]
    app: AppArgs,
    /// The input topic (the record timestamps are the event time).
    #[arg(long, value_name = "TOPIC")]
    input: String,
    /// The output topic: `<key>@<window start ms>` → the window's final count.
    #[arg(long, value_name = "TOPIC")]
    output: String,
    /// The windows' size, seconds.
    #[arg(long, value_name = "N", default_value_t = 60)]
    window_secs: u64,
    /// Hopping windows that start every N seconds (default: tumbling).
    #[arg(long, value_name = "N")]
    hop_secs: Option<u64>,
    /// How long after its end a window still takes late records, seconds.
    #[arg(long, value_name = "N", default_value_t = 10)]
    grace_secs: u64,
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
    let mut builder = args.app.builder()?;
    builder.input(args.input.clone());
    // The task: the `counts` window store, and a `WindowedCount` per task, sending to `--output`.
    let (app, _counts) = windowed_count::build(&mut builder, windows, &args.output)?;
    let running = Arc::new(app.start()?);
    eprintln!(
        "windowed_count: {} running ({} partitions, windows of {} ms every {} ms, grace {} ms, {})",
        args.app.application_id,
        running.partitions(),
        windows.size_ms(),
        windows.advance_ms(),
        windows.grace_ms(),
        args.app.guarantee
    );
    running
        .run_until_signal()
        .await
        .context("windowed_count failed")?;
    eprintln!("windowed_count: stopped");
    Ok(())
}
