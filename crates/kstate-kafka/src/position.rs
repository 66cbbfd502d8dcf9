//! The changelog position stored inside RocksDB (invariant 3, DESIGN.md).
//!
//! The offset RocksDB's contents correspond to lives in the metadata column family and is written
//! in the same atomic `WriteBatch` as the data it describes; with atomic flush, whatever prefix
//! of writes survives a crash carries its own position. There is no checkpoint file to fsync or
//! tear (Kafka Streams' `.checkpoint`, Samza's `OFFSET` file).

use kstate_core::KeyValueStore;
use kstate_rocksdb::RocksDbStore;

use crate::error::ChangelogError;

const VERSION_KEY: &[u8] = b"kstate.format.version";
const TOPIC_KEY: &[u8] = b"kstate.changelog.topic";
const PARTITION_KEY: &[u8] = b"kstate.changelog.partition";
const OFFSET_KEY: &[u8] = b"kstate.changelog.offset";

/// The metadata format this crate writes.
pub const FORMAT_VERSION: u32 = 1;

/// Which changelog record the store's contents end at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogPosition {
    /// The changelog topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The offset of the last record the store holds.
    pub offset: i64,
}

impl ChangelogPosition {
    /// The metadata records to write with the data.
    pub(crate) fn encode(&self) -> [(&'static [u8], Vec<u8>); 4] {
        [
            (VERSION_KEY, FORMAT_VERSION.to_be_bytes().to_vec()),
            (TOPIC_KEY, self.topic.as_bytes().to_vec()),
            (PARTITION_KEY, self.partition.to_be_bytes().to_vec()),
            (OFFSET_KEY, self.offset.to_be_bytes().to_vec()),
        ]
    }

    /// The position stored in `store`, if any.
    pub(crate) fn read(store: &RocksDbStore) -> Result<Option<Self>, ChangelogError> {
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
        }))
    }
}
