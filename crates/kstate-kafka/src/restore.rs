//! Restore: replay the changelog into a fresh or stale RocksDB when a store opens.
//!
//! 1. Open RocksDB and read the stored [`ChangelogPosition`].
//! 2. Ask the broker for the partition's low and high watermarks; the end is the high watermark
//!    captured now (writes made after this point are not waited for).
//! 3. Start at the stored offset + 1. The stored position cannot be trusted, and the store is
//!    wiped and rebuilt from the low watermark with a warning, when: it names another topic or
//!    partition; the next offset is below the low watermark (the log was truncated past it, e.g.
//!    by `deleteRecords`); or the stored offset is at or beyond the high watermark (the topic was
//!    deleted and recreated). A store that has data but no position is rebuilt too.
//! 4. Replay with `isolation.level=read_committed` (records of aborted transactions never appear)
//!    into `WriteBatch`es of [`restore_batch_records`](crate::ChangelogConfig::restore_batch_records)
//!    records, each written atomically with its last offset. Done when the consumer's *position*
//!    reaches the end: offsets held by transaction markers or compacted away never hold it up.
//! 5. Report to the [`RestoreListener`], through `tracing` spans and `metrics`.
//!
//! Reading and writing overlap: the thread that opens the store reads records into a chunk, and a
//! writer thread writes full chunks to RocksDB in order, each with the offset of its last record.
//!
//! Limits of the trust rules, which only see offsets: a topic deleted, recreated and grown past
//! the stored offset before the store reopens is not detected (the metadata holds no topic id);
//! and a store offline for longer than the topic's `delete.retention.ms` (24 h by default) can
//! miss tombstones that compaction removed meanwhile, so deleted keys may come back. Rebuild such
//! stores (delete the directory) rather than resume them.
//!
//! An empty store (nothing stored yet, or wiped for a rebuild) takes the bulk path of DESIGN.md
//! step 5, chosen by profile: chunks of
//! [`bulk_chunk_records`](crate::ChangelogConfig::bulk_chunk_records) records are sorted (newest record of
//! each key wins) and ingested as SST files, then the chunk's position is written. A profile of the
//! batched path spent over 40% of its time in the memtable's skiplist inserts, which ingestion
//! skips. Data may briefly be ahead of its stored position (ingestion and the metadata write are
//! two steps); a replay from the older position converges on the same state.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate_core::{BoxError, KeyValueStore};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;

use crate::config::ChangelogConfig;
use crate::error::ChangelogError;
use crate::key_prefix::key_prefix;
use crate::position::ChangelogPosition;

/// The restore consumer's fetch settings, measured on 1,000,000-record restores (BENCHMARKS.md).
/// Once the local queue is full, librdkafka postpones the next fetch by `fetch.queue.backoff.ms`
/// (1 s by default); a restore drains the queue far sooner and then sat idle, losing most of a
/// second per million records. 2 MiB fetches with the default queue (100,000 messages) beat
/// 16 MiB with 200,000 by about 18%: less memory to fault in per response. Public so that a
/// baseline consumer (the rows-per-second example's) reads with exactly these.
pub const RESTORE_FETCH_SETTINGS: &[(&str, &str)] = &[
    ("fetch.queue.backoff.ms", "10"),
    ("max.partition.fetch.bytes", "2097152"),
];

/// Checks a replayed record before it is applied, e.g. that the typed layer can decode it.
/// A rejected record fails the restore with an error naming topic, partition and offset.
pub type RecordCheck = Arc<dyn Fn(&[u8], &[u8]) -> Result<(), BoxError> + Send + Sync>;

/// Where and how far a restore goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreStart {
    /// The changelog topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The first offset read.
    pub start_offset: i64,
    /// The high watermark captured at the start: the restore ends there.
    pub end_offset: i64,
    /// Why the store was wiped and rebuilt from the beginning, if it was.
    pub rebuild_reason: Option<String>,
}

