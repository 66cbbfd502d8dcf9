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

use anyhow::{Context as _, Result, bail};
use kstate::kstate_kafka::{ClientProperties, RestoreListener, RestoreReport, RestoreStart};
use kstate::kstate_task::{App, AppState, ProcessingGuarantee};

#[path = "shared/count_by_key.rs"]
mod count;

struct Args {
    /// The cluster and every client's properties (TLS and SASL settings among them).
    client: ClientProperties,
    application_id: String,
    inputs: Vec<String>,
    output: String,
    state_dir: PathBuf,
    threads: usize,
    /// The process's restorer threads (shared by its workers); the runtime's default when not given.
    restore_threads: Option<usize>,
    commit_interval: Duration,
    coalesce: bool,
    consumer_properties: Vec<(String, String)>,
    guarantee: ProcessingGuarantee,
    instance_id: Option<String>,
    standby_replicas: u32,
    failure_detection: Option<Duration>,
}

const USAGE: &str = "usage: count_by_key --application-id ID --input TOPIC [--input TOPIC]... --output TOPIC \
    [--bootstrap-servers HOST:PORT] [--client-properties FILE] [--state-dir PATH] [--threads N] [--restore-threads N] [--commit-interval-ms N] \
    [--guarantee at-least-once|exactly-once] [--instance-id NAME] [--standby-replicas N] [--failure-detection-ms N] [--coalesce] \
    [--consumer-property KEY=VALUE]...";

fn parse_args() -> Result<Args> {
    let mut bootstrap_servers = None;
    let mut client_properties = None;
    let (mut application_id, mut inputs, mut output) = (None, Vec::new(), None);
    let mut state_dir = None;
    let mut threads = 1;
    let mut restore_threads = None;
    let mut commit_interval = Duration::from_millis(100);
    let mut coalesce = false;
    let mut consumer_properties = Vec::new();
    let mut guarantee = ProcessingGuarantee::default();
    let mut instance_id = None;
    let mut standby_replicas = 0;
    let mut failure_detection = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--coalesce" {
            coalesce = true;
            continue;
        }
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--bootstrap-servers" => bootstrap_servers = Some(value),
            "--client-properties" => client_properties = Some(PathBuf::from(value)),
            "--application-id" => application_id = Some(value),
            "--input" => inputs.push(value),
            "--output" => output = Some(value),
            "--state-dir" => state_dir = Some(PathBuf::from(value)),
            "--consumer-property" => {
                let (key, value) = value
                    .split_once('=')
                    .with_context(|| format!("--consumer-property {value}: expected KEY=VALUE"))?;
                consumer_properties.push((key.to_string(), value.to_string()));
            }
            "--threads" => threads = value.parse().context("--threads")?,
            "--restore-threads" => {
                restore_threads = Some(value.parse().context("--restore-threads")?)
            }
            "--commit-interval-ms" => {
                commit_interval =
                    Duration::from_millis(value.parse().context("--commit-interval-ms")?)
            }
            "--guarantee" => guarantee = value.parse()?,
            "--instance-id" => instance_id = Some(value),
            "--standby-replicas" => {
                standby_replicas = value.parse().context("--standby-replicas")?
            }
            "--failure-detection-ms" => {
                failure_detection = Some(Duration::from_millis(
                    value.parse().context("--failure-detection-ms")?,
                ))
            }
            _ => bail!("unknown flag {flag}; {USAGE}"),
        }
    }
    let application_id =
        application_id.with_context(|| format!("--application-id is required; {USAGE}"))?;
    // A properties file (`key=value` lines, librdkafka names: `security.protocol`, `sasl.*`,
    // `ssl.*`) keeps secrets off the command line.
    let client = kstate_bench::cluster::required(
        client_properties.as_deref(),
        bootstrap_servers.as_deref(),
    )?;
    Ok(Args {
        client,
        state_dir: state_dir.unwrap_or_else(|| std::env::temp_dir().join("kstate-count-by-key")),
        application_id,
        inputs: if inputs.is_empty() {
            bail!("--input is required; {USAGE}")
        } else {
            inputs
        },
        output: output.with_context(|| format!("--output is required; {USAGE}"))?,
        threads,
        restore_threads,
        commit_interval,
        coalesce,
        consumer_properties,
        guarantee,
        instance_id,
        standby_replicas,
        failure_detection,
    })
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
    let args = parse_args()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut builder = App::builder(args.application_id.clone(), args.client.clone());
    for input in &args.inputs {
        builder.input(input.clone());
    }
    builder
        .state_dir(args.state_dir.clone())
        .threads(args.threads)
        .commit_interval(args.commit_interval)
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
    if let Some(timeout) = args.failure_detection {
        builder.static_membership(true).failure_detection(timeout);
    }
    if let Some(n) = args.restore_threads {
        builder.restore_threads(n);
    }
    for (key, value) in &args.consumer_properties {
        builder.consumer_property(key.clone(), value.clone());
    }
    let (app, _) = count::build(&mut builder, &args.output, args.coalesce)?;
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
