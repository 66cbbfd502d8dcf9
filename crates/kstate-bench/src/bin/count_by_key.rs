//! count_by_key: the canonical stream task as a service, which the runtime's tests
//! (`tests/task_failover.rs`) and the benchmarks against Kafka Streams
//! (`benches/kafka-streams/failover.sh`) run as separate processes. Reads records (key bytes,
//! any value) from `--input`, keeps the count per key in a store named `counts`, and for every
//! input record sends `(key, count as decimal ASCII)` to `--output`, same partition. Several `--input`s
//! (co-partitioned topics) give one count over all, the merge a join starts from: task *p* runs
//! where partition *p* of every input is.
//!
//! ```text
//! cargo build --release --workspace --bin count_by_key
//! $CARGO_TARGET_DIR/release/count_by_key --application-id counter \
//!     --input events --output counts [--bootstrap-servers HOST:PORT]
//! ```
//!
//! Copies with the same application id share the input's partitions; each runs until SIGTERM or
//! SIGINT, then commits, closes its stores, leaves the group and exits 0. The other flags
//! (`--help`) choose the rest: exactly-once, coalescing (Kafka Streams' caching), standbys,
//! failure detection, a TLS and SASL cluster (`--client-properties FILE`).
//!
//! The task is [`kstate_bench::topology::count_by_key`]
//! (`crates/kstate-bench/src/topology/count_by_key.rs`, a 20-line `Processor`): the very task the
//! runtime's tests check and the benchmarks measure against Kafka Streams' `groupByKey().count()`.
//! What this file adds is what a service needs around it: its flags, a restore listener, and a
//! clean shutdown on SIGTERM (`Running::run_until_signal`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use kstate_bench::cli::{AppArgs, key_value};
use kstate_bench::topology::count_by_key;
use kstate_kafka::{RestoreListener, RestoreReport, RestoreStart};

/// count_by_key: counts records per key from --input and sends every count to --output.
/// Several copies with the same --application-id share the input's partitions; each runs until
/// SIGTERM or SIGINT, then commits, closes its stores, leaves the group and exits 0.
#[derive(Debug, Parser)]
#[command(name = "count_by_key")]
struct Args {
    #[command(flatten)]
    app: AppArgs,
    /// An input topic; give it several times for co-partitioned topics (one count over all).
    #[arg(long = "input", value_name = "TOPIC", required = true)]
    inputs: Vec<String>,
    /// The output topic: `(key, count as decimal ASCII)` for every input record.
    #[arg(long, value_name = "TOPIC")]
    output: String,
    /// The process's restorer threads, shared by its workers (default: the runtime's).
    #[arg(long, value_name = "N")]
    restore_threads: Option<usize>,
    /// Coalesce the counts' changelog and send each key's latest count per commit interval
    /// (Kafka Streams with caching on); otherwise every record's count goes out.
    #[arg(long)]
    coalesce: bool,
    /// A librdkafka property for the input consumers (repeatable), e.g. session.timeout.ms=6000.
    #[arg(long = "consumer-property", value_name = "KEY=VALUE", value_parser = key_value)]
    consumer_properties: Vec<(String, String)>,
    /// Warm standbys of the tasks a failure of another copy would bring this one (with
    /// --instance-id: static members, the eager range assignor).
    #[arg(long, value_name = "N", default_value_t = 0)]
    standby_replicas: u32,
    /// Beacon to the other copies and remove one silent for this many ms from the group without
    /// waiting for its session timeout (with --instance-id).
    #[arg(long, value_name = "N")]
    failure_detection_ms: Option<u64>,
}

/// Prints two lines per store restore to stderr, for operators and for the failover test:
/// `count_by_key: restore <topic>/<partition> from <start> to <end> (rebuild: <why or none>)`
/// when it starts, `count_by_key: restored <topic>/<partition> to <end> (<n> records)` when done.
struct PrintRestores;

impl RestoreListener for PrintRestores {
    fn on_restore_start(&self, start: &RestoreStart) {
        eprintln!(
            "count_by_key: restore {}/{} from {} to {} (rebuild: {})",
            start.topic,
            start.partition,
            start.start_offset,
            start.end_offset,
            start.rebuild_reason.as_deref().unwrap_or("none")
        );
    }

    fn on_restore_end(&self, report: &RestoreReport) {
        eprintln!(
            "count_by_key: restored {}/{} to {} ({} records)",
            report.start.topic, report.start.partition, report.start.end_offset, report.records
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    // `--client-properties FILE` (`key=value` lines, librdkafka names: `security.protocol`,
    // `sasl.*`, `ssl.*`) keeps secrets off the command line.
    let mut builder = args.app.builder()?;
    for input in &args.inputs {
        builder.input(input.clone());
    }
    builder.restore_listener(Arc::new(PrintRestores));
    if args.standby_replicas > 0 {
        builder
            .static_membership(true)
            .standby_replicas(args.standby_replicas);
    }
    if let Some(ms) = args.failure_detection_ms {
        builder
            .static_membership(true)
            .failure_detection(Duration::from_millis(ms));
    }
    if let Some(n) = args.restore_threads {
        builder.restore_threads(n);
    }
    for (key, value) in &args.consumer_properties {
        builder.consumer_property(key.clone(), value.clone());
    }
    // The task: the `counts` store, and a `CountByKey` per task.
    let (app, _counts) = count_by_key::build(&mut builder, &args.output, args.coalesce)?;
    let running = Arc::new(app.start()?);
    eprintln!(
        "count_by_key: {} running ({} partitions, {} threads, {})",
        args.app.application_id,
        running.partitions(),
        args.app.threads,
        args.app.guarantee
    );
    running
        .run_until_signal()
        .await
        .context("count_by_key failed")?;
    eprintln!("count_by_key: stopped");
    Ok(())
}
