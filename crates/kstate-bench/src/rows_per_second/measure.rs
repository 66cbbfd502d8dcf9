//! The measuring: every thread's write loop, one configuration at a time; the restore of the
//! `logged-group` changelog against a bare consumer; the ratios between configurations; and the
//! results as `--json` writes them.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use kstate_core::KeyValueStore;
use kstate_kafka::LoggedStore;
use tempfile::TempDir;

use super::args::Args;
use super::configs::{Config, RESTORED_CONFIG, RunContext, Slot, config};
use super::sinks::RowSink;
use crate::BenchError;
use crate::latency::{Latency, LatencySummary};
use crate::progress::Progress;
use crate::workload::Rows;

/// A progress line every this many rows.
const PROGRESS_EVERY: u64 = 100_000;

/// One configuration's results at one thread count, as `--json` writes them.
#[derive(Debug, serde::Serialize)]
pub struct ConfigResult {
    /// The configuration.
    pub config: &'static str,
    /// Its threads (and stores).
    pub threads: usize,
    /// Rows written.
    pub rows: u64,
    /// From the first write to the last thread's last write.
    pub ms: f64,
    /// `rows` over `ms`.
    pub rows_per_sec: f64,
    /// Every write call of every thread.
    #[serde(flatten)]
    pub latency: LatencySummary,
    /// The slowest thread's flush after its writes.
    pub flush_ms: f64,
    /// (rows, elapsed ms) at every progress line.
    pub progress: Vec<(u64, f64)>,
}

/// The restore measurement, as `--json` writes it.
#[derive(Debug, serde::Serialize)]
pub struct RestoreResult {
    /// Records the restore replayed.
    pub records: u64,
    /// How long it took.
    pub ms: f64,
    /// `records` over `ms`.
    pub records_per_sec: f64,
    /// A bare rdkafka consumer reading the same partition.
    pub bare_consumer_records_per_sec: f64,
}

/// Everything one run measured, for `--json`.
#[derive(Debug, serde::Serialize)]
pub struct RunResult {
    /// Rows per configuration.
    pub rows: u64,
    /// Bytes per value.
    pub value_size: usize,
    /// Rows per write call.
    pub batch: usize,
    /// The thread counts.
    pub threads: Vec<usize>,
    /// Each configuration at each thread count.
    pub configs: Vec<ConfigResult>,
    /// The restore, when `logged-group` ran.
    pub restore: Option<RestoreResult>,
}

/// One run: the command line, the rows every configuration writes, a temporary directory for
/// the stores, and the cluster.
pub struct Harness {
    args: Args,
    work: Rows,
    base: TempDir,
    context: RunContext,
}

impl Harness {
    /// Prepares the rows (seeded), the stores' directory and the run's topic names.
    pub fn new(args: Args) -> Result<Self, BenchError> {
        let base = match &args.dir {
            Some(dir) => tempfile::tempdir_in(dir).map_err(BenchError::io(dir))?,
            None => tempfile::tempdir().map_err(BenchError::io(std::env::temp_dir()))?,
        };
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let context = RunContext {
            cluster: args.cluster()?,
            run_id: format!("{}-{}", std::process::id(), since_epoch.as_secs()),
            restore_topic: args.restore_topic.clone(),
            restore_threads: args.threads.first().copied().unwrap_or(1),
            linger: args.linger_ms.map(Duration::from_millis),
        };
        Ok(Harness {
            work: Rows::new(args.rows, args.value_size, args.seed),
            args,
            base,
            context,
        })
    }

    /// The command line the run was given.
    pub fn args(&self) -> &Args {
        &self.args
    }

    /// What the run measures, in order: every configuration the command line names at each
    /// thread count, without those that need a cluster when there is none.
    pub fn plan(&self) -> Vec<(usize, &'static Config)> {
        let mut plan = Vec::new();
        for &threads in &self.args.threads {
            for config in self.named_configs() {
                if !config.needs_broker || self.context.cluster.is_some() {
                    plan.push((threads, config));
                }
            }
        }
        plan
    }

