//! Exactly-once: how often the worker aborts and starts over before it gives up. An abort
//! undoes a transaction that failed for a reason that may pass (a broker that did not answer in
//! time); one that keeps failing must not loop for ever, leaving aborted records and a marker
//! in every changelog partition each round. So aborts in a row without a commit are bounded,
//! and spaced out: 100 ms after the first, doubling up to 5 s, which rides out about half a
//! minute of trouble before the application fails.

use std::time::Duration;

/// Aborts in a row (without a commit in between) before the worker fails.
pub(crate) const MAX_ABORTS: u32 = 10;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Aborts since the last commit.
#[derive(Debug, Default)]
pub(crate) struct Retries {
    aborts: u32,
}

impl Retries {
    /// A transaction committed: the count starts over.
    pub(crate) fn committed(&mut self) {
        self.aborts = 0;
    }

    /// A transaction aborted: how long to wait before starting over, or `None` once that was
    /// one abort too many.
    pub(crate) fn aborted(&mut self) -> Option<Duration> {
        self.aborts += 1;
        if self.aborts >= MAX_ABORTS {
            return None;
        }
        let doubled = FIRST_BACKOFF.saturating_mul(1 << (self.aborts - 1).min(16));
        Some(doubled.min(MAX_BACKOFF))
    }

    pub(crate) fn aborts(&self) -> u32 {
        self.aborts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aborts_in_a_row_back_off_and_are_bounded() {
        let mut retries = Retries::default();
        let waits: Vec<Duration> = std::iter::from_fn(|| retries.aborted()).collect();
        assert_eq!(waits.len() as u32, MAX_ABORTS - 1);
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], FIRST_BACKOFF * 2);
        assert!(waits.iter().all(|w| *w <= MAX_BACKOFF));
        assert_eq!(retries.aborted(), None, "still exhausted");
    }

    #[test]
    fn a_commit_starts_the_count_over() {
        let mut retries = Retries::default();
        for _ in 0..MAX_ABORTS - 1 {
            assert!(retries.aborted().is_some());
        }
        retries.committed();
        assert_eq!(retries.aborted(), Some(FIRST_BACKOFF));
    }
}
