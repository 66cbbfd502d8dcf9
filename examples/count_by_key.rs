//! count_by_key: the canonical stream task. Reads records (key bytes, any value) from `--input`,
//! keeps the count per key in a store named `counts`, and for every input record sends
//! `(key, count as decimal ASCII)` to `--output`, same partition. `--input` may be given several
//! times (co-partitioned topics): a key's count then covers every input, the merge a join
//! starts from, and task *p* runs where partition *p* of every input is.
//!
//! ```text
//! cargo run --release --example count_by_key -- --application-id counter \
//!     --input events --output counts [--bootstrap-servers HOST:PORT] [--state-dir PATH] \
//!     [--threads N] [--restore-threads N] [--commit-interval-ms N] \
//!     [--guarantee at-least-once] [--coalesce]
//! ```
//!
//! `--client-properties FILE` reads librdkafka client properties (`key=value` lines:
//! `security.protocol`, `sasl.*`, `ssl.*`, `bootstrap.servers`) for every client the application
//! makes: a TLS and SASL cluster. `--bootstrap-servers` replaces the file's brokers;
//! `$KAFKA_BOOTSTRAP_SERVERS` is used when neither names them. Runs until SIGTERM or SIGINT,
//! then commits, closes its stores, leaves the group and exits 0. Several copies with the same
//! application id share the input's partitions.
//!
//! `--help` lists every flag.
//!
//! `--coalesce` turns on changelog coalescing for `counts` and sends only each key's latest
//! count per commit interval (Kafka Streams with caching on); without it every record's count
//! goes out (caching off).
//!
//! `--consumer-property KEY=VALUE` (repeatable) passes a librdkafka property to the input
//! consumers, e.g. `session.timeout.ms=6000` so that the group notices a killed copy sooner.
//!
//! `--guarantee exactly-once` runs it exactly-once: one Kafka transaction per worker and commit
//! interval carries the counts' changelog, the outputs and the input offsets; a `read_committed`
//! reader of the output sees every key's counts 1, 2, ..., n once each, through any crash.
//! `--instance-id NAME` names this copy's transactional ids (`<app-id>-<NAME>-<worker>`): a copy
//! restarted with the same name fences its previous incarnation at once. Never give two running
//! copies the same name.
//!
//! `--standby-replicas 1` (with `--instance-id`) makes the copies static group members that
//! keep warm standbys of the tasks a failure of another copy would bring them, so that a
//! takeover replays only the last records (the eager range assignor, `AppBuilder::standby_replicas`).
//! `--failure-detection-ms N` (with `--instance-id`; static members too) makes the copies beacon
//! to each other and remove a copy silent for N ms from the group without waiting for its
//! session timeout (`AppBuilder::failure_detection`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;
use kstate::kstate_core::BoxError;
use kstate::kstate_kafka::{RestoreListener, RestoreReport, RestoreStart};
use kstate::kstate_task::{
    App, AppState, Context, ProcessingGuarantee, Processor, Record, StoreHandle, StoreOptions,
};
use kstate_bench::cli::{ClusterArgs, key_value};

