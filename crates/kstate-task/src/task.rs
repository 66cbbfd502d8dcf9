//! A task: partition *p* of every input, its processor, and its stores.
//!
//! # Commit (at least once), per task
//! 1. [`prepare_commit`](Task::prepare_commit): coalesced outputs are sent and coalesced store
//!    writes go to the logged stores (and so to the changelog);
//! 2. the worker flushes its producer once for all its tasks: outputs and changelog records
//!    acknowledged;
//! 3. [`commit_stores`](Task::commit_stores): each store writes its overlay and its changelog
//!    offset into RocksDB (no broker round trip left: step 2 waited for it);
//! 4. the worker commits the input offsets.
//!
//! A crash anywhere replays the input from the last committed offset, whose effects on the
//! stores may then be applied twice (a count counts such records twice): at-least-once. The
//! stores themselves always restore to exactly what their changelog acknowledged.
//!
//! # Input offsets
//! Per input topic the task knows the next offset to process and the offset the group has
//! committed for it, as far as it knows: an offset commit that failed leaves the two apart, so
//! the next commit sends it again (a graceful hand-over never leaves the next owner an older
//! offset than the work already in the stores). A task starts from its committed offsets, so
//! an exactly-once commit always has an offset to carry (see the worker's commit paths).
//!
//! # Records handed over again
//! After a partition is resumed, librdkafka can hand over records the task already processed
//! (a partition paused before its first record was consumed resumes from the committed offset:
//! librdkafka #672, #1802). Right after a resume, records below the next offset are skipped
//! (`kstate_task_redelivered_records`); once a record at or past it arrives, every record is
//! processed, even one below it: an input log truncated by an unclean leader election, or
//! offsets reset, reuse offsets, and those records are new.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate_core::{BoxError, KeyValueStore};
use kstate_kafka::{LoggedStore, RestoredStore, SharedProducer};
use rdkafka::{Offset, TopicPartitionList};

use crate::cache::CoalescingStore;
use crate::config::StoreSpec;
use crate::error::{ProcessorStep, TaskError, panic_message};
use crate::ids::{InputPartition, Record, TaskId};
use crate::processor::ProcessorFactory;
use crate::processor::{Context, Latest, Processor};
use crate::status::CommittedSoFar;
use crate::stores::{SWEEP_PER_COMMIT, TaskStore, Timed};
use crate::timers::Timers;

/// How long an offset an asynchronous commit sent is not sent again without a confirmation.
/// rust-rdkafka 0.39 confirms none (fede1024/rust-rdkafka#856), so this is how often an idle
/// task's offset is committed again, in case the commit failed unseen; a revocation and the
/// shutdown commit every offset anyway, and the shutdown's is confirmed from the group.
pub(crate) const RESEND_UNCONFIRMED: Duration = Duration::from_secs(10);

/// One input partition's offsets, as the task knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InputOffset {
    /// The next offset to process: the last processed + 1, or the committed offset.
    next: i64,
    /// The offset the group holds, as far as this task knows.
    committed: Option<i64>,
    /// The offset an asynchronous commit sent, and when; not confirmed (yet).
    sent: Option<(i64, Instant)>,
    /// Resumed, and no record at or past `next` arrived since.
    catching_up: bool,
}

/// What became of a record given to [`Task::process`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Processed {
    /// The processor ran on it.
    Done,
    /// Processed here already: handed over again after a resume.
    Redelivered,
}

/// A running task.
pub(crate) struct Task {
    pub(crate) id: TaskId,
    stores: Vec<TaskStore>,
    processor: Box<dyn Processor>,
    /// Per input topic.
    offsets: BTreeMap<String, InputOffset>,
    timers: Timers,
    stream_time: Option<i64>,
    latest: Latest,
    /// Records processed and the input position, as of the last commit.
    pub(crate) committed: Arc<CommittedSoFar>,
    processed_since_commit: u64,
    /// The processor ran since the last commit (it may have written or sent something).
    touched: bool,
    flush_interval: Duration,
    delivery_timeout: Duration,
}

