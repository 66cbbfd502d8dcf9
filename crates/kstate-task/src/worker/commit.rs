//! The commit path, chosen once per guarantee when the worker starts: every other part of the
//! worker calls it without asking which guarantee it runs under.
//!
//! - [`AtLeastOnce`]: per task, outputs acknowledged, then stores committed, then input
//!   offsets. Periodic commits send only the offsets the group does not have yet (a failure
//!   leaves them pending, and the next commit sends them again); a revocation or a shutdown
//!   commits every ending task's offsets, moved or not. Every offset commit is asynchronous: a
//!   synchronous one has no time limit of librdkafka's (against a stalled coordinator it waits
//!   for ever), while librdkafka finishes a rebalance only after its outstanding commits, and
//!   the worker's shutdown waits for the last one's answer up to the revocation timeout.
//! - [`Transactional`]: one transaction carries every task's changelog records, outputs and
//!   input offsets (EOS v2). Every commit carries at least one offset: `TxnOffsetCommit` is
//!   where the broker checks the group generation, so a member that lost its partitions while
//!   paused cannot commit even a transaction its timers filled without input.

use std::time::{Duration, Instant};

use kstate_kafka::SharedProducer;
use rdkafka::consumer::CommitMode;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::TaskError;
use crate::ids::InputPartition;
use crate::shared::AppShared;
use crate::task::Task;
use crate::worker::input::Input;

/// How often the last offset commit is looked for in the group's offsets.
pub(crate) const CONFIRM_RETRY: Duration = Duration::from_millis(50);

/// The longest one look at the group's offsets may take before the commit is sent again.
const CONFIRM_QUERY: Duration = Duration::from_secs(2);

/// What a commit came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Committed {
    Done,
    /// Exactly-once: the transaction aborted instead (nothing of it is visible; the stores are
    /// as at the last commit). Every task must start over from its committed offsets.
    Aborted(String),
}

/// Which commit: the periodic one, or the last one of ending tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Occasion {
    Periodic,
    Ending,
}

/// The commit protocol of one guarantee.
pub(crate) trait CommitPath: Send {
    /// The producer every task's stores and outputs go through.
    fn producer(&self) -> &SharedProducer;

    /// Whether one commit carries every task (a transaction) rather than each task on its own:
    /// dropping one task's work drops all of theirs ([`react`](super::failure::react) takes it).
    fn shared_fate(&self) -> bool;

    /// Whether the last commit of the `ending` tasks carries `task`: under a transaction every
    /// task's work is in it.
    fn carries(&self, ending: &[i32], task: &Task) -> bool {
        self.shared_fate() || ending.contains(&task.id.partition)
    }

    /// Commits `tasks`.
    fn commit(
        &mut self,
        tasks: &mut [&mut Task],
        input: &dyn Input,
        occasion: Occasion,
    ) -> Result<Committed, TaskError>;

    /// Drops what the tasks did since their last commit. Returns whether every running task
    /// must start over: under exactly-once the transaction aborted; under at-least-once there
    /// is nothing shared to drop.
    fn abandon(&mut self, why: &str) -> Result<bool, TaskError>;

    /// The producer could not go on: a new one.
    fn renew(&mut self, app: &AppShared) -> Result<(), TaskError>;

    /// The consumer's commit callback answered: the group holds the offsets sent.
    fn offsets_committed(&mut self) {}

    /// The worker ends: only the commit of its last tasks is to be confirmed, not that of an
    /// earlier revocation (those partitions are others' now).
    fn forget_unconfirmed(&mut self) {}

    /// After the last commit: whether the group holds its offsets, asked until `deadline`.
    /// Under a transaction the commit itself said so.
    fn confirm_last(&mut self, _input: &dyn Input, _deadline: Instant) -> bool {
        true
    }

    /// Whether a last commit waits for [`confirm_last`](Self::confirm_last).
    #[cfg(test)]
    fn awaits_confirmation(&self) -> bool {
        false
    }
}

/// The commit path of `config`'s guarantee, with a new producer.
pub(crate) fn for_config(app: &AppShared, worker: usize) -> Result<Box<dyn CommitPath>, TaskError> {
    let config = &app.config;
    Ok(match config.guarantee {
        crate::config::ProcessingGuarantee::AtLeastOnce => Box::new(AtLeastOnce {
            worker,
            producer: SharedProducer::with_config(&config.producer_config())
                .map_err(|e| TaskError::producer(worker, e))?,
            timeout: config.commit_timeout(),
            unconfirmed: None,
        }),
        crate::config::ProcessingGuarantee::ExactlyOnce => Box::new(Transactional {
            worker,
            producer: Transactional::producer_for(app, worker)?,
            timeout: config.commit_timeout(),
        }),
    })
}

