//! Where a restore ends: the partition's real end, captured once, never a point short of it.
//!
//! A `read_committed` client's watermark query answers with the last stable offset (LSO), not the
//! high watermark: while any transaction on the partition is open, the LSO stops at its first
//! record. Taken for the end, it made a restore stop short of records the store had already
//! applied, and made a store whose stored offset lay past it look like one of a recreated topic,
//! to be wiped. So the end is the high watermark from a `read_uncommitted` query, and a restore
//! waits (within the open timeout) until the LSO reaches it: until every transaction below the end
//! has committed or aborted, `read_committed` cannot tell which of their records count.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::ChangelogConfig;
use crate::connection::ConnectionWatch;
use crate::error::ChangelogError;
use crate::restore::CancelToken;
use crate::restore::consumer::RestoreConsumer;

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

/// How long one watermark query of a cancellable capture may wait for the broker.
const CANCEL_SLICE: Duration = Duration::from_secs(1);

/// The partition's watermarks once no open transaction holds its stable offset below its end.
/// `uncommitted` is a [`metadata_client`](crate::topic::metadata_client) (`read_uncommitted`),
/// `committed` the restore's `read_committed` consumer. A `cancel`led wait returns
/// [`ChangelogError::Cancelled`] within a poll interval: a follower or a restore revoked while
/// an open transaction holds the partition must not hold its task until the transaction ends.
pub(crate) fn capture_end(
    config: &ChangelogConfig,
    uncommitted: &BaseConsumer<ConnectionWatch>,
    committed: &RestoreConsumer,
    cancel: Option<&CancelToken>,
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
    // A cluster in motion (a leader being elected or moved, a broker that died or restarts)
    // answers with an error at once; a client that already knows the cluster asks again,
    // within the open timeout, instead of failing the restore. Each query waits at most what
    // is left of the open timeout.
    // A query cannot be interrupted: with a cancel token, each waits at most
    // [`CANCEL_SLICE`], so that a follower or restore revoked while the broker does not answer
    // lets go within a slice.
    type Query<'a> = &'a dyn Fn(Duration) -> rdkafka::error::KafkaResult<(i64, i64)>;
    let cancelled = || {
        cancel
            .is_some_and(CancelToken::is_cancelled)
            .then(|| ChangelogError::Cancelled {
                topic: topic.to_string(),
                partition,
            })
    };
    let watermarks = |query: Query<'_>| loop {
        if let Some(e) = cancelled() {
            return Err(e);
        }
        let left = config.open_timeout.saturating_sub(started.elapsed());
        let timeout = match cancel {
            Some(_) => left.min(CANCEL_SLICE),
            None => left,
        };
        match query(timeout.max(Duration::from_millis(1))) {
            Err(KafkaError::MetadataFetch(code))
                if crate::is_in_motion(code) && started.elapsed() < config.open_timeout =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            result => return result.map_err(unreachable),
        }
    };
    let open_transaction = |stable, high| ChangelogError::OpenTransaction {
        topic: topic.to_string(),
        partition,
        last_stable_offset: stable,
        high_watermark: high,
        waited: started.elapsed(),
    };
    // The last stable offset and end seen while a transaction held the partition open.
    let mut held: Option<(i64, i64)> = None;
    let mut logged = false;
    loop {
        if let Some(e) = cancelled() {
            return Err(e);
        }
        let queried =
            watermarks(&|timeout| uncommitted.fetch_watermarks(topic, partition, timeout))
                .and_then(|(low, high)| {
                    let (_, stable) = watermarks(&|timeout| {
                        committed.fetch_watermarks(topic, partition, timeout)
                    })?;
                    Ok((low, high, stable))
                });
        let (low, high, stable) = match (queried, held) {
            (Ok(offsets), _) => offsets,
            // A query near the deadline has almost no time left and times out: what the open
            // ran out of time waiting for is the transaction, which the error must name.
            (Err(ChangelogError::BrokerUnreachable { .. }), Some((stable, high)))
                if started.elapsed() >= config.open_timeout =>
            {
                return Err(open_transaction(stable, high));
            }
            (Err(e), _) => return Err(e),
        };
        if stable >= high {
            return Ok(Watermarks { low, high });
        }
        if started.elapsed() >= config.open_timeout {
            return Err(open_transaction(stable, high));
        }
        held = Some((stable, high));
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

/// The ends of many changelog partitions asked for at once ([`RestoreClients::prefetch_ends`]):
/// three `ListOffsets` round trips (log start, high watermark, last stable offset) for all of
/// them, where a restore one at a time asks four for each. Only partitions with no open
/// transaction below their end (stable ≥ high) are returned: the others are captured by their
/// own restore, which waits for the transaction.
///
/// [`RestoreClients::prefetch_ends`]: crate::RestoreClients::prefetch_ends
pub(crate) fn capture_ends(
    changelogs: &[(&str, i32)],
    uncommitted: &BaseConsumer<ConnectionWatch>,
    committed: &RestoreConsumer,
    timeout: Duration,
) -> KafkaResult<Vec<((String, i32), Watermarks)>> {
    let low = offsets(uncommitted, changelogs, Offset::Beginning, timeout)?;
    let high = offsets(uncommitted, changelogs, Offset::End, timeout)?;
    let stable = offsets(committed, changelogs, Offset::End, timeout)?;
    Ok(high
        .into_iter()
        .filter_map(|(key, high)| {
            let low = *low.get(&key)?;
            (*stable.get(&key)? >= high).then_some((key, Watermarks { low, high }))
        })
        .collect())
}

/// `changelogs`' offsets at `at` (the log start or the end) as `consumer`'s isolation level sees
/// them, in one `ListOffsets` request per leader; partitions the answer has no offset for are
/// left out.
fn offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    changelogs: &[(&str, i32)],
    at: Offset,
    timeout: Duration,
) -> KafkaResult<HashMap<(String, i32), i64>> {
    let mut list = TopicPartitionList::with_capacity(changelogs.len());
    for (topic, partition) in changelogs {
        list.add_partition_offset(topic, *partition, at)?;
    }
    Ok(consumer
        .offsets_for_times(list, timeout)?
        .elements()
        .into_iter()
        .filter(|e| e.error().is_ok())
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) => Some(((e.topic().to_string(), e.partition()), n)),
            _ => None,
        })
        .collect())
}
