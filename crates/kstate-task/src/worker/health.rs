//! A worker's health: fine, fenced (its producer cannot go on; it drops its tasks and rejoins
//! with a new one), or failed (it stops, and the application with it). One enum, changed only by
//! its transitions: the first failure wins, and one fencing event is counted once however many
//! calls report it.

use std::time::{Duration, Instant};

use crate::error::TaskError;

/// A worker whose producer had to be replaced this many times within [`PRODUCER_LOSS_WINDOW`]
/// fails instead of rejoining.
pub(crate) const MAX_PRODUCER_LOSSES: usize = 3;
pub(crate) const PRODUCER_LOSS_WINDOW: Duration = Duration::from_secs(300);

#[derive(Debug)]
pub(crate) enum Health {
    Ok,
    /// Exactly-once: the producer cannot go on (the broker fenced it, or an abort could not
    /// complete). The tasks are dropped without applying anything; a new producer and a rejoin
    /// follow.
    ProducerLost(TaskError),
    /// The worker stops with this error.
    Failed(TaskError),
}

impl Health {
    pub(crate) fn is_ok(&self) -> bool {
        matches!(self, Health::Ok)
    }

    pub(crate) fn is_failed(&self) -> bool {
        matches!(self, Health::Failed(_))
    }

    /// The worker fails, unless it failed already (the first failure is the one reported).
    pub(crate) fn fail(&mut self, worker: usize, error: TaskError) {
        if self.is_failed() {
            tracing::warn!(worker, error = %error, "a further failure after the worker failed");
            return;
        }
        tracing::error!(worker, error = %error, "worker failed");
        *self = Health::Failed(error);
    }

    /// The producer cannot go on. Counted once per event: while the loss is being handled,
    /// further reports of it change nothing. Too many within the window fail the worker.
    pub(crate) fn producer_lost(
        &mut self,
        worker: usize,
        error: TaskError,
        losses: &mut ProducerLosses,
    ) {
        if !self.is_ok() {
            return;
        }
        if losses.count(Instant::now()) {
            tracing::warn!(worker, error = %error, "the producer cannot go on: dropping the tasks without applying anything and rejoining with a new producer");
            *self = Health::ProducerLost(error);
        } else {
            tracing::error!(
                worker,
                error = %error,
                "the producer had to be replaced {MAX_PRODUCER_LOSSES} times within {PRODUCER_LOSS_WINDOW:?}: either another process runs with this instance id (and fences us), or transactions stay open past transaction.timeout.ms (a stalled broker, or a process paused for that long)"
            );
            *self = Health::Failed(error);
        }
    }

    /// The loss was handled: a new producer is in place.
    pub(crate) fn recovered(&mut self) {
        if matches!(self, Health::ProducerLost(_)) {
            *self = Health::Ok;
        }
    }

    /// The failure, once the worker stops.
    pub(crate) fn into_failure(self) -> Option<TaskError> {
        match self {
            Health::Failed(e) => Some(e),
            Health::Ok | Health::ProducerLost(_) => None,
        }
    }
}

/// When the worker's producer was last replaced.
#[derive(Debug, Default)]
pub(crate) struct ProducerLosses(Vec<Instant>);

impl ProducerLosses {
    /// Counts one loss at `now`; false when it is one too many within the window.
    pub(crate) fn count(&mut self, now: Instant) -> bool {
        self.0
            .retain(|t| now.duration_since(*t) < PRODUCER_LOSS_WINDOW);
        if self.0.len() >= MAX_PRODUCER_LOSSES {
            return false;
        }
        self.0.push(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(n: usize) -> TaskError {
        TaskError::InvalidConfig(format!("failure {n}"))
    }

    #[test]
    fn the_first_failure_is_the_one_reported() {
        let mut health = Health::Ok;
        health.fail(0, error(1));
        health.fail(0, error(2));
        let reported = health.into_failure().map(|e| e.to_string());
        assert_eq!(
            reported.as_deref(),
            Some("invalid application configuration: failure 1")
        );
    }

    #[test]
    fn one_producer_loss_reported_several_times_counts_once() {
        let (mut health, mut losses) = (Health::Ok, ProducerLosses::default());
        for n in 0..5 {
            health.producer_lost(0, error(n), &mut losses);
        }
        assert!(matches!(health, Health::ProducerLost(_)));
        health.recovered();
        assert!(health.is_ok());
        // Two more events are still within the limit; the fourth within the window fails.
        for n in 0..2 {
            health.producer_lost(0, error(n), &mut losses);
            assert!(matches!(health, Health::ProducerLost(_)), "loss {n}");
            health.recovered();
        }
        health.producer_lost(0, error(9), &mut losses);
        assert!(health.is_failed());
    }

    #[test]
    fn producer_losses_older_than_the_window_do_not_count() {
        let mut losses = ProducerLosses::default();
        let start = Instant::now();
        for _ in 0..MAX_PRODUCER_LOSSES {
            assert!(losses.count(start));
        }
        assert!(!losses.count(start + Duration::from_secs(1)));
        assert!(losses.count(start + PRODUCER_LOSS_WINDOW + Duration::from_secs(1)));
    }

    #[test]
    fn a_failed_worker_does_not_count_producer_losses() {
        let (mut health, mut losses) = (Health::Ok, ProducerLosses::default());
        health.fail(0, error(1));
        health.producer_lost(0, error(2), &mut losses);
        assert!(health.is_failed());
        assert!(losses.0.is_empty());
    }
}
