//! Moving a store from the one-directory-per-store layout (`<task>/<store>/`, what kstate wrote
//! first) into its column family of the task's RocksDB (`<task>/`), the first time the task
//! opens with the new layout. Nothing is rebuilt from the changelog: the data, its position and
//! every other metadata record are copied as they are, so a store whose changelog is gone
//! (`LostChangelog::Reseed`) keeps its only copy.
//!
//! Crash safety, step by step:
//! 1. The column family is cleared (a copy a crash interrupted), then the old store's entries
//!    are ingested in key order as SST files.
//! 2. Its metadata records (the position among them) are written, and the task's RocksDB is
//!    flushed: only now does the column family hold a position.
//! 3. The old directory is wiped (renamed aside, then deleted).
//!
//! A crash before step 2 leaves a column family without metadata and the old directory intact:
//! the next open copies again. A crash after it leaves the old directory beside a column family
//! that holds metadata: the next open deletes the directory (it is never written again: kstate
//! opens it only here).

use std::path::Path;

use kstate_core::KeyValueStore;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

use crate::error::ChangelogError;
use crate::restore::wipe;

/// Bytes of entries ingested as one SST file.
const CHUNK_BYTES: usize = 64 << 20;

/// Moves the store the older layout left at `old` (if any) into `store`.
pub(crate) fn adopt(
    store: &RocksDbStore,
    old: &Path,
    options: &RocksDbOptions,
) -> Result<(), ChangelogError> {
    wipe::remove_leftover_copies(old);
    if !old.join("CURRENT").is_file() {
        return Ok(());
    }
    if !store.metadata_entries()?.is_empty() {
        tracing::warn!(path = %old.display(), "deleting a store directory already moved into its task's RocksDB");
        return wipe::wipe(old);
    }
    let source = RocksDbStore::open(old, options)?;
    store.clear()?;
    let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut bytes = 0;
    let mut entries = 0u64;
    let ingest = |chunk: &mut Vec<(Vec<u8>, Vec<u8>)>| {
        let result = store.ingest_sorted(
            chunk
                .iter()
                .map(|(k, v)| (k.as_slice(), Some(v.as_slice()))),
        );
        chunk.clear();
        result
    };
    for entry in source.all()? {
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
    let metadata = source.metadata_entries()?;
    let records: Vec<(&[u8], Option<&[u8]>)> = metadata
        .iter()
        .map(|(k, v)| (k.as_slice(), Some(v.as_slice())))
        .collect();
    store.write_with_metadata(std::iter::empty(), &records)?;
    store.flush()?;
    drop(source);
    wipe::wipe(old)?;
    tracing::info!(
        path = %old.display(),
        into = %store.path().display(),
        entries,
        "moved a store from its own directory into its task's RocksDB"
    );
    Ok(())
}
