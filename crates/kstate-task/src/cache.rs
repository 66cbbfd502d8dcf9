//! Changelog coalescing (Kafka Streams' record cache, Samza's CachedStore): writes stay in a
//! map, last value per key, until the task commits; then they go to the logged store as one
//! batch. A key written a thousand times in a commit interval costs one changelog record.
//!
//! Reads see the map first. After a drain the written entries stay in the map, clean, so that
//! the next interval's first read of a hot key does not go to RocksDB (in the count-by-key
//! benchmark a third of all reads did, one per key per 100 ms commit). Only keys written since
//! the last drain are written again; clean entries are the logged store's values, so dropping
//! them loses nothing. A scan first drains the map into the logged store (a scan is rare on the
//! per-record path, and merging a third layer is not worth its code). The map is bounded: past
//! `max_entries` or `max_bytes` it drains and forgets its clean entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kstate_core::{Batch, EntryIter, KeyRange, KeyValueStore, Order, Result};
use kstate_kafka::LoggedStore;

/// A key's latest value (`None`: deleted), and whether the logged store has it yet.
#[derive(Debug)]
struct Entry {
    value: Option<Vec<u8>>,
    dirty: bool,
}

#[derive(Debug, Default)]
struct Cache {
    map: HashMap<Vec<u8>, Entry>,
    /// Keys written since the last drain, in no order, at most once each.
    dirty: Vec<Vec<u8>>,
    /// Keys and values held, dirty or clean.
    bytes: usize,
}

/// A write-coalescing, read-caching layer over a task's logged store.
#[derive(Debug)]
pub(crate) struct CoalescingStore {
    inner: Arc<LoggedStore>,
    cache: Mutex<Cache>,
    max_entries: usize,
    max_bytes: usize,
}

fn size(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len)
}

impl CoalescingStore {
    pub(crate) fn new(inner: Arc<LoggedStore>) -> Self {
        CoalescingStore {
            inner,
            cache: Mutex::default(),
            max_entries: 100_000,
            max_bytes: 32 << 20,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        kstate_core::sync::lock(&self.cache)
    }

    /// Writes the entries written since the last drain to the logged store (which sends them to
    /// the changelog); they stay cached, clean. Past the bounds, the cache is emptied instead.
    pub(crate) fn drain(&self) -> Result<()> {
        let mut cache = self.lock();
        if cache.dirty.is_empty() {
            return Ok(());
        }
        let keys = std::mem::take(&mut cache.dirty);
        let over = cache.map.len() >= self.max_entries || cache.bytes >= self.max_bytes;
        let mut batch = Batch::with_capacity(keys.len());
        if over {
            for key in keys {
                if let Some(entry) = cache.map.remove(&key) {
                    batch.push(key, entry.value);
                }
            }
            cache.map.clear();
            cache.bytes = 0;
        } else {
            for key in keys {
                if let Some(entry) = cache.map.get_mut(&key) {
                    entry.dirty = false;
                    batch.push(key, entry.value.clone());
                }
            }
        }
        drop(cache);
        metrics::counter!("kstate_task_coalesced_writes").increment(batch.len() as u64);
        self.inner.write(batch)
    }

    /// Caches a value the logged store now holds (clean), within the bounds.
    fn remember(&self, cache: &mut Cache, key: &[u8], value: Option<Vec<u8>>) {
        if let Some(entry) = cache.map.get_mut(key) {
            cache.bytes = cache.bytes.saturating_sub(size(key, &entry.value)) + size(key, &value);
            entry.value = value;
        } else if cache.map.len() < self.max_entries && cache.bytes < self.max_bytes {
            cache.bytes += size(key, &value);
            cache.map.insert(
                key.to_vec(),
                Entry {
                    value,
                    dirty: false,
                },
            );
        }
    }
}

impl KeyValueStore for CoalescingStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(entry) = self.lock().map.get(key) {
            return Ok(entry.value.clone());
        }
        let value = self.inner.get(key)?;
        self.remember(&mut self.lock(), key, value.clone());
        Ok(value)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        let full = {
            let mut cache = self.lock();
            let cache = &mut *cache;
            for (key, value) in batch.into_mutations() {
                cache.bytes += size(&key, &value);
                match cache.map.get_mut(&key) {
                    Some(entry) => {
                        cache.bytes = cache.bytes.saturating_sub(size(&key, &entry.value));
                        if !entry.dirty {
                            cache.dirty.push(key);
                        }
                        *entry = Entry { value, dirty: true };
                    }
                    None => {
                        cache.dirty.push(key.clone());
                        cache.map.insert(key, Entry { value, dirty: true });
                    }
                }
            }
            cache.dirty.len() >= self.max_entries || cache.bytes >= self.max_bytes
        };
        if full { self.drain() } else { Ok(()) }
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.drain()?;
        self.inner.scan(range, order)
    }

    fn approximate_len(&self) -> Result<u64> {
        let pending = self.lock().dirty.len() as u64;
        Ok(self.inner.approximate_len()? + pending)
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
