//! What the benchmarks write.
//!
//! - [`Rows`]: the keys `0..rows` as 8-byte big-endian integers in a seeded shuffled order, with
//!   `value_size`-byte pseudo-random values (rows_per_second and the Kafka Streams `puts` mode
//!   write the same kind of rows).
//! - [`wide_key`]: unique keys of any width, for a state of a chosen size (the failover
//!   benchmark's ~1 GB): the index, then pseudo-random filler so that it does not compress away.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};

/// Rows every configuration writes, in the same shuffled order.
#[derive(Debug)]
pub struct Rows {
    order: Vec<u64>,
    value_pool: Vec<u8>,
    value_size: usize,
}

/// Values are windows into a pool this much longer than one value.
const POOL_SLACK: usize = 4096;

impl Rows {
    /// `rows` rows with `value_size`-byte values, shuffled by `seed`.
    pub fn new(rows: u64, value_size: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<u64> = (0..rows).collect();
        order.shuffle(&mut rng);
        let mut value_pool = vec![0u8; value_size + POOL_SLACK];
        rng.fill_bytes(&mut value_pool);
        Rows {
            order,
            value_pool,
            value_size,
        }
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Row `i`: its key and value.
    pub fn row(&self, i: usize) -> ([u8; 8], &[u8]) {
        let offset = (i * 61) % POOL_SLACK;
        (
            self.order[i].to_be_bytes(),
            &self.value_pool[offset..offset + self.value_size],
        )
    }
}

/// Key `index` at `width` bytes (at least 8): the index big-endian, then filler from a
/// SplitMix64 sequence seeded by the index. Distinct indexes give distinct keys.
pub fn wide_key(index: u64, width: usize) -> Vec<u8> {
    let mut key = Vec::with_capacity(width.max(8));
    key.extend_from_slice(&index.to_be_bytes());
    let mut state = index ^ 0x9e37_79b9_7f4a_7c15;
    while key.len() < width {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let take = (width - key.len()).min(8);
        key.extend_from_slice(&z.to_le_bytes()[..take]);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_a_seeded_permutation() {
        let (a, b) = (Rows::new(1000, 100, 7), Rows::new(1000, 100, 7));
        let mut keys: Vec<u64> = (0..a.len())
            .map(|i| u64::from_be_bytes(a.row(i).0))
            .collect();
        assert_eq!(a.row(17), b.row(17));
        assert_eq!(a.row(3).1.len(), 100);
        keys.sort_unstable();
        assert_eq!(keys, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn wide_keys_are_distinct_and_sized() {
        let k = wide_key(5, 500);
        assert_eq!(k.len(), 500);
        assert_eq!(&k[..8], &5u64.to_be_bytes());
        assert_eq!(k, wide_key(5, 500));
        assert_ne!(k[8..], wide_key(6, 500)[8..]);
        assert_eq!(wide_key(9, 3).len(), 8);
    }
}
