//! A store of an older layout, opened to be read ([`Reader`]: no write is reachable through
//! it), and the copy of everything it holds into a store of today's layout.

use std::path::Path;

use kstate_core::{EntryIter, KeyValueStore, Result};

use crate::store::RocksDbStore;

/// Bytes of entries ingested as one SST file.
const CHUNK_BYTES: usize = 64 << 20;

/// A store of an older layout, for reading only.
pub(crate) struct Reader(RocksDbStore);

impl Reader {
    pub(crate) fn new(store: RocksDbStore) -> Self {
        Reader(store)
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }

    fn entries(&self) -> Result<EntryIter<'_>> {
        self.0.all()
    }

    fn metadata(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.metadata_entries()
    }

    /// Whether it holds a metadata record (a changelog position).
    pub(crate) fn has_metadata(&self) -> Result<bool> {
        Ok(!self.metadata()?.is_empty())
    }
}

/// Replaces everything in `target` with `source`'s entries and metadata records, then flushes;
/// returns how many entries.
pub(crate) fn copy(source: &Reader, target: &RocksDbStore) -> Result<u64> {
    target.clear()?;
    let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut bytes = 0;
    let mut entries = 0u64;
    let ingest = |chunk: &mut Vec<(Vec<u8>, Vec<u8>)>| {
        let result = target.ingest_sorted(
            chunk
                .iter()
                .map(|(k, v)| (k.as_slice(), Some(v.as_slice()))),
        );
        chunk.clear();
        result
    };
    for entry in source.entries()? {
        let (key, value) = entry?;
        bytes += key.len() + value.len();
        entries += 1;
        chunk.push((key, value));
        if bytes >= CHUNK_BYTES {
            ingest(&mut chunk)?;
            bytes = 0;
        }
    }
    ingest(&mut chunk)?;
    let metadata = source.metadata()?;
    let records: Vec<(&[u8], Option<&[u8]>)> = metadata
        .iter()
        .map(|(k, v)| (k.as_slice(), Some(v.as_slice())))
        .collect();
    target.write_with_metadata(std::iter::empty(), &records)?;
    target.flush()?;
    Ok(entries)
}
