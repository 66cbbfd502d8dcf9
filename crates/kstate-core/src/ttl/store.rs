//! [`TtlStore`]: a key-value store whose keys expire, over any [`KeyValueStore`].

use std::ops::Bound;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::range::{KeyRange, Order, prefix_end};
use crate::segments::{self, STREAM_TIME_KEY};
use crate::store::{Batch, KeyValueStore};
use crate::sync::lock;

/// The first byte of an entry's key: `0x01 ‖ key`.
pub(crate) const DATA: u8 = 0x01;
/// The first byte of an expiry index key: `0x02 ‖ expiry (flipped) ‖ key`.
pub(crate) const INDEX: u8 = 0x02;
/// Bytes before an entry's value: its write time and expiry (i64 BE each).
pub(crate) const HEADER: usize = 16;
const NONE: i64 = i64::MIN;

/// Which clock says a key expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TtlClock {
    /// Stream time: the latest record timestamp written. A replay of old input expires
    /// exactly as the first run did, and a restart changes nothing.
    #[default]
    EventTime,
    /// The wall clock of the process reading.
    WallClock,
}

/// How long a key lives after its write, by which clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlOptions {
    pub(crate) ttl: i64,
    pub(crate) clock: TtlClock,
}

impl TtlOptions {
    /// Keys live `ttl` after their write's timestamp, in event time.
    pub fn new(ttl: Duration) -> Self {
        TtlOptions {
            ttl: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            clock: TtlClock::EventTime,
        }
    }

    /// Expire by `clock` instead.
    pub fn clock(mut self, clock: TtlClock) -> Self {
        self.clock = clock;
        self
    }

    /// The default time to live, ms.
    pub fn ttl_ms(&self) -> i64 {
        self.ttl
    }

    /// Checks the options: a positive time to live. The error names `store`.
    pub fn validate(&self, store: &str) -> Result<()> {
        if self.ttl <= 0 {
            return Err(Error::InvalidArgument {
                store: store.to_string(),
                message: format!("the time to live must be positive, not {} ms", self.ttl),
            });
        }
        Ok(())
    }
}

/// A key-value store whose keys expire a time to live after their write, by event time
/// (default) or the wall clock; the top ask of Kafka Streams' users (KIP-1225 is still a draft).
///
/// - An expired key is invisible at once, to `get` and scans.
/// - [`sweep`](Self::sweep) deletes expired keys, a bounded number per call, with ordinary
///   deletes: over a changelog-backed store those are tombstones in the same commit as the
///   rest, so the store and its changelog agree, and a restore cannot bring an expired key back
///   (Kafka Streams' reason for having no TTL, apache/kafka#5656). The task runtime sweeps
///   before each commit.
/// - Each entry's value carries its write time and expiry; an index by expiry (local, never
///   logged, rebuilt by a restore) lets the sweep find them in order. A key written again
///   leaves its old index entry behind; the sweep drops it when it finds the key still live.
/// - Stream time is stored with the data, so expiry after a restart is what it was before.
#[derive(Debug)]
pub struct TtlStore<S> {
    store: S,
    options: TtlOptions,
    stream_time: AtomicI64,
    writing: Mutex<()>,
}

/// The local key of `key`'s entry.
pub(crate) fn data_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(DATA);
    k.extend_from_slice(key);
    k
}

/// The local key of `key`'s expiry index entry.
pub(crate) fn index_key(key: &[u8], expires_at: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 9);
    k.push(INDEX);
    k.extend_from_slice(&segments::flip(expires_at));
    k.extend_from_slice(key);
    k
}