pub(crate) struct AtLeastOnce {
    worker: usize,
    producer: SharedProducer,
    timeout: Duration,
    /// The offsets of the last commit of ending tasks, until the group is seen to hold them
    /// ([`confirm_last`](CommitPath::confirm_last)).
    unconfirmed: Option<Vec<(InputPartition, i64)>>,
}

impl CommitPath for AtLeastOnce {
    fn producer(&self) -> &SharedProducer {
        &self.producer
    }

    fn shared_fate(&self) -> bool {
        false
    }

    fn commit(
        &mut self,
        tasks: &mut [&mut Task],
        input: &dyn Input,
        occasion: Occasion,
    ) -> Result<Committed, TaskError> {
        let started = Instant::now();
        let sent: Vec<(InputPartition, i64)> = match occasion {
            Occasion::Periodic => Vec::new(),
            Occasion::Ending => tasks.iter().flat_map(|t| t.positions()).collect(),
        };
        for task in tasks.iter_mut() {
            task.prepare_commit(&self.producer)?;
        }
        self.producer
            .flush(self.timeout.saturating_sub(started.elapsed()))
            .map_err(|e| TaskError::producer(self.worker, e))?;
        // A revocation's commit is bounded as a whole; a periodic one waits as long as a store's
        // changelog may take (and a stuck one poisons the store).
        let deadline = match occasion {
            Occasion::Periodic => None,
            Occasion::Ending => Some(started + self.timeout),
        };
        let mut offsets = TopicPartitionList::new();
        for task in tasks.iter_mut() {
            task.commit_stores(deadline)?;
            match occasion {
                Occasion::Periodic => task.pending_offsets(&mut offsets),
                Occasion::Ending => task.current_offsets(&mut offsets),
            };
        }
        if offsets.count() > 0 {
            match input.commit(&offsets, CommitMode::Async) {
                // Not confirmed (rust-rdkafka 0.39 calls no commit callback for it,
                // fede1024/rust-rdkafka#856): sent again after `RESEND_UNCONFIRMED` if no record
                // moves it. The last one is confirmed from the group's offsets
                // (`confirm_last`).
                Ok(()) => {
                    for task in tasks.iter_mut() {
                        task.offsets_sent(&offsets);
                    }
                }
                // Not fatal: the stores are committed, and the offsets stay pending.
                Err(e) => {
                    tracing::warn!(worker = self.worker, error = %e, ?occasion, "input offset commit failed; the offsets stay pending")
                }
            }
        }
        metrics::histogram!("kstate_task_commit_seconds").record(started.elapsed().as_secs_f64());
        if occasion == Occasion::Ending {
            self.unconfirmed = Some(sent);
        }
        Ok(Committed::Done)
    }

    fn abandon(&mut self, _why: &str) -> Result<bool, TaskError> {
        Ok(false)
    }

    fn renew(&mut self, app: &AppShared) -> Result<(), TaskError> {
        self.producer = SharedProducer::with_config(&app.config.producer_config())
            .map_err(|e| TaskError::producer(self.worker, e))?;
        Ok(())
    }

    fn offsets_committed(&mut self) {
        self.unconfirmed = None;
    }

    fn forget_unconfirmed(&mut self) {
        self.unconfirmed = None;
    }

    #[cfg(test)]
    fn awaits_confirmation(&self) -> bool {
        self.unconfirmed.is_some()
    }

