//! Microbenchmarks of the store layers, one operation at a time: put, get and range scans on the
//! memory and RocksDB stores, and the cost of the codecs. The rows-per-second example measures
//! whole workloads; these isolate where a change moves the cost.
//!
//! `cargo bench --workspace --bench store_ops` (criterion; results in target/criterion).

#![allow(clippy::expect_used, missing_docs)] // benchmark code: a failure is a panic

use std::hint::black_box;
use std::ops::Bound;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kstate::kstate_core::{Bincode, Codec, KeyValueStore, MemoryStore, OrderedKey};
use kstate::kstate_rocksdb::{MemoryBudget, RocksDbOptions, RocksDbStore};
use serde::{Deserialize, Serialize};

const KEYS: u64 = 100_000;
const VALUE: [u8; 100] = [42; 100];

/// A key in a scattered order, so puts and gets do not walk the key space in sequence.
fn key(i: u64) -> [u8; 8] {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS).to_be_bytes()
}

fn fill(store: &dyn KeyValueStore) {
    for i in 0..KEYS {
        store.put(&key(i), &VALUE).expect("fill");
    }
}

fn store_ops(c: &mut Criterion, name: &str, store: &dyn KeyValueStore) {
    fill(store);
    let mut i = 0u64;
    c.bench_function(&format!("{name}/put"), |b| {
        b.iter(|| {
            i += 1;
            store.put(&key(i), &VALUE).expect("put");
        })
    });
    c.bench_function(&format!("{name}/get"), |b| {
        b.iter(|| {
            i += 1;
            black_box(store.get(&key(i)).expect("get"));
        })
    });
    c.bench_function(&format!("{name}/range-1000"), |b| {
        b.iter(|| {
            i += 1;
            let start = (i * 7_919 % (KEYS - 1_000)).to_be_bytes();
            let end = (i * 7_919 % (KEYS - 1_000) + 1_000).to_be_bytes();
            let n = store
                .range(Bound::Included(&start), Bound::Excluded(&end))
                .expect("range")
                .count();
            black_box(n);
        })
    });
}

fn memory(c: &mut Criterion) {
    store_ops(c, "memory", &MemoryStore::new("bench"));
}

fn rocksdb(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = RocksDbOptions::default().memory_budget(MemoryBudget::new(256 << 20, 128 << 20));
    let store = RocksDbStore::open(dir.path(), &options).expect("open");
    store_ops(c, "rocksdb", &store);
}

#[derive(Clone, Serialize, Deserialize)]
struct Click {
    user: String,
    page: u32,
    count: u64,
    tags: Vec<String>,
}

fn codecs(c: &mut Criterion) {
    let click = Click {
        user: "user-1234".into(),
        page: 17,
        count: 99,
        tags: vec!["mobile".into(), "eu".into()],
    };
    c.bench_function("codec/bincode-encode", |b| {
        b.iter_batched_ref(
            || Vec::with_capacity(64),
            |out| Bincode.encode(black_box(&click), out).expect("encode"),
            BatchSize::SmallInput,
        )
    });
    let mut bytes = Vec::new();
    Bincode.encode(&click, &mut bytes).expect("encode");
    c.bench_function("codec/bincode-decode", |b| {
        b.iter(|| {
            let decoded: Click = Bincode.decode(black_box(&bytes)).expect("decode");
            black_box(decoded);
        })
    });
    c.bench_function("codec/ordered-key-pair", |b| {
        let k = (42u64, "session-7".to_string());
        b.iter_batched_ref(
            || Vec::with_capacity(32),
            |out| black_box(&k).encode_key(out),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, memory, rocksdb, codecs);
criterion_main!(benches);