impl Task {
    /// Attaches the restored stores to the worker's producer and starts the processor, from
    /// the `committed` input offsets (the next offset to read per input topic; a topic missing
    /// here has none).
    pub(crate) fn start(
        id: TaskId,
        specs: &[StoreSpec],
        restored: Vec<RestoredStore>,
        producer: &SharedProducer,
        factory: &ProcessorFactory,
        delivery_timeout: Duration,
        committed: &BTreeMap<String, i64>,
    ) -> Result<Task, TaskError> {
        let mut stores = Vec::with_capacity(specs.len());
        for (spec, restored) in specs.iter().zip(restored) {
            let logged = Arc::new(
                LoggedStore::attach(restored, producer)
                    .map_err(|source| TaskError::restore(id, source))?,
            );
            let cache = spec
                .options
                .coalesce
                .then(|| CoalescingStore::new(logged.clone()));
            let timed = Timed::open(&spec.kind, &logged).map_err(|source| TaskError::Store {
                task: id,
                store: spec.name.clone(),
                source: Box::new(source),
            })?;
            stores.push(TaskStore {
                name: spec.name.clone(),
                kind: spec.kind,
                logged,
                cache,
                timed,
            });
        }
        let flush_interval = stores
            .iter()
            .map(|s| s.logged.flush_interval())
            .min()
            .unwrap_or(Duration::from_secs(3600));
        let mut task = Task {
            id,
            stores,
            processor: factory(id),
            offsets: BTreeMap::new(),
            timers: Timers::default(),
            stream_time: None,
            latest: Latest::new(),
            committed: Arc::default(),
            processed_since_commit: 0,
            touched: false,
            flush_interval,
            delivery_timeout,
        };
        task.start_from(committed);
        task.run(producer, || ProcessorStep::Init, |p, ctx| p.init(ctx))?;
        Ok(task)
    }

    fn start_from(&mut self, committed: &BTreeMap<String, i64>) {
        self.offsets = committed
            .iter()
            .map(|(topic, &offset)| {
                let at = InputOffset {
                    next: offset,
                    committed: Some(offset),
                    sent: None,
                    catching_up: false,
                };
                (topic.clone(), at)
            })
            .collect();
    }

    /// The logged stores, for the query API.
    pub(crate) fn logged_stores(&self) -> Vec<(String, Arc<LoggedStore>)> {
        self.stores
            .iter()
            .map(|s| (s.name.clone(), s.logged.clone()))
            .collect()
    }

