//! rows_per_second: how many rows per second each store configuration takes, in the form of the
//! SAMZA-543 listing (`100000 rows in 649 ms`, cumulative), followed by a summary line per
//! configuration.
//!
//! ```text
//! cargo run --release --example rows_per_second -- [--rows N] [--value-size BYTES] [--batch N]
//!     [--configs a,b,...] [--dir PATH] [--seed N] [--sync-rows N] [--restore-topic NAME]
//!     [--write-buffer-mb N] [--compression none|lz4|lz4-zstd] [--threads N[,N...]]
//!     [--client-properties FILE] [--bootstrap-servers HOST:PORT] [--client-property KEY=VALUE]
//!     [--linger-ms N] [--json PATH]
//! ```
//!
//! `--threads 1,2,4` runs every configuration once per thread count, with one store per thread
//! (its own directory, and for the logged configurations its own partition of one changelog
//! topic with that many partitions), as a stream job runs one task per input partition. The
//! threads split the same rows between them (thread `t` of `n` writes rows `t`, `t + n`, ...), so
//! the total work stays the same and rows/s shows how the configuration scales with partitions.
//!
//! `--client-properties FILE` reads librdkafka client properties (`key=value` lines, e.g. the
//! `sasl_ssl.properties` that `scripts/kafka start --secure` prints) for every Kafka client of the
//! run: a TLS and SASL cluster. `--bootstrap-servers` replaces the file's brokers;
//! `$KAFKA_BOOTSTRAP_SERVERS` is used when neither names them
//! (`kstate_bench::cluster`). `--client-property KEY=VALUE` (repeatable)
//! adds a librdkafka property on top, e.g. `compression.type=none`; `--linger-ms N` sets the
//! logged configurations' producer linger (`ChangelogConfig::linger`).
//!
//! `--help` lists the flags and the configurations; counts may use `_` as a digit separator
//! (`--rows 4_000_000`).
//!
//! `--json PATH` also writes every result (with the progress points) for machines;
//! `benches/chart.py` turns it into the cumulative-rows-against-time chart.
//!
//! Configurations (one list, one write loop; later work adds the changelog configurations):
//! - `rocksdb-wal`: a bare `rocksdb::DB` with the store's options but the WAL **on**. The only
//!   place in the project where a WAL is ever written: it is the baseline SAMZA-543 measured
//!   against.
//! - `rocksdb-bare-nowal`: the same bare DB with the WAL off, to measure what the store adds.
//! - `rocksdb-nowal`: `kstate_rocksdb::RocksDbStore`, the store itself.
//! - `logged-async`, `logged-group`, `logged-sync`: `kstate_kafka::LoggedStore` (the store plus
//!   its Kafka changelog) in each durability mode. `async` commits when the overlay bound is
//!   reached and at the end; `group` commits every 10 ms; `sync` waits for the broker's
//!   acknowledgement of every put, so it writes at most 50,000 rows (`--sync-rows`).
//! - `kafka-bare-producer`: no store, only the changelog's other half: a bare rdkafka producer
//!   with exactly the settings of the producer a logged store sends through
//!   ([`ProducerConfig::client_config`]: acks=all, idempotence, lz4, the same linger) sends the
//!   same rows to a topic partition per thread; as for a logged store, the clock covers the send
//!   calls and the wait for the broker's last acknowledgement is the flush. With
//!   `rocksdb-bare-nowal` it brackets `logged-group`: a logged store can be no faster than
//!   either of its parts alone.
//!
//! After the logged configurations, the `logged-group` changelog (a new topic per run, or the one
//! `--restore-topic` names, which must not exist yet; partition 0 of the first thread count's
//! topic) is restored into an empty directory (`restored <n> records in <t> ms (<r> records/s)`),
//! and a bare rdkafka consumer reads the same partition for comparison. The changelog
//! configurations need a broker (`KAFKA_BOOTSTRAP_SERVERS`, which `scripts/rows-per-second` sets
//! up, or the flags above); without one the example runs the store-only configurations and says
//! how to get the rest.
//!
//! Keys are the numbers `0..rows` as 8-byte big-endian integers in a shuffled order (seeded, so
//! every configuration writes the same sequence); values are `--value-size` pseudo-random bytes.
//! The clock covers the write calls only; the flush after them is reported on its own line.

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use kstate::kstate_core::{Batch, KeyValueStore};
use kstate::kstate_kafka::{
    ChangelogConfig, ClientProperties, Durability, LoggedStore, ProducerConfig, RestoreClients,
};
use kstate::kstate_rocksdb::rocksdb::{self, ColumnFamilyDescriptor, DB, WriteOptions};
use kstate::kstate_rocksdb::{
    Compression, METADATA_CF, MemoryBudget, RocksDbOptions, RocksDbStore,
};
use kstate_bench::cli::{ClusterArgs, key_value, number};
use kstate_bench::kafka::{Settled, send, wait_for_leaders};
use kstate_bench::latency::{Latency, LatencySummary};
use kstate_bench::progress::Progress;
use kstate_bench::report::write_json;
use kstate_bench::workload::Rows;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};

