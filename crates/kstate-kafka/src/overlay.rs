//! The overlay: writes whose changelog records may not be acknowledged yet.
//!
//! Invariant 2 (DESIGN.md): RocksDB only ever holds a prefix of the changelog. So a write goes
//! to this ordered in-memory map first and reaches RocksDB only in a commit, after the broker
//! acknowledged it. Reads and scans merge the overlay over RocksDB. Unlike "write RocksDB first"
//! (Kafka Streams, Samza), a background memtable flush can never persist a write whose send later
//! fails (KAFKA-20685), so a crash never needs a full wipe.
//!
//! Range drops (a window store's expired segment) wait here too: a drop is decided by a
//! stream time that is itself a write of the overlay, so it may reach RocksDB only with that
//! write, in the same commit. Dropped any earlier, an abort or a crash would bring back the old
//! stream time over a store that lost windows still live at it.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::iter::Peekable;

use kstate_core::{Entry, EntryIter, KeyRange, Mutation, Order, Result};

use crate::key_prefix::PrefixedKey;

/// Keys mapped to their newest value, or `None` for a delete. Keys compare by their first 8
/// bytes held in the map's own nodes, so an insert rarely follows a pointer to another key.
pub(crate) type Map = BTreeMap<PrefixedKey, Option<Vec<u8>>>;

/// An overlay layer: ranges dropped, then the writes made since each drop, with their size
/// for the bounds. A layer's writes are newer than its drops (a drop removes the layer's
/// writes in its range), so a commit applies the drops first.
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    pub(crate) map: Map,
    pub(crate) drops: Vec<KeyRange>,
    pub(crate) bytes: usize,
}

/// A layer frozen for a commit: what [`Overlay`] held.
#[derive(Debug, Default, Clone)]
pub(crate) struct Frozen {
    pub(crate) map: Map,
    pub(crate) drops: Vec<KeyRange>,
}

impl Frozen {
    /// What this layer says of `key`: `Some(value)` (`Some(None)`: deleted or dropped), or
    /// `None` when older layers decide.
    pub(crate) fn lookup(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        lookup(&self.map, &self.drops, key)
    }
}

fn lookup(map: &Map, drops: &[KeyRange], key: &[u8]) -> Option<Option<Vec<u8>>> {
    if let Some(value) = map.get(key) {
        return Some(value.clone());
    }
    drops.iter().any(|d| d.contains(key)).then_some(None)
}

impl Overlay {
    /// What this layer says of `key`, as [`Frozen::lookup`].
    pub(crate) fn lookup(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        lookup(&self.map, &self.drops, key)
    }

    /// Drops `range`: this layer's writes in it go, and reads no longer see older ones.
    pub(crate) fn drop_range(&mut self, range: &KeyRange) {
        if range.is_empty() {
            return;
        }
        let doomed: Vec<PrefixedKey> = self
            .map
            .range::<[u8], _>(range.as_bounds())
            .map(|(k, _)| k.clone())
            .collect();
        for key in doomed {
            if let Some(value) = self.map.remove(key.as_slice()) {
                self.bytes -= key.as_slice().len() + value.map_or(0, |v| v.len());
            }
        }
        self.drops.push(range.clone());
    }

    /// Whether this layer holds nothing to commit: no write, no drop.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty() && self.drops.is_empty()
    }

    /// Empties this layer into a frozen one.
    pub(crate) fn take_frozen(&mut self) -> (Frozen, usize) {
        let taken = std::mem::take(self);
        (
            Frozen {
                map: taken.map,
                drops: taken.drops,
            },
            taken.bytes,
        )
    }

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

    /// Puts `older`'s drops and entries under this overlay's: keys this one holds keep their
    /// (newer) values, and `older`'s entries in a range this one dropped stay dropped. How a
    /// frozen layer whose commit gave up returns to the active one.
    pub(crate) fn put_under(&mut self, older: Frozen) {
        for (key, value) in older.map {
            if self.drops.iter().any(|d| d.contains(key.as_slice())) {
                continue;
            }
            if let std::collections::btree_map::Entry::Vacant(slot) = self.map.entry(key) {
                self.bytes += slot.key().as_slice().len() + value.as_ref().map_or(0, Vec::len);
                slot.insert(value);
            }
        }
        let mut drops = older.drops;
        drops.append(&mut self.drops);
        self.drops = drops;
    }
}

