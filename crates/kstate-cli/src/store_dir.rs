//! Opening a store for the operator. A path names a directory holding one store (the layout
//! kstate wrote first), or `<task directory>/<store>`: a store of a task, at the path where the
//! older layout kept it. The task's stores are in the RocksDB the application's tasks share
//! (`<state-dir>/<app-id>/rocksdb`, beside the task directories `<state-dir>/<app-id>/<p>`), or
//! in a RocksDB of the task's own at the task directory (the layout before). Where both exist
//! (the application keeps a task's old RocksDB that holds a store it no longer declares, after
//! moving the others into the shared one), the tool takes the store from where the application
//! does: the shared RocksDB, once the store's position is there. The tool never creates a
//! RocksDB where the user mistyped a path, and RocksDB's own lock refuses a directory a running
//! application holds.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kstate_kafka::{ChangelogPosition, StoreLocation};
use kstate_rocksdb::{Layout, OpenError, RocksDbOptions, RocksDbStore, SharedDb, TaskDb};

/// The task directory and store name `dir` names, when `dir` is `<task directory>/<store>` and
/// the task directory is a RocksDB of its own.
fn in_task(dir: &Path) -> Option<(&Path, &str)> {
    let task = dir.parent()?;
    let name = dir.file_name()?.to_str()?;
    (task.join("CURRENT").is_file() && !dir.exists()).then_some((task, name))
}

/// A store of a task in the RocksDB its application's tasks share.
struct InShared<'a> {
    /// `<state-dir>/<app-id>/rocksdb`.
    rocksdb: PathBuf,
    task: u32,
    task_dir: &'a Path,
    name: &'a str,
}

impl InShared<'_> {
    fn task_db(&self, shared: &SharedDb) -> Result<TaskDb> {
        Ok(shared.task(self.task, self.task_dir)?)
    }
}

/// What `dir` names when it is `<state-dir>/<app-id>/<p>/<store>` and
/// `<state-dir>/<app-id>/rocksdb` is a RocksDB.
fn in_shared(dir: &Path) -> Option<InShared<'_>> {
    let task_dir = dir.parent()?;
    let name = dir.file_name()?.to_str()?;
    let task = task_dir.file_name()?.to_str()?.parse().ok()?;
    let rocksdb = task_dir.parent()?.join("rocksdb");
    (rocksdb.join("CURRENT").is_file() && !dir.exists()).then_some(InShared {
        rocksdb,
        task,
        task_dir,
        name,
    })
}

/// Opens the existing store at `dir`.
pub(crate) fn open_existing(dir: &Path) -> Result<RocksDbStore> {
    let old = in_task(dir);
    if let Some(at) = in_shared(dir) {
        let shared = SharedDb::open_existing(&at.rocksdb, &RocksDbOptions::default())
            .with_context(|| format!("opening the tasks' RocksDB at {}", at.rocksdb.display()))?;
        // The application's order (`StateDir::open_task`): the shared RocksDB once it
        // holds the store's position, else the task's own RocksDB not moved yet.
        match at.task_db(&shared).and_then(|db| Ok(db.store(at.name)?)) {
            Ok(store) if old.is_none() || !store.metadata_entries()?.is_empty() => {
                return Ok(store);
            }
            Err(e) if old.is_none() => return Err(e),
            Ok(_) | Err(_) => {}
        }
    }
    if let Some((task, name)) = old {
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
        Err(OpenError::WrongLayout {
            found: Layout::Shared,
            ..
        }) => {
            let app = dir.parent().unwrap_or(dir);
            bail!(
                "{} holds the stores of an application's tasks: name one as {}/<partition>/<store>",
                dir.display(),
                app.display()
            )
        }
        result => result.with_context(|| format!("opening the store at {}", dir.display())),
    }
}

/// Where the store at `dir` is, for commands that may create it (`restore`, `reseed`): in its
/// task's RocksDB when `dir` is `<task directory>/<store>` (the shared one when the application
/// has one: a store written there wins over the task's own RocksDB when the application next
/// opens the task), else a directory of its own.
pub(crate) fn location(dir: &Path) -> Result<StoreLocation> {
    if let Some(at) = in_shared(dir) {
        let shared = SharedDb::open(&at.rocksdb, &[at.name], &RocksDbOptions::default())
            .with_context(|| format!("opening the tasks' RocksDB at {}", at.rocksdb.display()))?;
        return Ok(StoreLocation::InTask {
            db: at.task_db(&shared)?,
            name: at.name.to_string(),
        });
    }
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
/// a task, its SST files ([`RocksDbStore::sst_bytes`]).
pub(crate) fn disk_bytes(store: &RocksDbStore, dir: &Path) -> Result<u64> {
    if dir.is_dir() {
        return directory_bytes(dir);
    }
    Ok(store.sst_bytes()?)
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
