//! Key ranges and their normal form.
//!
//! Callers give ranges with any [`Bound`]s (`a..b`, `a..=b`, `(Excluded(a), Unbounded)`, a
//! prefix). Engines only need one shape: an inclusive lower and an exclusive upper bound, either
//! possibly absent. Because keys order lexicographically as bytes, the smallest key greater than
//! `k` is `k ++ [0x00]`, so every bound converts exactly: `Included(k)` as an upper bound is
//! `Excluded(k ++ [0])`, and `Excluded(k)` as a lower bound is `Included(k ++ [0])`. RocksDB's
//! `iterate_lower_bound`/`iterate_upper_bound` take exactly this normal form.

use std::ops::Bound;

/// The direction of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Ascending key order.
    Forward,
    /// Descending key order.
    Reverse,
}

/// A range of keys in normal form: `lower <= key < upper`; `None` means unbounded on that side.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct KeyRange {
    /// Inclusive lower bound.
    pub lower: Option<Vec<u8>>,
    /// Exclusive upper bound.
    pub upper: Option<Vec<u8>>,
}

impl KeyRange {
    /// Every key.
    pub fn all() -> Self {
        KeyRange::default()
    }

    /// The range described by two bounds.
    pub fn new(start: Bound<&[u8]>, end: Bound<&[u8]>) -> Self {
        let lower = match start {
            Bound::Included(k) => Some(k.to_vec()),
            Bound::Excluded(k) => Some(successor(k)),
            Bound::Unbounded => None,
        };
        let upper = match end {
            Bound::Included(k) => Some(successor(k)),
            Bound::Excluded(k) => Some(k.to_vec()),
            Bound::Unbounded => None,
        };
        KeyRange { lower, upper }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        KeyRange {
            lower: (!prefix.is_empty()).then(|| prefix.to_vec()),
            upper: prefix_end(prefix),
        }
    }

    /// True when `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.lower.as_deref().is_none_or(|l| key >= l)
            && self.upper.as_deref().is_none_or(|u| key < u)
    }

    /// True when no key can lie in the range (for example `b..a`, or `a..a`).
    pub fn is_empty(&self) -> bool {
        matches!((&self.lower, &self.upper), (Some(l), Some(u)) if l >= u)
    }

    /// The range as a pair of [`Bound`]s over borrowed keys, for `BTreeMap::range`.
    pub fn as_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (
            self.lower
                .as_deref()
                .map_or(Bound::Unbounded, Bound::Included),
            self.upper
                .as_deref()
                .map_or(Bound::Unbounded, Bound::Excluded),
        )
    }
}

/// The smallest key greater than `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = Vec::with_capacity(key.len() + 1);
    next.extend_from_slice(key);
    next.push(0);
    next
}

/// The smallest key greater than every key starting with `prefix`, or `None` when there is none
/// (the prefix is empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b != 0xff)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Bound::{Excluded, Included, Unbounded};

    #[test]
    fn inclusive_upper_bound_includes_the_key_and_nothing_longer_than_needed() {
        let r = KeyRange::new(Included(b"a"), Included(b"c"));
        assert!(r.contains(b"a") && r.contains(b"c") && r.contains(b"b\xff\xff"));
        assert!(!r.contains(b"c\x00"));
    }

    #[test]
    fn exclusive_lower_bound_skips_only_the_key() {
        let r = KeyRange::new(Excluded(b"a"), Unbounded);
        assert!(!r.contains(b"a"));
        assert!(r.contains(b"a\x00"));
    }

    #[test]
    fn prefix_ranges_cover_exactly_the_prefix() {
        let r = KeyRange::prefix(b"ab");
        assert!(r.contains(b"ab") && r.contains(b"ab\xff\xff"));
        assert!(!r.contains(b"aa\xff") && !r.contains(b"ac"));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(KeyRange::prefix(b""), KeyRange::all());
    }

    #[test]
    fn inverted_ranges_are_empty() {
        assert!(KeyRange::new(Included(b"b"), Excluded(b"a")).is_empty());
        assert!(KeyRange::new(Included(b"a"), Excluded(b"a")).is_empty());
        assert!(!KeyRange::new(Included(b"a"), Included(b"a")).is_empty());
    }
}
