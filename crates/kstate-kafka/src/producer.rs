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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kstate_core::PoisonReason;
use kstate_core::sync::{lock, read, wait_timeout, write};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};

use crate::config::{ChangelogConfig, ProducerConfig};
use crate::error::ChangelogError;
use crate::transaction_member::{Transaction, TransactionMember};

/// What the broker has acknowledged so far.
#[derive(Debug, Default)]
struct Acks {
    /// Every record with a sequence number up to this one is acknowledged.
    acked_seq: u64,
    /// The offset of record `acked_seq`.
    last_offset: Option<i64>,
    /// A commit waiting for the offset of this sequence number.
    watch: Option<u64>,
    watched_offset: Option<i64>,
    /// The offset the next acknowledged record must have: the restore's end, then the last
    /// acknowledged offset + 1. `None` until the restore has ended (nothing is sent before).
    next_offset: Option<i64>,
    /// Why the changelog can no longer be trusted, once it cannot.
    poisoned: Option<PoisonReason>,
    /// Threads waiting on `changed`. Acknowledgements wake them only when there are any: most
    /// records have no waiter, and a wake is a system call per record.
    waiters: u32,
    /// Under a transaction: the records of an aborted transaction, whose delivery reports (the
    /// purge's failures, a late success) no longer count.
    aborted: Option<(u64, u64)>,
    /// Under a transaction: an abort is under way; every report is of an aborted record.
    aborting: bool,
    /// Under a transaction: a transaction committed and no record landed since, so the next
    /// one may land past `next_offset` if the coordinator wrote its marker more than once.
    after_marker: bool,
    /// Offsets `from..to` that the first record after a marker skipped: markers only, unless
    /// another writer's records are there; the commit checks before it applies
    /// ([`take_marker_gaps`](AckTracker::take_marker_gaps)).
    marker_gaps: Vec<MarkerGap>,
}

/// Offsets between a store's commit marker and its next record, `from..to`, which must hold
/// nothing but more markers (see [`crate::marker_gap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkerGap {
    /// Where the store's next record was expected.
    pub(crate) from: i64,
    /// Where it landed.
    pub(crate) to: i64,
}

/// Shared between the producer's delivery callback and the store.
#[derive(Debug)]
pub(crate) struct AckTracker {
    acks: Mutex<Acks>,
    changed: Condvar,
    /// Set once `poisoned` is, so that every send can check it without taking the lock the
    /// delivery callback takes for every record.
    is_poisoned: AtomicBool,
    /// `topic/partition`, for the log.
    changelog: String,
    /// `kstate_changelog_acked_offset` of this partition, registered once: setting it is an
    /// atomic store, cheap enough for every acknowledgement.
    acked_offset: metrics::Gauge,
}

