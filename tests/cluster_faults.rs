//! A logged store on the three-node cluster (`kstate_test_broker::cluster`, replication 3,
//! `min.insync.replicas=2`): the changelog takes the cluster's replication unless told
//! otherwise, and a changelog that could lose acknowledged writes there is warned about; a
//! restore whose changelog's leader dies before it starts or while it reads finishes with every
//! record (it waits for the next leader within its open timeout), and never ends early or wipes.
//!
//! The store under leader kills at random moments, with its writer SIGKILLed too, is the
//! cluster part of tests/torture.rs; the task runtime under broker faults is in
//! tests/topologies.rs (`*_on_a_cluster_*`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{ChangelogConfig, ClientProperties, Durability, LoggedStore};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::{CLUSTER_NODES, Cluster, unique_topic};
use rdkafka::consumer::{BaseConsumer, Consumer};

fn changelog(cluster: &Cluster, topic: &str) -> ChangelogConfig {
    common::changelog_on(ClientProperties::new(cluster.bootstrap_servers()), topic)
        .open_timeout(Duration::from_secs(60))
}

/// The replica count of every partition of `topic`.
fn replicas(cluster: &Cluster, topic: &str) -> Result<Vec<usize>> {
    let consumer: BaseConsumer = ClientProperties::new(cluster.bootstrap_servers())
        .client_config()
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .map(|p| p.replicas().len())
        .collect())
}

fn logged_since(start: usize) -> String {
    let logs = common::captured_logs(tracing::Level::WARN).lock().unwrap();
    String::from_utf8_lossy(&logs[start.min(logs.len())..]).into_owned()
}

fn logs_len() -> usize {
    common::captured_logs(tracing::Level::WARN)
        .lock()
        .unwrap()
        .len()
}

#[test]
fn a_changelog_created_on_a_cluster_takes_its_three_replicas_and_is_not_warned_about() -> Result<()>
{
    // Exclusive: another test of this file kills nodes.
    let cluster = kstate_test_broker::cluster()?.exclusive()?;
    let start = logs_len();
    let topic = unique_topic("cluster-default-replication");
    let dir = tempfile::tempdir()?;
    let store = LoggedStore::open(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        changelog(&cluster, &topic),
    )?;
    store.put(b"k", b"v")?;
    store.commit()?;
    ensure!(
        replicas(&cluster, &topic)? == vec![CLUSTER_NODES as usize],
        "replicas of {topic}: {:?}, expected the cluster's default of {CLUSTER_NODES}",
        replicas(&cluster, &topic)?
    );
    let logs = logged_since(start);
    ensure!(
        !logs.contains(&topic),
        "a changelog of 3 replicas was warned about:\n{logs}"
    );
    Ok(())
}

#[test]
fn a_changelog_of_one_replica_on_a_cluster_is_warned_about() -> Result<()> {
    // Exclusive: another test of this file kills nodes.
    let cluster = kstate_test_broker::cluster()?.exclusive()?;
    let start = logs_len();
    let topic = unique_topic("cluster-one-replica");
    let dir = tempfile::tempdir()?;
    let store = LoggedStore::open(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        changelog(&cluster, &topic).replication_factor(1),
    )?;
    store.put(b"k", b"v")?;
    store.commit()?;
    ensure!(replicas(&cluster, &topic)? == vec![1]);
    let logs = logged_since(start);
    let warning = logs
        .lines()
        .find(|l| l.contains("changelog replication") && l.contains(&topic));
    ensure!(
        warning.is_some_and(|w| w.contains("1 replicas") && w.contains("3 brokers")),
        "no replication warning for {topic}; logged:\n{logs}"
    );
    Ok(())
}

/// Writes `count` puts (key `i`, value `i` as big-endian u64) through a logged store in a fresh
/// directory, committed, and returns what the store holds.
fn write_changelog(
    cluster: &Cluster,
    topic: &str,
    count: u64,
) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let dir = tempfile::tempdir()?;
    let store = LoggedStore::open(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        changelog(cluster, topic).durability(Durability::Async),
    )?;
    for i in 0..count {
        store.put(&i.to_be_bytes(), &i.to_be_bytes())?;
        if i % 10_000 == 9_999 {
            store.commit()?;
        }
    }
    store.commit()?;
    let held = common::contents(&store)?;
    store.close()?;
    Ok(held)
}

/// Restores `topic` into a fresh directory, with the leader of its partition killed `delay`
/// after the restore starts (`None`: killed just before), and checks that the store holds
/// exactly `expected`. Brings the node back and in sync afterwards.
fn restore_through_a_leader_kill(
    cluster: &Cluster,
    topic: &str,
    expected: &BTreeMap<Vec<u8>, Vec<u8>>,
    delay: Option<Duration>,
) -> Result<()> {
    let leader = cluster.leader(topic, 0)?;
    let killer = match delay {
        None => {
            cluster.kill(leader)?;
            None
        }
        Some(delay) => Some(std::thread::spawn(move || {
            std::thread::sleep(delay);
            kstate_test_broker::cluster()?.kill(leader)
        })),
    };
    let dir = tempfile::tempdir()?;
    let restored = common::open_reporting(&dir.path().join("store"), changelog(cluster, topic));
    if let Some(killer) = killer {
        killer.join().expect("killer thread")?;
    }
    let (store, report) = restored?;
    let held = common::contents(&store)?;
    store.close()?;
    cluster.restart(leader)?;
    cluster.wait_for_full_isr(topic, Duration::from_secs(120))?;
    ensure!(
        report.start.rebuild_reason.is_none(),
        "the restore rebuilt: {:?}",
        report.start.rebuild_reason
    );
    ensure!(
        held.len() == expected.len() && held == *expected,
        "restored {} keys through the kill of node {leader} ({delay:?}), expected {}",
        held.len(),
        expected.len()
    );
    Ok(())
}

#[test]
fn a_restore_whose_changelogs_leader_dies_finishes_with_every_record() -> Result<()> {
    let cluster = kstate_test_broker::cluster()?.exclusive()?;
    let topic = unique_topic("cluster-restore-leader-kill");
    let expected = write_changelog(&cluster, &topic, 200_000)?;
    // Killed just before: the metadata still names the dead node until the controller fences
    // it; the restore must wait for the next leader, not fail.
    restore_through_a_leader_kill(&cluster, &topic, &expected, None)?;
    // Killed while the restore reads.
    for delay_ms in [100, 400] {
        restore_through_a_leader_kill(
            &cluster,
            &topic,
            &expected,
            Some(Duration::from_millis(delay_ms)),
        )?;
    }
    Ok(())
}