const PROGRESS_EVERY: u64 = 100_000;

/// rows_per_second: how many rows per second each store configuration takes, in the form of
/// the SAMZA-543 listing, followed by a summary line per configuration.
#[derive(Debug, Clone, Parser)]
#[command(name = "rows_per_second")]
struct Args {
    /// Rows per configuration (`_` may separate digits).
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 1_000_000)]
    rows: u64,
    /// Bytes per value.
    #[arg(long, value_name = "BYTES", value_parser = number::<usize>, default_value_t = 100)]
    value_size: usize,
    /// Rows per write call (1: `put`; more: a batch).
    #[arg(long, value_name = "N", value_parser = number::<usize>, default_value_t = 1)]
    batch: usize,
    /// The configurations to run, comma-separated (default: all; the list is below).
    #[arg(long, value_name = "A,B,...", value_delimiter = ',', value_parser = known_config)]
    configs: Vec<String>,
    /// Where the stores go (a temporary directory inside it; default: the system's).
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
    /// The seed of the rows' order and values.
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 543)]
    seed: u64,
    /// At most this many rows for `logged-sync`, which waits for every put's acknowledgement.
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 50_000)]
    sync_rows: u64,
    /// The `logged-group` changelog's topic (it must not exist yet; default: a new one per run).
    #[arg(long, value_name = "NAME")]
    restore_topic: Option<String>,
    /// The stores' write buffer, MB (default: the store's).
    #[arg(long, value_name = "N", value_parser = number::<usize>)]
    write_buffer_mb: Option<usize>,
    /// The stores' compression (default: the store's).
    #[arg(long, value_enum)]
    compression: Option<CompressionArg>,
    /// Thread counts, comma-separated: every configuration runs once per count, one store per
    /// thread.
    #[arg(
        long,
        value_name = "N[,N...]",
        value_delimiter = ',',
        value_parser = number::<usize>,
        default_values_t = [1]
    )]
    threads: Vec<usize>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// A librdkafka property on top of the cluster's (repeatable), e.g. compression.type=none.
    #[arg(long = "client-property", value_name = "KEY=VALUE", value_parser = key_value)]
    client_properties: Vec<(String, String)>,
    /// The logged configurations' producer linger, ms (`ChangelogConfig::linger`).
    #[arg(long, value_name = "N", value_parser = number::<u64>)]
    linger_ms: Option<u64>,
    /// Also write every result, with the progress points, as JSON (for benches/chart.py).
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// `--compression`'s values.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum CompressionArg {
    /// No compression.
    None,
    /// lz4 on every level.
    Lz4,
    /// lz4, and zstd for the bottommost level.
    Lz4Zstd,
}

impl From<CompressionArg> for Compression {
    fn from(arg: CompressionArg) -> Self {
        match arg {
            CompressionArg::None => Compression::None,
            CompressionArg::Lz4 => Compression::Lz4,
            CompressionArg::Lz4Zstd => Compression::Lz4ThenZstd,
        }
    }
}

