//! [`TaskError`]: what can stop an application, naming the worker, task, topic, partition and
//! offset involved — each failure its own variant, with no placeholder values: a failure that
//! concerns no partition has no partition field.

use std::time::Duration;

use kstate_core::BoxError;
use kstate_kafka::ChangelogError;

use crate::ids::{TaskId, TimerId};

/// Which call of a processor a failure happened in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessorStep {
    /// [`Processor::init`](crate::Processor::init), when the task started or restarted.
    Init,
    /// [`Processor::process`](crate::Processor::process) of one input record.
    Record {
        /// The input topic.
        topic: String,
        /// Its partition (the task's).
        partition: i32,
        /// The record's offset.
        offset: i64,
    },
    /// [`Processor::on_timer`](crate::Processor::on_timer).
    Timer {
        /// Which timer.
        timer: TimerId,
        /// The time it fired at (milliseconds since the epoch, its clock's).
        time_ms: i64,
    },
}

impl std::fmt::Display for ProcessorStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessorStep::Init => f.write_str("init"),
            ProcessorStep::Record {
                topic,
                partition,
                offset,
            } => write!(f, "record {topic}/{partition}@{offset}"),
            ProcessorStep::Timer { timer, time_ms } => write!(f, "{timer} at {time_ms}"),
        }
    }
}