    /// The configurations the command line names that need a cluster the run does not have.
    pub fn skipped(&self) -> Vec<&'static str> {
        match self.context.cluster {
            Some(_) => Vec::new(),
            None => self
                .named_configs()
                .filter(|c| c.needs_broker)
                .map(|c| c.name)
                .collect(),
        }
    }

    fn named_configs(&self) -> impl Iterator<Item = &'static Config> + '_ {
        self.args.configs.iter().filter_map(|name| config(name))
    }

    /// Runs `config` on `threads` stores, one thread each, in fresh directories, printing the
    /// progress lines as the rows go in.
    pub fn run(&self, config: &Config, threads: usize) -> Result<ConfigResult, BenchError> {
        let rows = match config.name {
            "logged-sync" => self.args.rows.min(self.args.sync_rows),
            _ => self.args.rows,
        };
        let dir = self.base.path().join(format!("{}-t{threads}", config.name));
        // Each store gets the options (and memory budget) a one-thread run has, so the thread
        // count is the only thing that changes.
        let mut sinks = (0..threads)
            .map(|index| {
                let path = dir.join(index.to_string());
                let options = self.args.store_options();
                config.open(&path, &options, Slot { index, threads }, &self.context)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let progress = Progress::new("rows", PROGRESS_EVERY);
        let writes_finished = Barrier::new(threads);
        let outcomes = std::thread::scope(|scope| {
            let handles: Vec<_> = sinks
                .iter_mut()
                .enumerate()
                .map(|(index, sink)| {
                    let writer = Writer {
                        work: &self.work,
                        slot: Slot { index, threads },
                        rows: rows as usize,
                        batch: self.args.batch,
                        progress: &progress,
                        writes_finished: &writes_finished,
                    };
                    scope.spawn(move || writer.write(sink.as_mut()))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| BenchError::Panicked("writer"))?)
                .collect::<Result<Vec<_>, _>>()
        })?;
        drop(sinks);
        // A configuration without a store (the bare producer) made no directory.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(BenchError::io(&dir))?;
        }
        let mut latency = Latency::new();
        for outcome in &outcomes {
            latency.merge(&outcome.latency)?;
        }
        let last_write = outcomes.iter().map(|o| o.writes_done).max();
        let elapsed = last_write.map_or(Duration::ZERO, |last| last - progress.start());
        let finish = outcomes.iter().map(|o| o.finish).max().unwrap_or_default();
        Ok(ConfigResult {
            config: config.name,
            threads,
            rows,
            ms: elapsed.as_secs_f64() * 1e3,
            rows_per_sec: rows as f64 / elapsed.as_secs_f64(),
            latency: latency.summary(),
            flush_ms: finish.as_secs_f64() * 1e3,
            progress: progress.into_points(),
        })
    }

    /// Restores the `logged-group` changelog of the first thread count (partition 0) into an
    /// empty directory, then reads the same partition with a bare consumer, so the two rates
    /// compare within one run; `None` when `logged-group` did not run.
    pub fn restore(&self) -> Result<Option<RestoreResult>, BenchError> {
        let ran = self.args.configs.iter().any(|c| c == RESTORED_CONFIG);
        if !ran || self.context.cluster.is_none() {
            return Ok(None);
        }
        let cluster = self.context.cluster()?;
        let threads = self.context.restore_threads;
        let topic = self.context.topic(RESTORED_CONFIG, threads);
        let dir = self.base.path().join("restore");
        let partitions = Slot { index: 0, threads }.partitions()?;
        let config =
            kstate_kafka::ChangelogConfig::new(cluster.clone(), &topic, 0).partitions(partitions);
        let what = format!("restore {topic}/0 into {}", dir.display());
        let store = LoggedStore::open(&dir, &self.args.store_options(), config)
            .map_err(BenchError::store(what.clone()))?;
        let report = store.restore_report().clone();
        store.close().map_err(BenchError::store(what))?;
        drop(store);
        std::fs::remove_dir_all(&dir).map_err(BenchError::io(&dir))?;
        let (count, elapsed) = crate::kafka::bare_read(cluster, &topic, 0)?;
        Ok(Some(RestoreResult {
            records: report.records,
            ms: report.elapsed.as_secs_f64() * 1e3,
            records_per_sec: report.records_per_sec(),
            bare_consumer_records_per_sec: count as f64 / elapsed.as_secs_f64(),
        }))
    }

    /// The results of the run, for `--json`.
    pub fn result(&self, configs: Vec<ConfigResult>, restore: Option<RestoreResult>) -> RunResult {
        RunResult {
            rows: self.args.rows,
            value_size: self.args.value_size,
            batch: self.args.batch,
            threads: self.args.threads.clone(),
            configs,
            restore,
        }
    }
}

/// What one writer thread measured.
struct ThreadOutcome {
    writes_done: Instant,
    finish: Duration,
    latency: Latency,
}

