//! The local layout that window and session stores share: time segments as a key prefix, user
//! keys in a self-delimiting encoding, and a stream time kept with the data.
//!
//! Every key of such a store, in its [`KeyValueStore`](crate::KeyValueStore), is one of:
//! - `0x00 ‖ name`: a local value derived from the data (the stream time, the duplicates'
//!   sequence), written in the same batch as the data it follows and never logged;
//! - `0x01 ‖ segment (i64, sign flipped, BE) ‖ escaped key ‖ time suffix`: an entry.
//!
//! Why:
//! - **One key space, segments as a prefix.** Kafka Streams opens a RocksDB per segment and
//!   deletes expired ones as directories; its own newer versioned store keeps every segment in
//!   one RocksDB under an 8-byte prefix and drops one with `deleteRange`. Here too: dropping
//!   every expired segment is one [`drop_range`](crate::KeyValueStore::drop_range), whose cost
//!   does not depend on what the segments hold.
//! - **Escaped keys.** Kafka Streams appends the timestamp to the raw key, so the entries of a
//!   key can interleave with those of a longer key it is a prefix of, and every fetch filters
//!   and widens its bounds. Here a key is escaped (`0x00` → `0x00 0xFF`) and ends with
//!   `0x00 0x00`: no encoded key is a prefix of another and the order of keys is kept, so a
//!   key's entries are one contiguous run in each segment and a fetch is one exact seek per
//!   segment. The changelog still carries Kafka Streams' raw format
//!   ([`ChangelogKeys`](crate::ChangelogKeys) maps between them).
//! - **Sign-flipped big-endian times** order as signed numbers.

use crate::error::Result;
use crate::range::{KeyRange, prefix_end};
use crate::store::KeyValueStore;

/// The first byte of an entry's key.
pub(crate) const DATA: u8 = 0x01;
/// The local key holding the stream time (local keys start with `0x00`).
pub(crate) const STREAM_TIME_KEY: &[u8] = b"\x00stream-time";

/// `t` as 8 bytes whose unsigned order is `t`'s signed order.
pub(crate) fn flip(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The inverse of [`flip`]; `bytes` must be 8 bytes long.
pub(crate) fn unflip(bytes: &[u8]) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(bytes);
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

/// Appends `key` escaped and terminated: order-preserving and prefix-free.
pub(crate) fn escape_into(key: &[u8], out: &mut Vec<u8>) {
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// Splits an escaped key off the front of `bytes`: the key, and what follows its terminator.
/// `None` when `bytes` holds no well-formed escaped key.
pub(crate) fn unescape(bytes: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut key = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != 0 {
            key.push(b);
            i += 1;
            continue;
        }
        match bytes.get(i + 1) {
            Some(0xFF) => {
                key.push(0);
                i += 2;
            }
            Some(0) => return Some((key, &bytes[i + 2..])),
            _ => return None,
        }
    }
    None
}

/// Reads a stream time stored under [`STREAM_TIME_KEY`]; a malformed value reads as none.
pub(crate) fn decode_time(value: &[u8]) -> Option<i64> {
    (value.len() == 8).then(|| i64::from_be_bytes(value.try_into().unwrap_or_default()))
}

/// The stream time `store` holds under [`STREAM_TIME_KEY`] (`None`: none yet).
pub(crate) fn stored_time<S: KeyValueStore + ?Sized>(store: &S) -> Result<Option<i64>> {
    Ok(store.get(STREAM_TIME_KEY)?.and_then(|v| decode_time(&v)))
}

/// Time segments of a fixed interval, and which of them a retention keeps at a stream time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segments {
    /// Milliseconds per segment, > 0.
    pub(crate) interval: i64,
    /// Milliseconds a time stays live behind stream time, > 0.
    pub(crate) retention: i64,
}

impl Segments {
    /// The segment holding time `t`.
    pub(crate) fn id(&self, t: i64) -> i64 {
        t.div_euclid(self.interval)
    }

