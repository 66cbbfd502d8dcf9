//! The changelog producer and its acknowledgement tracking: the one producer setup.
//!
//! One [`SharedProducer`] serves any number of stores (and, in the task runtime, the task's
//! outputs): a process with 100 partitions × 3 stores runs one producer per worker thread, not
//! 300. Each record carries its route as the delivery opaque, a plain integer: the store's route
//! id and its sequence number's low bits, or 0 for an output.
//!
//! Every record gets a sequence number (1, 2, ...) in send order, whose low bits travel in the
//! delivery opaque. With `enable.idempotence=true` and one partition, the broker acknowledges in
//! send order, so "records up to sequence `n` are acknowledged" is one counter, and the commit
//! protocol can ask for the exact offset of the last record of its snapshot. A failed delivery
//! poisons the store: once one record is lost, later ones must not be applied over it.
//!
//! One writer per partition (DESIGN.md): acknowledged offsets must also be contiguous, starting
//! at the restore's end. A gap means another writer (a second store on the partition, or a zombie
//! producer) appended records this store never applied; a commit past them would store an offset
//! the store's contents do not match, so the gap poisons instead, and the reopen restores them.
//!
//! In parts, so that each can be read and tested knowing only those before it:
//! - `acks.rs`: the acknowledgement tracker, the checks above, free of librdkafka (tested
//!   without a broker);
//! - `routing.rs`: what a delivery opaque means, and the producer context that hands each
//!   delivery report to its store's tracker or to the outputs' counts;
//! - `client_config.rs`: the librdkafka settings the commit protocol depends on;
//! - this file: the [`SharedProducer`] itself, and the records on their way to its queue;
//! - `changelog.rs`: one store's side of a shared producer.

mod acks;
mod changelog;
mod client_config;
mod routing;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate_core::sync::wait_timeout;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};

use crate::config::{ChangelogConfig, ProducerConfig};
use crate::error::ChangelogError;
use crate::transaction_member::Transaction;
pub(crate) use acks::MarkerGap;
pub(crate) use changelog::ChangelogProducer;
use routing::{OUTPUT_OPAQUE, OutputAcks, Router, Routes};

/// One idempotent, `acks=all` producer shared by many stores and their task's outputs.
///
/// Cheap to clone (a handle). Built from a [`ChangelogConfig`]'s client settings: bootstrap
/// servers, client properties, delivery timeout, linger and record limit; its topic and partition
/// are not used. A record that fails after retries fails the producer for good
/// (`enable.gapless.guarantee`): every store sending through it is poisoned, and the owner must
/// build a new producer and reopen them.
#[derive(Clone)]
pub struct SharedProducer {
    pub(crate) inner: Arc<ThreadedProducer<Router>>,
    pub(crate) outputs: Arc<OutputAcks>,
    pub(crate) routes: Arc<std::sync::RwLock<Routes>>,
    bootstrap_servers: Arc<str>,
    /// Set for a transactional producer.
    pub(crate) transaction: Option<Arc<Transaction>>,
}

impl std::fmt::Debug for SharedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedProducer")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .finish_non_exhaustive()
    }
}

impl SharedProducer {
    /// A producer with `config`'s client settings.
    pub fn new(config: &ChangelogConfig) -> Result<Self, ChangelogError> {
        Self::build(&config.into(), None)
    }

    /// A producer with settings of its own, not one store's (a task runtime's worker).
    pub fn with_config(config: &ProducerConfig) -> Result<Self, ChangelogError> {
        Self::build(config, None)
    }

    /// A producer, transactional when `transaction` is given (not yet initialised).
    pub(crate) fn build(
        config: &ProducerConfig,
        transaction: Option<Transaction>,
    ) -> Result<Self, ChangelogError> {
        let outputs = Arc::new(OutputAcks::default());
        let routes = Arc::new(std::sync::RwLock::new(Routes::default()));
        let context = Router {
            outputs: outputs.clone(),
            routes: routes.clone(),
        };
        let client = config.client_config_for(transaction.as_ref());
        let producer = client
            .create_with_context(context)
            .map_err(|source| config.client.redact_error(source))
            .map_err(|source| ChangelogError::Producer {
                bootstrap_servers: config.client.bootstrap_servers().to_string(),
                operation: "create producer",
                source,
            })?;
        Ok(SharedProducer {
            inner: Arc::new(producer),
            outputs,
            routes,
            bootstrap_servers: config.client.bootstrap_servers().into(),
            transaction: transaction.map(Arc::new),
        })
    }

