//! Benchmarks of the two changelog costs that grow with a parameter: a commit against the number
//! of entries in the overlay it writes to RocksDB, and a restore against its batch size (records
//! per RocksDB write batch when a stale store catches up; records per SST file when an empty store
//! is rebuilt through the bulk path).
//!
//! Needs a Kafka broker: `KAFKA_BOOTSTRAP_SERVERS`, else the one `kstate-test-broker` finds or
//! starts (`scripts/kafka`), else it fails saying what to install.
//!
//! `cargo bench --workspace --bench changelog` (criterion; results in target/criterion).

#![allow(clippy::expect_used, missing_docs)] // benchmark code: a failure is a panic

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate::kstate_rocksdb::{MemoryBudget, RocksDbOptions};

const VALUE: [u8; 100] = [42; 100];
/// Records in the changelog the restore benchmarks replay.
const RESTORE_RECORDS: u64 = 200_000;

fn servers() -> String {
    kstate_test_broker::bootstrap_servers().expect("the changelog benchmarks need a Kafka broker")
}

fn options() -> RocksDbOptions {
    RocksDbOptions::default().memory_budget(MemoryBudget::new(256 << 20, 128 << 20))
}

/// A key in a scattered order, so the overlay and RocksDB see random inserts.
fn key(i: u64) -> [u8; 8] {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes()
}

/// Waits until the broker acknowledged every write, so a commit measures only its own work.
fn wait_for_acks(store: &LoggedStore) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.unacknowledged() > 0 {
        assert!(Instant::now() < deadline, "writes not acknowledged in 60 s");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A commit writing an overlay of `n` acknowledged entries (data and changelog offset in one
/// RocksDB write batch), against `n`.
fn commit_cost(c: &mut Criterion) {
    let servers = servers();
    let dir = tempfile::tempdir().expect("tempdir");
    let topic = kstate_test_broker::unique_topic("bench-commit");
    // `async` with unreachable overlay bounds: only the benchmark commits.
    let config = ChangelogConfig::new(&servers, topic, 0)
        .partitions(1)
        .durability(Durability::Async)
        .overlay_bounds(usize::MAX, usize::MAX);
    let store = LoggedStore::open(dir.path(), &options(), config).expect("open");
    let mut next = 0u64;
    let mut group = c.benchmark_group("commit");
    group.sampling_mode(SamplingMode::Flat).sample_size(20);
    for n in [100u64, 1_000, 10_000, 100_000] {
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(BenchmarkId::new("overlay-entries", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    for _ in 0..n {
                        next += 1;
                        store.put(&key(next), &VALUE).expect("put");
                    }
                    wait_for_acks(&store);
                    let started = Instant::now();
                    store.commit().expect("commit");
                    total += started.elapsed();
                }
                total
            })
        });
    }
    group.finish();
    store.close().expect("close");
}

/// Writes `RESTORE_RECORDS` records to a new changelog topic and leaves a stale store (it holds
/// the topic's first record only) in `stale`. Returns the topic.
fn prepare_restore(servers: &str, stale: &Path) -> String {
    let topic = kstate_test_broker::unique_topic("bench-restore");
    let config = || {
        ChangelogConfig::new(servers, &topic, 0)
            .partitions(1)
            .durability(Durability::Async)
    };
    let first = LoggedStore::open(stale, &options(), config()).expect("open stale");
    first.put(&key(0), &VALUE).expect("put");
    first.close().expect("close stale");
    drop(first);
    let writer_dir = tempfile::tempdir().expect("tempdir");
    let writer = LoggedStore::open(writer_dir.path(), &options(), config()).expect("open writer");
    for i in 1..=RESTORE_RECORDS {
        // 1 in 4 keys is written twice: compaction and newest-wins have work to do.
        writer
            .put(&key(i % (RESTORE_RECORDS * 3 / 4)), &VALUE)
            .expect("put");
    }
    writer.close().expect("close writer");
    topic
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// Restore rate against batch size, on both paths. The time is the restore's own
/// (`RestoreReport::elapsed`: from the watermark query to the last write), not the topic check.
fn restore_rate(c: &mut Criterion) {
    let servers = servers();
    let stale = tempfile::tempdir().expect("tempdir");
    let topic = prepare_restore(&servers, stale.path());
    let mut group = c.benchmark_group("restore");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .throughput(Throughput::Elements(RESTORE_RECORDS));
    let restore = |config: ChangelogConfig, from: Option<&Path>| {
        let dir = tempfile::tempdir().expect("tempdir");
        if let Some(from) = from {
            copy_dir(from, dir.path());
        }
        let store = LoggedStore::open(dir.path(), &options(), config).expect("restore");
        let report = store.restore_report().clone();
        assert!(
            report.records >= RESTORE_RECORDS,
            "restored {}",
            report.records
        );
        store.close().expect("close");
        report.elapsed
    };
    // (name, size, the config for that size, the directory to start from: none for the bulk
    // path into an empty store, the stale store for the catch-up path)
    type Case<'a> = (&'a str, usize, ChangelogConfig, Option<&'a Path>);
    let base = || ChangelogConfig::new(&servers, &topic, 0).partitions(1);
    let cases: Vec<Case> = [10_000, 50_000, 250_000]
        .into_iter()
        .map(|n| ("bulk-chunk", n, base().bulk_chunk_records(n), None))
        .chain([1_000, 10_000, 100_000].into_iter().map(|n| {
            (
                "catch-up-batch",
                n,
                base().restore_batch_records(n),
                Some(stale.path()),
            )
        }))
        .collect();
    for (name, size, config, from) in cases {
        group.bench_function(BenchmarkId::new(name, size), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| restore(config.clone(), from)).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, commit_cost, restore_rate);
criterion_main!(benches);
