//! exactly_once: a count per key under exactly-once, and a verifier that proves it.
//!
//! With `ProcessingGuarantee::ExactlyOnce` each worker commits its tasks' changelog records,
//! outputs and input offsets in one Kafka transaction, and a store applies its writes only once
//! that transaction commits: whatever fails, a reader with `isolation.level=read_committed`
//! sees every input record's effect once. The proof is in the output: for every key the
//! counts read back must be exactly `1, 2, ..., n`, with `n` the key's records in the input. A
//! count seen twice or skipped fails the run.
//!
//! The example writes `--records` records over `--keys` keys to a new input topic, runs the
//! count (a [`Processor`] of ten lines, `CountByKey` below) until the output holds a count for
//! each record, and verifies the output.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example exactly_once -- \
//!     [--records 10000] [--keys 100] [--partitions 3]
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use clap::Parser;
use kstate::rdkafka::consumer::{BaseConsumer, Consumer};
use kstate::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use kstate::rdkafka::message::Message;
use kstate::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use kstate::rdkafka::{Offset, TopicPartitionList};
use kstate::{App, BoxError, ClientProperties, Context, ProcessingGuarantee, Processor, Record};
use kstate::{StoreHandle, StoreOptions, create_topic_if_missing};

/// Counts keys exactly once and verifies every count in the output.
#[derive(Parser)]
struct Args {
    /// The Kafka cluster.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS")]
    bootstrap_servers: String,
    /// Input records to write and count.
    #[arg(long, default_value_t = 10_000)]
    records: usize,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 100)]
    keys: usize,
    /// The input's and output's partitions (one task each).
    #[arg(long, default_value_t = 3)]
    partitions: i32,
}

/// The count per key, and `(key, count as decimal ASCII)` to the output for every record.
struct CountByKey(StoreHandle<Vec<u8>, u64>, String);

impl Processor for CountByKey {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default();
        let counts = ctx.store(&self.0);
        let count = counts.get(&key.to_vec())?.unwrap_or(0) + 1;
        counts.put(&key.to_vec(), &count)?;
        ctx.send(&self.1, key, Some(count.to_string().as_bytes()))?;
        Ok(())
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let servers = args.bootstrap_servers.as_str();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let app_id = format!("exactly-once-{}", now.as_millis());
    let (input, output) = (format!("{app_id}-input"), format!("{app_id}-output"));
    let client = ClientProperties::new(servers);
    for topic in [&input, &output] {
        // -1: the broker's default replication.
        create_topic_if_missing(
            &client,
            topic,
            args.partitions,
            -1,
            &[],
            Duration::from_secs(30),
        )?;
    }
    let writer: BaseProducer = client.client_config().create()?;
    for i in 0..args.records {
        let key = format!("key-{}", i % args.keys);
        let mut record = BaseRecord::<[u8], [u8]>::to(&input)
            .key(key.as_bytes())
            .payload(&b""[..]);
        // A full queue empties as deliveries are served.
        while let Err((e, back)) = writer.send(record) {
            if e != KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) {
                return Err(e.into());
            }
            writer.poll(Duration::from_millis(10));
            record = back;
        }
    }
    writer.flush(Duration::from_secs(60))?;

    let state = tempfile::tempdir()?;
    let mut builder = App::builder(app_id.clone(), servers);
    builder
        .input(input)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .state_dir(state.path());
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let to = output.clone();
    let app = builder.build(move |_task| Box::new(CountByKey(counts.clone(), to.clone())))?;
    let running = app.start()?;
    let seen = read_committed(servers, &output, args.partitions, args.records);
    running.shutdown();
    running.wait()?;
    let seen = seen?;

    // Per key, in output order (a key's counts are in one partition, in order): 1, 2, ..., n.
    let mut expected: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for (key, count) in &seen {
        let next = expected.entry(key.clone()).or_insert(0);
        *next += 1;
        if *count != *next {
            let key = String::from_utf8_lossy(key);
            bail!("key {key}: count {count} where {next} was due: not exactly once");
        }
    }
    let total: u64 = expected.values().sum();
    ensure!(
        total == args.records as u64,
        "{total} counts for {} records",
        args.records
    );
    println!(
        "verified: {} keys, {total} counts, each key's 1..n exactly once",
        expected.len()
    );
    Ok(())
}

/// The first `records` (key, count) records of `topic`, as a `read_committed` reader sees them.
fn read_committed(
    servers: &str,
    topic: &str,
    partitions: i32,
    records: usize,
) -> Result<Vec<(Vec<u8>, u64)>> {
    let consumer: BaseConsumer = ClientProperties::new(servers)
        .client_config()
        .set("group.id", format!("{topic}-verifier"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let (mut seen, deadline) = (Vec::new(), Instant::now() + Duration::from_secs(120));
    while seen.len() < records {
        ensure!(
            Instant::now() < deadline,
            "only {} of {records} counts after 120 s",
            seen.len()
        );
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message?;
            let count = std::str::from_utf8(message.payload().unwrap_or_default())?.parse()?;
            seen.push((message.key().unwrap_or_default().to_vec(), count));
        }
    }
    Ok(seen)
}
