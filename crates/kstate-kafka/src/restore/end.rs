//! Where a restore ends: the partition's real end, captured once, never a point short of it.
//!
//! A `read_committed` client's watermark query answers with the last stable offset (LSO), not the
//! high watermark: while any transaction on the partition is open, the LSO stops at its first
//! record. Taken for the end, it made a restore stop short of records the store had already
//! applied, and made a store whose stored offset lay past it look like one of a recreated topic,
//! to be wiped. So the end is the high watermark from a `read_uncommitted` query, and a restore
//! waits (within the open timeout) until the LSO reaches it: until every transaction below the end
//! has committed or aborted, `read_committed` cannot tell which of their records count.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::ChangelogConfig;
use crate::connection::ConnectionWatch;
use crate::error::ChangelogError;

/// The partition's offsets at the start of a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watermarks {
    /// The first offset still in the log.
    pub(crate) low: i64,
    /// The offset the next record will get: the restore ends here.
    pub(crate) high: i64,
}

impl Watermarks {
    /// True when the log holds no record (whatever offsets it has used).
    pub(crate) fn is_empty(&self) -> bool {
        self.low >= self.high
    }
}

/// The partition's watermarks once no open transaction holds its stable offset below its end.
/// `uncommitted` is a [`metadata_client`](crate::topic::metadata_client) (`read_uncommitted`),
/// `committed` the restore's `read_committed` consumer.
pub(crate) fn capture_end(
    config: &ChangelogConfig,
    uncommitted: &BaseConsumer<ConnectionWatch>,
    committed: &BaseConsumer,
) -> Result<Watermarks, ChangelogError> {
    let (topic, partition) = (config.topic.as_str(), config.partition);
    let unreachable = |source| ChangelogError::BrokerUnreachable {
        bootstrap_servers: config.bootstrap_servers().to_string(),
        topic: topic.to_string(),
        timeout: config.open_timeout,
        source,
        last_error: uncommitted.context().last_error(),
    };
    let started = Instant::now();
    // A partition whose leader is still being elected (a topic created a moment ago, a broker
    // restarting) answers "not leader" at once; a client that already knows the cluster asks
    // again instead of failing the restore.
    type Query<'a> = &'a dyn Fn(Duration) -> rdkafka::error::KafkaResult<(i64, i64)>;
    let watermarks = |query: Query<'_>| loop {
        match query(config.open_timeout) {
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::UnknownTopicOrPartition,
            )) if started.elapsed() < config.open_timeout => {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result.map_err(unreachable),
        }
    };
    let mut logged = false;
    loop {
        let (low, high) =
            watermarks(&|timeout| uncommitted.fetch_watermarks(topic, partition, timeout))?;
        let (_, stable) =
            watermarks(&|timeout| committed.fetch_watermarks(topic, partition, timeout))?;
        if stable >= high {
            return Ok(Watermarks { low, high });
        }
        let waited = started.elapsed();
        if waited >= config.open_timeout {
            return Err(ChangelogError::OpenTransaction {
                topic: topic.to_string(),
                partition,
                last_stable_offset: stable,
                high_watermark: high,
                waited,
            });
        }
        if !logged {
            tracing::warn!(
                topic,
                partition,
                last_stable_offset = stable,
                high_watermark = high,
                "an open transaction holds the changelog; waiting for it to finish"
            );
            logged = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
