//! [`KeyPrefix`]: a key's first 8 bytes as a number, so that sorting and searching compare
//! integers instead of calling `memcmp` (and, in a map, instead of following a pointer to the key).
//!
//! Two profiles found key comparisons at the top: the sort of a bulk restore chunk (a quarter of
//! its time in `memcmp`) and the overlay's `BTreeMap` inserts on the write path. Keys are often
//! 8-byte big-endian numbers, whose prefixes alone order them.

use std::borrow::Borrow;
use std::cmp::Ordering;

/// `key`'s first 8 bytes, zero-padded, as a big-endian number. Unequal prefixes order as their
/// keys do (a zero pad sorts like the end of a shorter key); equal prefixes say nothing, and the
/// whole keys must be compared.
pub(crate) fn key_prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(bytes)
}

/// An owned key that compares by [`key_prefix`] first. It orders exactly as its bytes do, so a
/// map keyed by it can be searched with a plain `&[u8]` (it borrows as one).
#[derive(Debug, Clone)]
pub(crate) struct PrefixedKey {
    prefix: u64,
    bytes: Vec<u8>,
}

impl PrefixedKey {
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        PrefixedKey {
            prefix: key_prefix(&bytes),
            bytes,
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes
    }
}

impl Ord for PrefixedKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.prefix
            .cmp(&other.prefix)
            .then_with(|| self.bytes.cmp(&other.bytes))
    }
}

impl PartialOrd for PrefixedKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PrefixedKey {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix && self.bytes == other.bytes
    }
}

impl Eq for PrefixedKey {}

impl Borrow<[u8]> for PrefixedKey {
    fn borrow(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(255)], 0..12)
    }

    proptest! {
        /// The contract `Borrow` demands: owned and borrowed forms order alike.
        #[test]
        fn prefixed_keys_order_as_their_bytes(a in key(), b in key()) {
            let (pa, pb) = (PrefixedKey::new(a.clone()), PrefixedKey::new(b.clone()));
            prop_assert_eq!(pa.cmp(&pb), a.cmp(&b));
            prop_assert_eq!(pa == pb, a == b);
        }
    }
}
