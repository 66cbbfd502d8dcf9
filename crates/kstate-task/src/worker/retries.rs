//! Exactly-once: how often the worker aborts and starts over before it gives up. An abort
//! undoes a transaction that failed for a reason that may pass (a broker that did not answer in
//! time); one that keeps failing must not loop for ever, leaving aborted records and a marker
//! in every changelog partition each round. So aborts in a row without a commit are bounded,
//! and spaced out: 100 ms after the first, doubling up to 5 s, which rides out about half a
//! minute of trouble before the application fails. Restores again of a task whose stores
//! disagree with their changelogs are bounded the same way ([`RestoreStreaks`]).

use std::collections::BTreeMap;
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

/// A task whose stores keep disagreeing with their changelog after this many restores in a row
/// (without a commit of records it took in between) fails the worker. A commit that carries
/// none of its records does not count: under at-least-once every periodic commit succeeds (its
/// offsets go asynchronously), so a task that restores, fails again before it takes a record,
/// and restores again would otherwise loop for ever.
pub(crate) const MAX_RESTORES: u32 = 3;

/// Restores in a row per task whose stores disagreed with their changelogs.
#[derive(Debug, Default)]
pub(crate) struct RestoreStreaks {
    restores: BTreeMap<i32, u32>,
}

impl RestoreStreaks {
    /// Task `partition` is to restore again: `Err(n)`, the `n` restores in a row it had, once
    /// that is one too many.
    pub(crate) fn again(&mut self, partition: i32) -> Result<(), u32> {
        let restores = self.restores.entry(partition).or_insert(0);
        *restores += 1;
        if *restores > MAX_RESTORES {
            return Err(*restores - 1);
        }
        Ok(())
    }

    /// A commit carried records of the `progressed` tasks: their streaks end.
    pub(crate) fn progressed(&mut self, progressed: &[i32]) {
        self.restores.retain(|p, _| !progressed.contains(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_in_a_row_are_bounded_until_a_commit_carries_the_tasks_records() {
        let mut streaks = RestoreStreaks::default();
        for _ in 0..MAX_RESTORES {
            assert_eq!(streaks.again(0), Ok(()));
        }
        assert_eq!(streaks.again(1), Ok(()), "each task counts its own");
        streaks.progressed(&[1]);
        assert_eq!(streaks.again(0), Err(MAX_RESTORES));
        streaks.progressed(&[0]);
        assert_eq!(streaks.again(0), Ok(()));
    }

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
