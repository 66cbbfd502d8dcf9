//! A task's timers: wall-clock timers fire even when the task has no input (Kafka Streams'
//! punctuations that never fire on idle tasks, #1689, are the stream-time kind); stream-time
//! timers follow the largest record timestamp the task has seen.
//!
//! Missed firings are not replayed: a timer that is overdue fires once and is rescheduled one
//! interval later (wall clock) or on its grid of intervals past the stream time (stream time),
//! as Kafka Streams' punctuators do.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::ids::TimerId;

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeKind {
    /// The wall clock: fires even when the task's input is empty or it is still waiting for
    /// records.
    WallClock,
    /// Stream time: the largest record timestamp the task has seen. Fires as records advance it.
    StreamTime,
}

/// A timer that fired.
#[derive(Debug, Clone, Copy)]
pub struct Timer {
    /// Which one.
    pub id: TimerId,
    /// Its clock.
    pub kind: TimeKind,
    /// The time it fired at, in milliseconds since the epoch (wall clock or stream time).
    pub time_ms: i64,
}

#[derive(Debug)]
struct TimerEntry {
    id: TimerId,
    kind: TimeKind,
    every: Duration,
    /// Wall clock: the next firing.
    next_wall: Instant,
    /// Stream time: the next firing, once the task has seen a timestamp.
    next_stream: Option<i64>,
}

/// A task's timers.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    entries: Vec<TimerEntry>,
    next_id: u64,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Timers {
    /// Adds a timer firing every `every` (at least 1 ms), first one interval after `now` (wall
    /// clock) or after `stream_time` (stream time; once the task has seen a timestamp).
    pub(crate) fn schedule(
        &mut self,
        kind: TimeKind,
        every: Duration,
        now: Instant,
        stream_time: Option<i64>,
    ) -> TimerId {
        let every = every.max(Duration::from_millis(1));
        let id = TimerId(self.next_id);
        self.next_id += 1;
        self.entries.push(TimerEntry {
            id,
            kind,
            every,
            next_wall: after(now, every),
            next_stream: stream_time.map(|t| t.saturating_add(millis(every))),
        });
        id
    }

    /// Removes a timer; removing one that does not exist does nothing.
    pub(crate) fn cancel(&mut self, id: TimerId) {
        self.entries.retain(|t| t.id != id);
    }

    /// The earliest wall-clock firing.
    pub(crate) fn next_wall(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter(|t| t.kind == TimeKind::WallClock)
            .map(|t| t.next_wall)
            .min()
    }

    /// The timers due at `now` (wall clock) or at `stream_time`, rescheduled.
    pub(crate) fn due(&mut self, now: Instant, stream_time: Option<i64>) -> Vec<Timer> {
        let mut due = Vec::new();
        for t in &mut self.entries {
            match t.kind {
                TimeKind::WallClock => {
                    if now >= t.next_wall {
                        t.next_wall = after(now, t.every);
                        due.push(Timer {
                            id: t.id,
                            kind: t.kind,
                            time_ms: now_ms(),
                        });
                    }
                }
                TimeKind::StreamTime => {
                    let Some(stream) = stream_time else { continue };
                    let every = millis(t.every).max(1);
                    let next = *t.next_stream.get_or_insert(stream.saturating_add(every));
                    if stream >= next {
                        // The first multiple of `every` after `stream`, counted from `next`;
                        // in i128, so that timestamps at the edges of i64 (any producer can
                        // write them) neither overflow nor wrap: past i64::MAX it stays there.
                        let (stream_, next_, every_) =
                            (i128::from(stream), i128::from(next), i128::from(every));
                        let following = stream_ - (stream_ - next_) % every_ + every_;
                        t.next_stream = Some(i64::try_from(following).unwrap_or(i64::MAX));
                        due.push(Timer {
                            id: t.id,
                            kind: t.kind,
                            time_ms: stream,
                        });
                    }
                }
            }
        }
        due
    }

    /// Whether any stream-time timer exists (so records need not check otherwise).
    pub(crate) fn has_stream(&self) -> bool {
        self.entries.iter().any(|t| t.kind == TimeKind::StreamTime)
    }
}