/// One thread's share of a configuration's rows: `slot.index`, `slot.index + slot.threads`, ...
struct Writer<'a> {
    work: &'a Rows,
    slot: Slot,
    rows: usize,
    batch: usize,
    progress: &'a Progress,
    writes_finished: &'a Barrier,
}

impl Writer<'_> {
    /// Writes this thread's rows into `sink`, then (once every thread has written) flushes it.
    fn write(self, sink: &mut dyn RowSink) -> Result<ThreadOutcome, BenchError> {
        let Writer { slot, batch, .. } = self;
        let mut latency = Latency::new();
        let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(batch);
        let mine = self.rows.saturating_sub(slot.index).div_ceil(slot.threads);
        let mut unreported = 0;
        let mut write = || -> Result<(), BenchError> {
            for (n, i) in (slot.index..self.rows).step_by(slot.threads).enumerate() {
                let (key, value) = self.work.row(i);
                let call = Instant::now();
                if batch == 1 {
                    sink.put(&key, value)?;
                } else {
                    pending.push((key.to_vec(), value.to_vec()));
                    if pending.len() == batch || n + 1 == mine {
                        sink.put_batch(&pending)?;
                        pending.clear();
                    }
                }
                latency.record(call.elapsed());
                unreported += 1;
                if unreported == Progress::STRIDE {
                    self.progress.add(unreported);
                    unreported = 0;
                }
            }
            self.progress.add(unreported);
            Ok(())
        };
        let written = write();
        let writes_done = Instant::now();
        // No thread flushes (for a logged store: commits and closes) while others still write; a
        // thread that failed waits too, so that the others are not left waiting for it.
        self.writes_finished.wait();
        written?;
        let flush_start = Instant::now();
        sink.finish()?;
        Ok(ThreadOutcome {
            writes_done,
            finish: flush_start.elapsed(),
            latency,
        })
    }
}

/// Each configuration against `rocksdb-wal` at the same thread count (`ratio`), each logged
/// configuration against each of its parts alone (`limit`: the physical limits of its rate), and
/// each configuration against itself at the first thread count (`scaling`), one line each.
pub fn ratios(results: &[ConfigResult]) -> Vec<String> {
    let rate = |config: &str, threads: usize| {
        results
            .iter()
            .find(|r| r.config == config && r.threads == threads)
            .map(|r| r.rows_per_sec)
    };
    let mut lines = Vec::new();
    for r in results {
        if let Some(baseline) = rate("rocksdb-wal", r.threads) {
            lines.push(format!(
                "ratio config={} threads={} vs=rocksdb-wal x={:.2}",
                r.config,
                r.threads,
                r.rows_per_sec / baseline
            ));
        }
    }
    for r in results.iter().filter(|r| r.config.starts_with("logged-")) {
        for part in ["rocksdb-bare-nowal", "kafka-bare-producer"] {
            if let Some(limit) = rate(part, r.threads) {
                lines.push(format!(
                    "limit config={} threads={} vs={part} x={:.2}",
                    r.config,
                    r.threads,
                    r.rows_per_sec / limit
                ));
            }
        }
    }
    if let Some(first) = results.first().map(|r| r.threads) {
        for r in results.iter().filter(|r| r.threads != first) {
            if let Some(one) = rate(r.config, first) {
                lines.push(format!(
                    "scaling config={} threads={} vs_threads={first} x={:.2}",
                    r.config,
                    r.threads,
                    r.rows_per_sec / one
                ));
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_store_configurations_write_every_row_without_a_broker() -> Result<(), BenchError> {
        let dir = tempfile::tempdir().map_err(BenchError::io("tmp"))?;
        let args = Args::try_parse_from([
            "rows_per_second",
            "--rows",
            "3000",
            "--configs",
            "rocksdb-wal,rocksdb-nowal",
            "--threads",
            "2",
            "--dir",
            &dir.path().display().to_string(),
        ])
        .map_err(|e| BenchError::Flag {
            flag: "clap",
            reason: e.to_string(),
        })?;
        let harness = Harness::new(args)?;
        let mut results = Vec::new();
        for (threads, config) in harness.plan() {
            results.push(harness.run(config, threads)?);
        }
        assert_eq!(results.len(), 2);
        assert!(
            results
                .iter()
                .all(|r| r.rows == 3000 && r.latency.calls == 3000)
        );
        let lines = ratios(&results);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("ratio config=rocksdb-nowal"))
        );
        Ok(())
    }
}
