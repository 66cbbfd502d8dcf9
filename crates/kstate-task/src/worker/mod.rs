//! A worker thread: one member of the consumer group, its producer, its restorer threads, and the
//! tasks it runs. Its parts, by name:
//!
//! - this file: the poll loop, and nothing else: poll a record or wait, then the chores
//!   (finished restores, timers, the commit), then the producer loss or the stop;
//! - [`callbacks`]: librdkafka's rebalance, commit and statistics callbacks;
//! - [`slots`]: each task's state, `Incomplete` → `Restoring` → `Running`, and the only writer
//!   of the status registry;
//! - [`core`]: the transitions (assigned, revoked, lost, restored, a record, a failure, an abort
//!   and rewind, the producer lost) over an [`input::Input`] and a [`commit::CommitPath`];
//! - [`activation`]: restore jobs and their results, where a task's inputs start, a restored
//!   task's start and the seek there, the rewind of every task after an abort;
//! - [`commit`]: the commit path, at-least-once or transactional, chosen once (the
//!   at-least-once one confirms the last commit from the group's offsets);
//! - [`failure`]: what kind of failure an error is, and the one table of what the worker does
//!   about it; [`recovery`]: bounded aborts, restores again and start timeouts, and the pause
//!   after an abort; [`health`]: ok, producer lost, failed; [`dead_letters`]: what the error
//!   policy does with a failed record, and the records it takes once they come again.
//!
//! Every transition has a test without a broker (`worker/tests`), and random sequences of them
//! run against a model of the assignment (`worker/tests/model.rs`).
//!
//! # Tasks and rebalances
//! - **Assigned**: every new input partition is paused. A task whose worker now holds
//!   partition *p* of every input restores its stores on a restorer thread while the worker
//!   keeps processing its other tasks; then it starts from its committed offsets, runs the
//!   records handed over before the pause took hold, and resumes. A worker holding only some
//!   of task *p*'s partitions (a protocol handing them over one by one, or members with
//!   different subscriptions) keeps them paused and runs nothing for them.
//! - **Revoked**: the ending tasks are committed (under exactly-once, the one transaction of
//!   every task) and closed, within the revocation timeout; a restore in progress is
//!   cancelled. The directories stay: a later reassignment replays only the tail.
//! - **Lost** (the member was fenced or timed out): the tasks are dropped without a commit
//!   (under exactly-once the transaction aborts, and the others start over).
//! - **A failure** follows its kind ([`failure`]): the error policy for a record's own,
//!   abort-and-retry under exactly-once for a transient one, a restore again for a store that
//!   disagrees with its changelog, a new producer for a lost one; anything else stops the
//!   worker, and with it the application: nothing after it is committed, and a restart
//!   restores.
//!
//! # Exactly-once
//! The worker's producer is transactional (`<app-id>-<instance-id>-<worker>`), created before
//! the consumer subscribes, so its fencing of an earlier incarnation (which aborts that one's
//! open transaction) happens before any restore captures its end offset. A transaction is
//! always open; every commit interval (or sooner, when a store's overlay is full) it commits
//! with the tasks' input offsets — at least one, so that the broker checks the group
//! generation — and the stores apply their overlays after it. Every wait inside a transaction
//! is shorter than the transaction timeout, so that a slow broker shows as an abort, not as
//! the broker's timeout fencing the producer. A lost producer (fenced, or an abort that could
//! not complete): every task is dropped without applying anything, a new producer is made and
//! the worker rejoins; three within five minutes fail it.

pub(crate) mod activation;
mod callbacks;
pub(crate) mod commit;
pub(crate) mod core;
pub(crate) mod dead_letters;
pub(crate) mod failure;
pub(crate) mod health;
pub(crate) mod input;
mod recovery;
pub(crate) mod retries;
pub(crate) mod slots;
mod start_timeouts;
#[cfg(test)]
mod tests;
mod transactional_start;

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, Timestamp};

use crate::config::{AppConfig, GroupProtocol};
use crate::error::TaskError;
use crate::ids::Record;
use crate::restorer::{Done, Job};
use crate::shared::AppShared;
use kstate_core::sync::lock;