    /// Calls the processor with a context over the task's other fields. A panic is caught and
    /// becomes [`TaskError::Panicked`]: it never unwinds through the worker (whose consumer's
    /// drop would run the revocation, and commit).
    fn run(
        &mut self,
        producer: &SharedProducer,
        step: impl FnOnce() -> ProcessorStep,
        f: impl FnOnce(&mut dyn Processor, &mut Context<'_>) -> Result<(), BoxError>,
    ) -> Result<(), TaskError> {
        self.touched = true;
        let Task {
            id,
            stores,
            processor,
            latest,
            timers,
            stream_time,
            delivery_timeout,
            ..
        } = self;
        let mut ctx = Context {
            task: *id,
            stores,
            producer,
            latest,
            timers,
            stream_time: *stream_time,
            delivery_timeout: *delivery_timeout,
        };
        let processor = processor.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(processor, &mut ctx))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(TaskError::Processor {
                task: *id,
                step: step(),
                source,
            }),
            Err(payload) => Err(TaskError::Panicked {
                task: *id,
                step: step(),
                message: panic_message(&*payload),
            }),
        }
    }

    fn step_of(record: &Record<'_>) -> ProcessorStep {
        ProcessorStep::Record {
            topic: record.topic.to_string(),
            partition: record.partition,
            offset: record.offset,
        }
    }

    /// Runs the processor on one record, then the stream-time timers it made due.
    pub(crate) fn process(
        &mut self,
        producer: &SharedProducer,
        record: &Record<'_>,
    ) -> Result<Processed, TaskError> {
        if let Some(at) = self.offsets.get_mut(record.topic) {
            if record.offset >= at.next {
                at.catching_up = false;
            } else if at.catching_up {
                metrics::counter!("kstate_task_redelivered_records").increment(1);
                return Ok(Processed::Redelivered);
            } else {
                tracing::warn!(
                    task = %self.id,
                    topic = record.topic,
                    offset = record.offset,
                    next = at.next,
                    "input offsets went back (the log was truncated or the offsets reset): processing"
                );
            }
        }
        // A record the processor refuses (bad input the error policy may skip) moves no
        // stream time: a skipped timestamp far ahead must not fire every stream-time timer.
        let before = self.stream_time;
        if let Some(ts) = record.timestamp {
            self.stream_time = Some(self.stream_time.map_or(ts, |t| t.max(ts)));
        }
        let ran = self.run(
            producer,
            || Self::step_of(record),
            |processor, ctx| processor.process(ctx, record),
        );
        if ran.is_err() {
            self.stream_time = before;
        }
        ran?;
        self.advance(record);
        if self.timers.has_stream() {
            self.fire_timers(producer, Instant::now(), true)?;
        }
        Ok(Processed::Done)
    }

    /// Counts `record` as processed without running the processor on it (the error policy
    /// skipped it, or dead-lettered it).
    pub(crate) fn skip(&mut self, record: &Record<'_>) {
        self.touched = true;
        self.advance(record);
    }

    /// Where each input goes on: the record after the last this task took, or its start offset
    /// in `starts` for an input it took none of yet.
    pub(crate) fn next_offsets(&self, starts: &BTreeMap<String, i64>) -> Vec<(String, i64)> {
        starts
            .iter()
            .map(|(topic, start)| {
                let next = self.offsets.get(topic).map_or(*start, |at| at.next);
                (topic.clone(), next)
            })
            .collect()
    }

    fn advance(&mut self, record: &Record<'_>) {
        let next = record.offset + 1;
        match self.offsets.get_mut(record.topic) {
            Some(at) => at.next = next,
            None => {
                let at = InputOffset {
                    next,
                    committed: None,
                    sent: None,
                    catching_up: false,
                };
                self.offsets.insert(record.topic.to_string(), at);
            }
        }
        self.processed_since_commit += 1;
    }

    /// The task's partitions are fetched again: records below the next offset may come again.
    pub(crate) fn resumed(&mut self) {
        for at in self.offsets.values_mut() {
            at.catching_up = true;
        }
    }

    /// When the next wall-clock timer is due.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        self.timers.next_wall()
    }

    /// Fires the due timers (wall clock, and stream time when `stream` is set).
    pub(crate) fn fire_timers(
        &mut self,
        producer: &SharedProducer,
        now: Instant,
        stream: bool,
    ) -> Result<(), TaskError> {
        let stream_time = if stream { self.stream_time } else { None };
        for timer in self.timers.due(now, stream_time) {
            self.run(
                producer,
                || ProcessorStep::Timer {
                    timer: timer.id,
                    time_ms: timer.time_ms,
                },
                |processor, ctx| processor.on_timer(ctx, &timer),
            )?;
        }
        Ok(())
    }

    /// Step 1 of a commit: TTL stores sweep their expired keys (the tombstones join this
    /// commit), then coalesced outputs and store writes go out.
    pub(crate) fn prepare_commit(&mut self, producer: &SharedProducer) -> Result<(), TaskError> {
        for store in &self.stores {
            if let Timed::Ttl(ttl) = &store.timed {
                ttl.sweep(SWEEP_PER_COMMIT)
                    .map_err(|source| self.store_error(store, source))?;
            }
        }
        for ((topic, partition, key), value) in std::mem::take(&mut self.latest) {
            producer
                .send_output(
                    &topic,
                    partition,
                    &key,
                    value.as_deref(),
                    self.delivery_timeout,
                )
                .map_err(|source| TaskError::Output {
                    task: self.id,
                    topic: topic.clone(),
                    source: Box::new(source),
                })?;
        }
        for store in &self.stores {
            if let Some(cache) = &store.cache {
                cache
                    .drain()
                    .map_err(|source| self.store_error(store, source))?;
            }
        }
        Ok(())
    }

    fn store_error(&self, store: &TaskStore, source: kstate_core::Error) -> TaskError {
        TaskError::Store {
            task: self.id,
            store: store.name.clone(),
            source: Box::new(source),
        }
    }

    /// Step 3: every store writes its acknowledged overlay and offset into RocksDB, and flushes
    /// its memtables when its flush interval has passed. With a `deadline`, a store that is
    /// still waiting for its changelog's acknowledgements then gives up without being poisoned
    /// ([`kstate_core::Error::Timeout`]): a revocation drops the task, and its input replays.
    pub(crate) fn commit_stores(&mut self, deadline: Option<Instant>) -> Result<(), TaskError> {
        let flush = self.flush_due();
        for store in &self.stores {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let done = match (flush, left) {
                (true, None) => store.logged.flush(),
                (false, None) => store.logged.commit(),
                (true, Some(left)) => store.logged.flush_within(left),
                (false, Some(left)) => store.logged.commit_within(left),
            };
            done.map_err(|source| self.store_error(store, source))?;
        }
        self.count_committed();
        Ok(())
    }

    /// Whether the flush interval has passed since the RocksDB under the task's stores last
    /// flushed. That RocksDB is shared by every task of the process and a flush covers them all,
    /// so the process flushes once per interval, not once per task.
    fn flush_due(&self) -> bool {
        self.stores
            .first()
            .is_some_and(|s| s.logged.flushed_at().elapsed() >= self.flush_interval)
    }

    /// Whether the processor ran since the last commit.
    pub(crate) fn touched(&self) -> bool {
        self.touched
    }

    /// Whether the task took a record (processed or skipped it) since its last commit.
    pub(crate) fn progressed(&self) -> bool {
        self.processed_since_commit > 0
    }

    fn count_committed(&mut self) {
        self.touched = false;
        self.committed.add(
            self.processed_since_commit,
            self.offsets
                .iter()
                .map(|(topic, at)| (topic.as_str(), at.next)),
        );
        metrics::counter!("kstate_task_records_processed").increment(self.processed_since_commit);
        self.processed_since_commit = 0;
    }

    /// Exactly-once, after the transaction committed (it applied the stores' overlays): counts
    /// the records it covered, and flushes the stores' memtables when their flush interval has
    /// passed.
    pub(crate) fn transaction_committed(&mut self) -> Result<(), TaskError> {
        if self.flush_due() {
            for store in &self.stores {
                store
                    .logged
                    .flush()
                    .map_err(|source| self.store_error(store, source))?;
            }
        }
        self.count_committed();
        Ok(())
    }

    /// Exactly-once, after the transaction aborted (its stores dropped their overlays): the task
    /// starts again from `committed` (the next offset to read per input topic, as committed):
    /// a new processor, empty caches, no pending outputs or timers. The worker seeks the input.
    pub(crate) fn rewind(
        &mut self,
        producer: &SharedProducer,
        factory: &ProcessorFactory,
        committed: &BTreeMap<String, i64>,
    ) -> Result<(), TaskError> {
        for store in &mut self.stores {
            if store.cache.is_some() {
                store.cache = Some(CoalescingStore::new(store.logged.clone()));
            }
            // What a store of time holds in memory (its stream time) may be ahead of the
            // aborted writes' state: read again from the store.
            store.timed =
                Timed::open(&store.kind, &store.logged).map_err(|source| TaskError::Store {
                    task: self.id,
                    store: store.name.clone(),
                    source: Box::new(source),
                })?;
        }
        self.latest = Latest::new();
        self.timers = Timers::default();
        self.stream_time = None;
        self.processed_since_commit = 0;
        self.start_from(committed);
        self.processor = factory(self.id);
        self.run(producer, || ProcessorStep::Init, |p, ctx| p.init(ctx))
    }

    /// The offsets the group does not have yet, as far as this task knows (moved since the
    /// last commit, or sent in a commit that failed).
    pub(crate) fn pending_offsets(&self, tpl: &mut TopicPartitionList) -> usize {
        let mut n = 0;
        for (topic, at) in &self.offsets {
            let in_flight = at
                .sent
                .is_some_and(|(o, when)| o == at.next && when.elapsed() < RESEND_UNCONFIRMED);
            if at.committed != Some(at.next) && !in_flight {
                n += add_offset(tpl, topic, self.id.partition, at.next);
            }
        }
        n
    }

    /// Every input offset the task knows (revocation and shutdown commit them all: what the
    /// stores hold must never be ahead of what the group holds).
    pub(crate) fn current_offsets(&self, tpl: &mut TopicPartitionList) -> usize {
        let mut n = 0;
        for (topic, at) in &self.offsets {
            n += add_offset(tpl, topic, self.id.partition, at.next);
        }
        n
    }

    /// Every input offset the task knows, by partition: what its last commit sends.
    pub(crate) fn positions(&self) -> Vec<(InputPartition, i64)> {
        self.offsets
            .iter()
            .map(|(topic, at)| (InputPartition::new(topic, self.id.partition), at.next))
            .collect()
    }

    /// An asynchronous commit sent these offsets: they are not pending again until
    /// [`RESEND_UNCONFIRMED`] has passed without a confirmation, or the commit failed.
    pub(crate) fn offsets_sent(&mut self, tpl: &TopicPartitionList) {
        let now = Instant::now();
        self.each_own(tpl, |at, offset, _| at.sent = Some((offset, now)));
    }

    /// An asynchronous commit of these offsets failed: they are pending again.
    pub(crate) fn offsets_commit_failed(&mut self, tpl: &TopicPartitionList) {
        self.each_own(tpl, |at, offset, _| {
            if at.sent.is_some_and(|(o, _)| o == offset) {
                at.sent = None;
            }
        });
    }

    /// The group now holds these offsets (a commit that included them succeeded).
    pub(crate) fn offsets_committed(&mut self, tpl: &TopicPartitionList) {
        self.each_own(tpl, |at, offset, failed| {
            if !failed {
                at.committed = Some(at.committed.map_or(offset, |c| c.max(offset)));
            }
        });
    }

    /// Calls `f` for each entry of `tpl` on this task's partition, of a topic it reads, with an
    /// offset: with that topic's offsets, the entry's offset, and whether the entry carries an
    /// error.
    fn each_own(
        &mut self,
        tpl: &TopicPartitionList,
        mut f: impl FnMut(&mut InputOffset, i64, bool),
    ) {
        for element in tpl.elements() {
            if element.partition() != self.id.partition {
                continue;
            }
            if let (Offset::Offset(offset), Some(at)) =
                (element.offset(), self.offsets.get_mut(element.topic()))
            {
                f(at, offset, element.error().is_err());
            }
        }
    }

    /// Closes the stores (each commits what is left; the worker has flushed the producer).
    pub(crate) fn close(self) -> Result<(), TaskError> {
        let mut first = Ok(());
        for store in &self.stores {
            if let Err(source) = store.logged.close() {
                tracing::warn!(task = %self.id, store = %store.name, error = %source, "closing a store failed");
                if first.is_ok() {
                    first = Err(self.store_error(store, source));
                }
            }
        }
        first
    }
}