/// An entry's write time and expiry.
pub(crate) fn header(value: &[u8]) -> Option<(i64, i64)> {
    let written = i64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let expires = i64::from_be_bytes(value.get(8..HEADER)?.try_into().ok()?);
    Some((written, expires))
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl<S: KeyValueStore> TtlStore<S> {
    /// A TTL store over `store`, which holds this store only.
    pub fn open(store: S, options: TtlOptions) -> Result<Self> {
        options.validate(store.name())?;
        let stream_time = segments::stored_time(&store)?.unwrap_or(NONE);
        Ok(TtlStore {
            store,
            options,
            stream_time: AtomicI64::new(stream_time),
            writing: Mutex::new(()),
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
    pub fn options(&self) -> &TtlOptions {
        &self.options
    }

    /// The latest timestamp written (`None`: none yet).
    pub fn stream_time(&self) -> Option<i64> {
        match self.stream_time.load(Ordering::Acquire) {
            NONE => None,
            t => Some(t),
        }
    }

    /// The time expiry is judged by: stream time, or the wall clock.
    pub fn now(&self) -> i64 {
        match self.options.clock {
            TtlClock::EventTime => self.stream_time.load(Ordering::Acquire),
            TtlClock::WallClock => wall_clock_ms(),
        }
    }

    /// Stores `value` under `key`, written at `timestamp` (a record's; ignored by the wall
    /// clock, which uses now), living the default time to live.
    pub fn put(&self, key: &[u8], value: &[u8], timestamp: i64) -> Result<()> {
        self.put_with_ttl(
            key,
            value,
            timestamp,
            Duration::from_millis(self.options.ttl as u64),
        )
    }

    /// [`put`](Self::put) with a time to live of its own.
    pub fn put_with_ttl(
        &self,
        key: &[u8],
        value: &[u8],
        timestamp: i64,
        ttl: Duration,
    ) -> Result<()> {
        let written = match self.options.clock {
            TtlClock::EventTime => timestamp,
            TtlClock::WallClock => wall_clock_ms(),
        };
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let expires = written.saturating_add(ttl);
        let mut entry = Vec::with_capacity(HEADER + value.len());
        entry.extend_from_slice(&written.to_be_bytes());
        entry.extend_from_slice(&expires.to_be_bytes());
        entry.extend_from_slice(value);
        let _guard = lock(&self.writing);
        let mut batch = Batch::with_capacity(3);
        batch.put(data_key(key), entry);
        batch.put(index_key(key, expires), Vec::new());
        let now = self.stream_time.load(Ordering::Acquire);
        let advanced = self.options.clock == TtlClock::EventTime && written > now;
        if advanced {
            batch.put(STREAM_TIME_KEY, written.to_be_bytes());
        }
        // The changelog record carries the stream time, so a restore rebuilds it exactly.
        self.store.write_at(batch, written.max(now))?;
        if advanced {
            self.stream_time.store(written, Ordering::Release);
        }
        Ok(())
    }

    /// Advances stream time to `time` (a record's timestamp), if it is later, so that keys
    /// expire by the records' time even when few are written; see
    /// [`WindowStore::observe`](crate::WindowStore::observe).
    pub fn observe(&self, time: i64) -> Result<()> {
        let _guard = lock(&self.writing);
        if time <= self.stream_time.load(Ordering::Acquire) {
            return Ok(());
        }
        self.store.put(STREAM_TIME_KEY, &time.to_be_bytes())?;
        self.stream_time.store(time, Ordering::Release);
        Ok(())
    }

    /// Removes `key`.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.store.delete(&data_key(key))
    }

    /// `key`'s value, unless absent or expired.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let now = self.now();
        Ok(self
            .store
            .get(&data_key(key))?
            .and_then(|entry| live_value(entry, now)))
    }

    /// The live entries between two bounds, in `order`.
    pub fn scan(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        order: Order,
    ) -> Result<impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + '_> {
        let under = |b: Bound<&[u8]>| b.map(data_key);
        let (lower, upper) = (under(start), under(end));
        let mut range = KeyRange::new(
            lower.as_ref().map(Vec::as_slice),
            upper.as_ref().map(Vec::as_slice),
        );
        if range.lower.is_none() {
            range.lower = Some(vec![DATA]);
        }
        if range.upper.is_none() {
            range.upper = prefix_end(&[DATA]);
        }
        let now = self.now();
        Ok(self
            .store
            .scan(&range, order)?
            .filter_map(move |entry| match entry {
                Err(e) => Some(Err(e)),
                Ok((mut key, value)) => live_value(value, now).map(|v| {
                    key.remove(0);
                    Ok((key, v))
                }),
            }))
    }

    /// Deletes up to `limit` expired keys, oldest expiry first; returns how many. Each is an
    /// ordinary delete (a changelog tombstone over a logged store).
    pub fn sweep(&self, limit: usize) -> Result<usize> {
        let now = self.now();
        if now == NONE {
            return Ok(0);
        }
        let due = KeyRange {
            lower: Some(vec![INDEX]),
            upper: Some(index_key(&[], now.saturating_add(1))),
        };
        let mut batch = Batch::new();
        let mut deleted = 0;
        for entry in self.store.scan(&due, Order::Forward)?.take(limit) {
            let (index, _) = entry?;
            let key = &index[9..];
            let data = data_key(key);
            if let Some((_, expires)) = self.store.get(&data)?.as_deref().and_then(header)
                && expires <= now
            {
                batch.delete(data);
                deleted += 1;
            }
            batch.delete(index);
        }
        self.store.write(batch)?;
        Ok(deleted)
    }
}

/// `entry`'s value if it is live at `now`.
fn live_value(mut entry: Vec<u8>, now: i64) -> Option<Vec<u8>> {
    let (_, expires) = header(&entry)?;
    if expires <= now {
        return None;
    }
    entry.drain(..HEADER);
    Some(entry)
}