/// The overlay entries in `range` (newest layer first in `layers`, each a map and the ranges
/// it dropped), in scan order. An older layer's entry in a range a newer layer dropped is not
/// one of them; the store's own entries in any dropped range the caller hides
/// ([`MergeScan::new`]).
pub(crate) fn overlay_range(
    layers: &[(&Map, &[KeyRange])],
    range: &KeyRange,
    order: Order,
) -> Vec<Mutation> {
    if range.is_empty() {
        return Vec::new();
    }
    let mut merged: BTreeMap<&[u8], &Option<Vec<u8>>> = BTreeMap::new();
    // Oldest first, so newer layers overwrite and drop.
    for (map, drops) in layers.iter().rev() {
        if !drops.is_empty() {
            merged.retain(|k, _| !drops.iter().any(|d| d.contains(k)));
        }
        for (k, v) in map.range::<[u8], _>(range.as_bounds()) {
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
    /// The merge of `overlay` over `store`, whose entries in a range of `dropped` (the ranges
    /// the overlay dropped, not yet dropped in the store) are hidden.
    pub(crate) fn new(
        overlay: Vec<Mutation>,
        store: EntryIter<'a>,
        dropped: Vec<KeyRange>,
        order: Order,
    ) -> Self {
        let store: EntryIter<'a> = if dropped.is_empty() {
            store
        } else {
            Box::new(store.filter(move |entry| match entry {
                Ok((k, _)) => !dropped.iter().any(|d| d.contains(k)),
                Err(_) => true,
            }))
        };
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
        newer.put_under(older.take_frozen().0);
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

    /// One step of the model test: a write, a drop, or a commit's freeze, give-back or apply.
    #[derive(Debug, Clone)]
    enum Step {
        Put(u8, u8),
        Delete(u8),
        Drop(u8, u8),
        Freeze,
        GiveBack,
        Apply,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..16, any::<u8>()).prop_map(|(k, v)| Step::Put(k, v)),
            1 => (0u8..16).prop_map(Step::Delete),
            2 => (0u8..17, 0u8..17).prop_map(|(a, b)| Step::Drop(a.min(b), a.max(b))),
            1 => Just(Step::Freeze),
            1 => Just(Step::GiveBack),
            1 => Just(Step::Apply),
        ]
    }

    proptest::proptest! {
        /// The active layer, a frozen one and the store under them (applied as a commit
        /// applies: drops first, then writes) read exactly as one map to which every write and
        /// drop went at once, through any order of freezes, give-backs and applies.
        #[test]
        fn layers_and_drops_read_as_the_writes_applied_in_order(
            steps in proptest::collection::vec(step(), 1..60),
        ) {
            let mut active = Overlay::default();
            let mut frozen: Option<Frozen> = None;
            let mut store: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Put(k, v) => {
                        active.insert(vec![k], Some(vec![v]));
                        model.insert(vec![k], vec![v]);
                    }
                    Step::Delete(k) => {
                        active.insert(vec![k], None);
                        model.remove(&vec![k]);
                    }
                    Step::Drop(lo, hi) => {
                        let range = KeyRange { lower: Some(vec![lo]), upper: Some(vec![hi]) };
                        active.drop_range(&range);
                        model.retain(|k, _| !range.contains(k));
                    }
                    Step::Freeze => {
                        if frozen.is_none() {
                            frozen = Some(active.take_frozen().0);
                        }
                    }
                    Step::GiveBack => {
                        if let Some(f) = frozen.take() {
                            active.put_under(f);
                        }
                    }
                    Step::Apply => {
                        if let Some(f) = frozen.take() {
                            for d in &f.drops {
                                store.retain(|k, _| !d.contains(k));
                            }
                            for (k, v) in f.map {
                                match v {
                                    Some(v) => store.insert(k.as_slice().to_vec(), v),
                                    None => store.remove(k.as_slice()),
                                };
                            }
                        }
                    }
                }
                let counted: usize = active
                    .map
                    .iter()
                    .map(|(k, v)| k.as_slice().len() + v.as_ref().map_or(0, Vec::len))
                    .sum();
                proptest::prop_assert_eq!(active.bytes, counted);
                for k in 0u8..17 {
                    let key = [k];
                    let read = active
                        .lookup(&key)
                        .or_else(|| frozen.as_ref().and_then(|f| f.lookup(&key)))
                        .unwrap_or_else(|| store.get(&key[..]).cloned());
                    proptest::prop_assert_eq!(read.as_ref(), model.get(&key[..]), "key {}", k);
                }
                let mut layers: Vec<(&Map, &[KeyRange])> = vec![(&active.map, &active.drops)];
                if let Some(f) = &frozen {
                    layers.push((&f.map, &f.drops));
                }
                let dropped: Vec<KeyRange> =
                    layers.iter().flat_map(|(_, d)| d.iter().cloned()).collect();
                let overlay = overlay_range(&layers, &KeyRange::all(), Order::Forward);
                let stored: EntryIter<'_> =
                    Box::new(store.clone().into_iter().map(Ok::<_, kstate_core::Error>));
                let scanned: Vec<Entry> = MergeScan::new(overlay, stored, dropped, Order::Forward)
                    .collect::<Result<_>>()
                    .expect("no store error");
                let expected: Vec<Entry> = model.clone().into_iter().collect();
                proptest::prop_assert_eq!(scanned, expected);
            }
        }
    }

    #[test]
    fn a_drop_removes_the_layers_writes_in_its_range_and_hides_older_layers() {
        let mut older = Overlay::default();
        older.insert(b"a1".to_vec(), Some(b"old".to_vec()));
        older.insert(b"b1".to_vec(), Some(b"kept".to_vec()));
        let mut newer = Overlay::default();
        newer.insert(b"a2".to_vec(), Some(b"gone".to_vec()));
        newer.drop_range(&KeyRange::prefix(b"a"));
        newer.insert(b"a3".to_vec(), Some(b"after".to_vec()));
        assert_eq!(newer.lookup(b"a2"), Some(None));
        assert_eq!(newer.lookup(b"a3"), Some(Some(b"after".to_vec())));
        assert_eq!(newer.lookup(b"b1"), None);
        assert_eq!(newer.bytes, 2 + 5);
        let older = older.take_frozen().0;
        let scanned = overlay_range(
            &[(&newer.map, &newer.drops), (&older.map, &older.drops)],
            &KeyRange::all(),
            Order::Forward,
        );
        assert_eq!(
            scanned,
            vec![
                (b"a3".to_vec(), Some(b"after".to_vec())),
                (b"b1".to_vec(), Some(b"kept".to_vec()))
            ]
        );
        // Given back under the newer layer, the older one's write in the dropped range stays
        // dropped, and its drops come first.
        newer.put_under(older);
        assert_eq!(newer.lookup(b"a1"), Some(None));
        assert_eq!(newer.lookup(b"b1"), Some(Some(b"kept".to_vec())));
        assert_eq!(newer.drops, vec![KeyRange::prefix(b"a")]);
    }
}
