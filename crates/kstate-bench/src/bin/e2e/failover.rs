//! `e2e failover`: a copy of an application SIGKILLed, a marker written to every input partition,
//! and the time until each marker's output is appended (see the crate's module docs).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, ensure};
use kstate_bench::cli::number;
use kstate_bench::kafka::{Settled, append_time, partition_count, producer, send};
use kstate_bench::report::write_json;
use kstate_kafka::ClientProperties;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::common::reader;

/// `e2e failover`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The input topic (one marker goes to each partition).
    #[arg(long)]
    input: String,
    /// The output topic.
    #[arg(long)]
    output: String,
    /// The process to SIGKILL.
    #[arg(long, value_name = "PID", value_parser = number::<u32>)]
    kill: u32,
    /// Give up after this many seconds.
    #[arg(long, value_parser = number::<u64>, default_value_t = 600)]
    timeout_s: u64,
    /// Also write the result as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// Markers' keys start with this; no input record's does (setup's keys start with an 8-byte
/// index).
const MARKER_PREFIX: &str = "kstate-failover-marker-";

/// A marker key for each of `partitions` partitions: one that murmur2 hashes to it, so that a
/// system whose output is partitioned by key (Kafka Streams' `to`) writes the marker's output to
/// the same partition number as one that keeps the input's (kstate's `send`).
fn marker_keys(partitions: i32) -> Vec<Vec<u8>> {
    let mut keys = vec![Vec::new(); partitions as usize];
    let mut missing = partitions;
    for n in 0u64.. {
        let key = format!("{MARKER_PREFIX}{n}").into_bytes();
        let p = kstate_task::partition_for(&key, partitions) as usize;
        if keys[p].is_empty() {
            keys[p] = key;
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
    }
    keys
}

/// What `failover --json` writes.
#[derive(serde::Serialize)]
struct FailoverResult {
    input: String,
    output: String,
    killed_pid: u32,
    /// Per input partition: ms from the SIGKILL to the append of its marker's output.
    partition_ms: BTreeMap<i32, i64>,
    /// Per input partition: ms from the SIGKILL until the (read_committed) reader got it.
    visible_ms: BTreeMap<i32, i64>,
    seconds: f64,
}

/// SIGKILLs `--kill`, then times each partition's marker until its output appears.
pub fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let Args {
        input,
        output,
        kill: pid,
        timeout_s,
        json,
    } = args;
    let timeout = Duration::from_secs(timeout_s);
    let partitions = partition_count(client.clone(), &input)?;
    ensure!(partitions > 0, "{input} does not exist");
    let consumer = reader(client)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(&output, p, Duration::from_secs(30))?;
        tpl.add_partition_offset(&output, p, Offset::Offset(high))?;
    }
    let producer = producer(client.clone(), 0, Settled::default())?;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .context("run kill")?;
    let killed_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    ensure!(killed.success(), "kill -KILL {pid} failed: {killed}");
    let markers = marker_keys(partitions);
    for (p, key) in markers.iter().enumerate() {
        send(
            &producer,
            BaseRecord::to(&input)
                .partition(p as i32)
                .key(&key[..])
                .payload(&b"m"[..]),
        );
    }
    producer
        .context()
        .wait_for(partitions as u64, Duration::from_secs(30))
        .context("markers")?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let (mut partition_ms, mut visible_ms) = (BTreeMap::new(), BTreeMap::new());
    while partition_ms.len() < partitions as usize {
        ensure!(
            started.elapsed() < timeout,
            "after {timeout:?} only partitions {:?} of {partitions} have their marker's output",
            partition_ms.keys().collect::<Vec<_>>()
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = message?;
        if m.key() == Some(&markers[m.partition() as usize][..])
            && !partition_ms.contains_key(&m.partition())
        {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
            partition_ms.insert(m.partition(), append_time(&m)? - killed_at);
            visible_ms.insert(m.partition(), now - killed_at);
        }
    }
    let slowest = partition_ms.values().copied().max().unwrap_or_default();
    let slowest_visible = visible_ms.values().copied().max().unwrap_or_default();
    for (p, ms) in &partition_ms {
        println!(
            "failover partition={p} ms={ms} visible_ms={}",
            visible_ms[p]
        );
    }
    let result = FailoverResult {
        input,
        output,
        killed_pid: pid,
        seconds: slowest as f64 / 1e3,
        partition_ms,
        visible_ms,
    };
    println!(
        "failover seconds={:.3} partitions={partitions} killed_at_ms={killed_at} visible_s={:.3}",
        result.seconds,
        slowest_visible as f64 / 1e3
    );
    if let Some(path) = json {
        write_json(&path, &result)?;
    }
    Ok(())
}
