//! [`MemoryStore`]: an ordered in-memory store for ephemeral state and tests.
//!
//! A `BTreeMap` behind a `RwLock`. Clones share the same map, so a test can "reopen" a memory
//! store by cloning the handle before closing it. Nothing survives the process.
//!
//! Scans read the map in pages of [`SCAN_PAGE`] entries, taking the read lock once per page and
//! resuming after the last key seen, so a long scan never holds the lock while the caller works
//! and never copies the whole map.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::sync::{read, write};

use crate::error::{Error, Result};
use crate::range::{KeyRange, Order};
use crate::store::{Batch, Entry, EntryIter, KeyValueStore};

/// How many entries a scan copies out of the map per lock acquisition.
pub const SCAN_PAGE: usize = 256;

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// An ordered in-memory [`KeyValueStore`].
#[derive(Debug, Clone)]
pub struct MemoryStore {
    name: Arc<str>,
    map: Arc<RwLock<Map>>,
    closed: Arc<AtomicBool>,
}

impl MemoryStore {
    /// An empty store called `name` (used in error messages).
    pub fn new(name: impl Into<String>) -> Self {
        MemoryStore {
            name: Arc::from(name.into()),
            map: Arc::default(),
            closed: Arc::default(),
        }
    }

    /// A handle on the same map that is open again, as if the store had been reopened.
    pub fn reopen(&self) -> Self {
        MemoryStore {
            name: self.name.clone(),
            map: self.map.clone(),
            closed: Arc::default(),
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed {
                store: self.name.to_string(),
            });
        }
        Ok(())
    }
}

impl KeyValueStore for MemoryStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        Ok(read(&self.map).get(key).cloned())
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.check_open()?;
        let mut map = write(&self.map);
        for (key, value) in batch.into_mutations() {
            match value {
                Some(v) => map.insert(key, v),
                None => map.remove(&key),
            };
        }
        Ok(())
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.check_open()?;
        if range.is_empty() {
            return Ok(Box::new(std::iter::empty()));
        }
        Ok(Box::new(PagedScan {
            store: self,
            range: range.clone(),
            order,
            page: Vec::new().into_iter(),
            resume_after: None,
            done: false,
        }))
    }

    fn approximate_len(&self) -> Result<u64> {
        self.check_open()?;
        Ok(read(&self.map).len() as u64)
    }

    fn drop_range(&self, range: &KeyRange) -> Result<()> {
        self.check_open()?;
        if range.is_empty() {
            return Ok(());
        }
        let mut map = write(&self.map);
        let doomed: Vec<Vec<u8>> = map
            .range::<[u8], _>(range.as_bounds())
            .map(|(k, _)| k.clone())
            .collect();
        for key in doomed {
            map.remove(&key);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.check_open()
    }

    fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}

/// A scan that copies [`SCAN_PAGE`] entries at a time out of the map.
struct PagedScan<'a> {
    store: &'a MemoryStore,
    range: KeyRange,
    order: Order,
    page: std::vec::IntoIter<Entry>,
    /// The last key yielded; the next page starts strictly after it (before it, in reverse).
    resume_after: Option<Vec<u8>>,
    done: bool,
}

impl PagedScan<'_> {
    fn fill_page(&mut self) -> Result<()> {
        self.store.check_open()?;
        let (mut lower, mut upper) = self.range.as_bounds();
        if let Some(last) = self.resume_after.as_deref() {
            match self.order {
                Order::Forward => lower = Bound::Excluded(last),
                Order::Reverse => upper = Bound::Excluded(last),
            }
        }
        let map = read(&self.store.map);
        let range = map.range::<[u8], _>((lower, upper));
        let page: Vec<Entry> = match self.order {
            Order::Forward => range
                .take(SCAN_PAGE)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            Order::Reverse => range
                .rev()
                .take(SCAN_PAGE)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        drop(map);
        self.done = page.len() < SCAN_PAGE;
        self.resume_after = page.last().map(|(k, _)| k.clone());
        self.page = page.into_iter();
        Ok(())
    }
}

impl Iterator for PagedScan<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(entry) = self.page.next() {
            return Some(Ok(entry));
        }
        if self.done {
            return None;
        }
        if let Err(e) = self.fill_page() {
            self.done = true;
            return Some(Err(e));
        }
        self.page.next().map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_longer_than_a_page_see_every_key_once() {
        let store = MemoryStore::new("pages");
        let n = SCAN_PAGE * 3 + 7;
        let mut batch = Batch::new();
        for i in 0..n as u32 {
            batch.put(i.to_be_bytes().to_vec(), vec![1]);
        }
        store.write(batch).unwrap();
        let forward: Vec<_> = store.all().unwrap().map(|e| e.unwrap().0).collect();
        assert_eq!(forward.len(), n);
        assert!(forward.windows(2).all(|w| w[0] < w[1]));
        let reverse: Vec<_> = store
            .scan(&KeyRange::all(), Order::Reverse)
            .unwrap()
            .map(|e| e.unwrap().0)
            .collect();
        assert_eq!(reverse.len(), n);
        assert!(reverse.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn reopen_sees_the_same_map_and_closed_handles_refuse() {
        let store = MemoryStore::new("m");
        store.put(b"k", b"v").unwrap();
        store.close().unwrap();
        assert!(matches!(store.get(b"k"), Err(Error::Closed { .. })));
        assert_eq!(store.reopen().get(b"k").unwrap(), Some(b"v".to_vec()));
    }
}