use self::callbacks::WorkerContext;
use self::core::Core;

type WorkerConsumer = BaseConsumer<WorkerContext>;

/// Runs worker `index` until the application shuts down or the worker fails.
pub(crate) fn run(index: usize, app: Arc<AppShared>, jobs: Sender<Job>) -> Result<(), TaskError> {
    let config = &app.config;
    // Under exactly-once, before the consumer subscribes: creating the transactional producer
    // fences this worker's previous incarnation and aborts its open transaction, which must not
    // hold any restore of ours back.
    let path = commit::for_config(&app, index)?;
    let (reply, done) = std::sync::mpsc::channel::<Done>();
    let state = Arc::new(Mutex::new(Core::new(index, app.clone(), path, jobs, reply)));
    let inputs = config.inputs.join(",");
    let consumer_error = |operation, source| TaskError::Consumer {
        worker: index,
        operation,
        inputs: inputs.clone(),
        source: Box::new(source),
    };
    let mut client = consumer_config(config);
    if let Some(id) = config.group_instance_id(index) {
        // The client id too: it is how other processes see the member's instance id in the
        // group's description (standby placement, the `standby` module).
        client.set("client.id", &id).set("group.instance.id", id);
    }
    let consumer: WorkerConsumer = client
        .create_with_context(WorkerContext {
            core: state.clone(),
        })
        .map_err(|source| consumer_error("create consumer", config.client.redact_error(source)))?;
    let topics: Vec<&str> = config.inputs.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|source| consumer_error("subscribe", source))?;

    let mut next_commit = Instant::now() + config.commit_interval;
    // Records are polled back to back while there are any; the rest (finished restores, timers,
    // the commit) is looked after at most every millisecond, or whenever the input is idle.
    let mut wait = Duration::ZERO;
    let mut next_chores = Instant::now();
    while !app.stopping() {
        if let Some(until) = lock(&state).take_backoff() {
            // After an abort: a pause before starting over (bounded; the group session is kept
            // by librdkafka's own thread).
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        }
        let polled = consumer.poll(wait);
        let mut core = lock(&state);
        let idle = match polled {
            Some(Ok(message)) => {
                let record = Record {
                    topic: message.topic(),
                    partition: message.partition(),
                    offset: message.offset(),
                    timestamp: match message.timestamp() {
                        Timestamp::NotAvailable => None,
                        Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => Some(t),
                    },
                    key: message.key(),
                    value: message.payload(),
                };
                core.record(&consumer, &record);
                false
            }
            Some(Err(e)) => {
                if let rdkafka::error::KafkaError::MessageConsumption(code) = &e
                    && *code == rdkafka::types::RDKafkaErrorCode::Fatal
                {
                    core.fail(consumer_error("poll", e));
                } else {
                    tracing::warn!(worker = index, error = %e, "consumer error");
                }
                true
            }
            None => true,
        };
        wait = Duration::ZERO;
        let now = Instant::now();
        if !idle && now < next_chores && core.health().is_ok() {
            continue;
        }
        next_chores = now + Duration::from_millis(1);
        if core.health().is_ok() {
            let finished: Vec<Done> = done.try_iter().collect();
            if !finished.is_empty() {
                core.restored(&consumer, finished);
            }
        }
        if core.health().is_ok() {
            core.fire_timers(&consumer);
        }
        // A store whose overlay is full under a transaction asks for an early commit.
        if (now >= next_commit || core.commit_requested()) && core.health().is_ok() {
            core.commit(&consumer);
            next_commit = Instant::now() + config.commit_interval;
        }
        if idle {
            // Nothing to read: sleep in the poll until the next commit, timer or restore check.
            let mut wake = next_commit;
            if let Some(t) = core.next_timer() {
                wake = wake.min(t);
            }
            if core.restoring_any() {
                wake = wake.min(now + Duration::from_millis(20));
            }
            wait = wake
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
        }
        if core.health().is_failed() {
            break;
        }
        if !core.health().is_ok() {
            // The producer was lost: with a new one, the held tasks restore the committed tail
            // of their stores and read on from their committed offsets.
            core.replace_producer();
            if core.health().is_ok() {
                core.restore_held(&consumer);
            }
        }
    }

    // Shutting down (or failed): a final commit, the stores closed, then the group left.
    let mut core = lock(&state);
    core.end(&consumer);
    // The ending tasks' offsets are committed asynchronously: the group is asked whether it
    // holds them, up to the revocation timeout.
    let deadline = Instant::now() + config.revocation_timeout;
    if !core.confirm_last_commit(&consumer, deadline) {
        tracing::warn!(
            worker = index,
            "the last offset commit was not confirmed within the revocation timeout; the next owner may replay some records"
        );
    }
    let failure = core.finish();
    // The consumer's callbacks hold the core until it closes, maybe on a thread of its own.
    drop(core);
    // Leaving the group revokes nothing left: every task is ended.
    consumer.unsubscribe();
    close_consumer(
        consumer,
        deadline.max(Instant::now() + CLOSE_AT_LEAST),
        index,
    );
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The least time a consumer is given to close, even when the last commit took up the
/// revocation timeout: enough for a broker that answers to take its leave request.
const CLOSE_AT_LEAST: Duration = Duration::from_secs(1);

