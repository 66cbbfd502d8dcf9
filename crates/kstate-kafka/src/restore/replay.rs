//! Replaying changelog records into RocksDB: the reading and writing half of a restore.
//!
//! Reading and writing overlap: the thread that opens the store reads records into a chunk, and a
//! writer thread writes full chunks to RocksDB in order, each with the offset of its last record.
//! A chunk is full at a number of records or of bytes, whichever comes first, so memory stays
//! bounded whatever the value sizes (three chunks at most: one read, one written, one sort buffer).
//!
//! An empty store (nothing stored yet, or wiped for a rebuild) takes the bulk path of DESIGN.md
//! step 5, chosen by profile: chunks are sorted (newest record of each key wins) and ingested as
//! SST files, then the chunk's position is written. A profile of the batched path spent over 40%
//! of its time in the memtable's skiplist inserts, which ingestion skips. Before the first chunk
//! the store gets the position "just before the start", flushed: a crash between an ingest and
//! its position then resumes from an older position (a replay converges on the same state) and
//! is never mistaken for a directory holding data that no changelog describes.
//!
//! Done when the consumer's *position* reaches the end: offsets held by transaction markers or
//! compacted away never hold it up.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use kstate_core::{BoxError, ChangelogReplay, KeyValueStore, MutationSink};
use kstate_rocksdb::RocksDbStore;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};

use crate::config::ChangelogConfig;
use crate::error::ChangelogError;
use crate::key_prefix::key_prefix;
use crate::position::ChangelogPosition;
use crate::restore::consumer::RestoreConsumer;
use crate::restore::{BatchRestored, CancelToken, RecordCheck, RestoreListener};

/// One replay's inputs.
pub(crate) struct Replay<'a> {
    pub(crate) path: &'a Path,
    pub(crate) store: &'a RocksDbStore,
    /// The restore's `read_committed` consumer.
    pub(crate) consumer: &'a RestoreConsumer,
    pub(crate) config: &'a ChangelogConfig,
    pub(crate) start_offset: i64,
    /// The `written_at` of every position the replay stores.
    pub(crate) since: Option<SystemTime>,
    /// The end captured before the replay: it stops here.
    pub(crate) high: i64,
    /// The store is empty: take the bulk path.
    pub(crate) bulk: bool,
    pub(crate) listener: Option<&'a dyn RestoreListener>,
    pub(crate) check: Option<&'a RecordCheck>,
    pub(crate) span: &'a tracing::Span,
    /// Stops the replay with an error.
    pub(crate) cancel: Option<&'a CancelToken>,
}