/// Adds one offset; returns 1, or 0 for an offset librdkafka refuses (never a real one).
fn add_offset(tpl: &mut TopicPartitionList, topic: &str, partition: i32, offset: i64) -> usize {
    usize::from(
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
            .is_ok(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kstate_kafka::ProducerConfig;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts the records it is given; panics on a record with key `panic`.
    struct Counting(Arc<AtomicU64>);

    impl Processor for Counting {
        fn process(&mut self, _: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
            if record.key == Some(b"panic") {
                panic!("the processor's own panic");
            }
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn record(offset: i64, key: &'static [u8]) -> Record<'static> {
        Record {
            topic: "input",
            partition: 0,
            offset,
            timestamp: None,
            key: Some(key),
            value: None,
        }
    }

    /// A task without stores, and a producer that never connects (nothing is sent).
    fn task(committed: &[(&str, i64)]) -> (Task, SharedProducer, Arc<AtomicU64>) {
        let producer = SharedProducer::with_config(&ProducerConfig::new("127.0.0.1:1"))
            .expect("a producer needs no broker to be made");
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let factory: ProcessorFactory = Arc::new(move |_| Box::new(Counting(counter.clone())));
        let committed = committed.iter().map(|(t, o)| (t.to_string(), *o)).collect();
        let task = Task::start(
            TaskId { partition: 0 },
            &[],
            Vec::new(),
            &producer,
            &factory,
            Duration::from_secs(1),
            &committed,
        )
        .expect("no stores to attach");
        (task, producer, calls)
    }

    /// librdkafka can hand a record to the worker again after a resume (librdkafka #672,
    /// #1802). A task that processed an offset must not process it again: a count would count
    /// it twice without any crash.
    #[test]
    fn a_record_handed_over_again_after_a_resume_is_not_processed_twice() {
        let (mut task, producer, calls) = task(&[]);
        for offset in [0, 1, 2] {
            task.process(&producer, &record(offset, b"k")).unwrap();
        }
        task.resumed();
        for offset in [1, 2, 3] {
            task.process(&producer, &record(offset, b"k")).unwrap();
        }
        assert_eq!(
            calls.load(Ordering::Relaxed),
            4,
            "offsets 1 and 2 came twice"
        );
    }

    /// Offsets reused after the input log was truncated (an unclean leader election) or reset
    /// are new records: the old rule skipped every record below the next offset, for ever.
    #[test]
    fn records_below_the_next_offset_without_a_resume_are_new_and_processed() {
        let (mut task, producer, calls) = task(&[]);
        for offset in 0..5 {
            task.process(&producer, &record(offset, b"k")).unwrap();
        }
        for offset in 0..3 {
            task.process(&producer, &record(offset, b"k")).unwrap();
        }
        assert_eq!(calls.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn a_failed_offset_commit_leaves_the_offset_pending_and_a_good_one_clears_it() {
        let (mut task, producer, _) = task(&[("input", 10)]);
        let mut tpl = TopicPartitionList::new();
        assert_eq!(
            task.pending_offsets(&mut tpl),
            0,
            "starts at its committed offset"
        );
        assert_eq!(task.current_offsets(&mut tpl), 1, "but knows it");
        task.process(&producer, &record(10, b"k")).unwrap();
        let mut sent = TopicPartitionList::new();
        assert_eq!(task.pending_offsets(&mut sent), 1);
        // The commit failed: nothing confirmed; the next commit sends it again.
        assert_eq!(task.pending_offsets(&mut TopicPartitionList::new()), 1);
        task.offsets_committed(&sent);
        assert_eq!(task.pending_offsets(&mut TopicPartitionList::new()), 0);
    }

    #[test]
    fn a_panicking_processor_is_a_typed_error_naming_the_record() {
        let (mut task, producer, _) = task(&[]);
        let error = task.process(&producer, &record(7, b"panic")).unwrap_err();
        match error {
            TaskError::Panicked {
                task,
                step,
                message,
            } => {
                assert_eq!(task, TaskId { partition: 0 });
                assert_eq!(
                    step,
                    ProcessorStep::Record {
                        topic: "input".into(),
                        partition: 0,
                        offset: 7
                    }
                );
                assert!(message.contains("the processor's own panic"), "{message}");
            }
            other => panic!("expected Panicked, got {other}"),
        }
        let mut tpl = TopicPartitionList::new();
        assert_eq!(
            task.pending_offsets(&mut tpl),
            0,
            "the panicking record is not processed"
        );
    }
}
