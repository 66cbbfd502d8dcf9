//! How a worker tries again, and when it stops trying: the state behind every "again" of the
//! worker's transitions, in one place, so that each bound is kept by the one who counts.
//!
//! - aborts in a row without a commit, spaced out and bounded ([`Retries`]);
//! - restores again of a task whose stores disagree with their changelogs, bounded until a
//!   commit carries the task's records ([`RestoreStreaks`]);
//! - how long a task may keep failing to start while the cluster is in motion, Kafka Streams'
//!   `task.timeout.ms` ([`StartTimeouts`]);
//! - the pause before the next record is processed after an abort or a start refused.
//!
//! Each way of trying again returns the error that ends the trying, with what it counted; the
//! worker's [`Core`](crate::worker::core::Core) fails with it. None of this calls the worker.

use std::time::{Duration, Instant};

use crate::error::TaskError;
use crate::ids::TaskId;
use crate::worker::retries::{RestoreStreaks, Retries};
use crate::worker::start_timeouts::StartTimeouts;

/// How long a worker waits before it asks again where its tasks' inputs start, while the
/// cluster is in motion.
const START_RETRY: Duration = Duration::from_millis(500);

/// A worker's retry state.
#[derive(Debug)]
pub(crate) struct Recovery {
    worker: usize,
    aborts: Retries,
    restores: RestoreStreaks,
    starts: StartTimeouts,
    /// Nothing is processed before this.
    backoff_until: Option<Instant>,
}

impl Recovery {
    pub(crate) fn new(worker: usize, task_timeout: Duration) -> Self {
        Recovery {
            worker,
            aborts: Retries::default(),
            restores: RestoreStreaks::default(),
            starts: StartTimeouts::new(task_timeout),
            backoff_until: None,
        }
    }

    /// Until when nothing is processed (taken once).
    pub(crate) fn take_backoff(&mut self) -> Option<Instant> {
        self.backoff_until.take()
    }

    /// A commit carried the records of the tasks `progressed`: the aborts in a row, and those
    /// tasks' restores in a row, count from zero again.
    pub(crate) fn committed(&mut self, progressed: &[i32]) {
        self.aborts.committed();
        self.restores.progressed(progressed);
    }

    /// A transaction aborted for `why`: the tasks start over after a back-off, or, one abort
    /// too many, the worker fails with [`TaskError::RetriesExhausted`].
    pub(crate) fn aborted(&mut self, why: String) -> Result<(), TaskError> {
        match self.aborts.aborted() {
            Some(wait) => {
                self.backoff_until = Some(Instant::now() + wait);
                Ok(())
            }
            None => Err(TaskError::RetriesExhausted {
                worker: self.worker,
                attempts: self.aborts.aborts(),
                last: why,
            }),
        }
    }

    /// Tasks `partitions` could not start because the cluster is in motion (`error`): they may
    /// try again (after a pause before the next record, if `pause`), until one of them has
    /// failed to start for the task timeout: then the result is [`TaskError::TimedOut`] with
    /// `error` as the last failure.
    pub(crate) fn start_later(
        &mut self,
        partitions: &[i32],
        error: TaskError,
        pause: bool,
    ) -> Result<(), TaskError> {
        let now = Instant::now();
        let expired = partitions
            .iter()
            .find_map(|&p| self.starts.failed(p, now).err().map(|w| (p, w)));
        if let Some((partition, waited)) = expired {
            return Err(TaskError::TimedOut {
                what: TaskId { partition }.to_string(),
                waited,
                timeout: self.starts.timeout(),
                last: Box::new(error),
            });
        }
        if pause {
            self.backoff_until = Some(now + START_RETRY);
        }
        Ok(())
    }

    /// Task `partition` runs, or left the worker: its start-timeout clock stops.
    pub(crate) fn started_or_left(&mut self, partition: i32) {
        self.starts.stopped(partition);
    }

    /// Task `partition`'s stores disagree with their changelogs (`error`): it may restore
    /// again, unless it did so too often without a commit carrying its records; then the result
    /// is [`TaskError::Corrupted`].
    pub(crate) fn restore_again(
        &mut self,
        partition: i32,
        error: &TaskError,
    ) -> Result<(), TaskError> {
        self.restores
            .again(partition)
            .map_err(|restores| TaskError::Corrupted {
                task: TaskId { partition },
                restores,
                last: error.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::retries::{MAX_ABORTS, MAX_RESTORES};

    fn in_motion() -> TaskError {
        TaskError::InvalidConfig("a failure".into())
    }

    #[test]
    fn an_abort_pauses_processing_until_too_many_in_a_row_fail_the_worker() {
        let mut recovery = Recovery::new(3, Duration::from_secs(60));
        for _ in 1..MAX_ABORTS {
            recovery.aborted("x".into()).unwrap();
            assert!(recovery.take_backoff().is_some());
            assert!(recovery.take_backoff().is_none(), "taken once");
        }
        let error = recovery.aborted("last".into()).unwrap_err();
        assert!(
            matches!(&error, TaskError::RetriesExhausted { worker: 3, attempts, last } if *attempts == MAX_ABORTS && last == "last"),
            "{error}"
        );
        recovery.committed(&[]);
        recovery.aborted("x".into()).unwrap();
    }

    #[test]
    fn a_start_refused_pauses_only_when_asked_and_times_out_per_task() {
        let mut recovery = Recovery::new(0, Duration::from_secs(60));
        recovery.start_later(&[1], in_motion(), false).unwrap();
        assert!(recovery.take_backoff().is_none());
        recovery.start_later(&[1], in_motion(), true).unwrap();
        assert!(recovery.take_backoff().is_some());

        let mut at_once = Recovery::new(0, Duration::ZERO);
        let error = at_once.start_later(&[4], in_motion(), true).unwrap_err();
        assert!(
            matches!(&error, TaskError::TimedOut { what, .. } if what.contains('4')),
            "{error}"
        );
        assert!(
            at_once.take_backoff().is_none(),
            "no pause for a worker that fails"
        );
    }

    #[test]
    fn restores_again_are_bounded_until_a_commit_carries_the_task() {
        let mut recovery = Recovery::new(0, Duration::from_secs(60));
        for _ in 0..MAX_RESTORES {
            recovery.restore_again(2, &in_motion()).unwrap();
        }
        let error = recovery.restore_again(2, &in_motion()).unwrap_err();
        assert!(
            matches!(error, TaskError::Corrupted { restores, .. } if restores == MAX_RESTORES),
            "{error}"
        );
        recovery.committed(&[2]);
        recovery.restore_again(2, &in_motion()).unwrap();
    }
}