/// One batch written to RocksDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRestored {
    /// The changelog topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The offset of the batch's last record, stored with it.
    pub last_offset: i64,
    /// Records in this batch.
    pub records: usize,
    /// Records so far.
    pub total_records: u64,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// Where it started and ended.
    pub start: RestoreStart,
    /// Records applied.
    pub records: u64,
    /// Batches written.
    pub batches: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl RestoreReport {
    /// Records per second.
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Hears about restores. Every method has an empty default.
pub trait RestoreListener: Send + Sync {
    /// Before the first record.
    fn on_restore_start(&self, _start: &RestoreStart) {}
    /// After each batch is written, in changelog order, from the restore's writer thread (the
    /// other two methods are called from the thread that opens the store).
    fn on_batch_restored(&self, _batch: &BatchRestored) {}
    /// After the last batch.
    fn on_restore_end(&self, _report: &RestoreReport) {}
}

/// Opens the store at `path` and brings it up to the changelog's current end.
pub(crate) fn restore(
    path: &Path,
    options: &RocksDbOptions,
    config: &ChangelogConfig,
    listener: Option<&dyn RestoreListener>,
    check: Option<&RecordCheck>,
) -> Result<(RocksDbStore, RestoreReport), ChangelogError> {
    let (topic, partition) = (config.topic.as_str(), config.partition);
    let span = tracing::info_span!("restore", topic, partition);
    let _entered = span.enter();
    let started = Instant::now();
    let kafka = |operation, source| ChangelogError::Kafka {
        topic: topic.to_string(),
        partition,
        operation,
        source,
    };

    let mut store = RocksDbStore::open(path, options)?;
    let position = ChangelogPosition::read(&store)?;

    let mut client = config.client_config();
    for (key, value) in RESTORE_FETCH_SETTINGS {
        client.set(*key, *value);
    }
    let consumer: BaseConsumer = client
        .set("group.id", "kstate-restore")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // If the log start moves past the position while restoring, fail instead of skipping
        // records silently; the next open then sees the truncation and rebuilds.
        .set("auto.offset.reset", "error")
        .create()
        .map_err(|e| kafka("create restore consumer", e))?;
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, config.open_timeout)
        .map_err(|source| ChangelogError::BrokerUnreachable {
            bootstrap_servers: config.bootstrap_servers.clone(),
            topic: topic.to_string(),
            timeout: config.open_timeout,
            source,
        })?;

    let rebuild_reason = match &position {
        Some(p) if p.topic != topic || p.partition != partition => Some(format!(
            "the store holds changelog {}/{}, not {topic}/{partition}",
            p.topic, p.partition
        )),
        Some(p) if p.offset >= high => Some(format!(
            "the stored offset {} is at or beyond the high watermark {high}: was the topic deleted and recreated?",
            p.offset
        )),
        Some(p) if p.offset + 1 < low => Some(format!(
            "the log starts at {low}, after the stored offset {} + 1: records were deleted before they were restored",
            p.offset
        )),
        Some(_) => None,
        None if store.all()?.next().is_some() => {
            Some("the store has data but no changelog position".into())
        }
        None => None,
    };
    // Empty at the start: nothing was stored, or the store is about to be wiped.
    let bulk = position.is_none() || rebuild_reason.is_some();
    let start_offset = match (&position, &rebuild_reason) {
        (Some(p), None) => p.offset + 1,
        _ => low,
    };
    if let Some(reason) = &rebuild_reason {
        tracing::warn!(%reason, path = %path.display(), "wiping the store and rebuilding it from the changelog");
        drop(store);
        std::fs::remove_dir_all(path).map_err(|source| ChangelogError::Wipe {
            path: path.to_path_buf(),
            source,
        })?;
        store = RocksDbStore::open(path, options)?;
    }
    let start = RestoreStart {
        topic: topic.to_string(),
        partition,
        start_offset,
        end_offset: high,
        rebuild_reason,
    };
    tracing::info!(start_offset, end_offset = high, low, "restore starting");
    if let Some(l) = listener {
        l.on_restore_start(&start);
    }

    let (mut records, mut batches) = (0u64, 0u64);
    if start_offset < high {
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, partition, Offset::Offset(start_offset))
            .map_err(|e| kafka("assign", e))?;
        consumer
            .assign(&assignment)
            .map_err(|e| kafka("assign", e))?;

        // An empty store takes the bulk path: chunks sorted and ingested as SST files, skipping
        // the memtable (whose skiplist inserts dominate a random-order restore).
        let chunk_records = if bulk {
            config.bulk_chunk_records
        } else {
            config.restore_batch_records
        };
        let writer = ChunkWriter {
            store: &store,
            topic,
            partition,
            high,
            bulk,
            listener,
            scratch: Vec::new(),
            records: 0,
            batches: 0,
        };
        let writer_span = span.clone();
        (records, batches) = std::thread::scope(|scope| {
            // Full chunks go to a writer thread, so that sorting and writing one chunk overlaps
            // reading the next (a profile of the single-threaded restore spent a quarter of its
            // time writing). A rendezvous channel: one chunk being written while the next is
            // filled; written chunks come back to be refilled without reallocating.
            let (to_writer, full_chunks) = std::sync::mpsc::sync_channel::<(Chunk, i64)>(0);
            let (to_reader, spare) = std::sync::mpsc::channel::<Chunk>();
            let writing = std::thread::Builder::new()
                .name("kstate-restore-writer".into())
                .spawn_scoped(scope, move || {
                    let _entered = writer_span.enter();
                    let mut writer = writer;
                    for (mut chunk, last_offset) in full_chunks {
                        writer.write(&mut chunk, last_offset)?;
                        let _ = to_reader.send(chunk);
                    }
                    Ok::<_, ChangelogError>((writer.records, writer.batches))
                })
                .map_err(|e| {
                    ChangelogError::Store(kstate_core::Error::backend(
                        path.display().to_string(),
                        "start restore writer thread",
                        e,
                    ))
                })?;
            // Reads until the end, handing full chunks to the writer. It owns the sending side:
            // dropping it (below, however it returned) ends the writer's loop. It borrows the
            // consumer, whose teardown is not part of the restore.
            let consumer = &consumer;
            let reader = move || -> Result<(), ChangelogError> {
                let mut batch = Chunk::default();
                let mut last_offset = start_offset - 1;
                let mut last_progress = Instant::now();
                let mut progress_offset = last_offset;
                loop {
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(message)) => {
                            let offset = message.offset();
                            let bad = |problem: String, source: Option<BoxError>| {
                                ChangelogError::BadRecord {
                                    topic: topic.to_string(),
                                    partition,
                                    offset,
                                    problem,
                                    source,
                                }
                            };
                            let key = message
                                .key()
                                .ok_or_else(|| bad("the record has no key".into(), None))?;
                            let value = message.payload();
                            if let (Some(check), Some(value)) = (check, value) {
                                check(key, value).map_err(|e| {
                                    bad("the record does not decode".into(), Some(e))
                                })?;
                            }
                            batch.push(key, value);
                            last_offset = offset;
                            if batch.records.len() >= chunk_records {
                                // Send, then take the chunk the writer returned before it took
                                // this one: never more than two chunks.
                                if to_writer
                                    .send((std::mem::take(&mut batch), last_offset))
                                    .is_err()
                                {
                                    break; // the writer failed: its error is returned below
                                }
                                batch = spare.try_recv().unwrap_or_default();
                            }
                            if offset + 1 >= high {
                                break;
                            }
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) | None => {
                            // Markers and compacted-away offsets leave gaps: the position, not the last
                            // record, says whether the end is reached.
                            let position = consumer_position(consumer, topic, partition);
                            if position.is_some_and(|p| p >= high) {
                                break;
                            }
                            let progress = position.unwrap_or(last_offset).max(last_offset);
                            if progress != progress_offset {
                                // Read the clock only when idle, never per record.
                                (progress_offset, last_progress) = (progress, Instant::now());
                            } else if last_progress.elapsed() > config.open_timeout {
                                return Err(kafka(
                                    "restore (no progress within the open timeout)",
                                    KafkaError::MessageConsumption(
                                        rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                                    ),
                                ));
                            }
                        }
                        Some(Err(e @ KafkaError::MessageConsumption(code)))
                            if code == rdkafka::types::RDKafkaErrorCode::OffsetOutOfRange
                                || code == rdkafka::types::RDKafkaErrorCode::AutoOffsetReset =>
                        {
                            return Err(kafka(
                                "restore read (the log moved past the restore position)",
                                e,
                            ));
                        }
                        Some(Err(e)) => {
                            // Transient client errors (a broker restarting, a connection dropped) are
                            // retried by librdkafka; the stall timeout above ends a restore that stops
                            // making progress.
                            tracing::warn!(error = %e, "restore read error; retrying");
                        }
                    }
                }
                // The last chunk; a failed send means the writer stopped on an error.
                let _ = to_writer.send((batch, last_offset));
                Ok(())
            };
            let read = reader();
            drop(reader);
            // Always joined, so that a writer that failed or panicked is reported here.
            let written = writing.join().map_err(|_| {
                ChangelogError::Store(kstate_core::Error::backend(
                    path.display().to_string(),
                    "restore writer thread",
                    std::io::Error::other("panicked"),
                ))
            })?;
            match (read, written) {
                (Err(read), Err(write)) => {
                    tracing::warn!(error = %write, "the restore writer failed as well");
                    Err(read)
                }
                (Err(read), Ok(_)) => Err(read),
                (Ok(()), written) => written,
            }
        })?;
    }
    let report = RestoreReport {
        start,
        records,
        batches,
        elapsed: started.elapsed(),
    };
    tracing::info!(
        records,
        batches,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "restore done"
    );
    metrics::histogram!("kstate_restore_seconds").record(report.elapsed.as_secs_f64());
    metrics::gauge!("kstate_restore_rate", "topic" => topic.to_string())
        .set(report.records_per_sec());
    if let Some(l) = listener {
        l.on_restore_end(&report);
    }
    Ok((store, report))
}

