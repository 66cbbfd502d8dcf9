//! [`SessionStore`]: sessions of activity per key over any [`KeyValueStore`].

use std::ops::Bound;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::range::{KeyRange, Order};
use crate::segments::{self, STREAM_TIME_KEY, Segments};
use crate::store::{Batch, EntryIter, KeyValueStore};
use crate::stream_clock::StreamClock;

/// Bytes after a session's escaped key: its end (8) and start (8).
pub(crate) const SUFFIX: usize = 16;
/// Kafka Streams' floor for a segment.
const MIN_DEFAULT_SEGMENT_MS: i64 = 60_000;

/// How long a session store keeps a session behind stream time, and its segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    pub(crate) retention: i64,
    pub(crate) segment_interval: Option<i64>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SessionOptions {
    /// Sessions kept until stream time passes their end by `retention` (at least the
    /// inactivity gap plus the grace of the aggregation that uses the store).
    pub fn new(retention: Duration) -> Self {
        SessionOptions {
            retention: millis(retention),
            segment_interval: None,
        }
    }

    /// The length of a time segment (default: half the retention, at least a minute).
    pub fn segment_interval(mut self, interval: Duration) -> Self {
        self.segment_interval = Some(millis(interval));
        self
    }

    /// The retention, ms.
    pub fn retention_ms(&self) -> i64 {
        self.retention
    }

    /// The segment length, ms.
    pub fn segment_interval_ms(&self) -> i64 {
        self.segment_interval
            .unwrap_or_else(|| (self.retention / 2).max(MIN_DEFAULT_SEGMENT_MS))
    }

    /// The `retention.ms` the changelog topic needs: the retention plus
    /// [`CHANGELOG_EXTRA_RETENTION`](crate::window::CHANGELOG_EXTRA_RETENTION).
    pub fn changelog_retention(&self) -> Duration {
        Duration::from_millis(self.retention.max(0) as u64)
            + crate::window::CHANGELOG_EXTRA_RETENTION
    }

    pub(crate) fn segments(&self) -> Segments {
        Segments {
            interval: self.segment_interval_ms(),
            retention: self.retention,
        }
    }

    /// Checks the options: a positive retention and segment interval. The error names `store`.
    pub fn validate(&self, store: &str) -> Result<()> {
        let problem = if self.retention <= 0 {
            Some(format!(
                "the retention must be positive, not {} ms",
                self.retention
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

/// A session: a key's activity from `start` to `end` (both inclusive, ms), and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The key.
    pub key: Vec<u8>,
    /// The first record's time.
    pub start: i64,
    /// The last record's time.
    pub end: i64,
    /// The aggregate.
    pub value: Vec<u8>,
}

/// What [`SessionStore::put`] and [`SessionStore::merge`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPut {
    /// Stored.
    Stored,
    /// The session ended at or before stream time − retention: nothing was written.
    Expired {
        /// The stream time it was too old for.
        stream_time: i64,
    },
}

/// Sessions per key, kept for a retention behind stream time (the latest session end put),
/// over any byte store; [`SessionChangelog`](crate::SessionChangelog) logs them in Kafka
/// Streams' format. The layout, expiry and stream time work as the
/// [`WindowStore`](crate::WindowStore)'s do, with segments by session end.
#[derive(Debug)]
pub struct SessionStore<S> {
    store: S,
    options: SessionOptions,
    segments: Segments,
    clock: StreamClock,
}

impl<S: KeyValueStore> SessionStore<S> {
    /// A session store over `store`, which holds this session store only.
    pub fn open(store: S, options: SessionOptions) -> Result<Self> {
        let sessions = Self::reader(store, options)?;
        sessions.drop_expired()?;
        Ok(sessions)
    }

    /// A session store over `store` for reads beside its writer (an interactive query): reads
    /// the stored stream time and writes nothing; what has expired by that time is invisible
    /// to its reads, and the writer drops it.
    pub fn reader(store: S, options: SessionOptions) -> Result<Self> {
        options.validate(store.name())?;
        let segments = options.segments();
        Ok(SessionStore {
            clock: StreamClock::read(&store, segments)?,
            segments,
            store,
            options,
        })
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.store
    }

    /// Takes the store underneath out.
    pub fn into_inner(self) -> S {
        self.store
    }

    /// The options it was opened with.
    pub fn options(&self) -> &SessionOptions {
        &self.options
    }

    /// The latest session end put or time [observed](Self::observe) (`None`: none yet).
    pub fn stream_time(&self) -> Option<i64> {
        self.clock.now()
    }

    /// Writes refused since open because their session had expired.
    pub fn expired_writes(&self) -> u64 {
        self.clock.expired_writes()
    }

    /// Advances stream time to `time` (a record's timestamp), if it is later; see
    /// [`WindowStore::observe`](crate::WindowStore::observe).
    pub fn observe(&self, time: i64) -> Result<()> {
        self.clock.observe(&self.store, time)
    }

    /// Stores `value` for `key`'s session `start..=end`.
    pub fn put(&self, key: &[u8], start: i64, end: i64, value: &[u8]) -> Result<SessionPut> {
        self.write(key, &[], Some((start, end, value)))
    }

    /// Removes `key`'s session `start..=end`.
    pub fn remove(&self, key: &[u8], start: i64, end: i64) -> Result<()> {
        self.write(key, &[(start, end)], None).map(drop)
    }

    /// The value of `key`'s session `start..=end`.
    pub fn fetch_session(&self, key: &[u8], start: i64, end: i64) -> Result<Option<Vec<u8>>> {
        if end < self.min_live() {
            return Ok(None);
        }
        self.store.get(&self.session_key(key, start, end))
    }

    /// `key`'s sessions that end at or after `earliest_end` and start at or before
    /// `latest_start` (Kafka Streams' `findSessions`), by end time.
    pub fn find_sessions(
        &self,
        key: &[u8],
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<SessionIter<'_, S>> {
        let lo = earliest_end.max(self.min_live());
        let Some(hi) = self.stream_time().filter(|&now| lo <= now) else {
            return Ok(self.iter(Vec::new(), i64::MAX, latest_start));
        };
        let ranges = (self.segments.id(lo)..=self.segments.id(hi))
            .map(|seg| {
                let mut lower = self.segments.prefix(seg);
                segments::escape_into(key, &mut lower);
                let mut upper = lower.clone();
                lower.extend_from_slice(&segments::flip(lo));
                upper.extend_from_slice(&[0xFF; SUFFIX]);
                KeyRange::new(Bound::Included(&lower), Bound::Included(&upper))
            })
            .collect();
        Ok(self.iter(ranges, lo, latest_start))
    }

    /// The session step of a session-windowed aggregation: a record of `key` at `time` starts
    /// a session, or extends or joins those within `gap` of it. Calls `aggregate` with the
    /// sessions it joins (by end time; none for a new session), then replaces them, in one
    /// batch, by the merged session and the value `aggregate` returns. Returns the merged
    /// session, or `Expired` for a record whose session would already be past retention.
    pub fn merge(
        &self,
        key: &[u8],
        time: i64,
        gap: Duration,
        aggregate: impl FnOnce(&[Session]) -> Vec<u8>,
    ) -> Result<(SessionPut, Option<Session>)> {
        let gap = millis(gap);
        let joined: Vec<Session> = self
            .find_sessions(key, time.saturating_sub(gap), time.saturating_add(gap))?
            .collect::<Result<_>>()?;
        let start = joined.iter().map(|s| s.start).fold(time, i64::min);
        let end = joined.iter().map(|s| s.end).fold(time, i64::max);
        if end < self.min_live() {
            return Ok((
                SessionPut::Expired {
                    stream_time: self.clock.refuse(self.stream_time()),
                },
                None,
            ));
        }
        let value = aggregate(&joined);
        let removed: Vec<(i64, i64)> = joined.iter().map(|s| (s.start, s.end)).collect();
        let put = self.write(key, &removed, Some((start, end, &value)))?;
        Ok((
            put,
            Some(Session {
                key: key.to_vec(),
                start,
                end,
                value,
            }),
        ))
    }

    /// Removes `removed` and stores `stored`, in one batch, advancing stream time.
    fn write(
        &self,
        key: &[u8],
        removed: &[(i64, i64)],
        stored: Option<(i64, i64, &[u8])>,
    ) -> Result<SessionPut> {
        let guard = self.clock.lock();
        let now = self.stream_time();
        if let Some((start, end, _)) = stored {
            if end < self.segments.min_live(now) {
                return Ok(SessionPut::Expired {
                    stream_time: self.clock.refuse(now),
                });
            }
            if start > end {
                return Err(Error::InvalidArgument {
                    store: self.store.name().to_string(),
                    message: format!("a session's start ({start}) is after its end ({end})"),
                });
            }
        }
        let mut batch = Batch::with_capacity(removed.len() + 2);
        for &(start, end) in removed {
            batch.delete(self.session_key(key, start, end));
        }
        let mut advanced = None;
        if let Some((start, end, value)) = stored {
            batch.put(self.session_key(key, start, end), value);
            if now.is_none_or(|now| end > now) {
                batch.put(STREAM_TIME_KEY, end.to_be_bytes());
                advanced = Some(end);
            }
        }
        // The changelog records carry the stream time, so a restore rebuilds it exactly.
        match advanced.or(now) {
            Some(time) => self.store.write_at(batch, time)?,
            None => self.store.write(batch)?,
        }
        if let Some(end) = advanced {
            self.clock.advance_to(end);
            drop(guard);
            self.drop_expired()?;
        }
        Ok(SessionPut::Stored)
    }

    fn min_live(&self) -> i64 {
        self.clock.min_live()
    }

    fn session_key(&self, key: &[u8], start: i64, end: i64) -> Vec<u8> {
        session_key(&self.segments, key, start, end)
    }

    fn iter(
        &self,
        mut ranges: Vec<KeyRange>,
        earliest_end: i64,
        latest_start: i64,
    ) -> SessionIter<'_, S> {
        ranges.reverse();
        SessionIter {
            sessions: self,
            ranges,
            earliest_end,
            latest_start,
            current: None,
        }
    }

    fn drop_expired(&self) -> Result<()> {
        self.clock.drop_expired(&self.store)
    }
}

/// The local key of `key`'s session `start..=end`.
pub(crate) fn session_key(segments: &Segments, key: &[u8], start: i64, end: i64) -> Vec<u8> {
    let mut k = segments.key_in(segments.id(end), key, SUFFIX);
    k.extend_from_slice(&segments::flip(end));
    k.extend_from_slice(&segments::flip(start));
    k
}

/// Decodes a session's local key: key, start, end.
pub(crate) fn decode_session_key(store_key: &[u8]) -> Option<(Vec<u8>, i64, i64)> {
    let (key, suffix) = segments::unescape(store_key.get(9..)?)?;
    if suffix.len() != SUFFIX {
        return None;
    }
    Some((
        key,
        segments::unflip(&suffix[8..]),
        segments::unflip(&suffix[..8]),
    ))
}

/// Sessions of a [`SessionStore`], lazily, a segment at a time.
pub struct SessionIter<'a, S> {
    sessions: &'a SessionStore<S>,
    ranges: Vec<KeyRange>,
    earliest_end: i64,
    latest_start: i64,
    current: Option<EntryIter<'a>>,
}

impl<S: KeyValueStore> Iterator for SessionIter<'_, S> {
    type Item = Result<Session>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let range = self.ranges.pop()?;
                match self.sessions.store.scan(&range, Order::Forward) {
                    Ok(scan) => self.current = Some(scan),
                    Err(e) => return Some(Err(e)),
                }
            }
            let Some(item) = self.current.as_mut()?.next() else {
                self.current = None;
                continue;
            };
            let (store_key, value) = match item {
                Ok(entry) => entry,
                Err(e) => return Some(Err(e)),
            };
            let Some((key, start, end)) = decode_session_key(&store_key) else {
                return Some(Err(Error::Decode {
                    store: self.sessions.store.name().to_string(),
                    what: "key",
                    location: crate::HexBytes(&store_key).to_string(),
                    source: "not a session's key (segment, escaped key, end, start)".into(),
                }));
            };
            if end < self.earliest_end || start > self.latest_start {
                continue;
            }
            return Some(Ok(Session {
                key,
                start,
                end,
                value,
            }));
        }
    }
}
