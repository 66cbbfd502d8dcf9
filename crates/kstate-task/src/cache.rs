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
//! `max_entries` or `max_bytes` it drains and forgets its clean entries. So is the memory of all
//! caches and overlays together: each cache charges what it holds to its store's budget
//! ([`PendingMemory`](kstate_rocksdb::PendingMemory)), and while the budget's pending share is
//! full a write drains its cache at once and the cache keeps no clean entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kstate_core::{Batch, EntryIter, KeyRange, KeyValueStore, Order, Result};
use kstate_kafka::LoggedStore;
use kstate_rocksdb::{PendingCharge, PendingMemory};

/// A key's latest value (`None`: deleted), and whether the logged store has it yet.
#[derive(Debug)]
struct Entry {
    value: Option<Vec<u8>>,
    dirty: bool,
}

#[derive(Debug)]
struct Cache {
    map: HashMap<Vec<u8>, Entry>,
    /// Keys written since the last drain, in no order, at most once each.
    dirty: Vec<Vec<u8>>,
    /// Keys and values held, dirty or clean.
    bytes: usize,
    /// `bytes`, charged to the budget.
    charge: PendingCharge,
}

impl Cache {
    /// Whether the budget's pending share is full: the cache should hold nothing it need not.
    fn budget_full(&self) -> bool {
        self.charge.account().is_full()
    }

    /// Charges the budget with what the cache holds now.
    fn recharge(&mut self) {
        self.charge.set(self.bytes);
    }
}

/// A write-coalescing, read-caching layer over a task's logged store.
#[derive(Debug)]
pub(crate) struct CoalescingStore<S: KeyValueStore = LoggedStore> {
    inner: Arc<S>,
    cache: Mutex<Cache>,
    max_entries: usize,
    max_bytes: usize,
}

fn size(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len)
}

impl CoalescingStore {
    /// The cache of a task's logged store, charged to its budget.
    pub(crate) fn new(inner: Arc<LoggedStore>) -> Self {
        let account = inner.pending_memory().clone();
        Self::charging(inner, &account)
    }
}

impl<S: KeyValueStore> CoalescingStore<S> {
    /// A cache over `inner` whose entries are charged to `account`.
    fn charging(inner: Arc<S>, account: &PendingMemory) -> Self {
        let charge = account.charge();
        CoalescingStore {
            inner,
            cache: Mutex::new(Cache {
                map: HashMap::new(),
                dirty: Vec::new(),
                bytes: 0,
                charge,
            }),
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
        let over = cache.map.len() >= self.max_entries
            || cache.bytes >= self.max_bytes
            || cache.budget_full();
        let mut batch = Batch::with_capacity(keys.len());
        if over {
            for key in keys {
                if let Some(entry) = cache.map.remove(&key) {
                    batch.push(key, entry.value);
                }
            }
            cache.map.clear();
            cache.bytes = 0;
            cache.recharge();
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
        } else if cache.map.len() < self.max_entries
            && cache.bytes < self.max_bytes
            && !cache.budget_full()
        {
            cache.bytes += size(key, &value);
            cache.map.insert(
                key.to_vec(),
                Entry {
                    value,
                    dirty: false,
                },
            );
        }
        cache.recharge();
    }
}

impl<S: KeyValueStore> KeyValueStore for CoalescingStore<S> {
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
            cache.recharge();
            cache.dirty.len() >= self.max_entries
                || cache.bytes >= self.max_bytes
                || cache.budget_full()
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

#[cfg(test)]
mod tests {
    use super::*;
    use kstate_core::MemoryStore;

    /// While the budget's pending share is full (held by other caches or overlays), a write
    /// goes down to the store at once and the cache keeps nothing: it holds no more than it must.
    /// Below the limit it coalesces and keeps clean entries, as before.
    #[test]
    fn a_cache_whose_budget_is_full_writes_through_and_keeps_nothing() {
        let account = PendingMemory::new(1000);
        let store = Arc::new(MemoryStore::new("s"));
        let cache = CoalescingStore::charging(store.clone(), &account);
        cache.put(b"a", b"1").unwrap();
        assert_eq!(store.get(b"a").unwrap(), None, "coalesced, not written yet");
        assert_eq!(account.usage(), 2, "the cache's entry is charged");

        let mut others = account.charge();
        others.set(1000);
        cache.put(b"b", b"2").unwrap();
        assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(account.usage(), 1000, "the cache gave back all it held");
        assert_eq!(cache.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(
            account.usage(),
            1000,
            "a read caches nothing while the budget is full"
        );

        drop(others);
        cache.put(b"c", b"3").unwrap();
        assert_eq!(
            store.get(b"c").unwrap(),
            None,
            "coalescing again below the limit"
        );
        assert_eq!(account.usage(), 2);
        drop(cache);
        assert_eq!(account.usage(), 0, "a dropped cache gives its charge back");
    }
}
