//! Helpers for the task-runtime tests: write keyed input, read a whole topic back, wait for a
//! condition.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kstate::kstate_kafka::ClientProperties;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};

/// A record read back: partition, offset, key, value.
pub type ReadRecord = (i32, i64, Vec<u8>, Option<Vec<u8>>);

/// Writes `(partition, key, value)` records to `topic` and waits until all are acknowledged.
pub fn produce(
    servers: &str,
    topic: &str,
    records: &[(i32, Vec<u8>, Vec<u8>)],
) -> anyhow::Result<()> {
    produce_with(&ClientProperties::new(servers), topic, records)
}

/// [`produce`] with `client`'s properties (a secured cluster).
pub fn produce_with(
    client: &ClientProperties,
    topic: &str,
    records: &[(i32, Vec<u8>, Vec<u8>)],
) -> anyhow::Result<()> {
    let producer = kstate_bench::kafka::producer(client.clone(), 5, DefaultProducerContext)?;
    for (partition, key, value) in records {
        kstate_bench::kafka::send(
            &producer,
            BaseRecord::to(topic)
                .partition(*partition)
                .key(&key[..])
                .payload(&value[..]),
        );
    }
    producer.flush(Duration::from_secs(60))?;
    // The last delivery reports may still queue behind log events (librdkafka's debug logging).
    wait_for(
        "the input's delivery reports",
        Duration::from_secs(30),
        || Ok(producer.in_flight_count() == 0),
    )
}

/// One timestamped record: partition, key, value and timestamp (ms).
pub type TimedRecord<'a> = (i32, &'a [u8], &'a [u8], i64);

/// Writes timestamped records to `topic`, in order, and waits until all are acknowledged.
pub fn produce_timed<'a>(
    servers: &str,
    topic: &str,
    records: impl IntoIterator<Item = TimedRecord<'a>>,
) -> anyhow::Result<()> {
    let client = ClientProperties::new(servers);
    let producer = kstate_bench::kafka::producer(client, 5, DefaultProducerContext)?;
    for (partition, key, value, time) in records {
        kstate_bench::kafka::send(
            &producer,
            BaseRecord::to(topic)
                .partition(partition)
                .key(key)
                .payload(value)
                .timestamp(time),
        );
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Every record of `topic` (`partitions` partitions) as (partition, offset, key, value), read
/// with `isolation.level=read_committed` (what an exactly-once writer's readers see; the same as
/// read_uncommitted for a topic written without transactions) up to the high watermarks taken
/// when called. A partition is done when the consumer's position reaches its watermark:
/// transaction markers take offsets but are never delivered.
pub fn read_topic(servers: &str, topic: &str, partitions: i32) -> anyhow::Result<Vec<ReadRecord>> {
    read_topic_with(&ClientProperties::new(servers), topic, partitions)
}

/// `topic`/`partition`'s watermarks, asked again while the broker answers that the partition
/// has no leader right now (a busy or restarting broker, a leader moving on a cluster), for up
/// to 30 s.
fn watermarks(consumer: &BaseConsumer, topic: &str, partition: i32) -> anyhow::Result<(i64, i64)> {
    use anyhow::Context as _;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match consumer.fetch_watermarks(topic, partition, Duration::from_secs(20)) {
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::OffsetNotAvailable,
            )) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            result => {
                return result.with_context(|| format!("the watermarks of {topic}/{partition}"));
            }
        }
    }
}

/// [`read_topic`] with `client`'s properties (a secured cluster).
pub fn read_topic_with(
    client: &ClientProperties,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<Vec<ReadRecord>> {
    let consumer: BaseConsumer = client
        .client_config()
        .set("group.id", "kstate-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) = watermarks(&consumer, topic, p)?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ends.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "reading {topic} timed out");
        let polled = consumer.poll(Duration::from_millis(200));
        let check = !matches!(polled, Some(Ok(_))) || out.len() % 256 == 0;
        match polled {
            Some(Ok(m)) => out.push((
                m.partition(),
                m.offset(),
                m.key().unwrap_or_default().to_vec(),
                m.payload().map(<[u8]>::to_vec),
            )),
            Some(Err(e)) => anyhow::bail!("reading {topic}: {e}"),
            None => {}
        }
        if !check {
            continue;
        }
        for element in consumer.position()?.elements() {
            if let Offset::Offset(position) = element.offset()
                && ends
                    .get(&element.partition())
                    .is_some_and(|end| position >= *end)
            {
                ends.remove(&element.partition());
            }
        }
    }
    Ok(out)
}

/// Waits until `done` returns true, checking every 100 ms, at most `limit`.
pub fn wait_for(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if done()? {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last decimal count per key in `records` (count_by_key's output).
pub fn last_counts(records: &[ReadRecord]) -> BTreeMap<Vec<u8>, u64> {
    let mut last = BTreeMap::new();
    for (_, _, key, value) in records {
        if let Some(v) = value
            && let Some(n) = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
        {
            let e = last.entry(key.clone()).or_insert(0);
            *e = (*e).max(n);
        }
    }
    last
}

/// Every key's counts in `output` (`partitions` partitions, read with `read_committed`), in
/// offset order, must be exactly `1, 2, ..., n` with `n` its true count in `truth`: no
/// duplicate, no gap, no key missing or extra.
pub fn check_exact_sequences(
    servers: &str,
    output: &str,
    partitions: i32,
    truth: &BTreeMap<Vec<u8>, u64>,
) -> anyhow::Result<()> {
    let mut out = read_topic(servers, output, partitions)?;
    out.sort_by_key(|r| (r.0, r.1));
    let mut seen: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for (partition, offset, key, value) in &out {
        let value = value.as_deref().unwrap_or_default();
        let count: u64 = std::str::from_utf8(value)?.parse()?;
        let last = seen.entry(key.clone()).or_insert(0);
        anyhow::ensure!(
            count == *last + 1,
            "key {}: count {count} at {output}/{partition}@{offset} follows {last}: a {}",
            String::from_utf8_lossy(key),
            if count <= *last { "duplicate" } else { "gap" }
        );
        *last = count;
    }
    if &seen != truth {
        let differ: Vec<_> = truth
            .keys()
            .chain(seen.keys())
            .filter(|k| truth.get(*k) != seen.get(*k))
            .take(10)
            .map(|k| {
                (
                    String::from_utf8_lossy(k).to_string(),
                    truth.get(k).copied(),
                    seen.get(k).copied(),
                )
            })
            .collect();
        anyhow::bail!(
            "final counts in {output} differ from the true counts ({} keys counted, {} written); \
             (key, true, counted): {differ:?}",
            seen.len(),
            truth.len()
        );
    }
    Ok(())
}

/// The environment variable `name` as a number, if it is set and parses.
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}
