//! An idle producer whose id the broker has expired (`producer.id.expiration.ms`) sends a burst of
//! pipelined records: librdkafka may see `UNKNOWN_PRODUCER_ID`. The store must either keep every
//! write or fail clearly (poisoned, typed reason), never lose writes silently: after a reopen it
//! equals its changelog, and when the commit succeeded it holds all of the burst.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use kstate::kstate_core::{Error, KeyValueStore};
use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::{PrivateBroker, unique_topic};

const BURST: u32 = 10_000;

#[test]
fn a_burst_after_the_producer_id_expired_is_kept_or_refused_never_lost() -> Result<()> {
    let broker = PrivateBroker::start_with(&[
        ("producer.id.expiration.ms", "3000"),
        ("producer.id.expiration.check.interval.ms", "500"),
    ])?;
    let servers = broker.bootstrap_servers().to_string();
    let topic = unique_topic("idle-producer");
    let dir = tempfile::tempdir()?;
    let config = || {
        ChangelogConfig::new(&servers, &topic, 0)
            .partitions(1)
            .durability(Durability::Async)
            .delivery_timeout(Duration::from_secs(20))
    };
    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config())?;
    store.put(b"before-idle", b"1")?;
    store.commit()?;
    std::thread::sleep(Duration::from_secs(8)); // past the expiration and a check after it

    let mut refused = None;
    for i in 0..BURST {
        if let Err(e) = store.put(format!("burst-{i:05}").as_bytes(), b"v") {
            refused = Some(e);
            break;
        }
    }
    let committed = match refused {
        Some(e) => Err(e),
        None => store.commit(),
    };
    println!("burst after the producer id expired: {committed:?}");
    match &committed {
        Ok(()) => {}
        Err(Error::Poisoned { reason, .. }) => println!("refused clearly: {reason}"),
        Err(other) => anyhow::bail!("neither kept nor a clear refusal: {other:?}"),
    }
    let _ = store.close();
    drop(store);

    let store = LoggedStore::open(dir.path(), &RocksDbOptions::default(), config())?;
    let held: BTreeMap<Vec<u8>, Vec<u8>> = store.all()?.collect::<Result<_, _>>()?;
    let end = common::high_watermark_at(&servers, &topic, 0)?;
    ensure!(
        held == common::fold_changelog_at(&servers, &topic, 0, end)?,
        "the reopened store differs from its changelog"
    );
    if committed.is_ok() {
        ensure!(
            held.len() == BURST as usize + 1,
            "the commit succeeded but the store holds {} of {} keys",
            held.len(),
            BURST + 1
        );
    }
    store.close()?;
    Ok(())
}
