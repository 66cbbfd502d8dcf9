//! window_compat: kstate's side of `benches/kafka-streams/window-compat.sh`, which checks that a
//! window changelog written by Kafka Streams (`windowedBy(...).count()` over a RocksDB window
//! store) restores into kstate window stores holding the same (key, window) → count as Kafka
//! Streams' own store.
//!
//! ```text
//! window_compat produce --input T --partitions P --records N [--keys 1000] [--minutes 30]
//!                       [--seed 7]
//! window_compat restore --changelog T --partitions P --out FILE [--size-ms 60000]
//!                       [--grace-ms 10000] [--retention-ms MS]
//! window_compat delete  --topics T1,T2,... [--groups G1,...]
//! ```
//!
//! Built into `$CARGO_TARGET_DIR/release/window_compat` by the workspace's build (`cargo build
//! --release --workspace --all-targets`, or `--bins --examples` as window-compat.sh does);
//! `window_compat <command> --help` lists the flags.
//! The broker: `--bootstrap-servers`, `--client-properties FILE` or `$KAFKA_BOOTSTRAP_SERVERS`
//! (`kstate_bench::cluster`).
//!
//! - `produce` creates the input topic and writes N records with event timestamps: keys
//!   `k0000..` drawn uniformly from K (murmur2-partitioned, as the Java producer does), times
//!   spread evenly over M minutes, 90% within ±3 s of their place (out of order inside a
//!   window), 5% up to 20 s behind (late, many within the 10 s grace, some past it) and 5% 20 s
//!   to 5 min behind (mostly too late: Kafka Streams drops them, and they never reach the
//!   changelog). The times are recent, so that the changelog's `retention.ms` (the store's
//!   retention plus a day) keeps every record, and end 30 s into the minute before the current
//!   one: stream time then sits half a window past the latest window's start, where the
//!   latest window start (Kafka Streams' stream time, and a restored kstate store's) and the
//!   latest record time would disagree about the oldest window a retention of size + grace
//!   keeps (benches/kafka-streams/README.md).
//! - `restore` restores every partition of the changelog into a fresh kstate window store,
//!   through kstate-kafka's restore with [`WindowChangelog`] keys (the path a task's store takes
//!   when it has lost its disk), and writes every visible (key, window start) and count as
//!   sorted lines `key<TAB>start<TAB>count`, the format `WindowBench window-count` dumps Kafka
//!   Streams' store in. The window options must be the Java store's: size and grace of
//!   `TimeWindows.ofSizeAndGrace`, and its retention (Kafka Streams' default for a windowed
//!   aggregation is size + grace, which is kstate's default too). Nothing is written to the
//!   changelog. Per partition it reports (stderr) the records restored, the restored stream
//!   time, and the entries stored and visible (stored but not visible: past retention by the
//!   restored stream time, in a segment not yet wholly expired).
//! - `delete` deletes topics, then consumer groups, waiting up to 2 minutes for a group to be
//!   empty (missing ones are fine).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, ensure};
use clap::{Parser, Subcommand};
use kstate_bench::cli::{ClusterArgs, number};
use kstate_bench::kafka::{create_topic, delete_groups, delete_topics, producer, send};
use kstate_core::{KeyRange, KeyValueStore, Order, WindowChangelog, WindowOptions, WindowStore};
use kstate_kafka::{ChangelogConfig, ClientProperties, LoggedStore};
use kstate_rocksdb::RocksDbOptions;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};

const MINUTE: i64 = 60_000;

/// kstate's side of benches/kafka-streams/window-compat.sh: a window changelog written by Kafka
/// Streams restores into kstate window stores with the same (key, window) -> count.
#[derive(Debug, Parser)]
#[command(name = "window_compat")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    cluster: ClusterArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Creates the input topic and writes records with event times, some late.
    Produce(ProduceArgs),
    /// Restores every partition of a window changelog and dumps the windows.
    Restore(RestoreArgs),
    /// Deletes topics, then consumer groups (missing ones are fine).
    Delete(DeleteArgs),
}

