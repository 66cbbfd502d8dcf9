//! restore: replays a changelog topic into an empty directory and reports how fast, the way a
//! task that lost its disk comes back.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=host:port cargo run --release --example restore -- --topic NAME \
//!     [--partition N] [--batch N] [--chunk N] [--client-properties FILE] \
//!     [--bootstrap-servers HOST:PORT]
//! ```
//!
//! `--client-properties FILE` reads librdkafka client properties (`key=value` lines) for a TLS
//! and SASL cluster; `--bootstrap-servers` replaces the file's brokers, and
//! `$KAFKA_BOOTSTRAP_SERVERS` is used when neither names them
//! (`ClientProperties::from_sources`: a shell's local broker never receives a file's
//! credentials).
//!
//! The directory starts empty, so the restore takes the bulk path: `--chunk` sets its records per
//! SST file (`ChangelogConfig::bulk_chunk_records`); `--batch` sets the records per write batch of
//! the catch-up path (`restore_batch_records`), which a stale store takes.
//!
//! Prints each batch's last offset every 100,000 records (the restore listener) and the totals.
//! `rows_per_second --restore-topic NAME` makes such a topic. `--help` lists the flags.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, ensure};
use clap::Parser;
use kstate::ClientProperties;
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{
    BatchRestored, ChangelogConfig, LoggedStore, OpenHooks, RestoreListener, RestoreStart,
};
use kstate::kstate_rocksdb::RocksDbOptions;

/// restore: replays a changelog topic into an empty directory and reports how fast.
#[derive(Debug, Parser)]
#[command(name = "restore")]
struct Args {
    /// The changelog topic.
    #[arg(long, value_name = "NAME")]
    topic: String,
    /// Its partition to restore.
    #[arg(long, value_name = "N", default_value_t = 0)]
    partition: i32,
    /// Records per write batch of the catch-up path (default: the library's).
    #[arg(long, value_name = "N")]
    batch: Option<usize>,
    /// Records per SST file of the bulk path, which an empty directory takes (default: the
    /// library's).
    #[arg(long, value_name = "N")]
    chunk: Option<usize>,
    /// librdkafka client properties, one `key=value` a line (`bootstrap.servers`,
    /// `security.protocol`, `sasl.*`, `ssl.*`): a TLS and SASL cluster.
    #[arg(long, value_name = "FILE")]
    client_properties: Option<PathBuf>,
    /// The brokers; replaces the properties file's `bootstrap.servers`. When neither names any,
    /// $KAFKA_BOOTSTRAP_SERVERS does.
    #[arg(long, value_name = "HOST:PORT")]
    bootstrap_servers: Option<String>,
}

/// Prints progress every 100,000 records.
#[derive(Default)]
struct Progress {
    next_report: AtomicU64,
}

impl RestoreListener for Progress {
    fn on_restore_start(&self, start: &RestoreStart) {
        println!(
            "restoring {}/{} offsets {}..{}{}",
            start.topic,
            start.partition,
            start.start_offset,
            start.end_offset,
            start
                .rebuild_reason
                .as_deref()
                .map(|r| format!(" (rebuild: {r})"))
                .unwrap_or_default()
        );
        self.next_report.store(100_000, Ordering::Relaxed);
    }

    fn on_batch_restored(&self, batch: &BatchRestored) {
        if batch.total_records >= self.next_report.load(Ordering::Relaxed) {
            println!(
                "{} records, last offset {}",
                batch.total_records, batch.last_offset
            );
            self.next_report.fetch_add(100_000, Ordering::Relaxed);
        }
    }
}

fn main() -> Result<()> {
    let Args {
        topic,
        partition,
        batch,
        chunk,
        client_properties,
        bootstrap_servers,
    } = Args::parse();
    let environment = std::env::var("KAFKA_BOOTSTRAP_SERVERS").ok();
    let cluster = ClientProperties::from_sources(
        client_properties.as_deref(),
        bootstrap_servers.as_deref(),
        environment.as_deref(),
    )?;
    ensure!(
        !cluster.bootstrap_servers().trim().is_empty(),
        "no brokers: give --bootstrap-servers, --client-properties or $KAFKA_BOOTSTRAP_SERVERS"
    );
    let mut config = ChangelogConfig::new(cluster, &topic, partition);
    if let Some(batch) = batch {
        config = config.restore_batch_records(batch);
    }
    if let Some(chunk) = chunk {
        config = config.bulk_chunk_records(chunk);
    }
    let dir = tempfile::tempdir()?;
    let hooks = OpenHooks {
        listener: Some(std::sync::Arc::new(Progress::default())),
        record_check: None,
        cancel: None,
    };
    let store = LoggedStore::open_with(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        config,
        hooks,
    )?;
    let report = store.restore_report().clone();
    println!(
        "restored {} records in {} ms ({:.0} records/s), {} batches",
        report.records,
        report.elapsed.as_millis(),
        report.records_per_sec(),
        report.batches
    );
    store.close()?;
    Ok(())
}
