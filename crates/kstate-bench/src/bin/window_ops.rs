//! window_ops: what a window store costs — a key's hour of windows read back, an expired segment
//! dropped, its changelog restored, and the files it keeps open.
//!
//! ```text
//! window_ops [fetch] [drop] [restore] \
//!     [--keys 1000] [--windows 1440] [--fetches 100000] [--drop-sizes 100000,1000000] \
//!     [--restore-keys 10000] [--restore-windows 60] [--restore-rounds 3] \
//!     [--client-properties FILE] [--bootstrap-servers HOST:PORT]
//! ```
//!
//! Built into `$CARGO_TARGET_DIR/release/window_ops` by the workspace's build (`cargo build
//! --release --workspace --all-targets`); `window_ops --help` lists the flags.
//!
//! With no part named, runs all three (`restore` needs a broker: `$KAFKA_BOOTSTRAP_SERVERS`,
//! `--bootstrap-servers` or a `--client-properties` file).
//!
//! - `fetch`: a RocksDB window store of `--keys` keys (`k0000`, ...) × `--windows` one-minute
//!   windows (starts 0, 60,000, ... ms; values 8-byte big-endian counts; retention one day),
//!   flushed; then `--fetches` `fetch(key, [t, t + 1 h))` at random keys and minutes, each read
//!   to its end (60 windows), after a tenth as many to warm up. Prints
//!   `window-fetch kstate p50=<us>us p99=<us>us entries=<per fetch> fetches=<n>` and
//!   `window-files kstate rocksdbs=1 segments=<n> files=<n>` (the store directory's files; Kafka
//!   Streams' `WindowBench window-fetch` prints the same two lines for its segmented store on
//!   the same data).
//! - `drop`: for each of `--drop-sizes`, a store whose oldest segment holds that many windows
//!   (flushed to SST files), then the stream time that expires the segment: prints
//!   `segment-drop entries=<n> ms=<time to drop it> sst_before=<bytes> sst_after=<bytes>`, and
//!   checks that no entry of the segment is left in the store underneath. The drop is a range
//!   tombstone plus the removal of the SST files wholly inside the range, so its time does not
//!   grow with the segment; a file that also holds live keys (here the one flushed file, which
//!   holds the stream time too) keeps its bytes until a compaction drops the covered keys.
//! - `restore`: a logged window store puts `--restore-keys` × `--restore-windows` windows
//!   (Kafka Streams' window changelog format); then, `--restore-rounds` times in turn, an empty
//!   directory restores that changelog, a plain key-value store restores the same records (what
//!   the mapping to window keys costs) and a bare consumer reads the same partition. Prints a
//!   `window-restore-round` line per round and then, from each one's best round,
//!   `window-restore records=<n> kstate=<r>/s consumer=<r>/s ratio=<kstate/consumer>
//!   key-value=<r>/s` (the machine is shared: one round of each is noise).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use kstate_bench::cli::{ClusterArgs, number};
use kstate_bench::latency::Latency;
use kstate_core::{KeyRange, KeyValueStore, Order, WindowChangelog, WindowOptions, WindowStore};
use kstate_kafka::{ChangelogConfig, ClientProperties, Durability, LoggedStore};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
const DAY: Duration = Duration::from_secs(86_400);

/// A small, fast, seeded generator: the fetches' keys and times, the same in every run.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn key(k: u64) -> Vec<u8> {
    format!("k{k:04}").into_bytes()
}

/// What a window store costs: a key's hour of windows read back, an expired segment dropped,
/// its changelog restored, and the files it keeps open.
#[derive(Debug, Parser)]
#[command(name = "window_ops")]
struct Cli {
    /// The parts to run, in this order (default: all three; restore needs a broker).
    #[arg(value_enum)]
    parts: Vec<Part>,
    /// fetch: keys in the store.
    #[arg(long, value_parser = number::<u64>, default_value_t = 1000)]
    keys: u64,
    /// fetch: one-minute windows per key (more than 60).
    #[arg(long, value_parser = number::<i64>, default_value_t = 1440)]
    windows: i64,
    /// fetch: timed fetches of an hour of windows (after a tenth as many to warm up).
    #[arg(long, value_parser = number::<u64>, default_value_t = 100_000)]
    fetches: u64,
    /// drop: the oldest segment's windows, one store per size, comma-separated.
    #[arg(
        long,
        value_name = "N,N,...",
        value_delimiter = ',',
        value_parser = number::<u64>,
        default_values_t = [100_000, 1_000_000]
    )]
    drop_sizes: Vec<u64>,
    /// restore: keys in the changelog.
    #[arg(long, value_parser = number::<u64>, default_value_t = 10_000)]
    restore_keys: u64,
    /// restore: one-minute windows per key.
    #[arg(long, value_parser = number::<i64>, default_value_t = 60)]
    restore_windows: i64,
    /// restore: rounds of (window store, key-value store, bare consumer); the best of each counts.
    #[arg(long, value_parser = number::<u32>, default_value_t = 3)]
    restore_rounds: u32,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// A part of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    /// An hour of a key's windows read back.
    Fetch,
    /// An expired segment dropped.
    Drop,
    /// A window changelog restored.
    Restore,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut parts = cli.parts.clone();
    if parts.is_empty() {
        parts = vec![Part::Fetch, Part::Drop, Part::Restore];
    }
    let dir = tempfile::tempdir()?;
    for part in parts {
        match part {
            Part::Fetch => fetch(&cli, &dir.path().join("fetch"))?,
            Part::Drop => drop_segments(&cli, &dir.path().join("drop"))?,
            Part::Restore => restore(&cli, &dir.path().join("restore"))?,
        }
    }
    Ok(())
}

