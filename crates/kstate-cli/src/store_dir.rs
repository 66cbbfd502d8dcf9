//! Opening a store for the operator. A path names either a directory holding one store (the
//! layout kstate wrote first), or `<task directory>/<store>`: a store of a task's RocksDB, at
//! the path where the older layout kept it. The tool never creates a RocksDB where the user
//! mistyped a path, and RocksDB's own lock refuses a directory a running application holds.

use std::path::Path;

use anyhow::{Context, Result, bail};
use kstate_kafka::{ChangelogPosition, StoreLocation};
use kstate_rocksdb::{Layout, OpenError, RocksDbOptions, RocksDbStore, TaskDb};

/// The task directory and store name `dir` names, when `dir` is `<task directory>/<store>`.
fn in_task(dir: &Path) -> Option<(&Path, &str)> {
    let task = dir.parent()?;
    let name = dir.file_name()?.to_str()?;
    (task.join("CURRENT").is_file() && !dir.exists()).then_some((task, name))
}

/// Opens the existing store at `dir`.
pub(crate) fn open_existing(dir: &Path) -> Result<RocksDbStore> {
    if let Some((task, name)) = in_task(dir) {
        let db = TaskDb::open_existing(task, &RocksDbOptions::default())
            .with_context(|| format!("opening the task's RocksDB at {}", task.display()))?;
        return Ok(db.store(name)?);
    }
    if !dir.join("CURRENT").is_file() {
        bail!(
            "{} is not a store directory (no RocksDB CURRENT file there), nor a store of a task's \
             RocksDB (none in its parent directory)",
            dir.display()
        );
    }
    match RocksDbStore::open(dir, &RocksDbOptions::default()) {
        Err(OpenError::WrongLayout {
            found: Layout::Task,
            ..
        }) => {
            let stores = TaskDb::open_existing(dir, &RocksDbOptions::default())
                .map(|db| db.stores())
                .unwrap_or_default();
            bail!(
                "{} holds the stores of a task ({}): name one as {}/<store>",
                dir.display(),
                stores.join(", "),
                dir.display()
            )
        }
        result => result.with_context(|| format!("opening the store at {}", dir.display())),
    }
}

/// Where the store at `dir` is, for commands that may create it (`restore`, `reseed`): in its
/// task's RocksDB when `dir` is `<task directory>/<store>`, else a directory of its own.
pub(crate) fn location(dir: &Path) -> Result<StoreLocation> {
    match in_task(dir) {
        Some((task, name)) => {
            let db = TaskDb::open(task, &[name], &RocksDbOptions::default())
                .with_context(|| format!("opening the task's RocksDB at {}", task.display()))?;
            Ok(StoreLocation::InTask {
                db,
                name: name.to_string(),
            })
        }
        None => Ok(StoreLocation::Directory(dir.to_path_buf())),
    }
}

/// The changelog position stored in `store`, or an error naming `dir` if there is none.
pub(crate) fn position(store: &RocksDbStore, dir: &Path) -> Result<ChangelogPosition> {
    ChangelogPosition::read(store)
        .with_context(|| format!("reading the changelog position of {}", dir.display()))?
        .with_context(|| {
            format!(
                "{} holds no changelog position: not a kstate logged store, or never committed",
                dir.display()
            )
        })
}

/// The bytes the store at `dir` takes on disk: every file of its directory, or, for a store of
/// a task's RocksDB, its SST files (RocksDB's `rocksdb.total-sst-files-size`).
pub(crate) fn disk_bytes(store: &RocksDbStore, dir: &Path) -> Result<u64> {
    if dir.is_dir() {
        return directory_bytes(dir);
    }
    let size = store.property("rocksdb.total-sst-files-size")?;
    Ok(size.and_then(|s| s.trim().parse().ok()).unwrap_or(0))
}

/// The bytes of every file under `dir`.
fn directory_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            directory_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