/// Writes restored chunks to RocksDB, each with the offset of its last record, and reports them.
struct ChunkWriter<'a> {
    store: &'a RocksDbStore,
    topic: &'a str,
    partition: i32,
    high: i64,
    /// Ingest sorted SST files (an empty store) instead of write batches in changelog order.
    bulk: bool,
    listener: Option<&'a dyn RestoreListener>,
    /// The buffer bulk chunks are sorted into.
    scratch: Vec<u8>,
    records: u64,
    batches: u64,
}

impl ChunkWriter<'_> {
    fn write(&mut self, chunk: &mut Chunk, last_offset: i64) -> Result<(), ChangelogError> {
        if chunk.records.is_empty() {
            return Ok(());
        }
        let n = chunk.records.len();
        let position = ChangelogPosition {
            topic: self.topic.to_string(),
            partition: self.partition,
            offset: last_offset,
        }
        .encode();
        let meta: Vec<(&[u8], Option<&[u8]>)> = position
            .iter()
            .map(|(k, v)| (*k, Some(v.as_slice())))
            .collect();
        if self.bulk {
            // Sorted, newest record of each key only, as one SST file; then the position.
            self.store
                .ingest_sorted(chunk.sorted_last_wins(&mut self.scratch))?;
            self.store.write_with_metadata(std::iter::empty(), &meta)?;
            // The SST is durable at once, the position only once flushed: flush it now, so a
            // crash later resumes here instead of finding data without a position (which would
            // force a full rebuild).
            self.store.flush()?;
        } else {
            // In changelog order, atomically with the position.
            self.store.write_with_metadata(chunk.in_order(), &meta)?;
        }
        chunk.clear();
        self.records += n as u64;
        self.batches += 1;
        metrics::counter!("kstate_restore_records_total", "topic" => self.topic.to_string())
            .increment(n as u64);
        metrics::gauge!("kstate_restore_lag", "topic" => self.topic.to_string())
            .set((self.high - 1 - last_offset) as f64);
        if let Some(l) = self.listener {
            l.on_batch_restored(&BatchRestored {
                topic: self.topic.to_string(),
                partition: self.partition,
                last_offset,
                records: n,
                total_records: self.records,
            });
        }
        Ok(())
    }
}

