//! rows_per_second: what the WAL costs, and what a Kafka changelog costs instead. Writes the
//! same rows into each store configuration — a bare RocksDB with its WAL (the baseline
//! SAMZA-543 measured against), the store with the WAL off, the logged store in each durability
//! mode, and the changelog's producer alone — and prints, per configuration, the SAMZA-543
//! listing (`100000 rows in 649 ms`, cumulative), a summary and the call latencies, then the
//! ratios between them, and the restore of the `logged-group` changelog into an empty directory
//! against a bare consumer reading the same partition.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example rows_per_second -- \
//!     [--rows 1_000_000] [--configs rocksdb-wal,rocksdb-nowal,...] [--threads 1,2,4] [--json PATH]
//! ```
//!
//! `scripts/rows-per-second` starts a broker and runs it. Without a broker the store-only
//! configurations run and the output says how to get the rest. `--help` lists every flag (value
//! size, batches, compression, a TLS and SASL cluster, ...) and every configuration; the
//! harness behind it (`kstate_bench::rows_per_second`) says what each configuration is and
//! what its clock covers. `--json PATH` writes every result for `benches/chart.py`, which draws
//! the cumulative rows against time.

use anyhow::Result;
use kstate_bench::report::write_json;
use kstate_bench::rows_per_second::{Args, Harness, ratios};

fn main() -> Result<()> {
    let harness = Harness::new(Args::from_command_line()?)?;
    let args = harness.args();
    let threads: Vec<String> = args.threads.iter().map(ToString::to_string).collect();
    println!(
        "rows_per_second: rows={} value_size={} batch={} threads={} configs={}",
        args.rows,
        args.value_size,
        args.batch,
        threads.join(","),
        args.configs.join(",")
    );
    let mut results = Vec::new();
    for (threads, config) in harness.plan() {
        println!("config {} threads={threads}", config.name);
        let r = harness.run(config, threads)?;
        println!(
            "summary config={} threads={threads} rows={} ms={:.0} rows_per_sec={:.0}",
            r.config, r.rows, r.ms, r.rows_per_sec
        );
        println!(
            "latency config={} threads={threads} {} flush_ms={:.0}",
            r.config, r.latency, r.flush_ms
        );
        results.push(r);
    }
    for line in ratios(&results) {
        println!("{line}");
    }
    let restore = harness.restore()?;
    if let Some(r) = &restore {
        println!(
            "restored {} records in {:.0} ms ({:.0} records/s)",
            r.records, r.ms, r.records_per_sec
        );
        println!(
            "bare consumer read the same partition at {:.0} records/s; restore/consumer x={:.2}",
            r.bare_consumer_records_per_sec,
            r.records_per_sec / r.bare_consumer_records_per_sec
        );
    }
    if let Some(path) = &args.json {
        write_json(path, &harness.result(results, restore))?;
        println!("wrote {}", path.display());
    }
    let skipped = harness.skipped();
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
