//! Several threads write one store at once, each its own keys, with puts, deletes and batches;
//! afterwards (and after a reopen that replays the uncommitted tail) the store equals the union
//! of the threads' models and the fold of its changelog.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, ensure};
use kstate::kstate_core::{Batch, KeyValueStore};
use kstate::kstate_kafka::{Durability, LoggedStore};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::unique_topic;
use rand::{Rng, SeedableRng};

const THREADS: u8 = 4;
const OPS: usize = 5_000;

/// One thread's writes: keys `[thread, n]`, a model of what it wrote.
fn write_some(store: &LoggedStore, thread: u8) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(thread));
    let mut model = BTreeMap::new();
    for op in 0..OPS {
        let key = vec![thread, rng.random_range(0..200u8)];
        match rng.random_range(0..10) {
            0..=5 => {
                let value = format!("{thread}-{op}").into_bytes();
                store.put(&key, &value)?;
                model.insert(key, value);
            }
            6..=7 => {
                store.delete(&key)?;
                model.remove(&key);
            }
            8 => {
                let mut batch = Batch::new();
                let other = vec![thread, rng.random_range(0..200u8)];
                batch
                    .put(key.clone(), b"batched".to_vec())
                    .delete(other.clone());
                store.write(batch)?;
                model.insert(key, b"batched".to_vec());
                model.remove(&other);
            }
            _ => store.commit()?,
        }
    }
    Ok(model)
}

#[test]
fn concurrent_writers_match_their_models_and_the_changelog() -> Result<()> {
    for mode in [Durability::Async, Durability::Sync] {
        let topic = unique_topic("concurrent");
        let dir = tempfile::tempdir()?;
        let config = common::changelog(&topic)?
            .durability(mode)
            .overlay_bounds(64 << 10, 500); // early commits interleave with the writers
        let store = Arc::new(LoggedStore::open(
            dir.path(),
            &RocksDbOptions::default(),
            config,
        )?);
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || write_some(&store, t))
            })
            .collect();
        let mut model = BTreeMap::new();
        for writer in writers {
            model.extend(writer.join().unwrap()?);
        }
        ensure!(
            common::contents(store.as_ref())? == model,
            "{mode}: live store != model"
        );
        store.commit()?;
        drop(store); // no close: the reopen replays whatever RocksDB's memtable lost

        let store = LoggedStore::open(
            dir.path(),
            &RocksDbOptions::default(),
            common::changelog(&topic)?,
        )?;
        let held = common::contents(&store)?;
        ensure!(held == model, "{mode}: reopened store != model");
        let end = store.restore_report().start.end_offset;
        ensure!(
            held == common::fold_changelog(&topic, 0, end)?,
            "{mode}: store != changelog"
        );
        store.close()?;
    }
    Ok(())
}