impl AckTracker {
    /// The tracker of `topic`'s partition `partition`.
    pub(crate) fn new(topic: &str, partition: i32) -> Self {
        AckTracker {
            acks: Mutex::default(),
            changed: Condvar::new(),
            is_poisoned: AtomicBool::new(false),
            changelog: format!("{topic}/{partition}"),
            acked_offset: metrics::gauge!(
                "kstate_changelog_acked_offset",
                "topic" => topic.to_string(),
                "partition" => partition.to_string()
            ),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Acks> {
        lock(&self.acks)
    }

    /// Records why the changelog can no longer be trusted (the first reason wins). Also while
    /// an abort is under way: that the abort's purge must not poison is decided where its
    /// failures arrive ([`failed`](Self::failed)), and a failure of the abort itself
    /// (`TransactionMember::producer_failed`) must poison, or the stores would go on serving
    /// the transaction that was to be dropped.
    fn set_poisoned(&self, acks: &mut Acks, reason: PoisonReason) {
        if acks.poisoned.is_none() {
            tracing::error!(changelog = %self.changelog, %reason, "changelog poisoned");
            acks.poisoned = Some(reason);
            self.is_poisoned.store(true, Ordering::Release);
        }
        self.changed.notify_all();
    }

    pub(crate) fn poison(&self, reason: PoisonReason) {
        let mut acks = self.lock();
        self.set_poisoned(&mut acks, reason);
    }

    /// Record `...seq_low` was not delivered: poisons, unless it belongs to an aborted
    /// transaction or to the one an abort is dropping (the purge fails every queued record).
    fn failed(&self, seq_low: u64, reason: PoisonReason) {
        let mut acks = self.lock();
        if !acks.aborting && !acks.is_aborted(seq_low) {
            self.set_poisoned(&mut acks, reason);
        }
    }

    /// The first record sent from now on must land at `offset` (the restore's end), each next one
    /// right after its predecessor. Under a transaction (`transactional`) the first may land
    /// further on past markers only, as after a commit: a transaction that an earlier instance
    /// of the task left open (it was killed) is aborted by the coordinator when it fences that
    /// instance or the transaction times out, which can be after the restore read the end, and
    /// its abort marker then lands in between. Such a gap is kept, and checked to hold markers
    /// only before the commit that would move past it ([`take_marker_gaps`](Self::take_marker_gaps)).
    pub(crate) fn expect_offsets_from(&self, offset: i64, transactional: bool) {
        let mut acks = self.lock();
        acks.next_offset = Some(offset);
        acks.after_marker = transactional;
    }

    pub(crate) fn poisoned(&self) -> Option<PoisonReason> {
        if !self.is_poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.lock().poisoned.clone()
    }

    /// Waits on `changed` for at most `left`, counted as a waiter meanwhile.
    fn wait<'a>(&self, mut acks: MutexGuard<'a, Acks>, left: Duration) -> MutexGuard<'a, Acks> {
        acks.waiters += 1;
        let mut acks = wait_timeout(&self.changed, acks, left);
        acks.waiters -= 1;
        acks
    }

    /// Every record up to this sequence number is acknowledged.
    pub(crate) fn acked_seq(&self) -> u64 {
        self.lock().acked_seq
    }

