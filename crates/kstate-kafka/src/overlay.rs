//! The overlay: writes whose changelog records may not be acknowledged yet.
//!
//! Invariant 2 (DESIGN.md): RocksDB only ever holds a prefix of the changelog. So a write goes
//! to this ordered in-memory map first and reaches RocksDB only in a commit, after the broker
//! acknowledged it. Reads and scans merge the overlay over RocksDB. Unlike "write RocksDB first"
//! (Kafka Streams, Samza), a background memtable flush can never persist a write whose send later
//! fails (KAFKA-20685), so a crash never needs a full wipe.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::iter::Peekable;

use kstate_core::{Entry, EntryIter, KeyRange, Mutation, Order, Result};

use crate::key_prefix::PrefixedKey;

/// Keys mapped to their newest value, or `None` for a delete. Keys compare by their first 8
/// bytes held in the map's own nodes, so an insert rarely follows a pointer to another key.
pub(crate) type Map = BTreeMap<PrefixedKey, Option<Vec<u8>>>;

/// An overlay map with its size, for the bounds.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    pub(crate) map: Map,
    pub(crate) bytes: usize,
}

impl Overlay {
    pub(crate) fn insert(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        let (key_len, value_len) = (key.len(), value.as_ref().map_or(0, Vec::len));
        match self.map.insert(PrefixedKey::new(key), value) {
            Some(old) => self.bytes = self.bytes - old.map_or(0, |v| v.len()) + value_len,
            None => self.bytes += key_len + value_len,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Puts `older`'s entries under this overlay's: keys this one holds keep their (newer)
    /// values. How a frozen layer whose commit gave up returns to the active one.
    pub(crate) fn put_under(&mut self, older: Map) {
        for (key, value) in older {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.map.entry(key) {
                self.bytes += slot.key().as_slice().len() + value.as_ref().map_or(0, Vec::len);
                slot.insert(value);
            }
        }
    }
}

/// The overlay entries in `range` (newest layer first in `layers`), in scan order.
pub(crate) fn overlay_range(layers: &[&Map], range: &KeyRange, order: Order) -> Vec<Mutation> {
    if range.is_empty() {
        return Vec::new();
    }
    let mut merged: BTreeMap<&[u8], &Option<Vec<u8>>> = BTreeMap::new();
    // Oldest first, so newer layers overwrite.
    for layer in layers.iter().rev() {
        for (k, v) in layer.range::<[u8], _>(range.as_bounds()) {
            merged.insert(k.as_slice(), v);
        }
    }
    let it = merged.into_iter().map(|(k, v)| (k.to_vec(), v.clone()));
    match order {
        Order::Forward => it.collect(),
        Order::Reverse => it.rev().collect(),
    }
}

/// Merges overlay entries over a store scan: an overlay entry hides the store's entry with the
/// same key; an overlay delete hides it without yielding anything.
pub(crate) struct MergeScan<'a> {
    overlay: Peekable<std::vec::IntoIter<Mutation>>,
    store: Peekable<EntryIter<'a>>,
    order: Order,
}

impl<'a> MergeScan<'a> {
    pub(crate) fn new(overlay: Vec<Mutation>, store: EntryIter<'a>, order: Order) -> Self {
        MergeScan {
            overlay: overlay.into_iter().peekable(),
            store: store.peekable(),
            order,
        }
    }

    /// Which comes first in scan order: the overlay's next key or the store's.
    fn next_source(&mut self) -> Option<Ordering> {
        let overlay_key = self.overlay.peek().map(|(k, _)| k);
        let store_key = match self.store.peek() {
            Some(Ok((k, _))) => Some(k),
            Some(Err(_)) => return Some(Ordering::Greater), // surface the error now
            None => None,
        };
        match (overlay_key, store_key) {
            (None, None) => None,
            (Some(_), None) => Some(Ordering::Less),
            (None, Some(_)) => Some(Ordering::Greater),
            (Some(o), Some(s)) => Some(match self.order {
                Order::Forward => o.cmp(s),
                Order::Reverse => s.cmp(o),
            }),
        }
    }
}

impl Iterator for MergeScan<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_source()? {
                Ordering::Greater => return self.store.next(),
                Ordering::Equal => {
                    self.store.next(); // hidden by the overlay
                    if let Some((k, Some(v))) = self.overlay.next() {
                        return Some(Ok((k, v)));
                    }
                }
                Ordering::Less => {
                    if let Some((k, Some(v))) = self.overlay.next() {
                        return Some(Ok((k, v)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_put_under_keeps_the_newer_values_and_counts_its_own_bytes() {
        let mut older = Overlay::default();
        older.insert(b"a".to_vec(), Some(b"old".to_vec()));
        older.insert(b"b".to_vec(), None);
        let mut newer = Overlay::default();
        newer.insert(b"a".to_vec(), Some(b"new!".to_vec()));
        newer.insert(b"c".to_vec(), Some(b"3".to_vec()));
        newer.put_under(older.map);
        let entries: Vec<(&[u8], Option<&[u8]>)> = newer
            .map
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
            .collect();
        assert_eq!(
            entries,
            vec![
                (&b"a"[..], Some(&b"new!"[..])),
                (b"b", None),
                (b"c", Some(b"3"))
            ]
        );
        // a + new!, b, c + 3
        assert_eq!(newer.bytes, 5 + 1 + 2);
    }
}
