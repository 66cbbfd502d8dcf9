//! [`WindowStore`]: values per (key, window start) over any [`KeyValueStore`].

use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};
use crate::range::{KeyRange, Order};
use crate::segments::{self, STREAM_TIME_KEY, Segments};
use crate::store::{Batch, EntryIter, KeyValueStore};
use crate::stream_clock::StreamClock;
use crate::window::options::WindowOptions;

/// The local key holding the next duplicate's sequence number.
pub(crate) const SEQ_KEY: &[u8] = b"\x00seq";
/// Bytes after an entry's escaped key: window start (8) and sequence number (4).
pub(crate) const SUFFIX: usize = 12;

/// What [`WindowStore::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowPut {
    /// The value is stored (or the window's value deleted).
    Stored,
    /// The window is older than stream time minus the retention: nothing was written (Kafka
    /// Streams drops these too, and counts them). [`WindowStore::expired_writes`] counts them.
    Expired {
        /// The stream time the window was too old for.
        stream_time: i64,
    },
}

/// A window's entry: its key, window start and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowEntry {
    key: Vec<u8>,
    start: i64,
    value: Vec<u8>,
}

impl WindowEntry {
    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The window start, ms.
    pub fn start(&self) -> i64 {
        self.start
    }

    /// The value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Takes the value out.
    pub fn into_value(self) -> Vec<u8> {
        self.value
    }
}

/// Values per (key, window start), kept for a retention behind stream time, over any byte
/// store: in memory, RocksDB, or logged to a changelog (with
/// [`WindowChangelog`](crate::WindowChangelog) as its [`ChangelogKeys`](crate::ChangelogKeys)).
///
/// - **Stream time** is the latest window start put. It is stored with the data, in the same
///   batch, so a window that was too old before a restart is too old after it (Kafka Streams
///   loses it, KAFKA-20099).
/// - **Retention is strict**: a window at or before stream time − retention is refused on write
///   and invisible to reads, even before its segment is dropped.
/// - **Expiry** drops every wholly expired segment with one
///   [`drop_range`](KeyValueStore::drop_range), when stream time enters a new segment and at
///   open.
/// - **Fetches** seek once per segment: a key's entries are contiguous in each (the layout is
///   in the `segments` module's docs).
///
/// Iteration order: [`fetch`](Self::fetch) by window start; [`fetch_keys`](Self::fetch_keys)
/// and [`fetch_all`](Self::fetch_all) segment by segment, and by key, then start, within one.
#[derive(Debug)]
pub struct WindowStore<S> {
    store: S,
    options: WindowOptions,
    segments: Segments,
    clock: StreamClock,
    next_seq: AtomicU32,
}

/// A time range in normal form, both ends inclusive.
fn time_bounds(range: impl RangeBounds<i64>) -> Option<(i64, i64)> {
    let lo = match range.start_bound() {
        Bound::Included(&t) => t,
        Bound::Excluded(&t) => t.checked_add(1)?,
        Bound::Unbounded => i64::MIN,
    };
    let hi = match range.end_bound() {
        Bound::Included(&t) => t,
        Bound::Excluded(&t) => t.checked_sub(1)?,
        Bound::Unbounded => i64::MAX,
    };
    (lo <= hi).then_some((lo, hi))
}

impl<S: KeyValueStore> WindowStore<S> {
    /// A window store over `store`, which holds this window store only. Reads the stored stream
    /// time and drops the segments it has expired (a restore may have written them before the
    /// records that expired them).
    pub fn open(store: S, options: WindowOptions) -> Result<Self> {
        let window = Self::reader(store, options)?;
        window.drop_expired()?;
        Ok(window)
    }

