//! Moving what the older layouts left into today's, the first time a task opens: the runtime
//! and the operators' tools read the older layouts here and nowhere else.
//!
//! | layout | on disk, under `<state-dir>/<app-id>/` | reader |
//! |---|---|---|
//! | 1 | `<task>/<store>/`, a RocksDB per store | `migrate/v1_store_dir.rs` |
//! | 2 | `<task>/`, a RocksDB per task, a column family per store | `migrate/v2_task_dir.rs` |
//! | 3 | `rocksdb/`, one RocksDB per process, a key prefix per task | today's ([`StateDir`](crate::StateDir)) |
//!
//! The readers open an older directory without writing a record into it (`OpenMode::Legacy`)
//! and offer nothing but reads. For each store the task declares, the move takes the newest
//! copy: the shared RocksDB's own once it holds metadata (a position), else layout 2's column
//! family with metadata, else layout 1's directory, else layout 2's column family without
//! metadata (data only). Nothing is rebuilt from the changelog: entries and every metadata
//! record are copied as they are, so a store whose changelog is gone keeps its only copy.
//!
//! Crash safety, for each store: the target is cleared (a copy a crash interrupted), the
//! entries are ingested in key order, the metadata is written, and the RocksDB flushed: only
//! then does the target hold a position. The older directories are deleted after every store
//! is copied: a crash before leaves them beside targets that hold metadata, and the next open
//! only deletes them. A task directory that holds a store the task does not declare, or a file
//! RocksDB did not write, is kept with a warning: it is not ours to delete.

mod copy;
mod v1_store_dir;
mod v2_task_dir;

use std::path::Path;

use crate::error::OpenError;
use crate::layout::Layout;
use crate::options::RocksDbOptions;
use crate::store::RocksDbStore;
use crate::task_db::TaskDb;
use crate::wipe;

use copy::{Reader, copy};
use v1_store_dir::StoreDir;
pub(crate) use v2_task_dir::TaskDir;

/// The stores a task's RocksDB of layout 2 at `task_dir` holds, in name order (none when there
/// is no RocksDB there), read without writing anything into it: for messages that name them.
pub fn task_dir_stores(
    task_dir: &Path,
    options: &RocksDbOptions,
) -> Result<Vec<String>, OpenError> {
    Ok(TaskDir::open(task_dir, options)?
        .map(|dir| dir.stores())
        .unwrap_or_default())
}

/// Moves what the older layouts left at `task_dir` (a task's directory) for `stores` into
/// `target`, the task's part of the shared RocksDB, then deletes the older copies.
pub(crate) fn run(
    target: &TaskDb,
    task_dir: &Path,
    stores: &[&str],
    options: &RocksDbOptions,
) -> Result<(), OpenError> {
    wipe::remove_leftover_copies(task_dir);
    let v2 = TaskDir::open(task_dir, options)?;
    for &name in stores {
        wipe::remove_leftover_copies(&task_dir.join(name));
        let store = target.store(name)?;
        move_store(&store, v2.as_ref(), &task_dir.join(name), name, options)?;
    }
    // Every target holds its metadata now: the older copies go.
    for &name in stores {
        let dir = task_dir.join(name);
        if dir.join("CURRENT").is_file() {
            wipe::wipe(&dir)?;
        }
    }
    let undeclared = match &v2 {
        Some(v2) => v2.stores_besides(stores),
        None => Vec::new(),
    };
    drop(v2);
    retire_task_dir(task_dir, &undeclared)?;
    Ok(())
}

/// Copies the newest older copy of store `name` into `store`, unless `store` holds metadata.
fn move_store(
    store: &RocksDbStore,
    v2: Option<&TaskDir>,
    v1_dir: &Path,
    name: &str,
    options: &RocksDbOptions,
) -> Result<(), OpenError> {
    let failed = |path: &Path, from| {
        let path = path.to_path_buf();
        move |source| OpenError::Migrate { path, from, source }
    };
    let held = store
        .metadata_entries()
        .map_err(failed(v1_dir, Layout::Shared))?;
    if !held.is_empty() {
        return Ok(());
    }
    let in_v2 = match v2 {
        Some(v2) => v2.store(name),
        None => None,
    };
    let v2_positioned = match &in_v2 {
        Some(reader) => reader
            .has_metadata()
            .map_err(failed(v1_dir, Layout::Task))?,
        None => false,
    };
    let v1 = match v2_positioned {
        true => None,
        false => StoreDir::open(v1_dir, options)?,
    };
    let (reader, from): (&Reader, _) = match (&in_v2, &v1) {
        (_, Some(v1)) => (v1.reader(), Layout::Store),
        (Some(v2), None) => (v2, Layout::Task),
        (None, None) => return Ok(()),
    };
    let entries = copy(reader, store).map_err(failed(reader.path(), from))?;
    tracing::info!(
        from = %reader.path().display(),
        layout = %from,
        into = %store.path().display(),
        entries,
        "moved a store of an older layout into the shared RocksDB"
    );
    Ok(())
}

/// Deletes the task's directory once nothing in it is needed: kept (with a warning) while it
/// holds `undeclared` stores or anything RocksDB did not write; removed if it is empty.
fn retire_task_dir(task_dir: &Path, undeclared: &[String]) -> Result<(), OpenError> {
    if !task_dir.is_dir() {
        return Ok(());
    }
    if !task_dir.join("CURRENT").is_file() {
        // Only what layout 1 left, now moved: an empty directory goes, anything else stays.
        let _ = std::fs::remove_dir(task_dir);
        return Ok(());
    }
    let foreign = wipe::foreign_entries(task_dir)?;
    if !undeclared.is_empty() || !foreign.is_empty() {
        tracing::warn!(
            path = %task_dir.display(),
            stores = ?undeclared,
            other = ?foreign,
            "kept a task's RocksDB directory: it holds stores the application no longer declares \
             (its other stores were moved into the shared RocksDB); delete it by hand when they \
             are not needed"
        );
        return Ok(());
    }
    wipe::wipe(task_dir)
}
