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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kstate_core::KeyValueStore;
use kstate_kafka::{LoggedStore, RestoredStore, SharedProducer};
use rdkafka::{Offset, TopicPartitionList};

use crate::cache::CoalescingStore;
use crate::config::{ProcessorFactory, StoreSpec};
use crate::error::TaskError;
use crate::processor::{Context, Latest, Processor, Record, TaskId, Timers};

/// One store of a task.
pub(crate) struct TaskStore {
    pub(crate) name: String,
    pub(crate) logged: Arc<LoggedStore>,
    cache: Option<CoalescingStore>,
}

impl TaskStore {
    /// What the processor reads and writes.
    pub(crate) fn view(&self) -> &dyn KeyValueStore {
        match &self.cache {
            Some(cache) => cache,
            None => &*self.logged,
        }
    }
}

/// A running task.
pub(crate) struct Task {
    pub(crate) id: TaskId,
    stores: Vec<TaskStore>,
    processor: Box<dyn Processor>,
    /// Per input topic: the offset to commit (last processed + 1), and whether it moved since
    /// the last commit.
    offsets: BTreeMap<String, (i64, bool)>,
    timers: Timers,
    stream_time: Option<i64>,
    latest: Latest,
    pub(crate) processed: Arc<AtomicU64>,
    processed_since_commit: u64,
    last_flush: Instant,
    flush_interval: Duration,
    delivery_timeout: Duration,
}

