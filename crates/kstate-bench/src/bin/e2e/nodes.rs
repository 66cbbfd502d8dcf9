//! `e2e leader` and `e2e in-sync`: what a benchmark that kills a broker needs to know of the
//! cluster (which node to kill, and when it is whole again), from the cluster's metadata.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kstate_bench::cli::number;
use kstate_kafka::ClientProperties;
use rdkafka::consumer::Consumer;

use crate::common::reader;

/// `e2e leader`'s flags.
#[derive(Debug, clap::Args)]
pub struct LeaderArgs {
    /// The topic.
    #[arg(long)]
    topic: String,
    /// Its partition.
    #[arg(long, value_parser = number::<i32>, default_value_t = 0)]
    partition: i32,
}

/// `e2e in-sync`'s flags.
#[derive(Debug, clap::Args)]
pub struct InSyncArgs {
    /// Give up after this many seconds.
    #[arg(long, value_parser = number::<u64>, default_value_t = 180)]
    timeout_s: u64,
}

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Prints the node id of the partition's leader.
pub fn leader(client: &ClientProperties, args: LeaderArgs) -> Result<()> {
    let LeaderArgs { topic, partition } = args;
    let consumer = reader(client)?;
    let metadata = consumer
        .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
        .with_context(|| format!("metadata of {topic}"))?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        bail!("{topic} is not in the cluster's metadata");
    };
    ensure!(found.error().is_none(), "{topic}: {:?}", found.error());
    let Some(p) = found.partitions().iter().find(|p| p.id() == partition) else {
        bail!("{topic} has no partition {partition}");
    };
    ensure!(p.leader() >= 0, "{topic}/{partition} has no leader");
    println!("{}", p.leader());
    Ok(())
}

/// Waits until every partition of every topic has all its replicas in sync and a leader.
pub fn in_sync(client: &ClientProperties, args: InSyncArgs) -> Result<()> {
    let timeout = Duration::from_secs(args.timeout_s);
    let consumer = reader(client)?;
    let started = Instant::now();
    loop {
        let lagging = match consumer.fetch_metadata(None, METADATA_TIMEOUT) {
            Ok(metadata) => metadata
                .topics()
                .iter()
                .flat_map(|t| t.partitions().iter().map(move |p| (t.name(), p)))
                .filter(|(_, p)| p.leader() < 0 || p.isr().len() < p.replicas().len())
                .map(|(topic, p)| format!("{topic}/{}", p.id()))
                .collect::<Vec<_>>(),
            Err(e) => vec![format!("metadata: {e}")],
        };
        if lagging.is_empty() {
            return Ok(());
        }
        ensure!(
            started.elapsed() < timeout,
            "after {timeout:?}, {} partitions are not fully in sync, e.g. {}",
            lagging.len(),
            lagging[..lagging.len().min(5)].join(", ")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
