//! Changelog coalescing (Kafka Streams' record cache, Samza's CachedStore): writes stay in a
//! map, last value per key, until the task commits; then they go to the logged store as one
//! batch. A key written a thousand times in a commit interval costs one changelog record.
//!
//! Reads see the map first. A scan first drains the map into the logged store (a scan is rare on
//! the per-record path, and merging a third layer is not worth its code), which only costs some
//! coalescing. The map is bounded: past `max_entries` or `max_bytes` it drains early.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kstate_core::{Batch, EntryIter, KeyRange, KeyValueStore, Order, Result};
use kstate_kafka::LoggedStore;

#[derive(Debug, Default)]
struct Dirty {
    map: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    bytes: usize,
}

/// A write-coalescing layer over a task's logged store.
#[derive(Debug)]
pub(crate) struct CoalescingStore {
    inner: Arc<LoggedStore>,
    dirty: Mutex<Dirty>,
    max_entries: usize,
    max_bytes: usize,
}

impl CoalescingStore {
    pub(crate) fn new(inner: Arc<LoggedStore>) -> Self {
        CoalescingStore {
            inner,
            dirty: Mutex::default(),
            max_entries: 100_000,
            max_bytes: 32 << 20,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Dirty> {
        self.dirty.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the coalesced entries to the logged store (which sends them to the changelog).
    pub(crate) fn drain(&self) -> Result<()> {
        let map = std::mem::take(&mut *self.lock()).map;
        if map.is_empty() {
            return Ok(());
        }
        metrics::counter!("kstate_task_coalesced_writes").increment(map.len() as u64);
        self.inner.write(map.into_iter().collect())
    }
}

impl KeyValueStore for CoalescingStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(value) = self.lock().map.get(key) {
            return Ok(value.clone());
        }
        self.inner.get(key)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        let full = {
            let mut dirty = self.lock();
            for (key, value) in batch.into_mutations() {
                dirty.bytes += key.len() + value.as_ref().map_or(0, Vec::len);
                if let Some(replaced) = dirty.map.insert(key, value) {
                    // The key is counted again above; only its old value goes.
                    dirty.bytes = dirty.bytes.saturating_sub(replaced.map_or(0, |v| v.len()));
                }
            }
            dirty.map.len() >= self.max_entries || dirty.bytes >= self.max_bytes
        };
        if full { self.drain() } else { Ok(()) }
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.drain()?;
        self.inner.scan(range, order)
    }

    fn approximate_len(&self) -> Result<u64> {
        Ok(self.inner.approximate_len()? + self.lock().map.len() as u64)
    }

    fn flush(&self) -> Result<()> {
        self.drain()?;
        self.inner.flush()
    }

    fn close(&self) -> Result<()> {
        self.drain()?;
        self.inner.close()
    }
}
