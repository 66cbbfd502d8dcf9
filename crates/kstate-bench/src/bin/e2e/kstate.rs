//! `e2e kstate`: kstate's side of the end-to-end runs, in process, until it has processed and
//! committed N records (see the crate's module docs).

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use clap::ValueEnum;
use kstate_bench::cli::number;
use kstate_bench::topology::{count_by_key, windowed_count, windowed_updates};
use kstate_kafka::ClientProperties;
use kstate_task::{App, AppState, ProcessingGuarantee};

use crate::common::e2e_windows;

/// `e2e kstate`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The input topic.
    #[arg(long)]
    input: String,
    /// The output topic.
    #[arg(long)]
    output: String,
    /// The application id (consumer group, changelog topic prefix).
    #[arg(long)]
    application_id: String,
    /// Stop once this many records are processed and committed.
    #[arg(long, value_parser = number::<u64>)]
    rows: u64,
    /// Worker threads.
    #[arg(long, value_parser = number::<usize>, default_value_t = 1)]
    threads: usize,
    /// Coalesce the counts' changelog and send each key's latest count per commit (Kafka
    /// Streams with caching on); `--topology count` only.
    #[arg(long)]
    coalesce: bool,
    /// at-least-once or exactly-once (one transaction per worker and commit interval).
    #[arg(long, default_value_t = ProcessingGuarantee::default())]
    guarantee: ProcessingGuarantee,
    /// What is counted: per key, or per key and 1-minute window (10 s grace).
    #[arg(long, value_enum, default_value_t = Topology::Count)]
    topology: Topology,
    /// The windowed topology's outputs: every window's new count, or each final count once.
    #[arg(long, value_enum, default_value_t = Emit::Updates)]
    emit: Emit,
}

/// What `--topology` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Topology {
    /// Count by key, every count sent (or the latest per commit, coalescing).
    Count,
    /// Count by key and window.
    Windowed,
}

/// What `--emit` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// Every window's new count, for each record.
    Updates,
    /// Each window's final count once, when it closes.
    Final,
}

/// The task the flags ask for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Task {
    /// Count by key, every count sent (or the latest per commit, coalescing).
    Count,
    /// Count by key and window, every window's new count sent.
    WindowedUpdates,
    /// Count by key and window, each window's final count sent once.
    WindowedFinal,
}

impl Task {
    fn from_args(args: &Args) -> Result<Self> {
        Ok(match (args.topology, args.emit) {
            (Topology::Count, Emit::Updates) => Task::Count,
            (Topology::Windowed, Emit::Updates) => Task::WindowedUpdates,
            (Topology::Windowed, Emit::Final) => Task::WindowedFinal,
            (Topology::Count, Emit::Final) => bail!("--emit final needs --topology windowed"),
        })
    }

    fn describe(self) -> &'static str {
        match self {
            Task::Count => "count",
            Task::WindowedUpdates => "windowed, emit updates",
            Task::WindowedFinal => "windowed, emit final",
        }
    }
}

/// Runs the task until `--rows` records are processed and committed, then stops it gracefully.
pub fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let (rows, coalesce, guarantee) = (args.rows, args.coalesce, args.guarantee);
    let task = Task::from_args(&args)?;
    ensure!(
        !coalesce || task == Task::Count,
        "--coalesce is for --topology count only"
    );
    let state_dir = tempfile::tempdir()?;
    eprintln!("e2e kstate: cluster {client}");
    let mut builder = App::builder(args.application_id, client.clone());
    builder
        .input(args.input)
        .state_dir(state_dir.path())
        .threads(args.threads)
        .processing_guarantee(guarantee);
    let output = args.output;
    let app = match task {
        Task::Count => count_by_key::build(&mut builder, &output, coalesce)?.0,
        Task::WindowedUpdates => windowed_updates::build(&mut builder, e2e_windows(), &output)?.0,
        Task::WindowedFinal => windowed_count::build(&mut builder, e2e_windows(), &output)?.0,
    };
    let started = Instant::now();
    let running = app.start()?;
    let deadline = started + Duration::from_secs(1800);
    loop {
        // `processed` counts committed records only (see the module docs), whatever the guarantee.
        let processed: u64 = running.tasks().iter().map(|t| t.processed).sum();
        if processed >= rows {
            break;
        }
        if let AppState::Failed(message) = running.state() {
            bail!("kstate failed: {message}");
        }
        ensure!(
            Instant::now() < deadline,
            "kstate processed {processed} of {rows}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    running.shutdown();
    running.wait()?;
    eprintln!(
        "kstate e2e processed {rows} records in {} ms from start ({}, coalescing {}, {guarantee})",
        elapsed.as_millis(),
        task.describe(),
        if coalesce { "on" } else { "off" }
    );
    Ok(())
}
