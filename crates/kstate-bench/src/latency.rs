//! Call latencies: one HDR histogram per thread (no sharing on the hot path), merged at the end
//! and summarised as the percentiles every benchmark line prints.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::BenchError;

/// The largest latency recorded exactly: a minute. Slower calls saturate at it.
const MAX_NS: u64 = 60_000_000_000;

/// Latencies in nanoseconds, 3 significant digits, 1 ns to a minute.
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Self {
        Latency(
            Histogram::new_with_bounds(1, MAX_NS, 3)
                .unwrap_or_else(|e| unreachable!("1..{MAX_NS} ns at 3 digits is valid: {e}")),
        )
    }

    /// Records one call that took `elapsed`.
    pub fn record(&mut self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(MAX_NS);
        self.0.saturating_record(ns.clamp(1, MAX_NS));
    }

    /// Adds another thread's calls.
    pub fn merge(&mut self, other: &Latency) -> Result<(), BenchError> {
        self.0.add(&other.0)?;
        Ok(())
    }

    /// Calls recorded.
    pub fn calls(&self) -> u64 {
        self.0.len()
    }

    /// The percentiles, in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1e3;
        LatencySummary {
            calls: self.0.len(),
            p50_us: us(self.0.value_at_quantile(0.50)),
            p95_us: us(self.0.value_at_quantile(0.95)),
            p99_us: us(self.0.value_at_quantile(0.99)),
            p999_us: us(self.0.value_at_quantile(0.999)),
            max_us: us(self.0.max()),
        }
    }
}

/// A histogram's percentiles; `Display` prints them as `calls=.. p50_us=.. p95_us=.. p99_us=..
/// p999_us=.. max_us=..`, the form the benchmark lines (and the scripts that parse them) use.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Calls recorded.
    pub calls: u64,
    /// Median, µs.
    pub p50_us: f64,
    /// 95th percentile, µs.
    pub p95_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Slowest call, µs.
    pub max_us: f64,
}

impl fmt::Display for LatencySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "calls={} p50_us={:.1} p95_us={:.1} p99_us={:.1} p999_us={:.1} max_us={:.1}",
            self.calls, self.p50_us, self.p95_us, self.p99_us, self.p999_us, self.max_us
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_merged_threads() {
        let (mut a, mut b) = (Latency::new(), Latency::new());
        for us in 1..=500 {
            a.record(Duration::from_micros(us));
        }
        for us in 501..=1000 {
            b.record(Duration::from_micros(us));
        }
        a.merge(&b).ok();
        let s = a.summary();
        assert_eq!(s.calls, 1000);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{s}");
        assert!((s.p99_us - 990.0).abs() < 1.0, "{s}");
        assert!((s.max_us - 1000.0).abs() < 1.0, "{s}");
    }

    #[test]
    fn slower_than_a_minute_saturates() {
        let mut l = Latency::new();
        l.record(Duration::from_secs(3600));
        l.record(Duration::ZERO);
        assert_eq!(l.calls(), 2);
        assert!(l.summary().max_us >= 59e6);
        assert!(l.summary().to_string().starts_with("calls=2 p50_us="));
    }
}
