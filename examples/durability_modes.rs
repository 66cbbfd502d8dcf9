//! durability_modes: one logged store, its durability mode switched while it runs.
//!
//! A `LoggedStore` writes RocksDB without its write-ahead log and mirrors every write to a
//! changelog partition; its `Durability` says when a write counts as safe, and
//! `set_durability` changes it at any time, between any two writes (Pika's runtime WAL
//! switch, here a choice of acknowledgement):
//!
//! - `sync`: a put returns once the broker acknowledged it (acks=all);
//! - `group:<dur>`: puts return at once, and the store commits itself at least every `<dur>`;
//! - `async`: puts return at once, and are safe once the caller's `commit()` returns.
//!
//! The example writes `--rows` rows in each mode, in turn, into one store, commits, and prints
//! each mode's rate; then it opens the changelog into an empty directory, as a task that lost
//! its disk would, and checks every row came back.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example durability_modes -- \
//!     [--rows 20000] [--modes sync,group:10ms,async] [--topic NAME]
//! ```

use std::time::Instant;

use anyhow::{Result, ensure};
use clap::Parser;
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate::kstate_rocksdb::RocksDbOptions;

/// Writes rows into one logged store under each durability mode in turn, then restores them.
#[derive(Parser)]
struct Args {
    /// The Kafka cluster.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS")]
    bootstrap_servers: String,
    /// Rows written in each mode.
    #[arg(long, default_value_t = 20_000)]
    rows: u64,
    /// The modes, in the order they are switched to.
    #[arg(long, value_delimiter = ',', default_value = "sync,group:10ms,async")]
    modes: Vec<Durability>,
    /// The changelog topic (one partition, created compacted); a new one per run by default.
    #[arg(long)]
    topic: Option<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let topic = args.topic.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        format!("durability-modes-{}", now.map_or(0, |d| d.as_millis()))
    });
    let changelog =
        ChangelogConfig::new(args.bootstrap_servers.as_str(), topic.as_str(), 0).partitions(1);
    let dir = tempfile::tempdir()?;
    let store = LoggedStore::open(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        changelog.clone(),
    )?;

    let value = [7u8; 100];
    let mut written = 0;
    for mode in &args.modes {
        store.set_durability(*mode);
        let started = Instant::now();
        for i in 0..args.rows {
            store.put(format!("{mode}-{i:08}").as_bytes(), &value)?;
        }
        // Every mode's writes are safe once a commit returns (sync's already were).
        store.commit()?;
        let seconds = started.elapsed().as_secs_f64();
        written += args.rows;
        println!(
            "mode={mode} rows={} seconds={seconds:.3} rows_per_s={:.0}",
            args.rows,
            args.rows as f64 / seconds
        );
    }
    store.close()?;

    // A task that lost its disk: an empty directory, restored from the changelog.
    let restored = LoggedStore::open(
        dir.path().join("restored"),
        &RocksDbOptions::default(),
        changelog,
    )?;
    let rows = restored.restore_report().records;
    println!("restored {rows} rows from {topic} into an empty directory");
    ensure!(rows == written, "wrote {written} rows, restored {rows}");
    restored.close()?;
    Ok(())
}
