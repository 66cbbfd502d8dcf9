//! Standby followers share the process's Kafka clients, against a real broker.
//!
//! Two processes of one application (two `App`s in this test process, static members of the
//! eager `range` assignor, one standby replica) on twelve partitions of three stores: each runs
//! six tasks and follows the other six, eighteen changelogs. A follower used to make three
//! librdkafka clients per store (a metadata client, an admin client, a replaying consumer), each
//! with its own threads and sockets, then one replaying consumer per store. Now a process's
//! standby stores join its follower group, whose lanes (one consumer each, one per store of a
//! task) follow them all and share the restorers' metadata and admin clients. Counted by
//! librdkafka's main threads (`rdk:main`, one per client instance) once the standbys have
//! caught up: at most one per store of a task beyond what a process holds without standbys,
//! however many tasks it follows.
//!
//! A standby whose store is already at its changelog's end (the process ran the task until a
//! rebalance moved it) reports no lag: its position is where its restore left it, though the
//! restore replayed nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::streams::wait_for;
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, Context, GroupProtocol, Processor, Record, Running, StoreHandle, StoreOptions,
};
use kstate_test_broker::unique_topic;

const PARTITIONS: i32 = 12;
const STORES: [&str; 3] = ["a", "b", "c"];
/// Clients a process holds besides its followers' consumers, at most: its worker's consumer
/// and producer, its restorers' consumers and their shared metadata and admin clients, the
/// standby manager's group reader, with room to spare. Three clients per followed store, the
/// old cost, exceeds this by far (eighteen stores a process).
const CLIENTS_BESIDES_FOLLOWERS: usize = 16;

struct Nothing;

/// Counts each key in the first store.
struct Count(StoreHandle<Vec<u8>, u64>);

impl Processor for Count {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let count = ctx.store(&self.0).get(&key)?.unwrap_or(0) + 1;
        ctx.store(&self.0).put(&key, &count)?;
        Ok(())
    }
}

impl Processor for Nothing {
    fn process(&mut self, _: &mut Context<'_>, _: &Record<'_>) -> Result<(), BoxError> {
        Ok(())
    }
}

/// librdkafka client instances in this process: threads named `rdk:main`.
fn librdkafka_clients() -> anyhow::Result<usize> {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let comm = std::fs::read_to_string(task?.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "rdk:main" {
            n += 1;
        }
    }
    Ok(n)
}

fn start(app_id: &str, servers: &str, input: &str, process: usize) -> anyhow::Result<Running> {
    start_with(app_id, servers, input, process, |_| Box::new(Nothing))
}

fn start_with(
    app_id: &str,
    servers: &str,
    input: &str,
    process: usize,
    processor: fn(StoreHandle<Vec<u8>, u64>) -> Box<dyn Processor>,
) -> anyhow::Result<Running> {
    let dir = std::env::temp_dir().join(format!("{app_id}-p{process}"));
    let mut builder = App::builder(app_id, servers);
    builder
        .input(input)
        .state_dir(&dir)
        .group_protocol(GroupProtocol::Eager)
        .instance_id(format!("p{process}"))
        .static_membership(true)
        .standby_replicas(1)
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    let handles: Vec<StoreHandle<Vec<u8>, u64>> = STORES
        .iter()
        .map(|store| builder.store(*store, StoreOptions::default()))
        .collect();
    let first = handles[0].clone();
    Ok(builder.build(move |_| processor(first.clone()))?.start()?)
}

#[tokio::test(flavor = "multi_thread")]
async fn standby_followers_share_their_kafka_clients() -> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let input = unique_topic("followers-in");
    common::create_topic(&servers, &input, PARTITIONS, "delete").await?;
    let app_id = unique_topic("followers");
    let processes = [
        start(&app_id, &servers, &input, 0)?,
        start(&app_id, &servers, &input, 1)?,
    ];
    // Each process follows the six tasks the other runs, once the group has settled.
    let half = (PARTITIONS / 2) as usize;
    wait_for(
        "each process following the other's tasks",
        Duration::from_secs(120),
        || {
            Ok(processes.iter().all(|p| {
                let standbys = p.standbys();
                standbys.len() == half && standbys.iter().all(|s| s.lag.is_some())
            }))
        },
    )?;
    let followed_stores = processes
        .iter()
        .map(|p| p.standbys().len() * STORES.len())
        .sum::<usize>();
    // The standbys' starts (a consumer each while they restore) end once they have caught up.
    let allowed = processes.len() * (CLIENTS_BESIDES_FOLLOWERS + STORES.len());
    let settled = wait_for(
        "the standbys' starts to end",
        Duration::from_secs(15),
        || Ok(librdkafka_clients()? <= allowed),
    );
    let clients = librdkafka_clients()?;
    eprintln!(
        "standby followers: {followed_stores} followed stores, {clients} librdkafka clients in \
         the process (at most {allowed} allowed)"
    );
    assert!(
        settled.is_ok(),
        "{clients} librdkafka clients for {followed_stores} followed stores in two processes: \
         more than one per store of a task besides {CLIENTS_BESIDES_FOLLOWERS} a process"
    );
    for p in &processes {
        p.shutdown();
    }
    for p in processes {
        p.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for process in 0..2 {
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{app_id}-p{process}")));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_already_at_its_changelogs_end_reports_no_lag() -> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let input = unique_topic("at-end-in");
    common::create_topic(&servers, &input, PARTITIONS, "delete").await?;
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..PARTITIONS)
        .flat_map(|p| (0..5u8).map(move |k| (p, vec![b'k', k], b"v".to_vec())))
        .collect();
    common::streams::produce(&servers, &input, &records)?;
    let app_id = unique_topic("at-end");
    // The first process runs every task and writes every store.
    let first = start_with(&app_id, &servers, &input, 0, |counts| {
        Box::new(Count(counts))
    })?;
    wait_for(
        "the first process to run every task",
        Duration::from_secs(60),
        || Ok(first.tasks().len() == PARTITIONS as usize),
    )?;
    wait_for(
        "the first process to commit its input",
        Duration::from_secs(60),
        || Ok(first.tasks().iter().map(|t| t.processed).sum::<u64>() >= records.len() as u64),
    )?;
    // The second takes half: the first follows them, their stores at their changelogs' ends.
    let second = start_with(&app_id, &servers, &input, 1, |counts| {
        Box::new(Count(counts))
    })?;
    let half = (PARTITIONS / 2) as usize;
    let caught_up = wait_for(
        "the first process's standbys to report no lag",
        Duration::from_secs(90),
        || {
            let standbys = first.standbys();
            Ok(standbys.len() == half && standbys.iter().all(|s| s.lag == Some(0)))
        },
    );
    let standbys = first.standbys();
    for p in [&first, &second] {
        p.shutdown();
    }
    for p in [first, second] {
        p.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for process in 0..2 {
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{app_id}-p{process}")));
    }
    caught_up.map_err(|e| anyhow::anyhow!("{e}: {standbys:?}"))
}
