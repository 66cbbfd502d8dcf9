//! The changelog position stored inside RocksDB (invariant 3, DESIGN.md).
//!
//! The offset RocksDB's contents correspond to lives in the metadata column family and is written
//! in the same atomic `WriteBatch` as the data it describes; with atomic flush, whatever prefix
//! of writes survives a crash carries its own position. There is no checkpoint file to fsync or
//! tear (Kafka Streams' `.checkpoint`, Samza's `OFFSET` file).
//!
//! The position also carries a wall-clock time ([`ChangelogPosition::written_at`]). Restore
//! compares its age with the topic's `delete.retention.ms`: once a tombstone after the position
//! may have been compacted away, resuming could bring its key back, so the store is rebuilt
//! instead (invariant 4). Stores written before the time was kept have none and skip that check.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kstate_core::KeyValueStore;
use kstate_rocksdb::RocksDbStore;

use crate::error::ChangelogError;

const VERSION_KEY: &[u8] = b"kstate.format.version";
const TOPIC_KEY: &[u8] = b"kstate.changelog.topic";
const PARTITION_KEY: &[u8] = b"kstate.changelog.partition";
const OFFSET_KEY: &[u8] = b"kstate.changelog.offset";
const WRITTEN_AT_KEY: &[u8] = b"kstate.changelog.written_at_ms";
/// Present while a reseed (writing the local contents into the changelog) is under way.
const RESEEDING_KEY: &[u8] = b"kstate.changelog.reseeding";

/// The metadata format this crate writes.
pub const FORMAT_VERSION: u32 = 1;

/// Which changelog record the store's contents end at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogPosition {
    /// The changelog topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The last offset the store's contents cover (-1: none, the changelog starts at 0): its
    /// last record's, or the transaction marker after it (a commit under a transaction stores
    /// its commit marker; a restore stores the end it reached, markers included). Restore
    /// resumes at the next offset.
    pub offset: i64,
    /// A time from which on every tombstone after `offset` is still in the changelog for at least
    /// the topic's `delete.retention.ms`. A commit stores when it froze its overlay (every later
    /// record was written after it). A restore into an empty store stores when it started (every
    /// record it holds was still uncompacted then, so no tombstone of its keys had been cleaned
    /// yet); a restore onto a stale store keeps the older of that and the stale position's time,
    /// since it also holds what was applied back then. Restore rebuilds rather than resumes a
    /// position older than `delete.retention.ms`. `None` in stores written by kstate versions
    /// that did not keep it.
    pub written_at: Option<SystemTime>,
}

impl ChangelogPosition {
    /// The metadata records to write with the data.
    fn encode(&self) -> [(&'static [u8], Vec<u8>); 5] {
        let written_at_ms = self
            .written_at
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        [
            (VERSION_KEY, FORMAT_VERSION.to_be_bytes().to_vec()),
            (TOPIC_KEY, self.topic.as_bytes().to_vec()),
            (PARTITION_KEY, self.partition.to_be_bytes().to_vec()),
            (OFFSET_KEY, self.offset.to_be_bytes().to_vec()),
            (WRITTEN_AT_KEY, written_at_ms.to_be_bytes().to_vec()),
        ]
    }

    /// Writes `data` and this position to `store` in one atomic batch.
    pub(crate) fn write_with<'e>(
        &self,
        store: &RocksDbStore,
        data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
    ) -> kstate_core::Result<()> {
        self.write_after_drops(store, &[], data)
    }

    /// Drops `drops`, then writes `data` and this position, in one atomic batch
    /// ([`RocksDbStore::write_after_drops`]).
    pub(crate) fn write_after_drops<'e>(
        &self,
        store: &RocksDbStore,
        drops: &[kstate_core::KeyRange],
        data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
    ) -> kstate_core::Result<()> {
        let encoded = self.encode();
        let meta: Vec<(&[u8], Option<&[u8]>)> = encoded
            .iter()
            .map(|(k, v)| (*k, Some(v.as_slice())))
            .collect();
        store.write_after_drops(drops, data, &meta)
    }

    /// Writes this position and clears the reseed mark, in one atomic batch: the reseed that
    /// ends at this position is complete.
    pub(crate) fn write_finishing_reseed(&self, store: &RocksDbStore) -> kstate_core::Result<()> {
        let encoded = self.encode();
        let mut meta: Vec<(&[u8], Option<&[u8]>)> = encoded
            .iter()
            .map(|(k, v)| (*k, Some(v.as_slice())))
            .collect();
        meta.push((RESEEDING_KEY, None));
        store.write_with_metadata(std::iter::empty(), &meta)
    }

    /// How long ago `written_at` was, if known (zero if it lies in the future).
    pub fn age(&self) -> Option<Duration> {
        self.written_at
            .map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
    }

    /// The position stored in `store`, if any.
    pub fn read(store: &RocksDbStore) -> Result<Option<Self>, ChangelogError> {
        let bad = |what: &str| {
            ChangelogError::Store(kstate_core::Error::Decode {
                store: store.name().to_string(),
                what: "value",
                location: format!("metadata record {what}"),
                source: "wrong length or encoding".into(),
            })
        };
        let Some(offset) = store.metadata(OFFSET_KEY)? else {
            return Ok(None);
        };
        let version = store
            .metadata(VERSION_KEY)?
            .ok_or_else(|| bad("format.version"))?;
        let version = u32::from_be_bytes(version.try_into().map_err(|_| bad("format.version"))?);
        if version != FORMAT_VERSION {
            return Err(bad("format.version (written by a newer kstate?)"));
        }
        let topic = store
            .metadata(TOPIC_KEY)?
            .ok_or_else(|| bad("changelog.topic"))?;
        let partition = store
            .metadata(PARTITION_KEY)?
            .ok_or_else(|| bad("changelog.partition"))?;
        Ok(Some(ChangelogPosition {
            topic: String::from_utf8(topic).map_err(|_| bad("changelog.topic"))?,
            partition: i32::from_be_bytes(
                partition
                    .try_into()
                    .map_err(|_| bad("changelog.partition"))?,
            ),
            offset: i64::from_be_bytes(offset.try_into().map_err(|_| bad("changelog.offset"))?),
            written_at: match store.metadata(WRITTEN_AT_KEY)? {
                None => None,
                Some(ms) => {
                    let ms = u64::from_be_bytes(
                        ms.try_into().map_err(|_| bad("changelog.written_at_ms"))?,
                    );
                    (ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
                }
            },
        }))
    }
}

/// Marks `store` as being reseeded, durably (flushed), before the first record is sent: a crash
/// in the middle then finishes the reseed on the next open instead of mistaking the partial
/// changelog for one that lost records.
pub(crate) fn mark_reseeding(store: &RocksDbStore) -> kstate_core::Result<()> {
    store.write_with_metadata(std::iter::empty(), &[(RESEEDING_KEY, Some(&b"1"[..]))])?;
    store.flush()
}

/// Whether a reseed of `store` began and did not finish.
pub(crate) fn is_reseeding(store: &RocksDbStore) -> kstate_core::Result<bool> {
    Ok(store.metadata(RESEEDING_KEY)?.is_some())
}