    /// Waits until every record up to `seq` is acknowledged.
    pub(crate) fn wait_for(&self, seq: u64, timeout: Duration) -> Result<(), PoisonReason> {
        let deadline = Instant::now() + timeout;
        let mut acks = self.lock();
        loop {
            if let Some(reason) = &acks.poisoned {
                return Err(reason.clone());
            }
            if acks.acked_seq >= seq {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoisonReason::Timeout {
                    waiting_for: format!("the acknowledgement of record {seq}"),
                    waited: timeout,
                });
            }
            acks = self.wait(acks, left);
        }
    }

    /// The offset of record `seq`, waiting for its acknowledgement. Must be called before any
    /// record after `seq` is sent (the store calls it with its state lock held while
    /// registering), then waited on with [`AckTracker::wait_for_watched`].
    pub(crate) fn watch(&self, seq: u64) -> Result<Option<i64>, PoisonReason> {
        let mut acks = self.lock();
        if let Some(reason) = &acks.poisoned {
            return Err(reason.clone());
        }
        if acks.acked_seq == seq {
            // Nothing sent since the restore (a commit of local keys only, such as a TTL
            // store's expiry index): the position is the restore's end.
            let restored_end = acks.next_offset.map(|next| next - 1);
            if let Some(offset) = acks.last_offset.or(restored_end) {
                return Ok(Some(offset));
            }
        }
        acks.watch = Some(seq);
        acks.watched_offset = None;
        Ok(None)
    }

    /// The offset of record `seq`, the last one sent: [`watch`](Self::watch), then
    /// [`wait_for_watched`](Self::wait_for_watched) if it is not acknowledged yet. Only for a
    /// caller that may wait while holding off other sends.
    pub(crate) fn offset_of(&self, seq: u64, timeout: Duration) -> Result<i64, PoisonReason> {
        match self.watch(seq)? {
            Some(offset) => Ok(offset),
            None => self.wait_for_watched(timeout),
        }
    }

    pub(crate) fn wait_for_watched(&self, timeout: Duration) -> Result<i64, PoisonReason> {
        let deadline = Instant::now() + timeout;
        let mut acks = self.lock();
        loop {
            if let Some(reason) = &acks.poisoned {
                return Err(reason.clone());
            }
            if let Some(offset) = acks.watched_offset {
                acks.watch = None;
                return Ok(offset);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoisonReason::Timeout {
                    waiting_for: "the acknowledgement of a commit's last record".into(),
                    waited: timeout,
                });
            }
            acks = self.wait(acks, left);
        }
    }

    /// The offset of the last acknowledged record, once every record up to `sent` is
    /// acknowledged (a transaction's records, after `commit_transaction` returned).
    pub(crate) fn all_acknowledged(&self, sent: u64) -> Result<Option<i64>, PoisonReason> {
        let acks = self.lock();
        if let Some(reason) = &acks.poisoned {
            return Err(reason.clone());
        }
        if acks.acked_seq != sent {
            return Err(PoisonReason::OutOfOrder {
                message: format!(
                    "the transaction committed with records {}..={sent} unacknowledged",
                    acks.acked_seq + 1
                ),
            });
        }
        Ok(acks.last_offset)
    }

    /// A transaction this store wrote records to committed: its partition holds a commit
    /// marker after them, so the next record lands one offset later, or further on if the
    /// transaction coordinator wrote the marker again (it retries a marker write whose leader
    /// moved): such a gap is recorded, to be checked for records before the next commit applies.
    pub(crate) fn transaction_committed(&self) {
        let mut acks = self.lock();
        if let Some(next) = &mut acks.next_offset {
            *next += 1;
            acks.after_marker = true;
        }
    }

    /// The gaps recorded since the last call: the commit that is about to apply the records
    /// after them must make sure they hold markers only.
    pub(crate) fn take_marker_gaps(&self) -> Vec<MarkerGap> {
        std::mem::take(&mut self.lock().marker_gaps)
    }

    /// An abort is starting: the purged records' failures must not poison.
    pub(crate) fn abort_starting(&self) {
        self.lock().aborting = true;
    }

    /// The transaction whose records were sequence numbers `first..=last` aborted: they count
    /// for nothing; a failure they caused is forgotten unless it means more than this
    /// transaction (another writer, acknowledgements out of order, a local write that failed).
    /// The next record's offset is unknown (the aborted records and the marker may or may not
    /// have landed); the one after it is checked again.
    pub(crate) fn transaction_aborted(&self, first: u64, last: u64) {
        let mut acks = self.lock();
        acks.aborting = false;
        if last >= first {
            acks.aborted = Some((first, last));
        }
        acks.acked_seq = acks.acked_seq.max(last);
        acks.watch = None;
        acks.watched_offset = None;
        acks.next_offset = None;
        acks.after_marker = false;
        acks.marker_gaps.clear();
        if acks
            .poisoned
            .as_ref()
            .is_some_and(PoisonReason::is_transient)
        {
            acks.poisoned = None;
            self.is_poisoned.store(false, Ordering::Release);
        }
        self.changed.notify_all();
    }

    /// Record `acked_seq + 1` (whose sequence number ends in the bits `seq_low`) landed at
    /// `offset`.
    fn delivered(&self, seq_low: u64, offset: i64) {
        let mut acks = self.lock();
        if acks.poisoned.is_some() || acks.aborting || acks.is_aborted(seq_low) {
            // Past a failed record nothing counts as acknowledged: a commit must never cover it.
            // An aborted transaction's records count for nothing either.
            return;
        }
        let seq = acks.acked_seq + 1;
        if seq & SEQ_MASK != seq_low || offset < 0 {
            // The idempotent producer acknowledges in order with real offsets; anything else
            // breaks the offset bookkeeping, so refuse to go on rather than store a wrong position.
            let reason = PoisonReason::OutOfOrder {
                message: format!(
                    "acknowledgement for record ...{seq_low} (offset {offset}) arrived when record \
                     {seq} was due"
                ),
            };
            self.set_poisoned(&mut acks, reason);
            return;
        }
        if let Some(expected) = acks.next_offset
            && offset != expected
        {
            if acks.after_marker && offset > expected {
                acks.marker_gaps.push(MarkerGap {
                    from: expected,
                    to: offset,
                });
            } else {
                let reason = PoisonReason::ForeignWrite {
                    expected_offset: expected,
                    actual_offset: offset,
                };
                self.set_poisoned(&mut acks, reason);
                return;
            }
        }
        acks.after_marker = false;
        acks.next_offset = Some(offset + 1);
        acks.acked_seq = seq;
        acks.last_offset = Some(offset);
        if acks.watch == Some(seq) {
            acks.watched_offset = Some(offset);
        }
        self.acked_offset.set(offset as f64);
        if acks.waiters > 0 {
            self.changed.notify_all();
        }
    }
}

