//! `kstate restore`: a store brought up to its changelog's end by hand, with a progress bar;
//! `--follow` keeps applying new records until interrupted (a warm standby by hand).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use kstate_kafka::{
    BatchRestored, CancelToken, OpenHooks, RestoreListener, RestoreReport, RestoreStart,
    RestoredStore, follow_changelog,
};
use kstate_rocksdb::RocksDbOptions;
use serde::Serialize;

use crate::Outcome;
use crate::changelog::{KafkaArgs, bar_style, rate_message};
use crate::store_dir;

/// Restores a store from its changelog (creating the directory if needed): resumes from the
/// stored offset, or rebuilds when the store cannot be trusted, exactly as an application's open
/// does. Shows records, MB/s and ETA, then the restore's report. Never creates the topic.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  kstate restore --bootstrap-servers broker:9092 --topic counter-counts-changelog --partition 3 /var/lib/counter/counter/3/counts\n  kstate restore --topic counter-counts-changelog --partition 3 --follow /standby/3/counts"
)]
pub(crate) struct Args {
    /// The store's directory.
    dir: PathBuf,
    /// The changelog topic.
    #[arg(long)]
    topic: String,
    /// The changelog partition.
    #[arg(long)]
    partition: i32,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// After catching up, keep applying new records until SIGINT or SIGTERM.
    #[arg(long)]
    follow: bool,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Drives the progress bar from the restore's listener.
struct Bar {
    bar: ProgressBar,
    start_offset: AtomicI64,
    bytes: AtomicU64,
    started: Instant,
}

impl RestoreListener for Bar {
    fn on_restore_start(&self, start: &RestoreStart) {
        self.start_offset
            .store(start.start_offset, Ordering::Relaxed);
        self.bar
            .set_length((start.end_offset - start.start_offset).max(0) as u64);
        if let Some(reason) = &start.rebuild_reason {
            self.bar.println(format!("rebuilding: {reason}"));
        }
    }

    fn on_batch_restored(&self, batch: &BatchRestored) {
        let bytes =
            self.bytes.fetch_add(batch.bytes as u64, Ordering::Relaxed) + batch.bytes as u64;
        let done =
            (batch.last_offset + 1 - self.start_offset.load(Ordering::Relaxed)).max(0) as u64;
        if self.bar.length().is_some_and(|len| done > len) {
            self.bar.set_length(done); // following: the end moves
        }
        self.bar.set_position(done);
        self.bar.set_message(rate_message(
            batch.total_records,
            self.started.elapsed(),
            Some(bytes),
        ));
    }

    fn on_restore_end(&self, _: &RestoreReport) {
        self.bar.finish_and_clear();
    }
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    path: String,
    topic: &'a str,
    partition: i32,
    start_offset: i64,
    end_offset: i64,
    rebuild_reason: Option<&'a str>,
    records: u64,
    batches: u64,
    seconds: f64,
    records_per_second: f64,
}

pub(crate) fn run(args: Args) -> Result<Outcome> {
    let config = args.kafka.changelog(&args.topic, args.partition)?;
    let bar = Arc::new(Bar {
        bar: ProgressBar::new(0).with_style(bar_style("records")),
        start_offset: AtomicI64::new(0),
        bytes: AtomicU64::new(0),
        started: Instant::now(),
    });
    if let Some(parent) = args.dir.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let options = RocksDbOptions::default();
    let location = store_dir::location(&args.dir)?;
    let report = if args.follow {
        let stop = CancelToken::new();
        stop_on_signal(stop.clone())?;
        eprintln!(
            "following {}/{}; SIGINT or SIGTERM stops",
            args.topic, args.partition
        );
        follow_changelog(location, &options, &config, Some(bar.clone()), &stop)?
    } else {
        let hooks = OpenHooks {
            listener: Some(bar.clone()),
            record_check: None,
            cancel: None,
        };
        RestoredStore::restore(location, &options, config, &hooks)?.close()?
    };
    bar.bar.finish_and_clear();
    let start = &report.start;
    if args.json {
        let json = Report {
            path: args.dir.display().to_string(),
            topic: &start.topic,
            partition: start.partition,
            start_offset: start.start_offset,
            end_offset: start.end_offset,
            rebuild_reason: start.rebuild_reason.as_deref(),
            records: report.records,
            batches: report.batches,
            seconds: report.elapsed.as_secs_f64(),
            records_per_second: report.records_per_sec(),
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!(
            "restored {} from {}/{}: offsets {}..{}, {} records in {} batches, {:.2} s ({:.0} records/s){}",
            args.dir.display(),
            start.topic,
            start.partition,
            start.start_offset,
            start.end_offset,
            report.records,
            report.batches,
            report.elapsed.as_secs_f64(),
            report.records_per_sec(),
            start
                .rebuild_reason
                .as_deref()
                .map_or(String::new(), |r| format!("; rebuilt: {r}"))
        );
    }
    Ok(Outcome::Done)
}

/// Cancels `stop` on the first SIGINT or SIGTERM.
fn stop_on_signal(stop: CancelToken) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    std::thread::Builder::new()
        .name("kstate-signals".into())
        .spawn(move || {
            runtime.block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut term), Ok(mut int)) = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                stop.cancel();
            });
        })?;
    Ok(())
}
