//! Moving stores out of the layouts kstate wrote before, the first time a task opens with the
//! newer one. Nothing is rebuilt from the changelog: the data, its position and every other
//! metadata record are copied as they are, so a store whose changelog is gone
//! (`LostChangelog::Reseed`) keeps its only copy.
//! - [`adopt`]: a store of the one-directory-per-store layout (`<task>/<store>/`, the first)
//!   into its column family of the task's RocksDB.
//! - [`move_task_directory`]: a task's own RocksDB (`<task>/`, the second) into the task's part
//!   of the RocksDB all the tasks of a process share.
//!
//! Crash safety, step by step, for each store:
//! 1. The target is cleared (a copy a crash interrupted), then the old store's entries are
//!    ingested in key order as SST files.
//! 2. Its metadata records (the position among them) are written, and the target RocksDB is
//!    flushed: only now does the target hold a position.
//! 3. The old directory is wiped (renamed aside, then deleted).
//!
//! A crash before step 2 leaves a target without metadata and the old directory intact: the
//! next open copies again. A crash after it leaves the old directory beside a target that holds
//! metadata: the next open deletes the directory (it is never written again: kstate opens it
//! only here). A task directory that still holds a store the application no longer declares is
//! kept (with a warning), never deleted with that store in it.

use std::path::Path;

use kstate_core::KeyValueStore;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore, TaskDb};

use crate::error::ChangelogError;
use kstate_rocksdb::wipe;

/// Bytes of entries ingested as one SST file.
const CHUNK_BYTES: usize = 64 << 20;

/// Moves the store the oldest layout left at `old` (if any) into `store`.
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
        return Ok(wipe::wipe(old)?);
    }
    let source = RocksDbStore::open(old, options)?;
    let entries = copy(&source, store)?;
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

/// Moves the RocksDB of its own the task `into` had at its directory ([`TaskDb::path`]), if
/// any, into `into`, a part of a shared RocksDB. Stores of the oldest layout inside that
/// directory are adopted into it on the way.
pub fn move_task_directory(into: &TaskDb, options: &RocksDbOptions) -> Result<(), ChangelogError> {
    let old = into.path();
    if !into.is_shared() {
        return Ok(());
    }
    wipe::remove_leftover_copies(old);
    if !old.join("CURRENT").is_file() {
        return Ok(());
    }
    let source = TaskDb::open_existing(old, options)?;
    let declared = into.stores();
    let mut kept = Vec::new();
    let mut entries = 0;
    for name in source.stores() {
        if !declared.contains(&name) {
            kept.push(name);
            continue;
        }
        let from = source.store(&name)?;
        adopt(&from, &old.join(&name), options)?;
        let target = into.store(&name)?;
        if target.metadata_entries()?.is_empty() {
            entries += copy(&from, &target)?;
        }
    }
    drop(source);
    // Besides the undeclared stores of its own column families, the directory may hold what
    // the oldest layout left of a store the application stopped declaring back then
    // (`<task>/<store>/`, never adopted): a wipe refuses it, and it is not ours to delete.
    let foreign = wipe::foreign_entries(old)?;
    if !kept.is_empty() || !foreign.is_empty() {
        tracing::warn!(
            path = %old.display(),
            stores = ?kept,
            other = ?foreign,
            "kept a task's RocksDB directory: it holds stores the application no longer declares \
             (its other stores were moved into the shared RocksDB); delete it by hand when they \
             are not needed"
        );
        return Ok(());
    }
    wipe::wipe(old)?;
    tracing::info!(
        path = %old.display(),
        into = %into.rocksdb_path().display(),
        entries,
        "moved a task's RocksDB into the RocksDB the process's tasks share"
    );
    Ok(())
}

/// Replaces everything in `store` with `source`'s entries and metadata records, then flushes;
/// returns how many entries.
fn copy(source: &RocksDbStore, store: &RocksDbStore) -> Result<u64, ChangelogError> {
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
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kstate_rocksdb::SharedDb;

    #[test]
    fn a_task_directory_with_an_undeclared_oldest_layout_store_is_kept_not_fatal()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let options = RocksDbOptions::default();
        let task_dir = dir.path().join("0");
        // The second layout: a RocksDB of the task's own with store `a`.
        {
            let db = TaskDb::open(&task_dir, &["a"], &options)?;
            db.store("a")?.put(b"k", b"v")?;
            db.store("a")?.flush()?;
        }
        // Inside it, what the oldest layout left of a store no longer declared.
        {
            let gone = RocksDbStore::open(task_dir.join("gone"), &options)?;
            gone.put(b"old", b"entry")?;
            gone.close()?;
        }
        let shared = SharedDb::open(dir.path().join("rocksdb"), &["a"], &options)?;
        let task = shared.task(0, &task_dir)?;
        move_task_directory(&task, &options)?;
        assert_eq!(task.store("a")?.get(b"k")?.as_deref(), Some(&b"v"[..]));
        assert!(
            task_dir.join("gone").join("CURRENT").is_file(),
            "the undeclared store's directory was deleted"
        );
        // A second start does the same, without an error.
        move_task_directory(&task, &options)?;
        Ok(())
    }
}
