//! The byte-level [`KeyValueStore`] trait every engine implements.
//!
//! Keys and values are byte strings; keys order lexicographically as unsigned bytes (`memcmp`
//! order, shorter first on a common prefix), the order RocksDB's default comparator uses. The
//! typed layer ([`crate::Store`]) encodes keys so that this byte order is the natural order of
//! the key type.
//!
//! Methods take `&self`: stores are shared between threads (a task's processing thread and its
//! commit timer, for example), and engines synchronise internally. A small set of methods is
//! required; the rest are default methods over them, so an engine cannot give two answers to one
//! question (`put` is a one-entry [`write`](KeyValueStore::write), `all` is an unbounded
//! [`range`](KeyValueStore::range)). Engines override a default only to be faster, never to
//! differ.
//!
//! Iterators are weakly consistent: they yield each key at most once, in order, and reflect every
//! write that completed before the scan began; writes made while a scan runs may or may not be
//! seen.

use std::ops::Bound;

use crate::error::Result;
use crate::range::{KeyRange, Order};

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// An iterator over entries in key order (or reverse key order).
pub type EntryIter<'a> = Box<dyn Iterator<Item = Result<Entry>> + 'a>;

/// One mutation: a value to store, or `None` to delete the key.
pub type Mutation = (Vec<u8>, Option<Vec<u8>>);

/// An ordered list of mutations applied by [`KeyValueStore::write`]; later mutations of the same
/// key win. Readers never see part of a batch. What a crash leaves depends on the engine: see
/// [`KeyValueStore::write`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    mutations: Vec<Mutation>,
    payload_bytes: usize,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// An empty batch with room for `n` mutations.
    pub fn with_capacity(n: usize) -> Self {
        Batch {
            mutations: Vec::with_capacity(n),
            payload_bytes: 0,
        }
    }

    /// Adds a put.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> &mut Self {
        self.push(key.into(), Some(value.into()))
    }

    /// Adds a delete.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) -> &mut Self {
        self.push(key.into(), None)
    }

    /// Adds a mutation (`None` deletes).
    pub fn push(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) -> &mut Self {
        self.payload_bytes += key.len() + value.as_ref().map_or(0, Vec::len);
        self.mutations.push((key, value));
        self
    }

    /// The mutations, in the order they were added.
    pub fn mutations(&self) -> &[Mutation] {
        &self.mutations
    }

    /// Takes the mutations out.
    pub fn into_mutations(self) -> Vec<Mutation> {
        self.mutations
    }

    /// The number of mutations.
    pub fn len(&self) -> usize {
        self.mutations.len()
    }

    /// True when the batch holds no mutation.
    pub fn is_empty(&self) -> bool {
        self.mutations.is_empty()
    }

    /// The summed size of keys and values, in bytes.
    pub fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }
}

impl FromIterator<Mutation> for Batch {
    fn from_iter<I: IntoIterator<Item = Mutation>>(iter: I) -> Self {
        let mut batch = Batch::new();
        for (k, v) in iter {
            batch.push(k, v);
        }
        batch
    }
}

/// A local, ordered key-value store over bytes.
///
/// Required: [`name`](Self::name), [`get`](Self::get), [`write`](Self::write),
/// [`scan`](Self::scan), [`approximate_len`](Self::approximate_len), [`flush`](Self::flush),
/// [`close`](Self::close). Everything else is derived.
pub trait KeyValueStore: Send + Sync {
    /// The store's path (on-disk stores) or name; every error from this store carries it.
    fn name(&self) -> &str;

    /// The value stored under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Applies `batch`: readers see all of it or none of it. After a crash, per engine:
    /// - in-memory and RocksDB stores: all of it or none of it;
    /// - a changelog-backed store (`LoggedStore`): all or none in its local engine, but the
    ///   changelog holds one record per mutation, so a crash while the batch is being sent can
    ///   restore a prefix of it. Only a transactional changelog (exactly-once) makes a batch
    ///   atomic through a crash.
    fn write(&self, batch: Batch) -> Result<()>;

    /// The entries whose keys lie in `range`, in `order`.
    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>>;

    /// An estimate of the number of live entries; cheap, and allowed to be off (RocksDB counts
    /// overwrites and deletes it has not compacted yet).
    fn approximate_len(&self) -> Result<u64>;

    /// Makes every completed write durable in the engine's own storage (for RocksDB: flushes the
    /// memtables to SST files), so that it survives a crash without help from anywhere else. A
    /// changelog-backed store first waits until the changelog acknowledged every write and
    /// commits them locally, then flushes.
    fn flush(&self) -> Result<()>;

    /// Flushes and releases the store. Later calls on this handle return
    /// [`Error::Closed`](crate::Error::Closed). Closing twice is not an error, unless the first
    /// close failed: then the second returns that failure again.
    fn close(&self) -> Result<()>;