impl Acks {
    /// Whether the record whose sequence number ends in `seq_low` belongs to the last aborted
    /// transaction.
    fn is_aborted(&self, seq_low: u64) -> bool {
        let Some((first, last)) = self.aborted else {
            return false;
        };
        // The full sequence number with these low bits at or below `last`.
        let mut seq = (last & !SEQ_MASK) | seq_low;
        if seq > last {
            seq = seq.wrapping_sub(SEQ_MASK + 1);
        }
        seq >= first && seq <= last
    }
}

/// Delivery opaques are plain integers, so that a record costs no allocation and no reference
/// count on the hot path: 0 is an output; anything else is a store's route id (a slot in the
/// router's table, never reused while the store exists) above `SEQ_BITS`, and the low `SEQ_BITS`
/// bits of the record's sequence number. Acknowledgements of one store arrive in order, so its
/// tracker knows which full sequence number the low bits belong to.
const OUTPUT_OPAQUE: usize = 0;
const SEQ_BITS: u32 = 40;
pub(crate) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Route ids use the bits above `SEQ_BITS` (one spare).
const MAX_ROUTE: u32 = (1 << (usize::BITS - SEQ_BITS - 1)) - 1;
const _: () = assert!(usize::BITS == 64, "delivery opaques need 64-bit usize");

/// The stores sending through one producer, by route id.
#[derive(Default)]
pub(crate) struct Routes {
    last: u32,
    trackers: std::collections::HashMap<u32, Arc<AckTracker>>,
    /// Under a transaction: the stores whose overlays its commit applies and its abort drops.
    pub(crate) members: std::collections::HashMap<u32, std::sync::Weak<dyn TransactionMember>>,
}

/// Outputs sent through a [`SharedProducer`] and what became of them.
#[derive(Debug, Default)]
pub(crate) struct OutputAcks {
    counts: Mutex<OutputCounts>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct OutputCounts {
    sent: u64,
    /// Delivered or failed: no longer in flight.
    settled: u64,
    /// The first output that could not be delivered: why, and the client's error code.
    failed: Option<(String, Option<RDKafkaErrorCode>)>,
    waiters: u32,
}

impl OutputAcks {
    fn lock(&self) -> MutexGuard<'_, OutputCounts> {
        lock(&self.counts)
    }

    fn settled(&self, failure: Option<(String, Option<RDKafkaErrorCode>)>) {
        let mut counts = self.lock();
        counts.settled += 1;
        if counts.failed.is_none() {
            counts.failed = failure;
        }
        if counts.waiters > 0 {
            self.changed.notify_all();
        }
    }

    /// A transaction aborted: its outputs are gone, and so is their failure.
    pub(crate) fn forget(&self) {
        let mut counts = self.lock();
        counts.failed = None;
        counts.settled = counts.settled.max(counts.sent);
    }
}

/// The producer's context: routes delivery reports.
pub(crate) struct Router {
    outputs: Arc<OutputAcks>,
    routes: Arc<std::sync::RwLock<Routes>>,
}

impl ClientContext for Router {}

impl ProducerContext for Router {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        if opaque == OUTPUT_OPAQUE {
            let failure = result.as_ref().err().map(|(error, message)| {
                let text = format!(
                    "output to {}/{} was not delivered: {error}",
                    message.topic(),
                    message.partition()
                );
                (text, error.rdkafka_error_code())
            });
            self.outputs.settled(failure);
            return;
        }
        let route = (opaque >> SEQ_BITS) as u32;
        let seq_low = opaque as u64 & SEQ_MASK;
        let routes = read(&self.routes);
        // A store dropped with records in flight: nobody is waiting for them.
        let Some(tracker) = routes.trackers.get(&route) else {
            return;
        };
        match result {
            Ok(message) => tracker.delivered(seq_low, message.offset()),
            Err((error, message)) => tracker.failed(
                seq_low,
                PoisonReason::DeliveryFailed {
                    message: format!(
                        "changelog {}/{}: record ...{seq_low} was not delivered: {error}",
                        message.topic(),
                        message.partition()
                    ),
                },
            ),
        }
    }
}

