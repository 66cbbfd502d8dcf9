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

use std::time::Duration;

use kstate_kafka::SharedProducer;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::CommitMode;

use crate::config::AppConfig;
use crate::error::TaskError;
use crate::task::Task;
use crate::worker::input::Input;

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
    /// then a revocation commits every task, and dropping one task's work drops all of theirs.
    fn shared_fate(&self) -> bool;

    /// Commits `tasks`.
    fn commit(
        &mut self,
        tasks: &mut [&mut Task],
        input: &dyn Input,
        occasion: Occasion,
    ) -> Result<Committed, TaskError>;

    /// Drops what the tasks did since their last commit: under exactly-once the transaction
    /// aborts (every task must then start over); under at-least-once there is nothing shared to
    /// drop.
    fn abandon(&mut self, why: &str) -> Result<(), TaskError>;

    /// The producer could not go on: a new one.
    fn renew(&mut self, config: &AppConfig) -> Result<(), TaskError>;
}

/// The commit path of `config`'s guarantee, with a new producer.
pub(crate) fn for_config(
    config: &AppConfig,
    worker: usize,
) -> Result<Box<dyn CommitPath>, TaskError> {
    Ok(match config.guarantee {
        crate::config::ProcessingGuarantee::AtLeastOnce => Box::new(AtLeastOnce {
            worker,
            producer: SharedProducer::with_config(&config.producer_config())
                .map_err(|e| TaskError::producer(worker, e))?,
            timeout: config.commit_timeout(),
        }),
        crate::config::ProcessingGuarantee::ExactlyOnce => Box::new(Transactional {
            worker,
            producer: Transactional::producer_for(config, worker)?,
            timeout: config.commit_timeout(),
        }),
    })
}

pub(crate) struct AtLeastOnce {
    worker: usize,
    producer: SharedProducer,
    timeout: Duration,
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
        let started = std::time::Instant::now();
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
                // (`Core::confirm_last_commit`).
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
        Ok(Committed::Done)
    }

    fn abandon(&mut self, _why: &str) -> Result<(), TaskError> {
        Ok(())
    }

    fn renew(&mut self, config: &AppConfig) -> Result<(), TaskError> {
        self.producer = SharedProducer::with_config(&config.producer_config())
            .map_err(|e| TaskError::producer(self.worker, e))?;
        Ok(())
    }
}

pub(crate) struct Transactional {
    worker: usize,
    producer: SharedProducer,
    timeout: Duration,
}

impl Transactional {
    /// Creating it fences this worker's previous incarnation and aborts its open transaction.
    fn producer_for(config: &AppConfig, worker: usize) -> Result<SharedProducer, TaskError> {
        SharedProducer::transactional_with(
            &config.producer_config(),
            config.transactional_id(worker),
            config.transaction_timeout,
        )
        .map_err(|e| TaskError::producer(worker, e))
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
        let started = std::time::Instant::now();
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

    fn abandon(&mut self, why: &str) -> Result<(), TaskError> {
        self.producer
            .abort_transaction(why, self.timeout)
            .map_err(|e| TaskError::transaction(self.worker, e))
    }

    fn renew(&mut self, config: &AppConfig) -> Result<(), TaskError> {
        self.producer = Self::producer_for(config, self.worker)?;
        metrics::counter!("kstate_task_producers_renewed").increment(1);
        Ok(())
    }
}