/// A configuration's name, if it names one.
fn known_config(name: &str) -> Result<String> {
    match config(name) {
        Some(config) => Ok(config.name.to_string()),
        None => bail!("unknown configuration '{name}'; known: {}", names()),
    }
}

impl Args {
    /// The command line, with the configurations listed under `--help` and the checks clap
    /// cannot make alone.
    fn from_command_line() -> Result<Args> {
        let command =
            <Args as CommandFactory>::command().after_help(format!("Configurations: {}", names()));
        let mut args = Args::from_arg_matches(&command.get_matches())?;
        args.batch = args.batch.max(1);
        if args.configs.is_empty() {
            args.configs = CONFIGS.iter().map(|c| c.name.to_string()).collect();
        }
        if args.threads.contains(&0) {
            bail!("--threads: 0 threads cannot write anything");
        }
        let mut seen = args.threads.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != args.threads.len() {
            bail!("--threads: each count at most once (a repeat would reuse its topic)");
        }
        Ok(args)
    }
}

/// The store options of every configuration: the defaults, or the ones the flags sweep, with a
/// fresh budget each, so no configuration inherits another's warm cache.
fn store_options(args: &Args) -> RocksDbOptions {
    let mut options =
        RocksDbOptions::default().memory_budget(MemoryBudget::new(256 << 20, 128 << 20));
    if let Some(mb) = args.write_buffer_mb {
        options = options.write_buffer_size(mb << 20);
    }
    if let Some(compression) = args.compression {
        options = options.compression(compression.into());
    }
    options
}

/// Where rows go: a store, or a bare RocksDB for the baselines.
trait RowSink: Send {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<()>;
    /// Makes the rows durable in the engine (flush memtables).
    fn finish(&mut self) -> Result<()>;
}

/// Any kstate store.
struct StoreSink<S: KeyValueStore>(S);

impl<S: KeyValueStore + Send> RowSink for StoreSink<S> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        Ok(self.0.put(key, value)?)
    }
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = Batch::with_capacity(rows.len());
        for (k, v) in rows {
            batch.put(k.as_slice(), v.as_slice());
        }
        Ok(self.0.write(batch)?)
    }
    fn finish(&mut self) -> Result<()> {
        Ok(self.0.close()?)
    }
}

/// A bare `rocksdb::DB` opened with exactly the store's options and column families.
struct BareRocks {
    db: DB,
    write_opts: WriteOptions,
}

impl BareRocks {
    fn open(path: &Path, options: &RocksDbOptions, wal: bool) -> Result<Self> {
        let opts = options.to_rocksdb();
        let families = [
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(METADATA_CF, opts.clone()),
        ];
        let db = DB::open_cf_descriptors(&opts, path, families)?;
        let mut write_opts = WriteOptions::default();
        // The baseline: the WAL on, as RocksDB ships. Not synced, like Samza's baseline.
        write_opts.disable_wal(!wal);
        Ok(BareRocks { db, write_opts })
    }
}

impl RowSink for BareRocks {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        Ok(self.db.put_opt(key, value, &self.write_opts)?)
    }
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut wb = rocksdb::WriteBatch::default();
        for (k, v) in rows {
            wb.put(k, v);
        }
        Ok(self.db.write_opt(wb, &self.write_opts)?)
    }
    fn finish(&mut self) -> Result<()> {
        Ok(self.db.flush()?)
    }
}

/// A bare rdkafka producer with the settings of a logged store's producer: the changelog
/// without the store.
struct BareProducer {
    producer: ThreadedProducer<Settled>,
    topic: String,
    partition: i32,
    sent: u64,
}

impl BareProducer {
    /// Creates `config`'s topic of `partitions` partitions (one per thread, as the logged
    /// configurations have) and a producer exactly like the one a store opened with `config`
    /// sends through, and waits until it knows every partition's leader: a logged store's open
    /// waits for its topic too, so neither clock holds the topic's creation.
    fn open(config: &ChangelogConfig, partitions: i32) -> Result<Self> {
        RestoreClients::new(config)?.create_missing_topics(std::slice::from_ref(config))?;
        let producer: ThreadedProducer<Settled> = ProducerConfig::from(config)
            .client_config()
            .create_with_context(Settled::default())
            .context("bare producer")?;
        wait_for_leaders(producer.client(), config.topic(), partitions)?;
        Ok(BareProducer {
            producer,
            topic: config.topic().to_string(),
            partition: config.partition(),
            sent: 0,
        })
    }
}