/// Replays `start_offset..high`; returns the records and batches written.
pub(crate) fn replay(r: Replay<'_>) -> Result<(u64, u64), ChangelogError> {
    let Replay {
        path,
        store,
        consumer,
        config,
        start_offset,
        since,
        high,
        bulk,
        listener,
        check,
        span,
        cancel,
    } = r;
    let (topic, partition) = (config.topic.as_str(), config.partition);
    let kafka = |operation, source| ChangelogError::Kafka {
        topic: topic.to_string(),
        partition,
        operation,
        source,
    };
    if bulk {
        let before_start = ChangelogPosition {
            topic: topic.to_string(),
            partition,
            offset: start_offset - 1,
            written_at: since,
        };
        before_start.write_with(store, std::iter::empty())?;
        store.flush()?;
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(start_offset))
        .map_err(|e| kafka("assign", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| kafka("assign", e))?;

    // An empty store takes the bulk path: chunks sorted and ingested as SST files, skipping
    // the memtable (whose skiplist inserts dominate a random-order restore).
    let (chunk_records, chunk_bytes) = if bulk {
        (config.bulk_chunk_records, config.bulk_chunk_bytes)
    } else {
        (config.restore_batch_records, config.restore_batch_bytes)
    };
    let writer = ChunkWriter {
        store,
        topic,
        partition,
        high,
        bulk,
        since,
        listener,
        scratch: Vec::new(),
        records: 0,
        batches: 0,
    };
    let writer_span = span.clone();
    std::thread::scope(|scope| {
        // Full chunks go to a writer thread, so that sorting and writing one chunk overlaps
        // reading the next (a profile of the single-threaded restore spent a quarter of its
        // time writing). A rendezvous channel: one chunk being written while the next is
        // filled; written chunks come back to be refilled without reallocating.
        let (to_writer, full_chunks) = std::sync::mpsc::sync_channel::<(Chunk, ChunkEnd)>(0);
        let (to_reader, spare) = std::sync::mpsc::channel::<Chunk>();
        let writing = std::thread::Builder::new()
            .name("kstate-restore-writer".into())
            .spawn_scoped(scope, move || {
                let _entered = writer_span.enter();
                let mut writer = writer;
                for (mut chunk, end) in full_chunks {
                    writer.write(&mut chunk, end)?;
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
            // A store whose keys are not the changelog's maps each record (a window store).
            let mut replay = match &config.keys {
                Some(keys) => Some(keys.replay(store)?),
                None => None,
            };
            let mut batch = Chunk::default();
            // The last record read: a mapped store's chunk ends with the stream time sent with
            // it (one header parsed per chunk; see `ChangelogReplay::end_of_chunk`).
            let mut last_record = None;
            let mut last_offset = start_offset - 1;
            let mut last_progress = Instant::now();
            let mut progress_offset = last_offset;
            loop {
                if cancel.is_some_and(CancelToken::is_cancelled) {
                    return Err(ChangelogError::Cancelled {
                        topic: topic.to_string(),
                        partition,
                    });
                }
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(message)) => {
                        let offset = message.offset();
                        let bad =
                            |problem: String, source: Option<BoxError>| ChangelogError::BadRecord {
                                topic: topic.to_string(),
                                partition,
                                offset,
                                problem,
                                source,
                            };
                        let key = message
                            .key()
                            .ok_or_else(|| bad("the record has no key".into(), None))?;
                        let value = message.payload();
                        if let (Some(check), Some(value)) = (check, value) {
                            check(key, value)
                                .map_err(|e| bad("the record does not decode".into(), Some(e)))?;
                        }
                        batch.read += 1;
                        match replay.as_mut() {
                            None => batch.push(key, value),
                            Some(replay) => {
                                replay.record(key, value, &mut batch).map_err(|e| {
                                    bad("the record's key does not map".into(), Some(e))
                                })?;
                            }
                        }
                        last_offset = offset;
                        last_record = Some(message);
                        if batch.full(chunk_records, chunk_bytes) {
                            end_chunk(
                                &mut replay,
                                last_record.as_ref().and_then(sent_stream_time),
                                &mut batch,
                            );
                            // Send, then take the chunk the writer returned before it took
                            // this one: never more than two chunks.
                            if to_writer
                                .send((std::mem::take(&mut batch), ChunkEnd::at(last_offset)))
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
            end_chunk(
                &mut replay,
                last_record.as_ref().and_then(sent_stream_time),
                &mut batch,
            );
            let _ = to_writer.send((batch, ChunkEnd::at(last_offset)));
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
    })
}

/// The stream time kstate sent with a record (its [`TIME_HEADER`](crate::TIME_HEADER)); Kafka
/// Streams' records have none (their timestamp is the record's time, not the store's stream
/// time: the replay falls back to the record's window start or session end, as Kafka Streams).
pub(super) fn sent_stream_time(message: &BorrowedMessage<'_>) -> Option<i64> {
    use rdkafka::message::Headers;
    message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|h| h.key == crate::TIME_HEADER)
            .and_then(|h| h.value)
            .and_then(|v| <[u8; 8]>::try_from(v).ok())
            .map(i64::from_be_bytes)
    })
}

/// Appends the derived local keys of a mapped store to `batch`, which is about to be written;
/// `sent_time` is the stream time sent with the last record read into it.
pub(super) fn end_chunk(
    replay: &mut Option<Box<dyn ChangelogReplay>>,
    sent_time: Option<i64>,
    batch: &mut Chunk,
) {
    if let Some(replay) = replay {
        replay.end_of_chunk(sent_time, batch);
    }
}

/// How often a follower at the partition's end stores its position again with a fresh
/// `written_at`, when nothing else moved it.
pub(super) const WRITTEN_AT_REFRESH: Duration = Duration::from_secs(600);

/// How far before the read that found the partition's end a follower dates its position: the
/// fetch that found the end was served before the poll that reported it, by up to the
/// follower's fetch wait (`FOLLOW_FETCH_WAIT`, 500 ms) and the time the event queued. Against
/// a `delete.retention.ms` of hours, two seconds cost nothing.
pub(super) const WRITTEN_AT_MARGIN: Duration = Duration::from_secs(2);

/// Where a chunk ends: the offset its position stores, and a `written_at` newer than the
/// writer's (`None`: the writer's).
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkEnd {
    pub(super) offset: i64,
    pub(super) written_at: Option<SystemTime>,
}

impl ChunkEnd {
    /// The end at record `offset`, dated as the writer dates its positions.
    pub(super) fn at(offset: i64) -> Self {
        ChunkEnd {
            offset,
            written_at: None,
        }
    }
}

/// Writes restored chunks to RocksDB, each with the offset of its last record, and reports them.
pub(super) struct ChunkWriter<'a> {
    pub(super) store: &'a RocksDbStore,
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    pub(super) high: i64,
    /// Ingest sorted SST files (an empty store) instead of write batches in changelog order.
    pub(super) bulk: bool,
    /// The `written_at` of the positions it stores.
    pub(super) since: Option<SystemTime>,
    pub(super) listener: Option<&'a dyn RestoreListener>,
    /// The buffer bulk chunks are sorted into.
    pub(super) scratch: Vec<u8>,
    pub(super) records: u64,
    pub(super) batches: u64,
}

impl ChunkWriter<'_> {
    pub(super) fn write(&mut self, chunk: &mut Chunk, end: ChunkEnd) -> Result<(), ChangelogError> {
        if let Some(fresh) = end.written_at {
            // Every later position is at least as fresh: records after it came later still.
            self.since = Some(fresh);
        }
        let last_offset = end.offset;
        if chunk.read == 0 {
            if end.written_at.is_some() {
                // A follower at the end, with no record since: the position alone moves.
                ChangelogPosition {
                    topic: self.topic.to_string(),
                    partition: self.partition,
                    offset: last_offset,
                    written_at: self.since,
                }
                .write_with(self.store, std::iter::empty())?;
            }
            return Ok(());
        }
        let (n, bytes) = (chunk.read, chunk.bytes.len());
        let position = ChangelogPosition {
            topic: self.topic.to_string(),
            partition: self.partition,
            offset: last_offset,
            written_at: self.since,
        };
        if self.bulk {
            // Sorted, newest record of each key only, as one SST file; then the position.
            if !chunk.records.is_empty() {
                self.store
                    .ingest_sorted(chunk.sorted_last_wins(&mut self.scratch))?;
            }
            position.write_with(self.store, std::iter::empty())?;
            // The SST is durable at once, the position only once flushed: flush it now, so a
            // crash later resumes here instead of finding data without a position (which would
            // force a full rebuild).
            self.store.flush()?;
        } else {
            // In changelog order, atomically with the position.
            position.write_with(self.store, chunk.in_order())?;
        }
        chunk.clear();
        self.records += n;
        self.batches += 1;
        metrics::counter!("kstate_restore_records_total", "topic" => self.topic.to_string())
            .increment(n);
        metrics::gauge!("kstate_restore_lag", "topic" => self.topic.to_string())
            .set((self.high - 1 - last_offset).max(0) as f64);
        if let Some(l) = self.listener {
            l.on_batch_restored(&BatchRestored {
                topic: self.topic.to_string(),
                partition: self.partition,
                last_offset,
                records: n as usize,
                bytes,
                total_records: self.records,
            });
        }
        Ok(())
    }
}

/// The consumer's next offset in the partition, once it has one.
fn consumer_position(consumer: &RestoreConsumer, topic: &str, partition: i32) -> Option<i64> {
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
pub(super) struct Chunk {
    bytes: Vec<u8>,
    records: Vec<ChunkRecord>,
    /// Changelog records read into it: as many as `records` for a plain store; a mapped store
    /// writes some records as none (expired) and adds its derived keys at the chunk's end.
    pub(super) read: u64,
}

#[derive(Clone, Copy)]
struct ChunkRecord {
    /// Set by the sort: [`key_prefix`] of the key past the bytes every key of the chunk
    /// shares, which the sort compares first.
    prefix: u64,
    start: usize,
    key_len: u32,
    /// `None` for a tombstone.
    value_len: Option<u32>,
}

impl Chunk {
    /// Whether it holds `records` records or `bytes` bytes.
    pub(super) fn full(&self, records: usize, bytes: usize) -> bool {
        self.records.len() >= records || self.bytes.len() >= bytes
    }

    pub(super) fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        if let Some(value) = value {
            self.bytes.extend_from_slice(value);
        }
        self.records.push(ChunkRecord {
            prefix: 0,
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
        // The bytes every key starts with order nothing (a window store's keys share their
        // segment's prefix: compared as they were read, every comparison fell to `memcmp`).
        // The sort compares the 8 bytes after them first.
        let shared = self.shared_prefix_len(&order);
        for r in &mut order {
            r.prefix = key_prefix(&self.key(r)[shared..]);
        }
        order.reverse(); // newest first, so the stable sort keeps the newest first among equals
        order.sort_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| self.key(a)[shared..].cmp(&self.key(b)[shared..]))
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

    /// How many leading bytes all of `records`' keys share.
    fn shared_prefix_len(&self, records: &[ChunkRecord]) -> usize {
        let Some(first) = records.first().map(|r| self.key(r)) else {
            return 0;
        };
        records.iter().fold(first.len(), |shared, r| {
            let key = self.key(r);
            first[..shared]
                .iter()
                .zip(key)
                .position(|(a, b)| a != b)
                .unwrap_or(shared.min(key.len()))
        })
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.records.clear();
        self.read = 0;
    }
}

impl MutationSink for Chunk {
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.push(key, value);
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
