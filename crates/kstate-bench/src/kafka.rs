//! The Kafka side of a measurement: topics made for it, a producer whose every record is
//! acknowledged before the clock stops, and the broker's append time of what an application
//! produced (`message.timestamp.type=LogAppendTime` output topics), which times every system the
//! same way whoever produced the records.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, Timestamp};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};

use crate::BenchError;

/// The settings of an output topic whose records carry the broker's append time.
pub const LOG_APPEND_TIME: &[(&str, &str)] = &[("message.timestamp.type", "LogAppendTime")];

/// Creates `topic` with `partitions` partitions (replication factor 1) and `settings`.
pub async fn create_topic(
    servers: &str,
    topic: &str,
    partitions: i32,
    settings: &[(&str, &str)],
) -> Result<(), BenchError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .create()
        .map_err(BenchError::kafka("admin client"))?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
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
    Ok(())
}

/// How many partitions `topic` has (0 if it does not exist).
pub fn partition_count(servers: &str, topic: &str) -> Result<i32, BenchError> {
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .create()
        .map_err(BenchError::kafka("metadata client"))?;
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
    servers: &str,
    linger_ms: u32,
    context: C,
) -> Result<ThreadedProducer<C>, BenchError> {
    ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms.to_string())
        .set("compression.type", "lz4")
        .create_with_context(context)
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
