//! A worker's health: fine, fenced (its producer cannot go on; it drops its tasks and rejoins
//! with a new one), or failed (it stops, and the application with it). One enum, changed only by
//! its transitions: the first failure wins, and one fencing event is counted once however many
//! calls report it.

use std::time::{Duration, Instant};

use crate::error::TaskError;

/// A worker whose producer was fenced this many times within [`PRODUCER_LOSS_WINDOW`] fails
/// instead of rejoining: another process runs with its instance id, or its transactions keep
/// timing out.
pub(crate) const MAX_PRODUCER_LOSSES: usize = 3;
/// A worker whose producer failed otherwise (not fenced) this many times within the window
/// fails. Such failures come with a cluster in motion: librdkafka 2.12 may send an abort's
/// EndTxn for partitions whose AddPartitionsToTxn never reached the coordinator, which refuses it
/// with INVALID_TXN_STATE, fatal to the producer (confluentinc/librdkafka#4849); on the
/// three-node cluster a rolling restart under frequent aborts did that four times in ten
/// seconds. Each costs a rejoin, not a failure; only a producer that keeps failing is broken.
pub(crate) const MAX_OTHER_PRODUCER_LOSSES: usize = 30;
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

    /// The producer cannot go on (`fenced`: the broker fenced it). Counted once per event:
    /// while the loss is being handled, further reports of it change nothing. Too many within
    /// the window fail the worker.
    pub(crate) fn producer_lost(
        &mut self,
        worker: usize,
        error: TaskError,
        fenced: bool,
        losses: &mut ProducerLosses,
    ) {
        if !self.is_ok() {
            return;
        }
        if losses.count(Instant::now(), fenced) {
            tracing::warn!(worker, error = %error, fenced, "the producer cannot go on: dropping the tasks without applying anything and rejoining with a new producer");
            *self = Health::ProducerLost(error);
        } else if fenced {
            tracing::error!(
                worker,
                error = %error,
                "the producer was fenced {MAX_PRODUCER_LOSSES} times within {PRODUCER_LOSS_WINDOW:?}: either another process runs with this instance id (and fences us), or transactions stay open past transaction.timeout.ms (a stalled broker, or a process paused for that long)"
            );
            *self = Health::Failed(error);
        } else {
            tracing::error!(
                worker,
                error = %error,
                "the producer failed {MAX_OTHER_PRODUCER_LOSSES} times within {PRODUCER_LOSS_WINDOW:?}: it cannot work with this cluster"
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

/// When the worker's producer was last replaced: after a fencing, and after other failures.
#[derive(Debug, Default)]
pub(crate) struct ProducerLosses {
    fenced: Vec<Instant>,
    other: Vec<Instant>,
}

impl ProducerLosses {
    /// Counts one loss at `now` (`fenced` or not); false when it is one too many of its kind
    /// within the window.
    pub(crate) fn count(&mut self, now: Instant, fenced: bool) -> bool {
        let (times, max) = if fenced {
            (&mut self.fenced, MAX_PRODUCER_LOSSES)
        } else {
            (&mut self.other, MAX_OTHER_PRODUCER_LOSSES)
        };
        times.retain(|t| now.duration_since(*t) < PRODUCER_LOSS_WINDOW);
        if times.len() >= max {
            return false;
        }
        times.push(now);
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
            health.producer_lost(0, error(n), true, &mut losses);
        }
        assert!(matches!(health, Health::ProducerLost(_)));
        health.recovered();
        assert!(health.is_ok());
        // Two more events are still within the limit; the fourth within the window fails.
        for n in 0..2 {
            health.producer_lost(0, error(n), true, &mut losses);
            assert!(matches!(health, Health::ProducerLost(_)), "loss {n}");
            health.recovered();
        }
        health.producer_lost(0, error(9), true, &mut losses);
        assert!(health.is_failed());
    }

    /// A rolling restart under frequent aborts lost the producer four times in ten seconds to
    /// librdkafka's abort refused with INVALID_TXN_STATE (not a fencing), and the fencing limit
    /// failed the application. Other losses have a limit of their own.
    #[test]
    fn producer_losses_other_than_fencing_rejoin_beyond_the_fencing_limit() {
        let (mut health, mut losses) = (Health::Ok, ProducerLosses::default());
        for n in 0..MAX_OTHER_PRODUCER_LOSSES {
            health.producer_lost(0, error(n), false, &mut losses);
            assert!(matches!(health, Health::ProducerLost(_)), "loss {n}");
            health.recovered();
        }
        // Fencings are counted apart, and still fail at their own limit.
        for n in 0..MAX_PRODUCER_LOSSES {
            health.producer_lost(0, error(n), true, &mut losses);
            assert!(matches!(health, Health::ProducerLost(_)), "fencing {n}");
            health.recovered();
        }
        health.producer_lost(0, error(99), false, &mut losses);
        assert!(health.is_failed());
    }

    #[test]
    fn producer_losses_older_than_the_window_do_not_count() {
        let mut losses = ProducerLosses::default();
        let start = Instant::now();
        for _ in 0..MAX_PRODUCER_LOSSES {
            assert!(losses.count(start, true));
        }
        assert!(!losses.count(start + Duration::from_secs(1), true));
        assert!(losses.count(start + PRODUCER_LOSS_WINDOW + Duration::from_secs(1), true));
    }

    #[test]
    fn a_failed_worker_does_not_count_producer_losses() {
        let (mut health, mut losses) = (Health::Ok, ProducerLosses::default());
        health.fail(0, error(1));
        health.producer_lost(0, error(2), true, &mut losses);
        health.producer_lost(0, error(3), false, &mut losses);
        assert!(health.is_failed());
        assert!(losses.fenced.is_empty() && losses.other.is_empty());
    }
}