    /// Whether the group holds the offsets of the last commit, asked of the group coordinator
    /// until `deadline`; a commit the group does not hold (it failed) is sent again. The
    /// answer to an asynchronous commit cannot be waited for instead: rust-rdkafka 0.39 gives
    /// no commit callback for `CommitMode::Async` (fede1024/rust-rdkafka#856), and a
    /// synchronous commit waits without a time limit. The coordinator answers one
    /// connection's requests in order, so an offset fetch sent after the commit sees it unless
    /// it failed.
    fn confirm_last(&mut self, input: &dyn Input, deadline: Instant) -> bool {
        let Some(sent) = self.unconfirmed.take() else {
            return true;
        };
        let partitions: Vec<InputPartition> = sent.iter().map(|(p, _)| p.clone()).collect();
        // The commit, as it is sent again.
        let mut again = TopicPartitionList::new();
        for (p, offset) in &sent {
            let _ = again.add_partition_offset(&p.topic, p.partition, Offset::Offset(*offset));
        }
        loop {
            // Each question is bounded on its own: after a broker pause one offset fetch was
            // seen to hang for the whole revocation timeout while the commit never reached the
            // group (tests/graceful_handover_after_failed_commit.rs).
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(CONFIRM_QUERY);
            let held = match input.committed(&partitions, left.max(Duration::from_millis(1))) {
                Ok(held) => Some(held),
                Err(e) => {
                    tracing::debug!(worker = self.worker, error = %e, "the committed offsets could not be fetched");
                    None
                }
            };
            if held.as_ref().is_some_and(|held| {
                sent.iter()
                    .all(|(p, o)| held.get(p).is_some_and(|h| h >= o))
            }) {
                return true;
            }
            // Not held, or not known: sent again (a commit of offsets the group holds already
            // changes nothing).
            if held.is_some() {
                tracing::warn!(
                    worker = self.worker,
                    "the group does not hold the last offset commit; it is sent again"
                );
            }
            if let Err(e) = input.commit(&again, CommitMode::Async) {
                tracing::warn!(worker = self.worker, error = %e, "sending the last offset commit again failed");
            }
            if Instant::now() + CONFIRM_RETRY >= deadline {
                self.unconfirmed = Some(sent);
                return false;
            }
            std::thread::sleep(CONFIRM_RETRY);
        }
    }
}

pub(crate) struct Transactional {
    worker: usize,
    producer: SharedProducer,
    timeout: Duration,
}

impl Transactional {
    /// Creating it fences this worker's previous incarnation and aborts its open transaction.
    fn producer_for(app: &AppShared, worker: usize) -> Result<SharedProducer, TaskError> {
        crate::worker::transactional_start::open(app, worker)
    }
}

impl CommitPath for Transactional {
    fn producer(&self) -> &SharedProducer {
        &self.producer
    }

    fn shared_fate(&self) -> bool {
        true
    }

    fn commit(
        &mut self,
        tasks: &mut [&mut Task],
        input: &dyn Input,
        _occasion: Occasion,
    ) -> Result<Committed, TaskError> {
        let started = Instant::now();
        for task in tasks.iter_mut() {
            task.prepare_commit(&self.producer)?;
        }
        let mut offsets = TopicPartitionList::new();
        for task in tasks.iter() {
            task.pending_offsets(&mut offsets);
        }
        let wrote = self.producer.transaction_holds_records() || tasks.iter().any(|t| t.touched());
        if offsets.count() == 0 && wrote {
            // No input moved, but a timer, an init or a TTL sweep may have written: one task's
            // offsets all the same, for the generation check. (A transaction with nothing in it
            // needs none.)
            for task in tasks.iter() {
                if task.current_offsets(&mut offsets) > 0 {
                    break;
                }
            }
        }
        let group = input.group_metadata();
        let with_offsets = match group {
            Some(group) if offsets.count() > 0 => Some((offsets.clone(), group)),
            _ => None,
        };
        match self.producer.commit_transaction(with_offsets, self.timeout) {
            Ok(()) => {
                for task in tasks.iter_mut() {
                    task.offsets_committed(&offsets);
                    task.transaction_committed()?;
                }
                metrics::histogram!("kstate_task_commit_seconds")
                    .record(started.elapsed().as_secs_f64());
                Ok(Committed::Done)
            }
            Err(e) if e.is_aborted() => Ok(Committed::Aborted(e.to_string())),
            Err(e) => Err(TaskError::transaction(self.worker, e)),
        }
    }

    fn abandon(&mut self, why: &str) -> Result<bool, TaskError> {
        self.producer
            .abort_transaction(why, self.timeout)
            .map_err(|e| TaskError::transaction(self.worker, e))?;
        Ok(true)
    }

    fn renew(&mut self, app: &AppShared) -> Result<(), TaskError> {
        self.producer = Self::producer_for(app, self.worker)?;
        metrics::counter!("kstate_task_producers_renewed").increment(1);
        Ok(())
    }
}