    /// A window store over `store` for reads beside its writer (an interactive query): reads
    /// the stored stream time and writes nothing; what has expired by that time is invisible
    /// to its reads, and the writer drops it.
    pub fn reader(store: S, options: WindowOptions) -> Result<Self> {
        options.validate(store.name())?;
        let segments = options.segments();
        let next_seq = store
            .get(SEQ_KEY)?
            .and_then(|v| v.try_into().ok().map(u32::from_be_bytes))
            .unwrap_or(0);
        Ok(WindowStore {
            clock: StreamClock::read(&store, segments)?,
            segments,
            store,
            options,
            next_seq: AtomicU32::new(next_seq),
        })
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.store
    }

    /// Takes the store underneath out (to close or reopen it).
    pub fn into_inner(self) -> S {
        self.store
    }

    /// The options it was opened with.
    pub fn options(&self) -> &WindowOptions {
        &self.options
    }

    /// The latest window start put or time [observed](Self::observe) (`None`: none yet).
    pub fn stream_time(&self) -> Option<i64> {
        self.clock.now()
    }

    /// Writes refused since open because their window had expired.
    pub fn expired_writes(&self) -> u64 {
        self.clock.expired_writes()
    }

    /// Stores `value` for `key`'s window starting at `start` (`None` deletes it; with
    /// duplicates retained, `None` writes nothing, as in Kafka Streams). Advances stream time
    /// to `start`, dropping the segments that leaves wholly expired.
    pub fn put(&self, key: &[u8], start: i64, value: Option<&[u8]>) -> Result<WindowPut> {
        self.check_time(start)?;
        let guard = self.clock.lock();
        let now = self.clock.now();
        if start < self.segments.min_live(now) {
            return Ok(WindowPut::Expired {
                stream_time: self.clock.refuse(now),
            });
        }
        let retain = self.options.retain_duplicates;
        if retain && value.is_none() {
            return Ok(WindowPut::Stored);
        }
        let mut batch = Batch::with_capacity(3);
        let seq = if retain {
            let seq = self.next_seq.load(Ordering::Relaxed).wrapping_add(1);
            self.next_seq.store(seq, Ordering::Relaxed);
            batch.put(SEQ_KEY, seq.to_be_bytes());
            seq
        } else {
            0
        };
        batch.push(self.entry_key(key, start, seq), value.map(<[u8]>::to_vec));
        let advanced = now.is_none_or(|now| start > now);
        if advanced {
            batch.put(STREAM_TIME_KEY, start.to_be_bytes());
        }
        // The changelog record carries the stream time, so a restore rebuilds it exactly.
        let time = now.map_or(start, |now| now.max(start));
        self.store.write_at(batch, time)?;
        if advanced {
            self.clock.advance_to(start);
            drop(guard);
            self.drop_expired()?;
        }
        Ok(WindowPut::Stored)
    }

    /// Advances stream time to `time` (a record's timestamp), if it is later: a processor calls
    /// this for each record, so that windows close and expire by the records' time, not only by
    /// the window starts put. Stored with the data (a local key), so it survives a restart; a
    /// restore from the changelog alone knows only the window starts.
    pub fn observe(&self, time: i64) -> Result<()> {
        self.check_time(time)?;
        self.clock.observe(&self.store, time)
    }

