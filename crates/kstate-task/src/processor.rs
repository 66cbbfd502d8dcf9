//! The processor API: what a task runs for each input record and each timer.
//!
//! Processing is synchronous on the worker thread: RocksDB is blocking, and a record's work is a
//! few microseconds, so an async hop per record would cost more than the work. The application
//! handle ([`Running`](crate::Running)) is what async code talks to.
//!
//! A processor that returns an error, or whose store reads fail to decode, is handled by the
//! application's [`ErrorPolicy`](crate::ErrorPolicy); a processor that panics fails the
//! application (its state may be half-updated), and nothing of the call is committed under
//! exactly-once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate_core::codec::{Bincode, Codec, OrderedKey};
use kstate_core::{BoxError, KeyValueStore, Store};
use kstate_kafka::SharedProducer;

use crate::error::TaskError;
use crate::ids::{Record, TaskId, TimerId};
use crate::stores::{
    SessionHandle, StoreHandle, TaskSessionStore, TaskStore, TaskTtlStore, TaskWindowStore, Timed,
    TtlHandle, WindowHandle,
};
use crate::timers::{TimeKind, Timer, Timers};

/// Makes the processor of each task.
pub type ProcessorFactory = Arc<dyn Fn(TaskId) -> Box<dyn Processor> + Send + Sync>;

/// What a task runs. One processor per task, made by the application's factory.
pub trait Processor: Send {
    /// Called once when the task starts, after its stores are restored (timers are scheduled
    /// here), and again after an exactly-once abort started the task over.
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
        let stores: &'a [TaskStore] = self.stores;
        Store::new(stores[handle.index].view())
    }

    /// A window store of this task. Keys and values are bytes, as Kafka Streams' changelog
    /// holds them; call [`observe`](kstate_core::WindowStore::observe) with each record's
    /// timestamp so that windows close by the records' time.
    pub fn window_store(&self, handle: &WindowHandle) -> &'a TaskWindowStore {
        let stores: &'a [TaskStore] = self.stores;
        match &stores[handle.index].timed {
            Timed::Window(window) => window,
            _ => unreachable!("a WindowHandle names a window store"),
        }
    }

    /// A session store of this task.
    pub fn session_store(&self, handle: &SessionHandle) -> &'a TaskSessionStore {
        let stores: &'a [TaskStore] = self.stores;
        match &stores[handle.index].timed {
            Timed::Session(sessions) => sessions,
            _ => unreachable!("a SessionHandle names a session store"),
        }
    }

    /// A TTL store of this task. Its expired keys are swept before each commit.
    pub fn ttl_store(&self, handle: &TtlHandle) -> &'a TaskTtlStore {
        let stores: &'a [TaskStore] = self.stores;
        match &stores[handle.index].timed {
            Timed::Ttl(ttl) => ttl,
            _ => unreachable!("a TtlHandle names a TTL store"),
        }
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
            .map_err(|source| TaskError::Output {
                task: self.task,
                topic: topic.to_string(),
                source: Box::new(source),
            })
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
        self.timers
            .schedule(kind, every, Instant::now(), self.stream_time)
    }

    /// Cancels a timer; cancelling one that does not exist is not an error.
    pub fn cancel(&mut self, id: TimerId) {
        self.timers.cancel(id);
    }
}