impl ProducerConfig {
    /// The librdkafka settings of the producer [`SharedProducer::with_config`] builds from this
    /// configuration: the cluster's properties, `compression.type=lz4` unless they set one, and
    /// what the commit protocol depends on (`acks=all`, idempotence, at most 5 requests in
    /// flight, `enable.gapless.guarantee`), with this configuration's delivery timeout, linger
    /// and record limit. For a client that must send exactly as kstate's changelogs do (the
    /// bare-producer baseline of `rows_per_second`).
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_for(None)
    }

    /// The settings of the producer, transactional when `transaction` is given.
    fn client_config_for(&self, transaction: Option<&Transaction>) -> ClientConfig {
        let mut client = self.client.client_config();
        // Defaults a user may override through `client_property`.
        if self.client.get("compression.type").is_none() {
            client.set("compression.type", "lz4");
        }
        // What the commit protocol depends on: never overridden.
        let mut delivery_timeout = self.delivery_timeout;
        client
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("max.in.flight.requests.per.connection", "5");
        match transaction {
            // A record that fails after retries fails the producer: later records are never
            // delivered over a gap (librdkafka would otherwise go on past it).
            None => {
                client.set("enable.gapless.guarantee", "true");
            }
            // A record that fails fails its transaction, which aborts: nothing after it is
            // committed either. A record must time out before its transaction does (librdkafka
            // refuses a longer `message.timeout.ms`), so that the failure is ours to see and
            // abort on, not the broker's timeout abort: at most 90% of the transaction timeout.
            Some(transaction) => {
                delivery_timeout = delivery_timeout.min(transaction.timeout * 9 / 10);
                client.set("transactional.id", &transaction.id).set(
                    "transaction.timeout.ms",
                    transaction.timeout.as_millis().to_string(),
                );
            }
        }
        client
            .set(
                "message.timeout.ms",
                delivery_timeout.as_millis().to_string(),
            )
            .set(
                "linger.ms",
                format!("{}", self.linger.as_micros() as f64 / 1e3),
            )
            .set(
                "message.max.bytes",
                (self.max_record_bytes + crate::config::RECORD_OVERHEAD)
                    .max(1_000_000)
                    .to_string(),
            );
        client
    }
}

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

/// One store's side of a [`SharedProducer`]: its partition and its acknowledgements.
pub(crate) struct ChangelogProducer {
    producer: SharedProducer,
    pub(crate) tracker: Arc<AckTracker>,
    /// This store's route id, shifted into place for the delivery opaque.
    route: usize,
    topic: String,
    partition: i32,
}

impl ChangelogProducer {
    pub(crate) fn new(
        producer: SharedProducer,
        config: &ChangelogConfig,
    ) -> Result<Self, ChangelogError> {
        let tracker = Arc::new(AckTracker::new(&config.topic, config.partition));
        let id = {
            let mut routes = write(&producer.routes);
            // The next id not in use; ids are reused only after MAX_ROUTE more stores.
            let mut id = None;
            for _ in 0..MAX_ROUTE {
                routes.last = routes.last % MAX_ROUTE + 1;
                if !routes.trackers.contains_key(&routes.last) {
                    id = Some(routes.last);
                    break;
                }
            }
            let id = id.ok_or_else(|| ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: format!("more than {MAX_ROUTE} stores on one producer"),
            })?;
            routes.trackers.insert(id, tracker.clone());
            id
        };
        Ok(ChangelogProducer {
            producer,
            tracker,
            route: (id as usize) << SEQ_BITS,
            topic: config.topic.clone(),
            partition: config.partition,
        })
    }

    /// Queues one record (a tombstone when `value` is `None`) with sequence number `seq`. Waits
    /// while librdkafka's queue is full, up to `queue_timeout`; any other failure poisons, and a
    /// poisoned changelog takes no more records.
    pub(crate) fn send(
        &self,
        seq: u64,
        key: &[u8],
        value: Option<&[u8]>,
        time: Option<i64>,
        queue_timeout: Duration,
    ) -> Result<(), PoisonReason> {
        if let Some(reason) = self.tracker.poisoned() {
            return Err(reason);
        }
        let opaque = self.route | (seq & SEQ_MASK) as usize;
        let sent = self.producer.send_routed(
            Outgoing {
                topic: &self.topic,
                partition: Some(self.partition),
                key,
                value,
                headers: None,
                time,
            },
            opaque,
            queue_timeout,
        );
        let Err((error, waited)) = sent else {
            return Ok(());
        };
        let reason = if waited > Duration::ZERO {
            PoisonReason::Timeout {
                waiting_for: format!(
                    "room in the producer queue of changelog {}/{}",
                    self.topic, self.partition
                ),
                waited,
            }
        } else {
            PoisonReason::ClientFailed {
                message: format!(
                    "changelog {}/{}: send failed: {error}",
                    self.topic, self.partition
                ),
            }
        };
        self.tracker.poison(reason.clone());
        Err(reason)
    }

    /// Records queued or in flight in the shared producer.
    pub(crate) fn in_flight(&self) -> i32 {
        self.producer.in_flight()
    }

    /// The shared producer's transaction, if it is transactional.
    pub(crate) fn transaction(&self) -> Option<&Arc<Transaction>> {
        self.producer.transaction.as_ref()
    }

    /// Makes `member` (this store) part of every transaction of the producer.
    pub(crate) fn join_transactions(&self, member: std::sync::Weak<dyn TransactionMember>) {
        let id = (self.route >> SEQ_BITS) as u32;
        write(&self.producer.routes).members.insert(id, member);
    }
}