    /// Whether this store can place `time` (a record's timestamp, or a window start): an
    /// [`Error::InvalidArgument`] naming it when it is later than
    /// [`WindowOptions::latest_time`], whose windows would end or close past what an `i64`
    /// holds. [`put`](Self::put) and [`observe`](Self::observe) refuse such a time the same
    /// way, before they change anything; a processor that sends results before it writes
    /// checks first, so that a record it cannot place has no effect at all. The task
    /// runtime's error policy treats the error as bad input (skip, dead-letter or fail).
    pub fn check_time(&self, time: i64) -> Result<()> {
        let latest = self.options.latest_time();
        if time <= latest {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            store: self.store.name().to_string(),
            message: format!(
                "time {time} ms cannot be placed: a window holding it would end or close past \
                 i64::MAX (the latest time these windows can place is {latest} ms)"
            ),
        })
    }

    /// The value of `key`'s window starting at `start` (with duplicates retained: the first).
    pub fn get(&self, key: &[u8], start: i64) -> Result<Option<Vec<u8>>> {
        if self.options.retain_duplicates {
            return Ok(self
                .fetch(key, start..=start)?
                .next()
                .transpose()?
                .map(WindowEntry::into_value));
        }
        // One entry at most: a point lookup, not a scan (an aggregation's get per record).
        if start < self.clock.min_live() {
            return Ok(None);
        }
        self.store.get(&self.entry_key(key, start, 0))
    }

    /// `key`'s windows starting in `time`, earliest first.
    pub fn fetch(&self, key: &[u8], time: impl RangeBounds<i64>) -> Result<WindowIter<'_, S>> {
        self.fetch_key(key, time, Order::Forward)
    }

    /// `key`'s windows starting in `time`, latest first.
    pub fn fetch_backward(
        &self,
        key: &[u8],
        time: impl RangeBounds<i64>,
    ) -> Result<WindowIter<'_, S>> {
        self.fetch_key(key, time, Order::Reverse)
    }

    /// The windows starting in `time` of every key between two bounds.
    pub fn fetch_keys(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        time: impl RangeBounds<i64>,
    ) -> Result<WindowIter<'_, S>> {
        let Some((lo, hi)) = self.live_bounds(time) else {
            return Ok(self.iter(Vec::new(), Order::Forward, i64::MIN, i64::MAX));
        };
        let ranges = (self.segments.id(lo)..=self.segments.id(hi))
            .map(|seg| {
                let prefix = self.segments.prefix(seg);
                let key_bound = |key: &[u8], suffix: u8| {
                    let mut k = prefix.clone();
                    segments::escape_into(key, &mut k);
                    k.extend_from_slice(&[suffix; SUFFIX]);
                    k
                };
                let lower = match from {
                    Bound::Included(k) => key_bound(k, 0),
                    Bound::Excluded(k) => key_bound(k, 0xFF),
                    Bound::Unbounded => prefix.clone(),
                };
                let lower_bound = match from {
                    Bound::Excluded(_) => Bound::Excluded(lower.as_slice()),
                    _ => Bound::Included(lower.as_slice()),
                };
                let upper = match to {
                    Bound::Included(k) => Some(key_bound(k, 0xFF)),
                    Bound::Excluded(k) => Some(key_bound(k, 0)),
                    Bound::Unbounded => None,
                };
                let next_segment = self.segments.span(seg, seg).upper;
                match &upper {
                    Some(upper) if matches!(to, Bound::Included(_)) => {
                        KeyRange::new(lower_bound, Bound::Included(upper.as_slice()))
                    }
                    Some(upper) => KeyRange::new(lower_bound, Bound::Excluded(upper.as_slice())),
                    None => KeyRange {
                        upper: next_segment,
                        ..KeyRange::new(lower_bound, Bound::Unbounded)
                    },
                }
            })
            .collect();
        Ok(self.iter(ranges, Order::Forward, lo, hi))
    }

    /// Every window starting in `time`.
    pub fn fetch_all(&self, time: impl RangeBounds<i64>) -> Result<WindowIter<'_, S>> {
        let Some((lo, hi)) = self.live_bounds(time) else {
            return Ok(self.iter(Vec::new(), Order::Forward, i64::MIN, i64::MAX));
        };
        let span = self
            .segments
            .span(self.segments.id(lo), self.segments.id(hi));
        Ok(self.iter(vec![span], Order::Forward, lo, hi))
    }

    /// `time` cut to what can hold live data: from the oldest live time to stream time.
    fn live_bounds(&self, time: impl RangeBounds<i64>) -> Option<(i64, i64)> {
        let (lo, hi) = time_bounds(time)?;
        let now = self.stream_time()?;
        let lo = lo.max(self.segments.min_live(Some(now)));
        let hi = hi.min(now);
        (lo <= hi).then_some((lo, hi))
    }

    fn fetch_key(
        &self,
        key: &[u8],
        time: impl RangeBounds<i64>,
        order: Order,
    ) -> Result<WindowIter<'_, S>> {
        let Some((lo, hi)) = self.live_bounds(time) else {
            return Ok(self.iter(Vec::new(), order, i64::MIN, i64::MAX));
        };
        let mut ranges: Vec<KeyRange> = (self.segments.id(lo)..=self.segments.id(hi))
            .map(|seg| {
                let mut lower = self.segments.prefix(seg);
                segments::escape_into(key, &mut lower);
                let mut upper = lower.clone();
                lower.extend_from_slice(&segments::flip(lo));
                upper.extend_from_slice(&segments::flip(hi));
                upper.extend_from_slice(&[0xFF; 4]);
                KeyRange::new(Bound::Included(&lower), Bound::Included(&upper))
            })
            .collect();
        if order == Order::Reverse {
            ranges.reverse();
        }
        Ok(self.iter(ranges, order, lo, hi))
    }

    fn iter(&self, mut ranges: Vec<KeyRange>, order: Order, lo: i64, hi: i64) -> WindowIter<'_, S> {
        ranges.reverse(); // popped from the back
        WindowIter {
            window: self,
            ranges,
            order,
            lo,
            hi,
            current: None,
        }
    }

    /// The local key of an entry.
    fn entry_key(&self, key: &[u8], start: i64, seq: u32) -> Vec<u8> {
        let mut k = self.segments.key_in(self.segments.id(start), key, SUFFIX);
        k.extend_from_slice(&segments::flip(start));
        k.extend_from_slice(&seq.to_be_bytes());
        k
    }

    /// Drops every wholly expired segment, if stream time entered a new segment since the last
    /// drop. Everything below the first live segment goes each time, so what uncommitted writes
    /// of a changelog-backed store put back under it later goes at the next drop.
    fn drop_expired(&self) -> Result<()> {
        self.clock.drop_expired(&self.store)
    }
}

