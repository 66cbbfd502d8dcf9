//! The stream tasks the benchmarks run, and the task runtime's tests with them, so that a
//! benchmark measures the very task a test checks:
//!
//! - [`count_by_key`]: the count per key, every count (or each key's latest per commit) sent.
//! - [`windowed_count`]: the count per key and time window, each window's final count sent once.
//! - [`windowed_updates`]: the count per key and time window, every window's new count sent.
//!
//! The `count_by_key` and `windowed_count` examples run these as services (flags, a clean
//! shutdown on SIGTERM), so an example runs the very task the tests check. Each matches a Kafka
//! Streams topology of `benches/kafka-streams` (`KafkaStreamsBench`), record for record, so that
//! the two systems do the same work.

pub mod count_by_key;
pub mod windowed_count;
pub mod windowed_updates;

use kstate_core::BoxError;

/// A stored count: 8 bytes big-endian, Kafka Streams' `Long` serde, so that a window store's
/// changelog is Kafka Streams'.
fn decode_count(count: &[u8]) -> Result<i64, BoxError> {
    Ok(i64::from_be_bytes(count.try_into().map_err(|_| {
        format!("a count of {} bytes, not 8", count.len())
    })?))
}