/// `every` after `now`; an interval past what an `Instant` holds is a century (never, in
/// practice).
fn after(now: Instant, every: Duration) -> Instant {
    now.checked_add(every)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// `d` in whole milliseconds, at most `i64::MAX`.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(timers: &[Timer]) -> Vec<u64> {
        timers.iter().map(|t| t.id.0).collect()
    }

    #[test]
    fn timers_survive_the_largest_timestamps() {
        let now = Instant::now();
        for (scheduled_at, times) in [
            (Some(i64::MAX - 1), vec![i64::MAX - 1, i64::MAX, i64::MAX]),
            (Some(i64::MIN), vec![i64::MIN, 0, i64::MAX - 1, i64::MAX]),
            (None, vec![i64::MIN, i64::MAX]),
        ] {
            let mut timers = Timers::default();
            timers.schedule(
                TimeKind::StreamTime,
                Duration::from_millis(7),
                now,
                scheduled_at,
            );
            timers.schedule(TimeKind::StreamTime, Duration::MAX, now, scheduled_at);
            for t in times {
                for fired in timers.due(now, Some(t)) {
                    assert_eq!(fired.time_ms, t);
                }
            }
        }
    }

    #[test]
    fn a_stream_time_timer_fires_once_per_interval_of_stream_time_on_its_grid() {
        let mut timers = Timers::default();
        let now = Instant::now();
        let id = timers.schedule(
            TimeKind::StreamTime,
            Duration::from_millis(10),
            now,
            Some(100),
        );
        assert!(timers.due(now, Some(105)).is_empty(), "not due before 110");
        let fired = timers.due(now, Some(110));
        assert_eq!(ids(&fired), vec![id.0]);
        assert_eq!(fired[0].time_ms, 110);
        assert!(timers.due(now, Some(119)).is_empty(), "next at 120");
        // Stream time jumps past several intervals: one firing, the next on the grid after it.
        let fired = timers.due(now, Some(157));
        assert_eq!(fired.len(), 1, "missed firings are not replayed");
        assert_eq!(fired[0].time_ms, 157);
        assert!(timers.due(now, Some(159)).is_empty(), "next at 160");
        assert_eq!(timers.due(now, Some(160)).len(), 1);
    }

    #[test]
    fn a_stream_time_timer_scheduled_before_any_timestamp_starts_at_the_first_one() {
        let mut timers = Timers::default();
        let now = Instant::now();
        timers.schedule(TimeKind::StreamTime, Duration::from_millis(10), now, None);
        assert!(timers.due(now, None).is_empty(), "no stream time yet");
        assert!(
            timers.due(now, Some(1_000)).is_empty(),
            "first firing at 1010"
        );
        assert_eq!(timers.due(now, Some(1_010)).len(), 1);
    }

    #[test]
    fn stream_time_does_not_fire_wall_clock_timers_and_the_reverse() {
        let mut timers = Timers::default();
        let now = Instant::now();
        let wall = timers.schedule(TimeKind::WallClock, Duration::from_secs(1), now, Some(0));
        let stream = timers.schedule(TimeKind::StreamTime, Duration::from_secs(1), now, Some(0));
        assert_eq!(timers.next_wall(), Some(now + Duration::from_secs(1)));
        assert!(timers.has_stream());
        assert_eq!(ids(&timers.due(now, Some(5_000))), vec![stream.0]);
        let later = now + Duration::from_secs(2);
        assert_eq!(ids(&timers.due(later, None)), vec![wall.0]);
        assert_eq!(timers.next_wall(), Some(later + Duration::from_secs(1)));
    }

    #[test]
    fn a_cancelled_timer_never_fires() {
        let mut timers = Timers::default();
        let now = Instant::now();
        let id = timers.schedule(TimeKind::WallClock, Duration::from_millis(1), now, None);
        timers.cancel(id);
        timers.cancel(id);
        assert!(timers.due(now + Duration::from_secs(1), None).is_empty());
        assert_eq!(timers.next_wall(), None);
    }
}
