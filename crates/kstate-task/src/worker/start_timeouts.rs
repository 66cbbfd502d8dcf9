//! How long a task may keep failing to start while the cluster is in motion: Kafka Streams'
//! `task.timeout.ms` (KIP-572). A restore whose broker did not answer, a start that could not
//! learn its inputs' committed offsets, a seek refused during a rebalance: each passes once the
//! cluster settles (a broker restarted, a leader elected, a paused node back), so the task is
//! tried again; but a cluster that never settles must fail the application with the last
//! failure, not loop for ever. The clock starts at a task's first such failure and stops when
//! the task runs or leaves the worker.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Since when each task has failed to start.
#[derive(Debug)]
pub(crate) struct StartTimeouts {
    timeout: Duration,
    since: BTreeMap<i32, Instant>,
}

impl StartTimeouts {
    pub(crate) fn new(timeout: Duration) -> Self {
        StartTimeouts {
            timeout,
            since: BTreeMap::new(),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Task `partition` failed to start at `now` while the cluster is in motion: `Ok` while it
    /// may try again, `Err(waited)` once it has failed for the timeout.
    pub(crate) fn failed(&mut self, partition: i32, now: Instant) -> Result<(), Duration> {
        let since = *self.since.entry(partition).or_insert(now);
        let waited = now.saturating_duration_since(since);
        if waited >= self.timeout {
            return Err(waited);
        }
        Ok(())
    }

    /// Task `partition` runs, or left the worker: its clock stops.
    pub(crate) fn stopped(&mut self, partition: i32) {
        self.since.remove(&partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_may_fail_to_start_until_the_timeout_has_passed_since_its_first_failure() {
        let mut timeouts = StartTimeouts::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(timeouts.failed(0, t0), Ok(()));
        assert_eq!(timeouts.failed(0, t0 + Duration::from_secs(9)), Ok(()));
        assert_eq!(
            timeouts.failed(1, t0 + Duration::from_secs(9)),
            Ok(()),
            "each task has its own clock"
        );
        assert_eq!(
            timeouts.failed(0, t0 + Duration::from_secs(10)),
            Err(Duration::from_secs(10))
        );
        timeouts.stopped(0);
        assert_eq!(
            timeouts.failed(0, t0 + Duration::from_secs(11)),
            Ok(()),
            "a task that ran starts a new clock"
        );
    }

    #[test]
    fn a_zero_timeout_fails_at_the_first_failure() {
        let mut timeouts = StartTimeouts::new(Duration::ZERO);
        assert_eq!(timeouts.failed(0, Instant::now()), Err(Duration::ZERO));
    }
}