/// `window_compat produce`'s flags.
#[derive(Debug, clap::Args)]
struct ProduceArgs {
    /// The input topic to create.
    #[arg(long)]
    input: String,
    /// Its partitions (records go to them by murmur2, as the Java producer sends them).
    #[arg(long, value_parser = number::<i32>)]
    partitions: i32,
    /// The records to write.
    #[arg(long, value_parser = number::<u64>)]
    records: u64,
    /// Keys k0000.. drawn uniformly from this many (at most 10,000).
    #[arg(long, value_parser = number::<u64>, default_value_t = 1_000)]
    keys: u64,
    /// The event times span this many one-minute windows, ending before the current minute.
    #[arg(long, value_parser = number::<i64>, default_value_t = 30)]
    minutes: i64,
    /// The random generator's seed.
    #[arg(long, value_parser = number::<u64>, default_value_t = 7)]
    seed: u64,
}

/// `window_compat restore`'s flags: the window options must be the Java store's.
#[derive(Debug, clap::Args)]
struct RestoreArgs {
    /// The window changelog topic.
    #[arg(long)]
    changelog: String,
    /// Its partitions.
    #[arg(long, value_parser = number::<i32>)]
    partitions: i32,
    /// Where the sorted `key<TAB>start<TAB>count` lines go.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The windows' size.
    #[arg(long, value_parser = number::<u64>, default_value_t = 60_000)]
    size_ms: u64,
    /// Their grace.
    #[arg(long, value_parser = number::<u64>, default_value_t = 10_000)]
    grace_ms: u64,
    /// The store's retention (default: size + grace, Kafka Streams' default too).
    #[arg(long, value_name = "MS", value_parser = number::<u64>)]
    retention_ms: Option<u64>,
}

/// `window_compat delete`'s flags.
#[derive(Debug, clap::Args)]
struct DeleteArgs {
    /// Topics to delete, comma-separated.
    #[arg(long, value_name = "T1,T2,...", value_delimiter = ',')]
    topics: Vec<String>,
    /// Consumer groups to delete, comma-separated (waiting up to 2 minutes for each to empty).
    #[arg(long, value_name = "G1,...", value_delimiter = ',')]
    groups: Vec<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let client = cli.cluster.required()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Produce(args) => runtime.block_on(produce(&client, args)),
        Command::Restore(args) => restore(&client, args),
        Command::Delete(args) => runtime.block_on(delete(&client, args)),
    }
}

fn now_ms() -> Result<i64> {
    Ok(i64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis(),
    )?)
}

/// The input: see the module docs.
async fn produce(client: &ClientProperties, args: ProduceArgs) -> Result<()> {
    let ProduceArgs {
        input,
        partitions,
        records,
        keys,
        minutes,
        seed,
    } = args;
    ensure!(
        records > 0 && keys > 0 && minutes > 0,
        "records, keys and minutes must be positive"
    );
    ensure!(keys <= 10_000, "keys are k0000..k9999: at most 10,000");

    create_topic(client.clone(), &input, partitions, &[]).await?;
    let producer = producer(client.clone(), 5, DefaultProducerContext)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let now = now_ms()?;
    // Ends half a minute into a window (see the module docs), before the current minute.
    let span = minutes * MINUTE;
    let first = now - now.rem_euclid(MINUTE) - span - MINUTE / 2;
    let total = i64::try_from(records)?;
    let (mut jittered, mut late, mut very_late) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for i in 0..total {
        let key = format!("k{:04}", rng.random_range(0..keys));
        let place = first + i * span / total;
        let roll: f64 = rng.random();
        let time = if roll < 0.90 {
            jittered += 1;
            place + rng.random_range(-3_000..=3_000)
        } else if roll < 0.95 {
            late += 1;
            place - rng.random_range(0..=20_000)
        } else {
            very_late += 1;
            place - rng.random_range(20_000..=300_000)
        };
        let partition = kstate_task::partition_for(key.as_bytes(), partitions);
        send(
            &producer,
            BaseRecord::to(&input)
                .partition(partition)
                .key(key.as_bytes())
                .payload(&b"v"[..])
                .timestamp(time),
        );
    }
    producer.flush(Duration::from_secs(300))?;
    ensure!(producer.in_flight_count() == 0, "input not acknowledged");
    eprintln!(
        "window_compat produce: {records} records over {keys} keys into {input} ({partitions} \
         partitions), event times {first}..{} ({minutes} minutes): {jittered} within \
         ±3 s, {late} up to 20 s behind, {very_late} 20 s to 5 min behind; {} ms",
        first + span,
        started.elapsed().as_millis()
    );
    Ok(())
}