impl RowSink for BareProducer {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let record = BaseRecord::to(&self.topic)
            .partition(self.partition)
            .key(key)
            .payload(value);
        send(&self.producer, record);
        self.sent += 1;
        Ok(())
    }
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (k, v) in rows {
            self.put(k, v)?;
        }
        Ok(())
    }
    /// Waits for the broker's acknowledgement of every row, as a logged store's close does.
    fn finish(&mut self) -> Result<()> {
        Ok(self
            .producer
            .context()
            .wait_for(self.sent, Duration::from_secs(120))?)
    }
}

/// What configurations share within one run.
struct RunContext {
    /// The cluster and its security, when there is one: every client of the run starts from
    /// these properties (`--client-property` included).
    cluster: Option<ClientProperties>,
    /// Makes this run's changelog topics unique.
    run_id: String,
    /// The changelog topic of `logged-group`, when the caller names it (so that another system
    /// can restore the very same records); used at the first thread count, whose changelog the
    /// restore measurement replays.
    restore_topic: Option<String>,
    /// The first thread count.
    restore_threads: usize,
    /// `ChangelogConfig::linger` for the logged configurations, when set.
    linger: Option<Duration>,
}

/// Which of a configuration's stores a sink is: thread `index` of `threads`.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: usize,
    threads: usize,
}

impl RunContext {
    /// The changelog topic of `config` when it runs on `threads` threads (one partition each).
    fn topic(&self, config: &str, threads: usize) -> String {
        match &self.restore_topic {
            Some(topic) if config == RESTORED_CONFIG && threads == self.restore_threads => {
                topic.clone()
            }
            _ => format!("kstate-rows-per-second-{}-{config}-t{threads}", self.run_id),
        }
    }

    /// The changelog of configuration `name`'s store in `slot`, in durability `mode`.
    fn changelog(&self, slot: Slot, name: &str, mode: Durability) -> Result<ChangelogConfig> {
        let cluster = self.cluster.clone().context("no broker")?;
        let mut config = ChangelogConfig::new(
            cluster,
            self.topic(name, slot.threads),
            i32::try_from(slot.index)?,
        )
        .partitions(i32::try_from(slot.threads)?)
        .durability(mode);
        if let Some(linger) = self.linger {
            config = config.linger(linger);
        }
        Ok(config)
    }

    fn logged(
        &self,
        dir: &Path,
        opts: &RocksDbOptions,
        slot: Slot,
        name: &str,
        mode: Durability,
    ) -> Result<Box<dyn RowSink>> {
        let config = self.changelog(slot, name, mode)?;
        Ok(Box::new(StoreSink(LoggedStore::open(dir, opts, config)?)))
    }
}

/// How a configuration opens one of its sinks in a fresh directory.
type OpenSink = fn(&Path, &RocksDbOptions, Slot, &RunContext) -> Result<Box<dyn RowSink>>;

/// One configuration: a name and how to open its sinks.
struct Config {
    name: &'static str,
    needs_broker: bool,
    open: OpenSink,
}

