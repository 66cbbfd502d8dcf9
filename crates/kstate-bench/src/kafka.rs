//! The Kafka side of a measurement: topics made for it, a producer whose every record is
//! acknowledged before the clock stops, and the broker's append time of what an application
//! produced (`message.timestamp.type=LogAppendTime` output topics), which times every system the
//! same way whoever produced the records.
//!
//! Every helper takes the cluster as `impl Into<ClientProperties>`: a bootstrap address (`&str`)
//! for a plaintext broker, or the [`ClientProperties`] of a secured one (TLS, SASL), so that the
//! measuring clients reach the broker through the same listener, with the same security, as the
//! application they measure. A failure to create a client is reported without the properties'
//! secret values ([`ClientProperties::redact_error`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kstate_kafka::ClientProperties;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::FromClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, Timestamp};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};

use crate::BenchError;

/// The settings of an output topic whose records carry the broker's append time.
pub const LOG_APPEND_TIME: &[(&str, &str)] = &[("message.timestamp.type", "LogAppendTime")];

/// A client of `T` from `client`'s properties and `settings` on top; `what` names it in the
/// error, whose secret values are redacted.
pub fn create_client<T: FromClientConfig>(
    client: &ClientProperties,
    settings: &[(&str, &str)],
    what: &str,
) -> Result<T, BenchError> {
    let mut config = client.client_config();
    for (key, value) in settings {
        config.set(*key, *value);
    }
    config
        .create()
        .map_err(|e| client.redact_error(e))
        .map_err(BenchError::kafka(what))
}

/// Creates `topic` with `partitions` partitions (the broker's default replication) and `settings`, and
/// returns once the broker serves every partition (see [`wait_for_leaders`], which blocks).
pub async fn create_topic(
    client: impl Into<ClientProperties>,
    topic: &str,
    partitions: i32,
    settings: &[(&str, &str)],
) -> Result<(), BenchError> {
    let admin: AdminClient<DefaultClientContext> =
        create_client(&client.into(), &[], "admin client")?;
    let mut new = NewTopic::new(
        topic,
        partitions,
        TopicReplication::Fixed(kstate_kafka::BROKER_DEFAULT_REPLICATION),
    );
    for (k, v) in settings {
        new = new.set(k, v);
    }
    let results = admin
        .create_topics(&[new], &AdminOptions::new())
        .await
        .map_err(BenchError::kafka(format!("create topic {topic}")))?;
    for result in results {
        result.map_err(|(t, e)| BenchError::Broker(format!("create topic {t}: {e}")))?;
    }
    wait_for_leaders(admin.inner(), topic, partitions)
}

/// How long [`create_topic`] waits for a new topic's partitions to appear with leaders.
const TOPIC_PROPAGATION_LIMIT: Duration = Duration::from_secs(30);

/// Waits until the broker's metadata lists every one of `topic`'s `partitions` (at least one
/// when `partitions` is -1, the broker's default) with a leader.
///
/// A successful CreateTopics means the controller has committed the topic, not that the
/// brokers have applied it: under load the broker's metadata can lag by a second or more, and a
/// client asking in that window is told the partition does not exist (a watermark query fails
/// with `UnknownPartition`). This is the wait Kafka's own test harness does after creating a
/// topic (`TestUtils.createTopic`). It blocks the calling thread (this crate has no async
/// runtime); a failed metadata request is retried until the limit.
pub fn wait_for_leaders<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    partitions: i32,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + TOPIC_PROPAGATION_LIMIT;
    loop {
        let led = client
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .map(|metadata| {
                metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic && t.error().is_none())
                    .map_or(0, |t| {
                        t.partitions()
                            .iter()
                            .filter(|p| p.error().is_none() && p.leader() >= 0)
                            .count()
                    })
            });
        let complete = match (&led, usize::try_from(partitions)) {
            (Ok(led), Ok(wanted)) => *led == wanted,
            (Ok(led), Err(_)) => *led > 0,
            (Err(_), _) => false,
        };
        if complete {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(match led {
                Err(source) => BenchError::Kafka {
                    what: format!("read the metadata of the new topic {topic}"),
                    source,
                },
                Ok(led) => BenchError::Broker(format!(
                    "topic {topic} was created, but after {TOPIC_PROPAGATION_LIMIT:?} the \
                     broker lists {led} of its {partitions} partitions with a leader"
                )),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deletes `topics`; one that does not exist is not an error.
pub async fn delete_topics(
    client: impl Into<ClientProperties>,
    topics: &[&str],
) -> Result<(), BenchError> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> =
        create_client(&client.into(), &[], "admin client")?;
    let results = admin
        .delete_topics(topics, &AdminOptions::new())
        .await
        .map_err(BenchError::kafka("delete topics"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, e)) => return Err(BenchError::Broker(format!("delete topic {t}: {e}"))),
        }
    }
    Ok(())
}

/// Deletes the consumer groups `groups` (a group that does not exist is no error).
pub async fn delete_groups(
    client: impl Into<ClientProperties>,
    groups: &[&str],
) -> Result<(), BenchError> {
    if groups.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> =
        create_client(&client.into(), &[], "admin client")?;
    let results = admin
        .delete_groups(groups, &AdminOptions::new())
        .await
        .map_err(BenchError::kafka("delete consumer groups"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::GroupIdNotFound)) => {}
            Err((g, e)) => return Err(BenchError::Broker(format!("delete group {g}: {e}"))),
        }
    }
    Ok(())
}