fn fetch(cli: &Cli, dir: &Path) -> Result<()> {
    let (keys, windows, fetches) = (cli.keys, cli.windows, cli.fetches);
    if windows <= 60 {
        bail!("--windows must be more than 60 (an hour of one-minute windows)");
    }
    let options = WindowOptions::tumbling(Duration::from_secs(60)).retention(DAY);
    let store = WindowStore::open(
        RocksDbStore::open(dir.join("window"), &RocksDbOptions::default())?,
        options,
    )?;
    let started = Instant::now();
    for w in 0..windows {
        for k in 0..keys {
            store.put(&key(k), w * MINUTE, Some(&(w + 1).to_be_bytes()))?;
        }
    }
    store.inner().flush()?;
    let puts = keys * windows as u64;
    println!(
        "window-fill kstate puts={puts} ms={} ({:.0} puts/s)",
        started.elapsed().as_millis(),
        puts as f64 / started.elapsed().as_secs_f64()
    );

    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let starts = (windows - 60) as u64 + 1;
    let mut latency = Latency::new();
    let mut entries = 0u64;
    for i in 0..fetches + fetches / 10 {
        let k = key(rng.below(keys));
        let t = rng.below(starts) as i64 * MINUTE;
        let began = Instant::now();
        let mut n = 0u64;
        for entry in store.fetch(&k, t..t + HOUR)? {
            entry?;
            n += 1;
        }
        if i >= fetches / 10 {
            latency.record(began.elapsed());
            entries += n;
        }
    }
    let summary = latency.summary();
    println!(
        "window-fetch kstate p50={:.1}us p99={:.1}us entries={} fetches={fetches}",
        summary.p50_us,
        summary.p99_us,
        entries / fetches.max(1)
    );
    let segments = (windows - 1) * MINUTE / options.segment_interval_ms() + 1;
    println!(
        "window-files kstate rocksdbs=1 segments={segments} files={}",
        count_files(&dir.join("window"))?
    );
    store.into_inner().close()?;
    Ok(())
}

/// The files under `dir`, recursively.
fn count_files(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        n += if entry.file_type()?.is_dir() {
            count_files(&entry.path())?
        } else {
            1
        };
    }
    Ok(n)
}

fn drop_segments(cli: &Cli, dir: &Path) -> Result<()> {
    for &size in &cli.drop_sizes {
        drop_one(size, &dir.join(size.to_string()))?;
    }
    Ok(())
}

/// Fills the first segment (ten minutes) with `entries` windows, expires it, and times the drop.
fn drop_one(entries: u64, dir: &Path) -> Result<()> {
    let options = WindowOptions::tumbling(Duration::from_secs(60))
        .retention(Duration::from_secs(600))
        .segment_interval(Duration::from_secs(600));
    let store = WindowStore::open(
        RocksDbStore::open(dir, &RocksDbOptions::default())?,
        options,
    )?;
    let keys = entries.div_ceil(10);
    let mut written = 0;
    'fill: for w in 0..10 {
        for k in 0..keys {
            if written == entries {
                break 'fill;
            }
            store.put(
                format!("key-{k:08}").as_bytes(),
                w * MINUTE,
                Some(&[7u8; 8]),
            )?;
            written += 1;
        }
    }
    store.inner().flush()?;
    let before = store.inner().sst_bytes()?;
    // Stream time twenty minutes on: the first segment (0..10 min) is past retention.
    let began = Instant::now();
    store.observe(20 * MINUTE)?;
    let took = began.elapsed();
    let after = store.inner().sst_bytes()?;
    // Gone from the store underneath, not only hidden by the retention.
    let left = store
        .inner()
        .scan(&KeyRange::prefix(&[0x01]), Order::Forward)?
        .count();
    if left != 0 {
        bail!("{left} entries left after their segment was dropped");
    }
    println!(
        "segment-drop entries={entries} ms={:.3} sst_before={before} sst_after={after}",
        took.as_secs_f64() * 1e3
    );
    store.into_inner().close()?;
    Ok(())
}