const CONFIGS: &[Config] = &[
    Config {
        name: "rocksdb-wal",
        needs_broker: false,
        open: |dir, opts, _, _| Ok(Box::new(BareRocks::open(dir, opts, true)?)),
    },
    Config {
        name: "rocksdb-bare-nowal",
        needs_broker: false,
        open: |dir, opts, _, _| Ok(Box::new(BareRocks::open(dir, opts, false)?)),
    },
    Config {
        name: "rocksdb-nowal",
        needs_broker: false,
        open: |dir, opts, _, _| Ok(Box::new(StoreSink(RocksDbStore::open(dir, opts)?))),
    },
    Config {
        name: "logged-async",
        needs_broker: true,
        open: |dir, opts, slot, cx| cx.logged(dir, opts, slot, "logged-async", Durability::Async),
    },
    Config {
        name: "logged-group",
        needs_broker: true,
        open: |dir, opts, slot, cx| {
            cx.logged(
                dir,
                opts,
                slot,
                "logged-group",
                Durability::Group(Duration::from_millis(10)),
            )
        },
    },
    Config {
        name: "logged-sync",
        needs_broker: true,
        open: |dir, opts, slot, cx| cx.logged(dir, opts, slot, "logged-sync", Durability::Sync),
    },
    Config {
        name: "kafka-bare-producer",
        needs_broker: true,
        // The linger of `logged-group` (its durability mode sets the default).
        open: |_, _, slot, cx| {
            let mode = Durability::Group(Duration::from_millis(10));
            let config = cx.changelog(slot, "kafka-bare-producer", mode)?;
            Ok(Box::new(BareProducer::open(
                &config,
                i32::try_from(slot.threads)?,
            )?))
        },
    },
];

/// The configuration whose changelog the restore measurement replays.
const RESTORED_CONFIG: &str = "logged-group";

fn config(name: &str) -> Option<&'static Config> {
    CONFIGS.iter().find(|c| c.name == name)
}

fn names() -> String {
    CONFIGS
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one configuration measured at one thread count.
struct Outcome {
    /// From the first write to the last thread's last write.
    elapsed: Duration,
    /// The slowest thread's flush after its writes.
    finish: Duration,
    /// Every write call of every thread.
    latency: Latency,
    /// (rows, elapsed ms) at every progress line.
    progress: Vec<(u64, f64)>,
}

/// One configuration's results, as `--json` writes them.
#[derive(serde::Serialize)]
struct ConfigResult {
    config: &'static str,
    threads: usize,
    rows: u64,
    ms: f64,
    rows_per_sec: f64,
    #[serde(flatten)]
    latency: LatencySummary,
    flush_ms: f64,
    progress: Vec<(u64, f64)>,
}

/// The restore measurement, as `--json` writes it.
#[derive(serde::Serialize)]
struct RestoreResult {
    records: u64,
    ms: f64,
    records_per_sec: f64,
    bare_consumer_records_per_sec: f64,
}

/// Everything one run measured, for `--json`.
#[derive(serde::Serialize)]
struct RunResult {
    rows: u64,
    value_size: usize,
    batch: usize,
    threads: Vec<usize>,
    configs: Vec<ConfigResult>,
    restore: Option<RestoreResult>,
}

/// What one writer thread measured.
struct ThreadOutcome {
    writes_done: Instant,
    finish: Duration,
    latency: Latency,
}

/// One thread's write loop: rows `slot.index`, `slot.index + slot.threads`, ... of `rows`.
fn write_rows(
    sink: &mut dyn RowSink,
    work: &Rows,
    slot: Slot,
    rows: usize,
    batch: usize,
    progress: &Progress,
    writes_finished: &Barrier,
) -> Result<ThreadOutcome> {
    let mut latency = Latency::new();
    let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(batch);
    let mine = rows.saturating_sub(slot.index).div_ceil(slot.threads);
    let mut unreported = 0;
    let mut write = || -> Result<()> {
        for (n, i) in (slot.index..rows).step_by(slot.threads).enumerate() {
            let (key, value) = work.row(i);
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
                progress.add(unreported);
                unreported = 0;
            }
        }
        progress.add(unreported);
        Ok(())
    };
    let written = write();
    let writes_done = Instant::now();
    // No thread flushes (for a logged store: commits and closes) while others still write; a
    // thread that failed waits too, so that the others are not left waiting for it.
    writes_finished.wait();
    written?;
    let flush_start = Instant::now();
    sink.finish().context("flush")?;
    Ok(ThreadOutcome {
        writes_done,
        finish: flush_start.elapsed(),
        latency,
    })
}

