//! 100,000 keys with overwrites and deletes through the typed layer; the local directory is
//! deleted; reopening restores contents equal to a BTreeMap model, from the changelog alone.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use kstate::kstate_core::{Bincode, Store, entry_check};
use kstate::kstate_kafka::{Durability, LoggedStore, OpenHooks};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::unique_topic;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Account {
    owner: String,
    balance: i64,
}

#[test]
fn a_deleted_directory_is_rebuilt_from_the_changelog_alone() -> Result<()> {
    let topic = unique_topic("round-trip");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    let config = common::changelog(&topic)?.durability(Durability::Async);

    let mut model: BTreeMap<u64, Account> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(7);
    {
        let store: Store<u64, Account, _> = Store::new(LoggedStore::open(
            &path,
            &RocksDbOptions::default(),
            config.clone(),
        )?);
        for i in 0..100_000u64 {
            let account = Account {
                owner: format!("owner-{i}"),
                balance: i as i64,
            };
            store.put(&i, &account)?;
            model.insert(i, account);
        }
        // Overwrites and deletes of random keys, some in batches.
        for round in 0..20_000u64 {
            let key = rng.random_range(0..100_000u64);
            match round % 4 {
                0 => {
                    store.delete(&key)?;
                    model.remove(&key);
                }
                1 => {
                    let batch: Vec<(u64, Account)> = (key..key + 3)
                        .map(|k| {
                            (
                                k,
                                Account {
                                    owner: format!("batch-{round}"),
                                    balance: -(k as i64),
                                },
                            )
                        })
                        .collect();
                    store.put_all(batch.iter().map(|(k, v)| (k, v)))?;
                    model.extend(batch);
                }
                _ => {
                    let account = Account {
                        owner: format!("overwrite-{round}"),
                        balance: round as i64,
                    };
                    store.put(&key, &account)?;
                    model.insert(key, account);
                }
            }
            if round % 5_000 == 0 {
                store.inner().commit()?;
            }
        }
        store.close()?;
    }

    std::fs::remove_dir_all(&path)?;
    let hooks = OpenHooks {
        listener: None,
        record_check: Some(Arc::new(entry_check::<u64, Account, _>(Bincode))),
        cancel: None,
    };
    // Small bulk chunks, so overwrites and deletes fall in other chunks than the records they
    // replace: the newest must win across SST files.
    let config = config.bulk_chunk_records(7_000);
    let logged = LoggedStore::open_with(&path, &RocksDbOptions::default(), config, hooks)?;
    let report = logged.restore_report().clone();
    assert_eq!(
        report.start.start_offset, 0,
        "an empty directory restores from the beginning"
    );
    assert!(
        report.records >= model.len() as u64,
        "restored {} records",
        report.records
    );
    let store: Store<u64, Account, _> = Store::new(logged);
    let restored: BTreeMap<u64, Account> = store.all()?.collect::<Result<_, _>>()?;
    assert_eq!(restored.len(), model.len());
    assert!(restored == model, "restored contents differ from the model");
    store.close()?;
    Ok(())
}