/// count_by_key: counts records per key from --input and sends every count to --output.
/// Several copies with the same --application-id share the input's partitions; each runs until
/// SIGTERM or SIGINT, then commits, closes its stores, leaves the group and exits 0.
#[derive(Debug, Parser)]
#[command(name = "count_by_key")]
struct Args {
    /// The application id: the consumer group, and the prefix of the changelog topics.
    #[arg(long)]
    application_id: String,
    /// An input topic; give it several times for co-partitioned topics (one count over all).
    #[arg(long = "input", value_name = "TOPIC", required = true)]
    inputs: Vec<String>,
    /// The output topic: `(key, count as decimal ASCII)` for every input record.
    #[arg(long, value_name = "TOPIC")]
    output: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Where the stores live (default: kstate-count-by-key in the temporary directory).
    #[arg(long, value_name = "PATH")]
    state_dir: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: usize,
    /// The process's restorer threads, shared by its workers (default: the runtime's).
    #[arg(long, value_name = "N")]
    restore_threads: Option<usize>,
    /// How often the workers commit, ms.
    #[arg(long, value_name = "N", default_value_t = 100)]
    commit_interval_ms: u64,
    /// Coalesce the counts' changelog and send each key's latest count per commit interval
    /// (Kafka Streams with caching on); otherwise every record's count goes out.
    #[arg(long)]
    coalesce: bool,
    /// A librdkafka property for the input consumers (repeatable), e.g. session.timeout.ms=6000.
    #[arg(long = "consumer-property", value_name = "KEY=VALUE", value_parser = key_value)]
    consumer_properties: Vec<(String, String)>,
    /// at-least-once, or exactly-once: one Kafka transaction per worker and commit interval.
    #[arg(long, default_value_t = ProcessingGuarantee::default())]
    guarantee: ProcessingGuarantee,
    /// This copy's name in its transactional ids (`<app-id>-<NAME>-<worker>`): a copy restarted
    /// with the same name fences its previous incarnation at once. Never give two running copies
    /// the same name.
    #[arg(long, value_name = "NAME")]
    instance_id: Option<String>,
    /// Warm standbys of the tasks a failure of another copy would bring this one (with
    /// --instance-id: static members, the eager range assignor).
    #[arg(long, value_name = "N", default_value_t = 0)]
    standby_replicas: u32,
    /// Beacon to the other copies and remove one silent for this many ms from the group without
    /// waiting for its session timeout (with --instance-id).
    #[arg(long, value_name = "N")]
    failure_detection_ms: Option<u64>,
}

/// Counts records per key in the store `counts`, and sends each record's key with its new
/// count (decimal ASCII) to `output`, to the input record's partition.
struct CountByKey {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
    /// Send only each key's latest count per commit (and coalesce the changelog).
    coalesce: bool,
}

impl Processor for CountByKey {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.counts);
        let count = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &count)?;
        let text = count.to_string();
        if self.coalesce {
            ctx.send_coalesced(&self.output, &key, Some(text.as_bytes()));
        } else {
            ctx.send(&self.output, &key, Some(text.as_bytes()))?;
        }
        Ok(())
    }
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

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    // A properties file (`key=value` lines, librdkafka names: `security.protocol`, `sasl.*`,
    // `ssl.*`) keeps secrets off the command line.
    let client = args.cluster.required()?;
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("kstate-count-by-key"));
    let mut builder = App::builder(args.application_id.clone(), client);
    for input in &args.inputs {
        builder.input(input.clone());
    }
    builder
        .state_dir(state_dir)
        .threads(args.threads)
        .commit_interval(Duration::from_millis(args.commit_interval_ms))
        .processing_guarantee(args.guarantee)
        .restore_listener(std::sync::Arc::new(PrintRestores));
    if let Some(id) = &args.instance_id {
        builder.instance_id(id.clone());
    }
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
    let coalesce = args.coalesce;
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions { coalesce });
    let output = args.output.clone();
    let app = builder.build(move |_task| {
        Box::new(CountByKey {
            counts: counts.clone(),
            output: output.clone(),
            coalesce,
        })
    })?;
    let running = app.start()?;
    eprintln!(
        "count_by_key: {} running ({} partitions, {} threads, {})",
        args.application_id,
        running.partitions(),
        args.threads,
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
        eprintln!("count_by_key: stopping");
        running.shutdown();
    }
    // The workers commit and close on their own threads; wait for them off the runtime.
    let running = std::sync::Arc::new(running);
    let waiting = running.clone();
    tokio::task::spawn_blocking(move || waiting.wait().map_err(anyhow::Error::from)).await??;
    match running.state() {
        AppState::Failed(message) => bail!("count_by_key failed: {message}"),
        _ => {
            eprintln!("count_by_key: stopped");
            Ok(())
        }
    }
}