impl Drop for ChangelogProducer {
    /// Leaves the router (and the transaction): reports for records still in flight are dropped.
    fn drop(&mut self) {
        let id = (self.route >> SEQ_BITS) as u32;
        let mut routes = write(&self.producer.routes);
        routes.trackers.remove(&id);
        routes.members.remove(&id);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_after_a_commit_may_land_past_a_repeated_marker_and_the_gap_is_kept_for_the_commit()
    {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.transaction_committed(); // marker at 11
        tracker.delivered(2, 13); // a second marker at 12
        assert!(tracker.poisoned().is_none());
        assert_eq!(
            tracker.take_marker_gaps(),
            vec![MarkerGap { from: 12, to: 13 }]
        );
        assert!(tracker.take_marker_gaps().is_empty());
        // Within a transaction, records follow each other: a gap there is another writer.
        tracker.delivered(3, 15);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 14,
                actual_offset: 15
            })
        ));
    }

    /// Seen on the three-node cluster: the restore ended at 12065 after a killed instance's
    /// last marker; the coordinator then aborted that instance's open transaction, whose abort
    /// marker landed at 12065, and the new instance's first record at 12066.
    #[test]
    fn a_first_record_under_a_transaction_may_land_past_an_abort_marker_after_the_restore() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 11); // an earlier instance's abort marker at 10
        assert!(tracker.poisoned().is_none(), "{:?}", tracker.poisoned());
        assert_eq!(
            tracker.take_marker_gaps(),
            vec![MarkerGap { from: 10, to: 11 }]
        );
        // Then records follow each other again.
        tracker.delivered(2, 13);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 12,
                actual_offset: 13
            })
        ));
    }

    #[test]
    fn a_first_record_without_a_transaction_must_land_at_the_restores_end() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, 11); // no markers without transactions: another writer's record
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 10,
                actual_offset: 11
            })
        ));
        assert!(tracker.take_marker_gaps().is_empty());
    }

    #[test]
    fn a_record_that_lands_before_its_expected_offset_after_a_commit_is_another_writers() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.transaction_committed();
        tracker.delivered(2, 11); // where the marker must be
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite { .. })
        ));
    }

    #[test]
    fn sequence_numbers_keep_counting_past_the_bits_the_opaque_carries() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.lock().acked_seq = SEQ_MASK - 1;
        tracker.expect_offsets_from(100, true);
        // Record SEQ_MASK, then SEQ_MASK + 1, whose low bits are 0.
        tracker.delivered(SEQ_MASK, 100);
        tracker.delivered(0, 101);
        assert_eq!(tracker.acked_seq(), SEQ_MASK + 1);
        assert!(tracker.poisoned().is_none());
        // Low bits that are not the next record's: out of order, poisoned.
        tracker.delivered(5, 102);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::OutOfOrder { .. })
        ));
    }
}