    /// The first key byte string of segment `id`.
    pub(crate) fn prefix(&self, id: i64) -> Vec<u8> {
        let mut p = Vec::with_capacity(9);
        p.push(DATA);
        p.extend_from_slice(&flip(id));
        p
    }

    /// Segment `id`'s prefix and `key` escaped, allocated once with room for `suffix` more
    /// bytes (an entry's local key is built on every put and get: growing it cost two
    /// allocations per call in a profile of the windowed count).
    pub(crate) fn key_in(&self, id: i64, key: &[u8], suffix: usize) -> Vec<u8> {
        let zeros = key.iter().filter(|&&b| b == 0).count();
        let mut k = Vec::with_capacity(9 + key.len() + zeros + 2 + suffix);
        k.push(DATA);
        k.extend_from_slice(&flip(id));
        escape_into(key, &mut k);
        k
    }

    /// The smallest time still live at stream time `now` (`None`: nothing seen yet, all live).
    pub(crate) fn min_live(&self, now: Option<i64>) -> i64 {
        now.map_or(i64::MIN, |now| {
            now.saturating_sub(self.retention).saturating_add(1)
        })
    }

    /// The keys of every segment wholly older than [`min_live`](Self::min_live): what a drop
    /// removes. Empty while the first segment is still live.
    pub(crate) fn expired(&self, now: Option<i64>) -> KeyRange {
        let first_live = self.id(self.min_live(now));
        KeyRange {
            lower: Some(vec![DATA]),
            upper: Some(self.prefix(first_live)),
        }
    }

    /// The keys of segments `first..=last`.
    pub(crate) fn span(&self, first: i64, last: i64) -> KeyRange {
        KeyRange {
            lower: Some(self.prefix(first)),
            upper: if last == i64::MAX {
                prefix_end(&[DATA])
            } else {
                Some(self.prefix(last + 1))
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn escaped(key: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        escape_into(key, &mut out);
        out
    }

    proptest! {
        #[test]
        fn escaping_keeps_order_round_trips_and_no_key_prefixes_another(
            a in proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(0xFF)], 0..6),
            b in proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(0xFF)], 0..6),
            suffix_a in any::<[u8; 4]>(),
            suffix_b in any::<[u8; 4]>(),
        ) {
            let (ea, eb) = (escaped(&a), escaped(&b));
            prop_assert_eq!(a.cmp(&b), ea.cmp(&eb));
            if a != b {
                // Whatever follows, two keys' entries never interleave.
                let (mut fa, mut fb) = (ea.clone(), eb.clone());
                fa.extend_from_slice(&suffix_a);
                fb.extend_from_slice(&suffix_b);
                prop_assert_eq!(a.cmp(&b), fa.cmp(&fb));
            }
            let mut with_suffix = ea.clone();
            with_suffix.extend_from_slice(&suffix_a);
            let (key, rest) = unescape(&with_suffix).unwrap();
            prop_assert_eq!(key, a);
            prop_assert_eq!(rest, &suffix_a[..]);
        }

        #[test]
        fn flipped_times_order_as_signed_numbers(a: i64, b: i64) {
            prop_assert_eq!(a.cmp(&b), flip(a).cmp(&flip(b)));
            prop_assert_eq!(unflip(&flip(a)), a);
        }
    }

    #[test]
    fn only_whole_segments_below_the_retention_expire() {
        let s = Segments {
            interval: 10,
            retention: 25,
        };
        assert_eq!(s.min_live(None), i64::MIN);
        // At stream time 44, times 20.. are live: segment 2 starts the live ones.
        assert_eq!(s.min_live(Some(44)), 20);
        assert_eq!(s.expired(Some(44)).upper, Some(s.prefix(2)));
        // At 45, time 20 expired but 21..29 still live: segment 2 stays.
        assert_eq!(s.expired(Some(45)).upper, Some(s.prefix(2)));
        assert_eq!(s.expired(Some(54)).upper, Some(s.prefix(3)));
        assert_eq!(s.id(-1), -1);
    }
}