/// Restores every partition of the changelog and dumps the windows: see the module docs.
fn restore(client: &ClientProperties, args: RestoreArgs) -> Result<()> {
    let RestoreArgs {
        changelog: topic,
        partitions,
        out,
        size_ms: size,
        grace_ms: grace,
        retention_ms,
    } = args;
    let mut options =
        WindowOptions::tumbling(Duration::from_millis(size)).grace(Duration::from_millis(grace));
    if let Some(retention) = retention_ms {
        options = options.retention(Duration::from_millis(retention));
    }
    eprintln!(
        "window_compat restore: {topic} ({partitions} partitions), windows {} ms, grace {} ms, \
         retention {} ms",
        options.size_ms(),
        options.grace_ms(),
        options.retention_ms()
    );

    let dir = tempfile::tempdir()?;
    let mut windows: BTreeMap<(Vec<u8>, i64), i64> = BTreeMap::new();
    for partition in 0..partitions {
        let config = ChangelogConfig::new(client.clone(), &topic, partition)
            .partitions(partitions)
            .keys(Arc::new(WindowChangelog::new(&options)))
            .retention(options.changelog_retention());
        let store = LoggedStore::open(
            dir.path().join(format!("counts-{partition}")),
            &RocksDbOptions::default(),
            config,
        )
        .with_context(|| format!("restore {topic}/{partition}"))?;
        let report = store.restore_report().clone();
        let counts = WindowStore::open(store, options)?;
        let mut visible = 0u64;
        for entry in counts.fetch_all(..)? {
            let entry = entry?;
            let count: [u8; 8] = entry.value().try_into().with_context(|| {
                format!(
                    "{topic}/{partition}: the value of {:?} at {} is {} bytes, not a Long's 8",
                    String::from_utf8_lossy(entry.key()),
                    entry.start(),
                    entry.value().len()
                )
            })?;
            let previous = windows.insert(
                (entry.key().to_vec(), entry.start()),
                i64::from_be_bytes(count),
            );
            ensure!(
                previous.is_none(),
                "{:?} at {} is in two partitions",
                String::from_utf8_lossy(entry.key()),
                entry.start()
            );
            visible += 1;
        }
        // Every window entry, past retention or not (window data keys start with 0x01; the
        // stream time and sequence keys with 0x00).
        let stored = counts
            .inner()
            .scan(&KeyRange::prefix(&[0x01]), Order::Forward)?
            .count();
        eprintln!(
            "window_compat restore: {topic}/{partition}: {} records in {} ms, stream time {}, \
             {stored} windows stored, {visible} visible",
            report.records,
            report.elapsed.as_millis(),
            counts
                .stream_time()
                .map_or_else(|| "none".to_string(), |t| t.to_string()),
        );
        counts.into_inner().close()?;
    }

    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&out).with_context(|| format!("create {}", out.display()))?,
    );
    let mut sum = 0i64;
    for ((key, start), count) in &windows {
        writeln!(file, "{}\t{start}\t{count}", String::from_utf8_lossy(key))?;
        sum += count;
    }
    file.flush()?;
    eprintln!(
        "window_compat restore: {} windows, counts summing to {sum}, dumped to {}",
        windows.len(),
        out.display()
    );
    Ok(())
}

/// Deletes `--topics` and `--groups` (comma-separated).
async fn delete(client: &ClientProperties, args: DeleteArgs) -> Result<()> {
    let list = |names: Vec<String>| -> Vec<String> {
        names.into_iter().filter(|s| !s.is_empty()).collect()
    };
    let topics = list(args.topics);
    let groups = list(args.groups);
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let group_refs: Vec<&str> = groups.iter().map(String::as_str).collect();
    delete_topics(client.clone(), &topic_refs).await?;
    // A member that closed without leaving (Kafka Streams' consumers do not leave on close)
    // keeps its group non-empty until its session times out.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match delete_groups(client.clone(), &group_refs).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        let delete = Cli::try_parse_from([
            "window_compat",
            "delete",
            "--topics",
            "a,b",
            "--groups",
            "g",
        ]);
        assert!(matches!(
            delete.map(|c| c.command),
            Ok(Command::Delete(DeleteArgs { topics, groups })) if topics.len() == 2 && groups.len() == 1
        ));
    }
}