/// Decodes an entry's local key: its key, window start and sequence number.
pub(crate) fn decode_entry_key(store_key: &[u8]) -> Option<(Vec<u8>, i64, u32)> {
    let (key, suffix) = segments::unescape(store_key.get(9..)?)?;
    if suffix.len() != SUFFIX {
        return None;
    }
    let start = segments::unflip(&suffix[..8]);
    let seq = u32::from_be_bytes(suffix[8..].try_into().ok()?);
    Some((key, start, seq))
}

/// Entries of a [`WindowStore`], lazily, one segment's scan at a time.
pub struct WindowIter<'a, S> {
    window: &'a WindowStore<S>,
    /// Ranges still to scan, the next one last.
    ranges: Vec<KeyRange>,
    order: Order,
    lo: i64,
    hi: i64,
    current: Option<EntryIter<'a>>,
}

impl<S: KeyValueStore> Iterator for WindowIter<'_, S> {
    type Item = Result<WindowEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let range = self.ranges.pop()?;
                match self.window.store.scan(&range, self.order) {
                    Ok(scan) => self.current = Some(scan),
                    Err(e) => return Some(Err(e)),
                }
            }
            let scan = self.current.as_mut()?;
            let Some(item) = scan.next() else {
                self.current = None;
                continue;
            };
            let (store_key, value) = match item {
                Ok(entry) => entry,
                Err(e) => return Some(Err(e)),
            };
            let Some((key, start, _)) = decode_entry_key(&store_key) else {
                return Some(Err(Error::Decode {
                    store: self.window.store.name().to_string(),
                    what: "key",
                    location: crate::HexBytes(&store_key).to_string(),
                    source: "not a window entry's key (segment, escaped key, start, sequence)"
                        .into(),
                }));
            };
            if start < self.lo || start > self.hi {
                continue;
            }
            return Some(Ok(WindowEntry { key, start, value }));
        }
    }
}
