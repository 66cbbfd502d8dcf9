//! Work done so far, across threads, in the SAMZA-543 listing's form (`100000 rows in 649 ms`,
//! cumulative), kept as (count, ms) points for the chart (`benches/chart.py`).
//!
//! Threads add in strides (see [`Progress::STRIDE`]) so that the shared counter stays off the
//! hot path; a line is printed for every multiple of `every` that an addition crosses.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A shared counter that prints and records a point every `every` units.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    unit: &'static str,
    every: u64,
    done: AtomicU64,
    points: Mutex<Vec<(u64, f64)>>,
}

impl Progress {
    /// Units a thread should count locally before calling [`Progress::add`].
    pub const STRIDE: u64 = 1_000;

    /// A counter started now, printing `<n> <unit> in <ms> ms` every `every` units.
    pub fn new(unit: &'static str, every: u64) -> Self {
        Progress {
            start: Instant::now(),
            unit,
            every: every.max(1),
            done: AtomicU64::new(0),
            points: Mutex::new(Vec::new()),
        }
    }

    /// When the counter started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Counts `n` more, printing a line for every multiple of `every` crossed.
    pub fn add(&self, n: u64) {
        let before = self.done.fetch_add(n, Ordering::Relaxed);
        let mut mark = (before / self.every + 1) * self.every;
        while mark <= before + n {
            let ms = self.start.elapsed().as_secs_f64() * 1e3;
            println!("{mark} {} in {ms:.0} ms", self.unit);
            kstate_core::sync::lock(&self.points).push((mark, ms));
            mark += self.every;
        }
    }

    /// The points, in count order (threads may have pushed them slightly out of order).
    pub fn into_points(self) -> Vec<(u64, f64)> {
        let mut points = std::mem::take(&mut *kstate_core::sync::lock(&self.points));
        points.sort_by_key(|&(n, _)| n);
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_per_multiple_crossed() {
        let p = Progress::new("rows", 100);
        p.add(50);
        p.add(250);
        p.add(99);
        p.add(1);
        let marks: Vec<u64> = p.into_points().into_iter().map(|(n, _)| n).collect();
        assert_eq!(marks, vec![100, 200, 300, 400]);
    }
}