    /// The values stored under `keys`, in the same order.
    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// [`write`](Self::write), at event time `time` (ms; the stream time of a store of time). A
    /// changelog-backed store sends `time` with its records (a header), so a restore learns the
    /// time from them; other engines ignore it.
    fn write_at(&self, batch: Batch, time: i64) -> Result<()> {
        let _ = time;
        self.write(batch)
    }

    /// Stores `value` under `key`.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut batch = Batch::with_capacity(1);
        batch.put(key, value);
        self.write(batch)
    }

    /// Removes `key`; removing an absent key is not an error.
    fn delete(&self, key: &[u8]) -> Result<()> {
        let mut batch = Batch::with_capacity(1);
        batch.delete(key);
        self.write(batch)
    }

    /// Stores all `entries` atomically.
    fn put_all(&self, entries: &[(&[u8], &[u8])]) -> Result<()> {
        let mut batch = Batch::with_capacity(entries.len());
        for (k, v) in entries {
            batch.put(*k, *v);
        }
        self.write(batch)
    }

    /// Removes all `keys` atomically.
    fn delete_all(&self, keys: &[&[u8]]) -> Result<()> {
        let mut batch = Batch::with_capacity(keys.len());
        for k in keys {
            batch.delete(*k);
        }
        self.write(batch)
    }

    /// The entries between two bounds, in ascending key order.
    fn range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<EntryIter<'_>> {
        self.scan(&KeyRange::new(start, end), Order::Forward)
    }

    /// The entries between two bounds, in descending key order.
    fn reverse_range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<EntryIter<'_>> {
        self.scan(&KeyRange::new(start, end), Order::Reverse)
    }

    /// The entries whose keys start with `prefix`, in ascending key order.
    fn prefix_scan(&self, prefix: &[u8]) -> Result<EntryIter<'_>> {
        self.scan(&KeyRange::prefix(prefix), Order::Forward)
    }

    /// Every entry, in ascending key order.
    fn all(&self) -> Result<EntryIter<'_>> {
        self.scan(&KeyRange::all(), Order::Forward)
    }

    /// Removes every key in `range` from this engine's own storage, and only there. It is how a
    /// window or session store drops an expired time segment:
    /// - a changelog-backed store does not log it: the changelog's own retention
    ///   (`cleanup.policy=compact,delete`) removes the records there, and a restore skips what
    ///   is past retention;
    /// - a changelog-backed store drops the range with its next commit, as durable as the writes
    ///   that decided it (a window store's stream time) and never before them: the writes it
    ///   took before the drop go with the range, the writes after it land; reads stop seeing the
    ///   range at once;
    /// - RocksDB drops the range with one range tombstone, and deletes the files wholly inside
    ///   it once a flush made the tombstone durable, whatever the range holds.
    ///
    /// The default deletes key by key, in one batch.
    fn drop_range(&self, range: &KeyRange) -> Result<()> {
        let keys = self
            .scan(range, Order::Forward)?
            .map(|entry| entry.map(|(key, _)| key))
            .collect::<Result<Vec<_>>>()?;
        let mut batch = Batch::with_capacity(keys.len());
        for key in keys {
            batch.delete(key);
        }
        self.write(batch)
    }
}

/// Implements [`KeyValueStore`] for a pointer type by forwarding every method to the store it
/// points at, overridden defaults included (the store may have faster ones).
macro_rules! forward_store {
    ($(#[$doc:meta])* $pointer:ty) => {
        $(#[$doc])*
        impl<S: KeyValueStore + ?Sized> KeyValueStore for $pointer {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
                (**self).get(key)
            }
            fn write(&self, batch: Batch) -> Result<()> {
                (**self).write(batch)
            }
            fn write_at(&self, batch: Batch, time: i64) -> Result<()> {
                (**self).write_at(batch, time)
            }
            fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
                (**self).scan(range, order)
            }
            fn approximate_len(&self) -> Result<u64> {
                (**self).approximate_len()
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn close(&self) -> Result<()> {
                (**self).close()
            }
            fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
                (**self).multi_get(keys)
            }
            fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
                (**self).put(key, value)
            }
            fn delete(&self, key: &[u8]) -> Result<()> {
                (**self).delete(key)
            }
            fn drop_range(&self, range: &KeyRange) -> Result<()> {
                (**self).drop_range(range)
            }
        }
    };
}

forward_store!(
    /// Shared and boxed stores are stores too, so layers can own `Arc<dyn KeyValueStore>`.
    std::sync::Arc<S>
);

forward_store!(
    /// A borrowed store is a store too, so a typed [`Store`](crate::Store) can be a short-lived
    /// view over a store someone else owns (the task runtime hands processors such views).
    &S
);
