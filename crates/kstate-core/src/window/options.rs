//! [`WindowOptions`]: the shape of a window store's windows and how long it keeps them.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::segments::Segments;

/// Kafka Streams' default segment floor: segments are at least a minute long.
const MIN_DEFAULT_SEGMENT_MS: i64 = 60_000;

/// Kafka Streams' `windowstore.changelog.additional.retention.ms`: the changelog keeps a window a
/// day longer than the store, so that clocks a little apart never lose a live window.
pub const CHANGELOG_EXTRA_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Windows of a fixed size (tumbling, or hopping by an advance), the grace after a window ends
/// during which late records still count, and how long the store keeps a window.
///
/// All times are milliseconds since the epoch, as Kafka's record timestamps are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowOptions {
    pub(crate) size: i64,
    pub(crate) advance: i64,
    pub(crate) grace: i64,
    pub(crate) retention: Option<i64>,
    pub(crate) retain_duplicates: bool,
    pub(crate) segment_interval: Option<i64>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl WindowOptions {
    /// Tumbling windows of `size`: each time is in exactly one window, `[k·size, (k+1)·size)`.
    pub fn tumbling(size: Duration) -> Self {
        let size = millis(size);
        WindowOptions {
            size,
            advance: size,
            grace: 0,
            retention: None,
            retain_duplicates: false,
            segment_interval: None,
        }
    }

    /// Hopping windows of `size` starting every `advance` (≤ `size`): each time is in
    /// `size / advance` windows.
    pub fn hopping(size: Duration, advance: Duration) -> Self {
        WindowOptions {
            advance: millis(advance),
            ..WindowOptions::tumbling(size)
        }
    }

    /// How long after a window's end a late record still updates it (default 0). A window is
    /// final, and its result may be emitted, once stream time reaches end + grace.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = millis(grace);
        self
    }

    /// How long behind stream time the store keeps a window, at least size + grace (the
    /// default). Writes to windows older than that are refused and counted.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(millis(retention));
        self
    }

    /// Keep every value put under one key and window, not only the last (a stream-stream join's
    /// buffer, Kafka Streams' `retainDuplicates`).
    pub fn retain_duplicates(mut self) -> Self {
        self.retain_duplicates = true;
        self
    }

    /// The length of a time segment (default: half the retention, at least a minute, as Kafka
    /// Streams'). Expired data goes a whole segment at a time.
    pub fn segment_interval(mut self, interval: Duration) -> Self {
        self.segment_interval = Some(millis(interval));
        self
    }

    /// The window size, ms.
    pub fn size_ms(&self) -> i64 {
        self.size
    }

    /// The advance between window starts, ms (the size, for tumbling windows).
    pub fn advance_ms(&self) -> i64 {
        self.advance
    }

    /// The grace period, ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace
    }

    /// The retention, ms.
    pub fn retention_ms(&self) -> i64 {
        self.retention
            .unwrap_or_else(|| self.size.saturating_add(self.grace))
    }

    /// Whether every value under one key and window is kept.
    pub fn retains_duplicates(&self) -> bool {
        self.retain_duplicates
    }

    /// The segment length, ms.
    pub fn segment_interval_ms(&self) -> i64 {
        self.segment_interval
            .unwrap_or_else(|| (self.retention_ms() / 2).max(MIN_DEFAULT_SEGMENT_MS))
    }

    /// The store's time segments.
    pub(crate) fn segments(&self) -> Segments {
        Segments {
            interval: self.segment_interval_ms(),
            retention: self.retention_ms(),
        }
    }

    /// The `retention.ms` the store's changelog topic needs (`cleanup.policy=compact,delete`):
    /// the store's retention plus [`CHANGELOG_EXTRA_RETENTION`], as Kafka Streams sets it.
    pub fn changelog_retention(&self) -> Duration {
        Duration::from_millis(self.retention_ms().max(0) as u64) + CHANGELOG_EXTRA_RETENTION
    }

    /// The start of every window holding time `t`, earliest first.
    ///
    /// Counted in i128: a timestamp at either edge of i64 (any producer can write one) never
    /// overflows; a window that would start before `i64::MIN` is not among them.
    pub fn windows_containing(&self, t: i64) -> impl Iterator<Item = i64> + use<> {
        let (size, advance, t) = (
            i128::from(self.size),
            i128::from(self.advance),
            i128::from(t),
        );
        // The latest window starting at or before t, then back by advance while it still
        // covers t.
        let last = t - t.rem_euclid(advance);
        let first = last - ((size - 1) / advance) * advance;
        (0..)
            .map(move |k: i128| first + k * advance)
            .take_while(move |&start| start <= last)
            .filter(move |&start| start + size > t)
            .filter_map(|start| i64::try_from(start).ok())
    }

    /// The latest time a window store can place: every window holding it ends, and closes
    /// (end plus grace), at a time an `i64` holds. A record timestamped later (any producer can
    /// write one) is bad input, refused by [`WindowStore::check_time`](crate::WindowStore::check_time).
    pub fn latest_time(&self) -> i64 {
        i64::MAX
            .saturating_sub(self.size)
            .saturating_sub(self.grace)
    }

    /// The time from which the window starting at `start` is final: its end plus the grace.
    pub fn closes_at(&self, start: i64) -> i64 {
        start.saturating_add(self.size).saturating_add(self.grace)
    }

    /// Checks the options: a positive size, an advance in `1..=size`, a grace ≥ 0, a retention
    /// of at least size + grace, a positive segment interval. The error names `store`.
    pub fn validate(&self, store: &str) -> Result<()> {
        let problem = if self.size <= 0 {
            Some(format!(
                "the window size must be positive, not {} ms",
                self.size
            ))
        } else if self.advance <= 0 || self.advance > self.size {
            Some(format!(
                "the advance must be in 1..={} ms (the size), not {} ms",
                self.size, self.advance
            ))
        } else if self.grace < 0 {
            Some(format!(
                "the grace must not be negative, not {} ms",
                self.grace
            ))
        } else if self.retention_ms() < self.size.saturating_add(self.grace) {
            Some(format!(
                "the retention ({} ms) must be at least the size plus the grace ({} ms): \
                 a window would be dropped before it closes",
                self.retention_ms(),
                self.size.saturating_add(self.grace)
            ))
        } else if self.segment_interval_ms() <= 0 {
            Some(format!(
                "the segment interval must be positive, not {} ms",
                self.segment_interval_ms()
            ))
        } else {
            None
        };
        match problem {
            Some(message) => Err(Error::InvalidArgument {
                store: store.to_string(),
                message,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_in_one_tumbling_window_and_in_size_over_advance_hopping_ones() {
        let tumbling = WindowOptions::tumbling(Duration::from_secs(60));
        assert_eq!(
            tumbling.windows_containing(61_000).collect::<Vec<_>>(),
            [60_000]
        );
        assert_eq!(
            tumbling.windows_containing(-1).collect::<Vec<_>>(),
            [-60_000]
        );
        let hopping = WindowOptions::hopping(Duration::from_secs(60), Duration::from_secs(20));
        assert_eq!(
            hopping.windows_containing(61_000).collect::<Vec<_>>(),
            [20_000, 40_000, 60_000]
        );
        assert_eq!(
            hopping.windows_containing(60_000).collect::<Vec<_>>(),
            [20_000, 40_000, 60_000]
        );
        assert_eq!(
            hopping.windows_containing(59_999).collect::<Vec<_>>(),
            [0, 20_000, 40_000]
        );
    }

    #[test]
    fn windows_containing_the_largest_times_do_not_overflow() {
        let hopping = WindowOptions::hopping(Duration::from_secs(60), Duration::from_secs(20));
        let tumbling = WindowOptions::tumbling(Duration::from_secs(60));
        for options in [&hopping, &tumbling] {
            for t in [i64::MAX, i64::MAX - 1, i64::MIN, i64::MIN + 1] {
                let starts: Vec<i64> = options.windows_containing(t).collect();
                for start in &starts {
                    assert!(
                        i128::from(*start) <= i128::from(t)
                            && i128::from(*start) + i128::from(options.size_ms()) > i128::from(t),
                        "window {start} does not hold {t}"
                    );
                }
                if t > 0 {
                    assert!(!starts.is_empty(), "no window holds {t}");
                }
            }
        }
        // At the bottom edge, only the windows that start at or after i64::MIN.
        assert_eq!(
            tumbling.windows_containing(i64::MIN).collect::<Vec<_>>(),
            Vec::<i64>::new()
        );
    }

    #[test]
    fn defaults_follow_kafka_streams_and_bad_shapes_are_refused() {
        let o = WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10));
        assert_eq!(o.retention_ms(), 70_000);
        assert_eq!(o.segment_interval_ms(), 60_000);
        assert_eq!(o.closes_at(0), 70_000);
        let day =
            WindowOptions::tumbling(Duration::from_secs(60)).retention(Duration::from_secs(86_400));
        assert_eq!(day.segment_interval_ms(), 43_200_000);
        assert!(o.validate("s").is_ok());
        let short = o.retention(Duration::from_secs(60));
        let err = short.validate("s").unwrap_err().to_string();
        assert!(err.contains("at least the size plus the grace"), "{err}");
        let wide = WindowOptions::hopping(Duration::from_secs(1), Duration::from_secs(2));
        assert!(wide.validate("s").is_err());
        assert!(
            WindowOptions::tumbling(Duration::ZERO)
                .validate("s")
                .is_err()
        );
    }
}
