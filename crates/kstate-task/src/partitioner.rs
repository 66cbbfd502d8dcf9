//! Kafka's default partitioner for keyed records (the Java client's and Kafka Streams'):
//! `murmur2(key) & 0x7fffffff % partitions`. The query API uses it to find the task that owns a
//! key, for inputs written by a producer that partitions the same way (librdkafka producers:
//! `partitioner=murmur2_random`).

/// The partition Kafka's Java producer picks for `key` among `partitions`.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_java_client() {
        // Values from Kafka's own UtilsTest (testMurmur2), as signed ints.
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key) as i32, *expected, "key {key:?}");
        }
    }

    #[test]
    fn partitions_are_in_range() {
        for i in 0..1000u32 {
            let p = partition_for(&i.to_be_bytes(), 12);
            assert!((0..12).contains(&p));
        }
    }
}