/// Closes the consumer (librdkafka's last revocation, then leaving the group) until
/// `deadline`. librdkafka waits for the answers to its outstanding requests (the last offset
/// commit, the leave request) before it closes, for as long as the socket timeout (60 s by
/// default); a consumer not closed by the deadline is handed to a thread of its own that
/// finishes closing it, so that the worker, and `Running::wait`, end in bounded time.
fn close_consumer(consumer: BaseConsumer<WorkerContext>, deadline: Instant, worker: usize) {
    match consumer.close_queue() {
        Ok(()) => {
            while !consumer.closed() && Instant::now() < deadline {
                // Records fetched before the close belong to no task any more.
                let _ = consumer.poll(Duration::from_millis(50));
            }
            if consumer.closed() {
                return;
            }
            tracing::warn!(
                worker,
                "the consumer did not close in time (the broker does not answer); it finishes closing in the background"
            );
        }
        Err(e) => {
            tracing::warn!(worker, error = %e, "closing the consumer failed; it is dropped in the background");
        }
    }
    let closing = std::thread::Builder::new()
        .name(format!("kstate-close-{worker}"))
        .spawn(move || drop(consumer));
    if let Err(e) = closing {
        // The consumer went with the closure, closed on this thread.
        tracing::warn!(worker, error = %e, "no thread to close the consumer in; it closed on the worker's");
    }
}

/// The client settings every input consumer gets.
fn consumer_config(config: &AppConfig) -> ClientConfig {
    let mut client = config.client.client_config();
    client
        .set("group.id", &config.application_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // Outputs of an exactly-once upstream must not be read before they commit.
        .set("isolation.level", "read_committed")
        // Consumer lag per task, as a metric (see the worker's statistics callback).
        .set("statistics.interval.ms", "5000")
        // A partition resumed after its restore joins the next fetch request, which waits for
        // the one in flight: while the other partitions are quiet that one is held by the broker
        // for up to this long (librdkafka's default is 500 ms, which a failover measured as
        // 500 ms more darkness). An idle worker sends 10 fetches a second instead of 2.
        .set("fetch.wait.max.ms", "100");
    match config.group_protocol {
        GroupProtocol::CooperativeSticky => {
            client.set("partition.assignment.strategy", "cooperative-sticky");
        }
        GroupProtocol::Eager => {
            client.set("partition.assignment.strategy", "range");
        }
        GroupProtocol::Consumer => {
            client
                .set("group.protocol", "consumer")
                .set("group.remote.assignor", "range");
        }
    }
    if let Some(timeout) = config.failure_detection {
        // After another process removes a dead one's members, a survivor joins the rebalance
        // at its next heartbeat.
        let interval = (timeout / 2).min(Duration::from_secs(1));
        client.set("heartbeat.interval.ms", interval.as_millis().to_string());
    }
    for (key, value) in &config.consumer_properties {
        client.set(key, value);
    }
    client
}