/// The consumer's next offset in the partition, once it has one.
fn consumer_position(consumer: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Records read but not yet written: every key and value in one buffer, records as offsets into
/// it, so a chunk of 250,000 records is two allocations instead of half a million (the allocator
/// showed up in the profile).
#[derive(Default)]
struct Chunk {
    bytes: Vec<u8>,
    records: Vec<ChunkRecord>,
}

#[derive(Clone, Copy)]
struct ChunkRecord {
    /// [`key_prefix`] of the key: the sort compares these first.
    prefix: u64,
    start: usize,
    key_len: u32,
    /// `None` for a tombstone.
    value_len: Option<u32>,
}

impl Chunk {
    fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        if let Some(value) = value {
            self.bytes.extend_from_slice(value);
        }
        self.records.push(ChunkRecord {
            prefix: key_prefix(key),
            start,
            key_len: key.len() as u32,
            value_len: value.map(|v| v.len() as u32),
        });
    }

    fn key(&self, r: &ChunkRecord) -> &[u8] {
        &self.bytes[r.start..r.start + r.key_len as usize]
    }

    /// The records in the order they were read (the changelog's).
    fn in_order(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.records.iter().map(|r| (self.key(r), self.value(r)))
    }

    fn value(&self, r: &ChunkRecord) -> Option<&[u8]> {
        let at = r.start + r.key_len as usize;
        r.value_len.map(|len| &self.bytes[at..at + len as usize])
    }

    /// The records sorted by key, keeping only the last (newest) record of each key. They are
    /// gathered into `scratch`, which then holds this chunk's old buffer (the buffers swap, so
    /// one scratch buffer serves every chunk).
    fn sorted_last_wins(
        &mut self,
        scratch: &mut Vec<u8>,
    ) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let mut order = std::mem::take(&mut self.records);
        order.reverse(); // newest first, so the stable sort keeps the newest first among equals
        order.sort_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| self.key(a).cmp(self.key(b)))
        });
        order.dedup_by(|later, kept| {
            later.prefix == kept.prefix && self.key(later) == self.key(kept)
        });
        // Gather the records into key order: a loop of independent copies, whose cache misses
        // the CPU overlaps, so that the SST writer then reads memory in sequence. Read in place,
        // each record cost a cache miss of its own (a third of the writer thread's time).
        let mut sorted = std::mem::take(scratch);
        sorted.clear();
        sorted.reserve(self.bytes.len());
        for r in &mut order {
            let len = r.key_len as usize + r.value_len.map_or(0, |v| v as usize);
            let start = sorted.len();
            sorted.extend_from_slice(&self.bytes[r.start..r.start + len]);
            r.start = start;
        }
        *scratch = std::mem::replace(&mut self.bytes, sorted);
        self.records = order;
        self.records.iter().map(|r| (self.key(r), self.value(r)))
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.records.clear();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::Just;

    use super::*;

    #[test]
    fn a_bulk_chunk_keeps_the_newest_record_of_each_key() {
        let mut chunk = Chunk::default();
        for (k, v) in [
            (&b"b"[..], Some(&b"1"[..])),
            (b"a", Some(b"2")),
            (b"b", None),
            (b"c", Some(b"3")),
            (b"a", Some(b"4")),
        ] {
            chunk.push(k, v);
        }
        let sorted: Vec<(&[u8], Option<&[u8]>)> = chunk.sorted_last_wins(&mut Vec::new()).collect();
        assert_eq!(
            sorted,
            vec![
                (&b"a"[..], Some(&b"4"[..])),
                (&b"b"[..], None),
                (&b"c"[..], Some(&b"3"[..]))
            ]
        );
    }

    proptest::proptest! {
        /// Against a model: the newest record of each key, in key order. Keys of 0 to 12 bytes
        /// from a 3-letter alphabet with zero bytes, so prefixes tie, pad and differ.
        #[test]
        fn a_bulk_chunk_matches_a_newest_wins_map(
            records in proptest::collection::vec(
                (
                    proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1), Just(255)], 0..12),
                    proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..4)),
                ),
                0..200,
            )
        ) {
            let mut model = std::collections::BTreeMap::new();
            for (key, value) in &records {
                model.insert(key.as_slice(), value.as_deref());
            }
            let expected: Vec<(&[u8], Option<&[u8]>)> = model.into_iter().collect();
            // Twice through one chunk and one scratch buffer, as the writer reuses them.
            let (mut chunk, mut scratch) = (Chunk::default(), Vec::new());
            for _ in 0..2 {
                chunk.clear();
                for (key, value) in &records {
                    chunk.push(key, value.as_deref());
                }
                let sorted: Vec<(&[u8], Option<&[u8]>)> =
                    chunk.sorted_last_wins(&mut scratch).collect();
                proptest::prop_assert_eq!(&sorted, &expected);
            }
        }
    }
}