impl Task {
    /// Attaches the restored stores to the worker's producer and starts the processor.
    pub(crate) fn start(
        id: TaskId,
        specs: &[StoreSpec],
        restored: Vec<RestoredStore>,
        producer: &SharedProducer,
        factory: &ProcessorFactory,
        delivery_timeout: Duration,
    ) -> Result<Task, TaskError> {
        let mut stores = Vec::with_capacity(specs.len());
        for (spec, restored) in specs.iter().zip(restored) {
            let logged = Arc::new(
                LoggedStore::attach(restored, producer)
                    .map_err(|source| TaskError::changelog(id.partition, source))?,
            );
            let cache = spec
                .options
                .coalesce
                .then(|| CoalescingStore::new(logged.clone()));
            stores.push(TaskStore {
                name: spec.name.clone(),
                logged,
                cache,
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
            processed: Arc::new(AtomicU64::new(0)),
            processed_since_commit: 0,
            last_flush: Instant::now(),
            flush_interval,
            delivery_timeout,
        };
        task.call(producer, |processor, ctx| processor.init(ctx))
            .map_err(|source| TaskError::Processor {
                topic: "init".into(),
                partition: id.partition,
                offset: -1,
                source,
            })?;
        Ok(task)
    }

    /// The logged stores, for the query API.
    pub(crate) fn logged_stores(&self) -> Vec<(String, Arc<LoggedStore>)> {
        self.stores
            .iter()
            .map(|s| (s.name.clone(), s.logged.clone()))
            .collect()
    }

    /// Calls the processor with a context over the task's other fields.
    fn call<R>(
        &mut self,
        producer: &SharedProducer,
        f: impl FnOnce(&mut dyn Processor, &mut Context<'_>) -> R,
    ) -> R {
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
        f(processor.as_mut(), &mut ctx)
    }

    /// Runs the processor on one record, then the stream-time timers it made due.
    pub(crate) fn process(
        &mut self,
        producer: &SharedProducer,
        record: &Record<'_>,
    ) -> Result<(), TaskError> {
        if self
            .offsets
            .get(record.topic)
            .is_some_and(|&(next, _)| record.offset < next)
        {
            // Processed here already: librdkafka delivered it again (see the test
            // `a_record_delivered_again_is_not_processed_twice`). Offsets only grow within a
            // partition, so this is never a record the task has not seen.
            metrics::counter!("kstate_task_redelivered_records").increment(1);
            return Ok(());
        }
        if let Some(ts) = record.timestamp {
            self.stream_time = Some(self.stream_time.map_or(ts, |t| t.max(ts)));
        }
        let partition = self.id.partition;
        self.call(producer, |processor, ctx| processor.process(ctx, record))
            .map_err(|source| TaskError::Processor {
                topic: record.topic.to_string(),
                partition,
                offset: record.offset,
                source,
            })?;
        match self.offsets.get_mut(record.topic) {
            Some(entry) => *entry = (record.offset + 1, true),
            None => {
                self.offsets
                    .insert(record.topic.to_string(), (record.offset + 1, true));
            }
        }
        self.processed_since_commit += 1;
        if self.timers.has_stream() {
            self.fire_timers(producer, Instant::now(), true)?;
        }
        Ok(())
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
        let due = self.timers.due(now, stream_time);
        let partition = self.id.partition;
        for timer in due {
            self.call(producer, |processor, ctx| processor.on_timer(ctx, &timer))
                .map_err(|source| TaskError::Processor {
                    topic: "timer".into(),
                    partition,
                    offset: -1,
                    source,
                })?;
        }
        Ok(())
    }

    /// Step 1 of a commit: coalesced outputs and store writes go out.
    pub(crate) fn prepare_commit(&mut self, producer: &SharedProducer) -> Result<(), TaskError> {
        for ((topic, partition, key), value) in std::mem::take(&mut self.latest) {
            producer
                .send_output(
                    &topic,
                    partition,
                    &key,
                    value.as_deref(),
                    self.delivery_timeout,
                )
                .map_err(|source| TaskError::changelog(self.id.partition, source))?;
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
            partition: self.id.partition,
            store: store.name.clone(),
            source,
        }
    }

    /// Step 3: every store writes its acknowledged overlay and offset into RocksDB, and flushes
    /// its memtables when its flush interval has passed.
    pub(crate) fn commit_stores(&mut self) -> Result<(), TaskError> {
        let flush = self.last_flush.elapsed() >= self.flush_interval;
        for store in &self.stores {
            let done = if flush {
                store.logged.flush()
            } else {
                store.logged.commit()
            };
            done.map_err(|source| self.store_error(store, source))?;
        }
        if flush {
            self.last_flush = Instant::now();
        }
        self.processed
            .fetch_add(self.processed_since_commit, Ordering::Relaxed);
        metrics::counter!("kstate_task_records_processed").increment(self.processed_since_commit);
        self.processed_since_commit = 0;
        Ok(())
    }

    /// Exactly-once, after the transaction committed (it applied the stores' overlays): counts
    /// the records it covered, and flushes the stores' memtables when their flush interval has
    /// passed.
    pub(crate) fn transaction_committed(&mut self) -> Result<(), TaskError> {
        if self.last_flush.elapsed() >= self.flush_interval {
            for store in &self.stores {
                store
                    .logged
                    .flush()
                    .map_err(|source| self.store_error(store, source))?;
            }
            self.last_flush = Instant::now();
        }
        self.processed
            .fetch_add(self.processed_since_commit, Ordering::Relaxed);
        metrics::counter!("kstate_task_records_processed").increment(self.processed_since_commit);
        self.processed_since_commit = 0;
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
        }
        self.latest = Latest::new();
        self.timers = Timers::default();
        self.stream_time = None;
        self.processed_since_commit = 0;
        self.offsets = committed
            .iter()
            .map(|(topic, offset)| (topic.clone(), (*offset, false)))
            .collect();
        self.processor = factory(self.id);
        let partition = self.id.partition;
        self.call(producer, |processor, ctx| processor.init(ctx))
            .map_err(|source| TaskError::Processor {
                topic: "init".into(),
                partition,
                offset: -1,
                source,
            })
    }

    /// Step 4's input: the offsets that moved since the last commit. Marks them committed.
    pub(crate) fn take_offsets(&mut self, tpl: &mut TopicPartitionList) {
        for (topic, (offset, moved)) in &mut self.offsets {
            if *moved {
                // Only fails for an invalid offset, which `offset + 1` of a real record is not.
                let _ = tpl.add_partition_offset(topic, self.id.partition, Offset::Offset(*offset));
                *moved = false;
            }
        }
    }

    /// Marks the offsets of a failed commit as not committed.
    pub(crate) fn untake_offsets(&mut self) {
        for (_, moved) in self.offsets.values_mut() {
            *moved = true;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreOptions;
    use kstate_core::BoxError;
    use kstate_kafka::{ChangelogConfig, OpenHooks};
    use kstate_rocksdb::RocksDbOptions;

    /// Counts the records it is given.
    struct Counting(Arc<AtomicU64>);

    impl Processor for Counting {
        fn process(&mut self, _: &mut Context<'_>, _: &Record<'_>) -> Result<(), BoxError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    /// librdkafka can hand a record to the worker again: a partition paused before any of its
    /// records was consumed resumes from the committed offset (or `auto.offset.reset`), not
    /// from the records the worker already took while the pause took hold (librdkafka #672,
    /// #1802). A task that processed an offset must not process it again: a count would count
    /// it twice without any crash.
    #[test]
    fn a_record_delivered_again_is_not_processed_twice() -> Result<(), Box<dyn std::error::Error>> {
        let servers = kstate_test_broker::bootstrap_servers()?;
        let topic = kstate_test_broker::unique_topic("task-redelivered");
        let dir = tempfile::tempdir()?;
        let config = ChangelogConfig::new(servers, &topic, 0).partitions(1);
        let restored = RestoredStore::restore(
            dir.path().join("counts"),
            &RocksDbOptions::default(),
            config.clone(),
            &OpenHooks::default(),
        )?;
        let producer = SharedProducer::new(&config)?;
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let factory: ProcessorFactory = Arc::new(move |_| Box::new(Counting(counter.clone())));
        let specs = [StoreSpec {
            name: "counts".into(),
            options: StoreOptions::default(),
        }];
        let mut task = Task::start(
            TaskId { partition: 0 },
            &specs,
            vec![restored],
            &producer,
            &factory,
            Duration::from_secs(30),
        )?;
        for offset in [0, 1, 2, 1, 2, 3] {
            let record = Record {
                topic: "input",
                partition: 0,
                offset,
                timestamp: None,
                key: Some(b"k"),
                value: None,
            };
            task.process(&producer, &record)?;
        }
        assert_eq!(
            calls.load(Ordering::Relaxed),
            4,
            "offsets 1 and 2 came twice; each must be processed once"
        );
        Ok(())
    }
}