    /// Queues one record, waiting while librdkafka's queue is full, up to `queue_timeout`.
    fn send_routed(
        &self,
        outgoing: Outgoing<'_>,
        opaque: usize,
        queue_timeout: Duration,
    ) -> Result<(), (KafkaError, Duration)> {
        let mut record = BaseRecord::with_opaque_to(outgoing.topic, opaque).key(outgoing.key);
        if let Some(partition) = outgoing.partition {
            record = record.partition(partition);
        }
        if let Some(value) = outgoing.value {
            record = record.payload(value);
        }
        let headers = match (outgoing.headers, outgoing.time) {
            (headers, None) => headers,
            (headers, Some(time)) => Some(
                headers
                    .unwrap_or_else(|| OwnedHeaders::new_with_capacity(1))
                    .insert(Header {
                        key: TIME_HEADER,
                        value: Some(&time.to_be_bytes()),
                    }),
            ),
        };
        if let Some(headers) = headers {
            record = record.headers(headers);
        }
        if let Some(transaction) = &self.transaction {
            // Before the send: a commit that sees no record may leave out the input offsets.
            transaction.record_sent();
        }
        let mut deadline = None;
        loop {
            match self.inner.send(record) {
                Ok(()) => return Ok(()),
                Err((error @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    let deadline = *deadline.get_or_insert_with(|| Instant::now() + queue_timeout);
                    if Instant::now() >= deadline {
                        return Err((error, queue_timeout));
                    }
                    // The producer's own thread drains the queue; give it a moment.
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err((error, _)) => return Err((error, Duration::ZERO)),
            }
        }
    }

    /// Sends an output record (a tombstone when `value` is `None`) to `partition` of `topic`.
    /// Its delivery is checked by [`flush`](Self::flush).
    pub fn send_output(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
        queue_timeout: Duration,
    ) -> Result<(), ChangelogError> {
        self.send_routed(
            Outgoing {
                topic,
                partition: Some(partition),
                key,
                value,
                headers: None,
                time: None,
            },
            OUTPUT_OPAQUE,
            queue_timeout,
        )
        .map_err(|(source, _)| ChangelogError::Kafka {
            topic: topic.to_string(),
            partition,
            operation: "send output",
            source,
        })?;
        self.outputs.lock().sent += 1;
        Ok(())
    }

    /// Sends a record with `headers` to `topic`, partitioned by librdkafka's partitioner (a
    /// dead-letter record: the failed input's key and value, headers naming the failure). Its
    /// delivery is checked by [`flush`](Self::flush), like an output's, and under a transaction
    /// it is part of it.
    pub fn send_with_headers(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, &[u8])],
        queue_timeout: Duration,
    ) -> Result<(), ChangelogError> {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (name, value) in headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(*value),
            });
        }
        self.send_routed(
            Outgoing {
                topic,
                partition: None,
                key: key.unwrap_or_default(),
                value,
                headers: Some(owned),
                time: None,
            },
            OUTPUT_OPAQUE,
            queue_timeout,
        )
        .map_err(|(source, _)| ChangelogError::Kafka {
            topic: topic.to_string(),
            partition: -1,
            operation: "send a dead-letter record",
            source,
        })?;
        self.outputs.lock().sent += 1;
        Ok(())
    }

    /// Waits until the broker acknowledged every output sent so far; fails if one was not
    /// delivered. Changelog records are waited for by their stores' commits.
    ///
    /// Not librdkafka's flush: that serves delivery reports on the calling thread while the
    /// producer's own thread serves them too, and two threads handing out reports can deliver a
    /// partition's acknowledgements out of order (seen: the stores' order check caught it).
    /// Batches go out after the producer's linger (1 ms by default) instead.
    pub fn flush(&self, timeout: Duration) -> Result<(), ChangelogError> {
        let deadline = Instant::now() + timeout;
        let mut counts = self.outputs.lock();
        loop {
            if let Some((message, code)) = &counts.failed {
                return Err(ChangelogError::OutputFailed {
                    message: message.clone(),
                    code: *code,
                });
            }
            if counts.settled >= counts.sent {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ChangelogError::OutputFailed {
                    message: format!(
                        "{} outputs not acknowledged within {timeout:?}",
                        counts.sent - counts.settled
                    ),
                    code: None,
                });
            }
            counts.waiters += 1;
            counts = wait_timeout(&self.outputs.changed, counts, left);
            counts.waiters -= 1;
        }
    }

    /// Outputs sent, and settled (delivered or failed), so far.
    pub fn outputs(&self) -> (u64, u64) {
        let counts = self.outputs.lock();
        (counts.sent, counts.settled)
    }

    /// Records queued or in flight.
    pub fn in_flight(&self) -> i32 {
        self.inner.in_flight_count()
    }
}

/// One record on its way to librdkafka's queue: no partition lets the producer's partitioner
/// choose, no value is a tombstone.
struct Outgoing<'a> {
    topic: &'a str,
    partition: Option<i32>,
    key: &'a [u8],
    value: Option<&'a [u8]>,
    headers: Option<OwnedHeaders>,
    /// The write's event time (ms), sent in the [`TIME_HEADER`] header.
    time: Option<i64>,
}

/// The header a changelog record of a timed write carries: the write's event time, 8 bytes
/// big-endian (a window store's stream time when it wrote). A header and not the record's
/// timestamp: that stays the wall clock, so a topic that also deletes by time
/// (`compact,delete`) keeps a record for its retention after it was written, however old the
/// data's event time (a replay of last year's input), and Kafka Streams, which reads window
/// times from keys, ignores it.
pub const TIME_HEADER: &str = "kstate.time";
