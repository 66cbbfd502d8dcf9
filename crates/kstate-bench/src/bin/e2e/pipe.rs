//! `e2e pipe`: the physical limit of the end-to-end runs, the same broker work as kstate's with no
//! state (see the crate's module docs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use kstate_bench::cli::number;
use kstate_bench::kafka::{Settled, create_client, create_topic, partition_count, send};
use kstate_kafka::{ClientProperties, ProducerConfig};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

/// `e2e pipe`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The input topic.
    #[arg(long)]
    input: String,
    /// The output topic.
    #[arg(long)]
    output: String,
    /// The consumer group; `<ID>-shadow-changelog` stands in for the changelog.
    #[arg(long)]
    application_id: String,
    /// Stop once this many records are consumed (and their outputs acknowledged).
    #[arg(long, value_parser = number::<u64>)]
    rows: u64,
}

/// The bare pipe: consume one, produce two, and every 100 ms commit the input offsets once the
/// broker acknowledged everything sent before them, without pausing the consumption meanwhile:
/// the most the broker and rdkafka allow this loop, a limit for kstate's end-to-end rate.
pub async fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let Args {
        input,
        output,
        application_id: app,
        rows,
    } = args;
    let shadow = format!("{app}-shadow-changelog");
    let partitions = partition_count(client.clone(), &input)?;
    create_topic(
        client.clone(),
        &shadow,
        partitions,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    let consumer: BaseConsumer = create_client(
        client,
        &[
            ("group.id", app.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            // As kstate's input consumers.
            ("isolation.level", "read_committed"),
            ("fetch.wait.max.ms", "100"),
            // Unlike them, 8 MiB per partition and fetch instead of 1: with 1 MiB this loop
            // drains what a fetch brought and waits for the next one, about half its time (it
            // ran at 287-294k records/s, 429-442k with 8 MiB; kstate ran the same with either,
            // BENCHMARKS.md "The pipe as a limit").
            ("max.partition.fetch.bytes", "8388608"),
        ],
        "pipe consumer",
    )?;
    consumer.subscribe(&[&input])?;
    // Exactly the producer settings kstate's workers send with (acks=all, idempotence, lz4,
    // its linger).
    let producer: ThreadedProducer<Settled> = ProducerConfig::new(client.clone())
        .client_config()
        .create_with_context(Settled::default())
        .context("pipe producer")?;
    let mut sent = 0u64;
    let mut offsets: BTreeMap<i32, i64> = BTreeMap::new();
    // A commit taken but not yet sent: the records it waits for, and the offsets it commits.
    let mut pending: Option<(u64, TopicPartitionList)> = None;
    let mut next_commit = Instant::now() + Duration::from_millis(100);
    let (mut seen, started) = (0u64, Instant::now());
    while seen < rows {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let m = message?;
            let key = m.key().unwrap_or_default();
            let value = m.payload().unwrap_or_default();
            send(
                &producer,
                BaseRecord::to(&output)
                    .partition(m.partition())
                    .key(key)
                    .payload(b"1"),
            );
            send(
                &producer,
                BaseRecord::to(&shadow)
                    .partition(m.partition())
                    .key(key)
                    .payload(value),
            );
            sent += 2;
            offsets.insert(m.partition(), m.offset() + 1);
            seen += 1;
        }
        if let Some((needed, _)) = &pending
            && producer.context().settled()? >= *needed
            && let Some((_, tpl)) = pending.take()
        {
            consumer.commit(&tpl, CommitMode::Async)?;
        }
        if pending.is_none() && Instant::now() >= next_commit {
            pending = Some((sent, offset_list(&input, &offsets)?));
            next_commit = Instant::now() + Duration::from_millis(100);
        }
    }
    producer
        .context()
        .wait_for(sent, Duration::from_secs(60))
        .context("pipe")?;
    consumer.commit(&offset_list(&input, &offsets)?, CommitMode::Sync)?;
    eprintln!(
        "pipe processed {rows} records in {} ms from start",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// `offsets` (partition to next offset) of `topic`, as a commit takes them.
fn offset_list(topic: &str, offsets: &BTreeMap<i32, i64>) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    Ok(tpl)
}