/// Why an application could not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The configuration is inconsistent.
    #[error("invalid application configuration: {0}")]
    InvalidConfig(String),

    /// The group protocol cannot put partition *p* of every input on one member, and the
    /// application has several inputs: task *p* could run on two members at once.
    #[error(
        "group protocol {protocol} cannot co-partition the inputs {}: use GroupProtocol::Eager (the classic range assignor) or GroupProtocol::Consumer (KIP-848, the broker's range assignor)",
        inputs.join(", ")
    )]
    CannotCoPartition {
        /// The protocol asked for.
        protocol: &'static str,
        /// The input topics.
        inputs: Vec<String>,
    },

    /// The input topics do not have the same partition count: task *p* reads partition *p* of
    /// every input, so they must be co-partitioned.
    #[error("input topics are not co-partitioned: {counts}")]
    NotCoPartitioned {
        /// Each topic with its partition count.
        counts: String,
    },

    /// The failure detector's topic exists with more than one partition: its beacons are read
    /// from one partition, so detection would cover only some processes.
    #[error(
        "the liveness topic {topic} has {partitions} partitions; failure detection needs it to \
         have one: delete it (the application creates it again)"
    )]
    LivenessTopic {
        /// The topic, `<application id>-liveness`.
        topic: String,
        /// Its partition count.
        partitions: usize,
    },

    /// An input topic does not exist.
    #[error("input topic {topic} does not exist on {bootstrap_servers}")]
    MissingInput {
        /// The topic.
        topic: String,
        /// Where it was looked for.
        bootstrap_servers: String,
    },

    /// The cluster did not answer, or refused the client's credentials or TLS handshake (the
    /// latter reported at once: waiting cannot fix it).
    #[error("{operation} at {bootstrap_servers}: {source}")]
    Cluster {
        /// What was being done.
        operation: &'static str,
        /// The bootstrap servers.
        bootstrap_servers: String,
        /// Why it failed.
        #[source]
        source: Box<kstate_kafka::MetadataError>,
    },

    /// A call of a worker's consumer that concerns no single partition failed: creating it,
    /// subscribing, polling.
    #[error("worker {worker}: {operation} failed (inputs {inputs}): {source}")]
    Consumer {
        /// The worker thread.
        worker: usize,
        /// What was being done.
        operation: &'static str,
        /// The input topics.
        inputs: String,
        /// The client's error.
        #[source]
        source: Box<rdkafka::error::KafkaError>,
    },

    /// A consumer call for one input partition failed: pause, resume, seek, the committed
    /// offsets.
    #[error("{operation} failed for input {topic}/{partition}: {source}")]
    Input {
        /// What was being done.
        operation: &'static str,
        /// The input topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The client's error.
        #[source]
        source: Box<rdkafka::error::KafkaError>,
    },

    /// A store of a task failed.
    #[error("{task}, store {store}: {source}")]
    Store {
        /// The task.
        task: TaskId,
        /// The store's name.
        store: String,
        /// What went wrong.
        #[source]
        source: Box<kstate_core::Error>,
    },

    /// The RocksDB the process's tasks share could not be opened (its error names the path).
    #[error("opening the tasks' RocksDB: {source}")]
    StateDb {
        /// What went wrong.
        #[source]
        source: Box<kstate_rocksdb::OpenError>,
    },

    /// Opening or restoring a store of a task failed.
    #[error("{task}: {source}")]
    Restore {
        /// The task.
        task: TaskId,
        /// What went wrong.
        #[source]
        source: Box<ChangelogError>,
    },

    /// An output (or dead-letter record) of a task could not be sent.
    #[error("{task}: output to {topic}: {source}")]
    Output {
        /// The task.
        task: TaskId,
        /// The output topic.
        topic: String,
        /// What went wrong.
        #[source]
        source: Box<ChangelogError>,
    },

    /// A worker's producer could not be made, or its outputs were not acknowledged.
    #[error("worker {worker}: {source}")]
    Producer {
        /// The worker thread.
        worker: usize,
        /// What went wrong.
        #[source]
        source: Box<ChangelogError>,
    },

    /// The processor returned an error.
    #[error("{task}: the processor failed in {step}: {source}")]
    Processor {
        /// The task.
        task: TaskId,
        /// The call that failed.
        step: ProcessorStep,
        /// The processor's error.
        #[source]
        source: BoxError,
    },

    /// The processor panicked. Nothing of the call is committed (under exactly-once its
    /// transaction is aborted); the application fails.
    #[error("{task}: the processor panicked in {step}: {message}")]
    Panicked {
        /// The task.
        task: TaskId,
        /// The call that panicked.
        step: ProcessorStep,
        /// The panic's message.
        message: String,
    },

    /// A transaction could not commit and the worker cannot go on (exactly-once): fenced too
    /// often, or a store that cannot apply it. Nothing of the open transaction was applied; a
    /// restart restores from the stored offsets.
    #[error("worker {worker}: {source}")]
    Transaction {
        /// The worker thread.
        worker: usize,
        /// What went wrong.
        #[source]
        source: Box<kstate_kafka::TransactionError>,
    },

    /// Exactly-once: transactions kept aborting (a broker or network failure that did not
    /// pass): the worker gave up after this many aborts in a row without a commit.
    #[error("worker {worker}: {attempts} transactions in a row aborted; the last: {last}")]
    RetriesExhausted {
        /// The worker thread.
        worker: usize,
        /// Aborts in a row.
        attempts: u32,
        /// Why the last one aborted.
        last: String,
    },

    /// A store of a task kept disagreeing with its changelog after being restored again (another
    /// writer of its changelog partition).
    #[error(
        "{task} was restored {restores} times in a row and its changelog still disagrees: {last}"
    )]
    Corrupted {
        /// The task.
        task: TaskId,
        /// Restores in a row.
        restores: u32,
        /// The last disagreement.
        last: String,
    },

    /// A task kept failing to start, or the application its start, while the cluster did not
    /// answer or was in motion, for the task timeout ([`crate::AppBuilder::task_timeout`]).
    #[error(
        "{what} could not start for {waited:?} (task timeout {timeout:?}); the last failure: {last}"
    )]
    TimedOut {
        /// The task, or the application.
        what: String,
        /// How long it tried.
        waited: Duration,
        /// The task timeout.
        timeout: Duration,
        /// The last failure.
        #[source]
        last: Box<TaskError>,
    },

    /// A handler for a signal that stops the application could not be installed.
    #[error("listening for {signal}: {source}")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// Why not.
        source: std::io::Error,
    },

    /// A thread of the runtime could not start, or panicked.
    #[error("thread {name}: {message}")]
    Thread {
        /// The thread.
        name: String,
        /// What happened.
        message: String,
    },
}

impl TaskError {
    pub(crate) fn transaction(worker: usize, source: kstate_kafka::TransactionError) -> Self {
        TaskError::Transaction {
            worker,
            source: Box::new(source),
        }
    }

    pub(crate) fn producer(worker: usize, source: ChangelogError) -> Self {
        TaskError::Producer {
            worker,
            source: Box::new(source),
        }
    }

    pub(crate) fn restore(task: TaskId, source: ChangelogError) -> Self {
        TaskError::Restore {
            task,
            source: Box::new(source),
        }
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}