/// How many partitions `topic` has (0 if it does not exist).
pub fn partition_count(
    client: impl Into<ClientProperties>,
    topic: &str,
) -> Result<i32, BenchError> {
    let probe: BaseConsumer = create_client(&client.into(), &[], "metadata client")?;
    let metadata = probe
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .map_err(BenchError::kafka(format!("metadata of {topic}")))?;
    Ok(metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len() as i32))
}

/// An idempotent, acks=all, lz4 producer with `context` and a linger of `linger_ms`.
pub fn producer<C: ProducerContext + 'static>(
    client: impl Into<ClientProperties>,
    linger_ms: u32,
    context: C,
) -> Result<ThreadedProducer<C>, BenchError> {
    let client = client.into();
    let linger = linger_ms.to_string();
    let mut config = client.client_config();
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger)
        .set("compression.type", "lz4");
    config
        .create_with_context(context)
        .map_err(|e| client.redact_error(e))
        .map_err(BenchError::kafka("producer"))
}

/// Sends `record`, waiting while the producer's queue is full.
pub fn send<C: ProducerContext<DeliveryOpaque = ()> + 'static>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) {
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, back)) => {
                record = back;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// A producer context that counts delivery reports, so that a caller can wait until everything
/// it sent is settled without librdkafka's `flush` (which costs far more on a busy producer).
#[derive(Debug, Default)]
pub struct Settled {
    count: AtomicU64,
    failed: AtomicBool,
}

impl rdkafka::ClientContext for Settled {}

impl ProducerContext for Settled {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        self.count.fetch_add(1, Ordering::AcqRel);
    }
}

impl Settled {
    /// How many records are settled so far; an error once one failed.
    pub fn settled(&self) -> Result<u64, BenchError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(BenchError::Broker("a record was not delivered".into()));
        }
        Ok(self.count.load(Ordering::Acquire))
    }

    /// Waits until `sent` records are settled; an error if one failed or `timeout` passed.
    pub fn wait_for(&self, sent: u64, timeout: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + timeout;
        while self.count.load(Ordering::Acquire) < sent {
            if Instant::now() >= deadline {
                return Err(BenchError::Broker(format!(
                    "{} of {sent} records acknowledged after {timeout:?}",
                    self.count.load(Ordering::Acquire)
                )));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        if self.failed.load(Ordering::Acquire) {
            return Err(BenchError::Broker("a record was not delivered".into()));
        }
        Ok(())
    }
}

/// The broker's append time of `message`, in ms since the epoch; an error if its topic does not
/// stamp append times.
pub fn append_time(message: &BorrowedMessage<'_>) -> Result<i64, BenchError> {
    match message.timestamp() {
        Timestamp::LogAppendTime(t) => Ok(t),
        _ => Err(BenchError::Broker(format!(
            "{} is not a LogAppendTime topic (create it with `e2e output`)",
            message.topic()
        ))),
    }
}

/// Reads `topic`'s `partition` from its start to its end with a bare consumer (kstate's restore
/// fetch settings, `read_committed`, no store) and returns the records read and the time taken:
/// the limit a restore of the same partition is compared to.
pub fn bare_read(
    client: &ClientProperties,
    topic: &str,
    partition: i32,
) -> Result<(u64, Duration), BenchError> {
    use rdkafka::{Offset, TopicPartitionList};

    let mut settings = vec![
        ("group.id", "kstate-bench-bare-read"),
        ("enable.auto.commit", "false"),
        ("isolation.level", "read_committed"),
    ];
    settings.extend_from_slice(kstate_kafka::RESTORE_FETCH_SETTINGS);
    let consumer: BaseConsumer = create_client(client, &settings, "bare consumer")?;
    let what = || format!("bare read of {topic}/{partition}");
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(30))
        .map_err(BenchError::kafka(what()))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .map_err(BenchError::kafka(what()))?;
    consumer.assign(&tpl).map_err(BenchError::kafka(what()))?;
    let start = Instant::now();
    let mut count = 0u64;
    if high > low {
        while let Some(message) = consumer.poll(Duration::from_secs(10)) {
            let message = message.map_err(BenchError::kafka(what()))?;
            count += 1;
            if message.offset() + 1 >= high {
                break;
            }
        }
    }
    Ok((count, start.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_secret_is_not_in_the_error() {
        let secret = "n0t-in-any-error";
        // librdkafka has no sasl.jaas.config (a Java name) and quotes the rejected value.
        let client = ClientProperties::new("127.0.0.1:9").set(
            "sasl.jaas.config",
            format!("ScramLoginModule required username=\"u\" password=\"{secret}\";"),
        );
        let shown = match create_client::<BaseConsumer>(&client, &[], "probe") {
            Ok(_) => panic!("librdkafka accepted sasl.jaas.config"),
            Err(e) => format!("{e} {e:?}"),
        };
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("sasl.jaas.config"), "{shown}");
        let shown = match producer(client, 0, rdkafka::producer::DefaultProducerContext) {
            Ok(_) => panic!("librdkafka accepted sasl.jaas.config"),
            Err(e) => format!("{e} {e:?}"),
        };
        assert!(!shown.contains(secret), "{shown}");
    }
}
