//! [`StreamClock`]: the stream time of a segmented store (window, session), shared by both so
//! that each keeps it, refuses expired writes and drops expired segments the same way.
//!
//! Stream time only grows: writes that advance it hold [`StreamClock::lock`] from reading it
//! until the new time is stored with their batch and published. Expired segments go with one
//! [`drop_range`](KeyValueStore::drop_range) when stream time enters a new segment, never twice.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::Result;
use crate::segments::{self, STREAM_TIME_KEY, Segments};
use crate::store::KeyValueStore;
use crate::sync::lock;

/// No stream time yet.
const NONE: i64 = i64::MIN;

/// A segmented store's stream time, its expired writes and what it has dropped.
#[derive(Debug)]
pub(crate) struct StreamClock {
    segments: Segments,
    time: AtomicI64,
    /// The first segment still live at the last drop.
    dropped_below: AtomicI64,
    expired_writes: AtomicU64,
    /// Serialises writes, so that the stored stream time only grows.
    writing: Mutex<()>,
}

impl StreamClock {
    /// The clock of `store`, from the stream time stored in it.
    pub(crate) fn read<S: KeyValueStore + ?Sized>(store: &S, segments: Segments) -> Result<Self> {
        let time = segments::stored_time(store)?.unwrap_or(NONE);
        Ok(StreamClock {
            segments,
            time: AtomicI64::new(time),
            dropped_below: AtomicI64::new(i64::MIN),
            expired_writes: AtomicU64::new(0),
            writing: Mutex::new(()),
        })
    }

    /// The stream time (`None`: none yet).
    pub(crate) fn now(&self) -> Option<i64> {
        match self.time.load(Ordering::Acquire) {
            NONE => None,
            t => Some(t),
        }
    }

    /// The oldest time still live.
    pub(crate) fn min_live(&self) -> i64 {
        self.segments.min_live(self.now())
    }

    /// Held by a write from reading the stream time until it has published the new one.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        lock(&self.writing)
    }

    /// Publishes `time`, which the caller (holding [`lock`](Self::lock)) has just stored.
    pub(crate) fn advance_to(&self, time: i64) {
        self.time.store(time, Ordering::Release);
    }

    /// Counts a write refused as expired; the stream time it was refused at.
    pub(crate) fn refuse(&self, now: Option<i64>) -> i64 {
        self.expired_writes.fetch_add(1, Ordering::Relaxed);
        now.unwrap_or(NONE)
    }

    /// Writes refused since open.
    pub(crate) fn expired_writes(&self) -> u64 {
        self.expired_writes.load(Ordering::Relaxed)
    }

    /// Advances stream time to `time` if it is later, storing it in `store`, and drops what
    /// that expires.
    pub(crate) fn observe<S: KeyValueStore + ?Sized>(&self, store: &S, time: i64) -> Result<()> {
        let guard = self.lock();
        if self.now().is_some_and(|now| now >= time) {
            return Ok(());
        }
        store.put(STREAM_TIME_KEY, &time.to_be_bytes())?;
        self.advance_to(time);
        drop(guard);
        self.drop_expired(store)
    }

    /// Drops every segment of `store` wholly expired by the stream time, once.
    pub(crate) fn drop_expired<S: KeyValueStore + ?Sized>(&self, store: &S) -> Result<()> {
        let Some(now) = self.now() else {
            return Ok(());
        };
        let first_live = self.segments.id(self.segments.min_live(Some(now)));
        if self.dropped_below.fetch_max(first_live, Ordering::AcqRel) >= first_live {
            return Ok(());
        }
        store.drop_range(&self.segments.expired(Some(now)))
    }
}