/// Runs `config` on `threads` stores, one thread each, in fresh directories under `base`.
fn run_config(
    config: &Config,
    threads: usize,
    rows: usize,
    base: &Path,
    args: &Args,
    context: &RunContext,
    work: &Rows,
) -> Result<Outcome> {
    let dir = base.join(format!("{}-t{threads}", config.name));
    // Each store gets the options (and memory budget) a one-thread run has, so the thread
    // count is the only thing that changes.
    let mut sinks = (0..threads)
        .map(|index| {
            let path = dir.join(index.to_string());
            (config.open)(
                &path,
                &store_options(args),
                Slot { index, threads },
                context,
            )
            .with_context(|| format!("{}: open {}", config.name, path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let progress = Progress::new("rows", PROGRESS_EVERY);
    let writes_finished = Barrier::new(threads);
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = sinks
            .iter_mut()
            .enumerate()
            .map(|(index, sink)| {
                let (progress, writes_finished) = (&progress, &writes_finished);
                let slot = Slot { index, threads };
                scope.spawn(move || {
                    write_rows(
                        sink.as_mut(),
                        work,
                        slot,
                        rows,
                        args.batch,
                        progress,
                        writes_finished,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a writer thread panicked"))?)
            .collect::<Result<Vec<_>>>()
    })
    .with_context(|| config.name)?;
    drop(sinks);
    // A configuration without a store (the bare producer) made no directory.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    let mut latency = Latency::new();
    for outcome in &outcomes {
        latency.merge(&outcome.latency)?;
    }
    let last_write = outcomes
        .iter()
        .map(|o| o.writes_done)
        .max()
        .context("no threads")?;
    Ok(Outcome {
        elapsed: last_write - progress.start(),
        finish: outcomes.iter().map(|o| o.finish).max().unwrap_or_default(),
        latency,
        progress: progress.into_points(),
    })
}

fn main() -> Result<()> {
    let args = Args::from_command_line()?;
    let work = Rows::new(args.rows, args.value_size, args.seed);
    let base = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    println!(
        "rows_per_second: rows={} value_size={} batch={} threads={} configs={}",
        args.rows,
        args.value_size,
        args.batch,
        args.threads
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        args.configs.join(",")
    );
    let context = RunContext {
        cluster: cluster(&args)?,
        run_id: format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
        ),
        restore_topic: args.restore_topic.clone(),
        restore_threads: args.threads[0],
        linger: args.linger_ms.map(Duration::from_millis),
    };
    let mut results: Vec<ConfigResult> = Vec::new();
    let mut skipped = Vec::new();
    for &threads in &args.threads {
        for name in &args.configs {
            let config = config(name).context("configuration vanished")?;
            if config.needs_broker && context.cluster.is_none() {
                if !skipped.contains(&config.name) {
                    skipped.push(config.name);
                }
                continue;
            }
            let rows = if config.name == "logged-sync" {
                args.rows.min(args.sync_rows)
            } else {
                args.rows
            };
            println!("config {} threads={threads}", config.name);
            let outcome = run_config(
                config,
                threads,
                rows as usize,
                base.path(),
                &args,
                &context,
                &work,
            )?;
            let ms = outcome.elapsed.as_secs_f64() * 1e3;
            let rows_per_sec = rows as f64 / outcome.elapsed.as_secs_f64();
            let latency = outcome.latency.summary();
            println!(
                "summary config={} threads={threads} rows={rows} ms={ms:.0} rows_per_sec={rows_per_sec:.0}",
                config.name
            );
            println!(
                "latency config={} threads={threads} {latency} flush_ms={:.0}",
                config.name,
                outcome.finish.as_secs_f64() * 1e3
            );
            results.push(ConfigResult {
                config: config.name,
                threads,
                rows,
                ms,
                rows_per_sec,
                latency,
                flush_ms: outcome.finish.as_secs_f64() * 1e3,
                progress: outcome.progress,
            });
        }
    }
    print_ratios(&results);
    let first_threads = args.threads[0];
    let restore = if args.configs.iter().any(|c| c == RESTORED_CONFIG) && context.cluster.is_some()
    {
        Some(measure_restore(
            &context,
            first_threads,
            base.path(),
            &args,
        )?)
    } else {
        None
    };
    if let Some(path) = &args.json {
        let run = RunResult {
            rows: args.rows,
            value_size: args.value_size,
            batch: args.batch,
            threads: args.threads.clone(),
            configs: results,
            restore,
        };
        write_json(path, &run)?;
        println!("wrote {}", path.display());
    }
    if !skipped.is_empty() {
        println!(
            "skipped {} (they need a Kafka broker): set KAFKA_BOOTSTRAP_SERVERS, give \
             --bootstrap-servers or --client-properties FILE, or run scripts/rows-per-second, \
             which starts one",
            skipped.join(",")
        );
    }
    Ok(())
}

/// Each configuration against `rocksdb-wal` at the same thread count, and against itself at the
/// first thread count (the scaling with partitions).
fn print_ratios(results: &[ConfigResult]) {
    let rate = |config: &str, threads: usize| {
        results
            .iter()
            .find(|r| r.config == config && r.threads == threads)
            .map(|r| r.rows_per_sec)
    };
    for r in results {
        if let Some(baseline) = rate("rocksdb-wal", r.threads) {
            println!(
                "ratio config={} threads={} vs=rocksdb-wal x={:.2}",
                r.config,
                r.threads,
                r.rows_per_sec / baseline
            );
        }
    }
    // A logged store against each of its parts alone: the physical limits of its rate.
    for r in results.iter().filter(|r| r.config.starts_with("logged-")) {
        for part in ["rocksdb-bare-nowal", "kafka-bare-producer"] {
            if let Some(limit) = rate(part, r.threads) {
                println!(
                    "limit config={} threads={} vs={part} x={:.2}",
                    r.config,
                    r.threads,
                    r.rows_per_sec / limit
                );
            }
        }
    }
    let Some(first) = results.first().map(|r| r.threads) else {
        return;
    };
    for r in results.iter().filter(|r| r.threads != first) {
        if let Some(one) = rate(r.config, first) {
            println!(
                "scaling config={} threads={} vs_threads={first} x={:.2}",
                r.config,
                r.threads,
                r.rows_per_sec / one
            );
        }
    }
}

/// The cluster the flags and the environment name (see the module docs), with
/// `--client-property` on top; `None` when nothing names one.
fn cluster(args: &Args) -> Result<Option<ClientProperties>> {
    let Some(mut cluster) = args.cluster.named()? else {
        return Ok(None);
    };
    for (key, value) in &args.client_properties {
        cluster.insert(key, value);
    }
    Ok(Some(cluster))
}

/// Restores the `logged-group` changelog into an empty directory, then reads the same partition
/// with a bare consumer, so the two rates compare within one run.
fn measure_restore(
    context: &RunContext,
    threads: usize,
    base: &Path,
    args: &Args,
) -> Result<RestoreResult> {
    let cluster = context.cluster.as_ref().context("no broker")?;
    let topic = context.topic(RESTORED_CONFIG, threads);
    let dir = base.join("restore");
    let options = store_options(args);
    let config =
        ChangelogConfig::new(cluster.clone(), &topic, 0).partitions(i32::try_from(threads)?);
    let store = LoggedStore::open(&dir, &options, config)?;
    let report = store.restore_report().clone();
    store.close()?;
    drop(store);
    std::fs::remove_dir_all(&dir)?;
    println!(
        "restored {} records in {} ms ({:.0} records/s)",
        report.records,
        report.elapsed.as_millis(),
        report.records_per_sec()
    );

    let (count, elapsed) = kstate_bench::kafka::bare_read(cluster, &topic, 0)?;
    let rate = count as f64 / elapsed.as_secs_f64();
    println!(
        "bare consumer read {count} records in {} ms ({rate:.0} records/s); restore/consumer x={:.2}",
        elapsed.as_millis(),
        report.records_per_sec() / rate
    );
    Ok(RestoreResult {
        records: report.records,
        ms: report.elapsed.as_secs_f64() * 1e3,
        records_per_sec: report.records_per_sec(),
        bare_consumer_records_per_sec: rate,
    })
}
