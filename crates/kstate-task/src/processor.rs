//! The processor API: what a task runs for each input record and each timer.
//!
//! Processing is synchronous on the worker thread: RocksDB is blocking, and a record's work is a
//! few microseconds, so an async hop per record would cost more than the work. The application
//! handle ([`Running`](crate::Running)) is what async code talks to.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kstate_core::codec::{Bincode, Codec, OrderedKey};
use kstate_core::{BoxError, KeyValueStore, Store};
use kstate_kafka::SharedProducer;

use crate::config::StoreHandle;
use crate::error::TaskError;
use crate::task::TaskStore;

/// A task: partition *p* of every input topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    /// The input partition.
    pub partition: i32,
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {}", self.partition)
    }
}

/// One input record.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The input topic.
    pub topic: &'a str,
    /// Its partition (the task's).
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp in milliseconds since the epoch, if it has one.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value (`None`: a tombstone).
    pub value: Option<&'a [u8]>,
}

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeKind {
    /// The wall clock: fires even when the task's input is empty or it is still waiting for
    /// records (Kafka Streams' punctuations that never fire on idle tasks, #1689, are the
    /// stream-time kind).
    WallClock,
    /// Stream time: the largest record timestamp the task has seen. Fires as records advance it.
    StreamTime,
}

/// A timer's identity, from [`Context::schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerId(pub(crate) u64);

/// A timer that fired.
#[derive(Debug, Clone, Copy)]
pub struct Timer {
    /// Which one.
    pub id: TimerId,
    /// Its clock.
    pub kind: TimeKind,
    /// The time it fired at, in milliseconds since the epoch (wall clock or stream time).
    pub time_ms: i64,
}

/// What a task runs. One processor per task, made by the application's factory.
pub trait Processor: Send {
    /// Called once when the task starts, after its stores are restored (timers are scheduled
    /// here).
    fn init(&mut self, _ctx: &mut Context<'_>) -> Result<(), BoxError> {
        Ok(())
    }

    /// Called for every input record, in offset order per input partition.
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError>;

    /// Called when a timer fires.
    fn on_timer(&mut self, _ctx: &mut Context<'_>, _timer: &Timer) -> Result<(), BoxError> {
        Ok(())
    }
}

#[derive(Debug)]
struct TimerEntry {
    id: TimerId,
    kind: TimeKind,
    every: Duration,
    /// Wall clock: the next firing.
    next_wall: Instant,
    /// Stream time: the next firing, once the task has seen a timestamp.
    next_stream: Option<i64>,
}

/// A task's timers.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    entries: Vec<TimerEntry>,
    next_id: u64,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Timers {
    /// The earliest wall-clock firing.
    pub(crate) fn next_wall(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter(|t| t.kind == TimeKind::WallClock)
            .map(|t| t.next_wall)
            .min()
    }

    /// The timers due at `now` (wall clock) or at `stream_time`, rescheduled.
    pub(crate) fn due(&mut self, now: Instant, stream_time: Option<i64>) -> Vec<Timer> {
        let mut due = Vec::new();
        for t in &mut self.entries {
            match t.kind {
                TimeKind::WallClock => {
                    if now >= t.next_wall {
                        // Missed firings are not replayed: one firing, then the next interval.
                        t.next_wall = now + t.every;
                        due.push(Timer {
                            id: t.id,
                            kind: t.kind,
                            time_ms: now_ms(),
                        });
                    }
                }
                TimeKind::StreamTime => {
                    let Some(stream) = stream_time else { continue };
                    let every = (t.every.as_millis() as i64).max(1);
                    let next = *t.next_stream.get_or_insert(stream + every);
                    if stream >= next {
                        t.next_stream = Some(stream - (stream - next) % every + every);
                        due.push(Timer {
                            id: t.id,
                            kind: t.kind,
                            time_ms: stream,
                        });
                    }
                }
            }
        }
        due
    }

    /// Whether any stream-time timer exists (so records need not check otherwise).
    pub(crate) fn has_stream(&self) -> bool {
        self.entries.iter().any(|t| t.kind == TimeKind::StreamTime)
    }
}

/// Output records kept until the commit, last value per key ([`Context::send_coalesced`]).
pub(crate) type Latest = BTreeMap<(String, i32, Vec<u8>), Option<Vec<u8>>>;

/// What a processor can do: read and write its task's stores, send outputs, schedule timers.
pub struct Context<'a> {
    pub(crate) task: TaskId,
    pub(crate) stores: &'a [TaskStore],
    pub(crate) producer: &'a SharedProducer,
    pub(crate) latest: &'a mut Latest,
    pub(crate) timers: &'a mut Timers,
    pub(crate) stream_time: Option<i64>,
    pub(crate) delivery_timeout: Duration,
}

impl<'a> Context<'a> {
    /// The task this processor runs for.
    pub fn task(&self) -> TaskId {
        self.task
    }

    /// The largest record timestamp this task has seen.
    pub fn stream_time(&self) -> Option<i64> {
        self.stream_time
    }

    /// A store of this task, typed.
    pub fn store<K: OrderedKey, V>(
        &self,
        handle: &StoreHandle<K, V>,
    ) -> Store<K, V, &'a dyn KeyValueStore>
    where
        Bincode: Codec<V>,
    {
        Store::new(self.raw_store(handle.index))
    }

    /// A store of this task by position, as bytes.
    fn raw_store(&self, index: usize) -> &'a dyn KeyValueStore {
        self.stores[index].view()
    }

    /// A store of this task by name, as bytes.
    pub fn store_bytes(&self, name: &str) -> Option<&'a dyn KeyValueStore> {
        let stores: &'a [TaskStore] = self.stores;
        stores.iter().find(|s| s.name == name).map(TaskStore::view)
    }

    /// Sends an output record to the task's partition of `topic` (inputs and outputs are
    /// co-partitioned). It is acknowledged before the input that produced it is committed.
    pub fn send(&mut self, topic: &str, key: &[u8], value: Option<&[u8]>) -> Result<(), TaskError> {
        let partition = self.task.partition;
        self.send_to(topic, partition, key, value)
    }

    /// Sends an output record to `partition` of `topic`.
    pub fn send_to(
        &mut self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), TaskError> {
        self.producer
            .send_output(topic, partition, key, value, self.delivery_timeout)
            .map_err(|source| TaskError::changelog(self.task.partition, source))
    }

    /// Sends an output record at the next commit, to the task's partition of `topic`; within a
    /// commit interval only the last value sent for each key goes out (downstream coalescing,
    /// like Kafka Streams' cached `KTable` emits).
    pub fn send_coalesced(&mut self, topic: &str, key: &[u8], value: Option<&[u8]>) {
        self.latest.insert(
            (topic.to_string(), self.task.partition, key.to_vec()),
            value.map(<[u8]>::to_vec),
        );
    }

    /// Schedules a timer firing every `every` on `kind`'s clock, starting one interval from now
    /// (wall clock) or from the current stream time.
    pub fn schedule(&mut self, kind: TimeKind, every: Duration) -> TimerId {
        let every = every.max(Duration::from_millis(1));
        let id = TimerId(self.timers.next_id);
        self.timers.next_id += 1;
        self.timers.entries.push(TimerEntry {
            id,
            kind,
            every,
            next_wall: Instant::now() + every,
            next_stream: self.stream_time.map(|t| t + every.as_millis() as i64),
        });
        id
    }

    /// Cancels a timer; cancelling one that does not exist is not an error.
    pub fn cancel(&mut self, id: TimerId) {
        self.timers.entries.retain(|t| t.id != id);
    }
}