fn restore(cli: &Cli, dir: &Path) -> Result<()> {
    let (keys, windows, rounds) = (cli.restore_keys, cli.restore_windows, cli.restore_rounds);
    let cluster = cli.cluster.required()?;
    let topic = format!(
        "window-ops-{}-{}",
        std::process::id(),
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis()
    );
    let options = WindowOptions::tumbling(Duration::from_secs(60))
        .retention(Duration::from_secs(2 * 3600 + 60 * windows.unsigned_abs()));
    let config = |cluster: &ClientProperties| {
        ChangelogConfig::new(cluster.clone(), &topic, 0)
            .partitions(1)
            .durability(Durability::Async)
            .keys(Arc::new(WindowChangelog::new(&options)))
            .retention(options.changelog_retention())
    };
    // Windows of the last `windows` minutes, so the changelog's retention keeps them all.
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let first = (now / MINUTE - windows) * MINUTE;
    let result = (|| -> Result<()> {
        let writer = WindowStore::open(
            LoggedStore::open(
                dir.join("writer"),
                &RocksDbOptions::default(),
                config(&cluster),
            )?,
            options,
        )?;
        for w in 0..windows {
            for k in 0..keys {
                writer.put(&key(k), first + w * MINUTE, Some(&(w + 1).to_be_bytes()))?;
            }
        }
        writer.inner().commit()?;
        writer.into_inner().close()?;

        let (mut best_kstate, mut best_consumer, mut best_plain) = (0f64, 0f64, 0f64);
        let mut records = 0;
        for round in 1..=rounds {
            let restored = LoggedStore::open(
                dir.join(format!("restored-{round}")),
                &RocksDbOptions::default(),
                config(&cluster),
            )?;
            let report = restored.restore_report().clone();
            let windows_back = WindowStore::open(restored, options)?;
            let back = windows_back.fetch_all(..)?.count() as u64;
            if back != keys * windows as u64 {
                bail!(
                    "restored {back} windows of {} written",
                    keys * windows as u64
                );
            }
            windows_back.into_inner().close()?;
            // The same records into a plain key-value store: what the mapping to window keys
            // costs.
            let plain = LoggedStore::open(
                dir.join(format!("plain-{round}")),
                &RocksDbOptions::default(),
                ChangelogConfig::new(cluster.clone(), &topic, 0).partitions(1),
            )?;
            let plain_rate = plain.restore_report().records_per_sec();
            plain.close()?;
            let (read, elapsed) = kstate_bench::kafka::bare_read(&cluster, &topic, 0)?;
            let consumer = read as f64 / elapsed.as_secs_f64();
            let kstate = report.records_per_sec();
            println!(
                "window-restore-round round={round} kstate={kstate:.0}/s consumer={consumer:.0}/s \
                 ratio={:.2} key-value={plain_rate:.0}/s",
                kstate / consumer
            );
            records = report.records;
            best_kstate = best_kstate.max(kstate);
            best_consumer = best_consumer.max(consumer);
            best_plain = best_plain.max(plain_rate);
        }
        println!(
            "window-restore records={records} kstate={best_kstate:.0}/s \
             consumer={best_consumer:.0}/s ratio={:.2} key-value={best_plain:.0}/s",
            best_kstate / best_consumer
        );
        Ok(())
    })();
    let deleted = tokio::runtime::Runtime::new()?
        .block_on(kstate_bench::kafka::delete_topics(cluster, &[&topic]));
    result?;
    deleted?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["window_ops", "drop", "--drop-sizes", "1_000,2000"]);
        let cli = cli.ok();
        assert_eq!(
            cli.as_ref().map(|c| c.parts.clone()),
            Some(vec![Part::Drop])
        );
        assert_eq!(cli.map(|c| c.drop_sizes), Some(vec![1000, 2000]));
        let defaults = Cli::try_parse_from(["window_ops"]).ok();
        assert_eq!(
            defaults.map(|c| c.drop_sizes),
            Some(vec![100_000, 1_000_000])
        );
    }
}
