//! [`TaskDb`]: one RocksDB for all the stores of a stream task, each store a column family.
//!
//! # Why one RocksDB per task
//! Kafka Streams opens a RocksDB per store per task; with hundreds of tasks a process holds
//! thousands of them, each with its own `LOCK`, `MANIFEST`, log file, directory handle, open
//! SST files and memtables (facebook/rocksdb#10700, #10588). Here a task's stores share one:
//! measured with 1,000 tasks of 3 stores, see BENCHMARKS.md ("Many tasks per process").
//!
//! # One consistent point
//! Writes skip the WAL, so what survives a crash is what was flushed. RocksDB's atomic flush
//! (on for every kstate RocksDB) flushes every column family together, and
//! [`flush`](kstate_core::KeyValueStore::flush) of any store flushes them all: after a crash the
//! task's stores and their changelog positions come back at one point of the task's write
//! order, never one store ahead of the others.
//!
//! # Or a part of a RocksDB many tasks share
//! [`SharedDb::task`](crate::SharedDb::task) hands out a `TaskDb` too: the same stores, their
//! keys under the task's prefix in a RocksDB the process opens once (what the task runtime
//! uses). The flush covers every task of that RocksDB, so the consistency above holds for each.
//!
//! # Column families are fixed at open
//! The stores are named when the RocksDB opens ([`TaskDb::open`]); column families it already
//! holds (a store no longer declared) are opened too and left alone. Rebuilding one store wipes
//! its column family ([`RocksDbStore::clear`]), not the directory the others share.

use std::path::Path;
use std::sync::Arc;

use std::path::PathBuf;

use crate::db::{Db, OpenMode, store_cf};
use crate::error::OpenError;
use crate::layout::Layout;
use crate::options::RocksDbOptions;
use crate::part::Part;
use crate::part::Prefixes;
use crate::store::RocksDbStore;

/// The RocksDB of one task, or its part of a RocksDB many tasks share: its stores as column
/// families. Cloning shares it; the directory's lock (the task's lease, in a shared RocksDB) is
/// released when the last clone and the last store handle are dropped.
#[derive(Clone)]
pub struct TaskDb {
    db: Arc<Db>,
    /// The task's directory: the RocksDB's own, or where the task's stores are named in a
    /// shared one (and where older layouts kept them).
    path: PathBuf,
    /// In a shared RocksDB: the task's key prefix, its metadata prefix, and its lease.
    part: Option<Part>,
}

impl std::fmt::Debug for TaskDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskDb")
            .field("path", &self.path)
            .field("rocksdb", &self.db.path)
            .field("stores", &self.stores())
            .finish()
    }
}

/// Why `name` cannot name a store (it becomes part of a column family name and a metadata
/// prefix ending in `/`).
fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.contains(['/', '\0']) {
        Some("contains '/' or NUL")
    } else {
        None
    }
}

/// The column families of `stores`, or why one of them cannot name a store of the RocksDB at
/// `path`.
pub(crate) fn store_families(path: &Path, stores: &[&str]) -> Result<Vec<String>, OpenError> {
    stores
        .iter()
        .map(|name| match name_problem(name) {
            Some(problem) => Err(OpenError::Layout {
                path: path.to_path_buf(),
                message: format!("store name {name:?} {problem}"),
            }),
            None => Ok(store_cf(name)),
        })
        .collect()
}

impl TaskDb {
    /// Opens (creating if needed) the task RocksDB in directory `path` with a column family for
    /// each of `stores`.
    ///
    /// Fails with a typed [`OpenError`] naming the path, as [`RocksDbStore::open`] does; a
    /// directory holding a single store (the layout kstate wrote first) is
    /// [`OpenError::WrongLayout`].
    pub fn open(
        path: impl AsRef<Path>,
        stores: &[&str],
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let families = store_families(path, stores)?;
        let db = Db::open(path, options, Layout::Task, &families, OpenMode::Create)?;
        Ok(Self::own(db))
    }

    fn own(db: Db) -> Self {
        TaskDb {
            path: db.path.clone(),
            db: Arc::new(db),
            part: None,
        }
    }

    /// Task `path`'s part of the shared RocksDB `db`.
    pub(crate) fn part(db: Arc<Db>, path: PathBuf, part: Part) -> Self {
        TaskDb {
            db,
            path,
            part: Some(part),
        }
    }

    /// Opens the task RocksDB that already exists at `path` with the stores it holds (for
    /// operators' tools: a mistyped path is [`OpenError::NotFound`], never a new RocksDB).
    pub fn open_existing(
        path: impl AsRef<Path>,
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        Self::open_in(path.as_ref(), options, OpenMode::Existing)
    }

    /// The task RocksDB that exists at `path`, opened as `mode` says.
    pub(crate) fn open_in(
        path: &Path,
        options: &RocksDbOptions,
        mode: OpenMode,
    ) -> Result<Self, OpenError> {
        let db = Db::open(path, options, Layout::Task, &[], mode)?;
        Ok(Self::own(db))
    }

    /// The task's directory: its RocksDB's, or, in a shared RocksDB, the one given to
    /// [`SharedDb::task`](crate::SharedDb::task) (where the older layouts kept the task).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of the RocksDB the task's stores are in.
    pub fn rocksdb_path(&self) -> &Path {
        &self.db.path
    }

    /// Whether the task's stores are part of a RocksDB other tasks share.
    pub fn is_shared(&self) -> bool {
        self.part.is_some()
    }

    /// The stores it holds, by name, in name order.
    pub fn stores(&self) -> Vec<String> {
        self.db.store_names()
    }

    /// A handle on store `name`, which must have been named at [`open`](Self::open) (or be held
    /// already). Errors name the store as `<directory>/<name>`.
    pub fn store(&self, name: &str) -> Result<RocksDbStore, OpenError> {
        let cf = store_cf(name);
        if !self.db.families.contains(&cf) {
            return Err(OpenError::NoSuchStore {
                path: self.path.clone(),
                store: name.to_string(),
                held: self.stores(),
            });
        }
        let display = self.path.join(name).display().to_string();
        let mut prefixes = Prefixes::default();
        if let Some(part) = &self.part {
            prefixes.keys = part.keys.clone();
            prefixes.metadata = part.metadata.clone();
            prefixes.lease = Some(part.lease.clone());
        }
        prefixes
            .metadata
            .extend_from_slice(format!("{cf}/").as_bytes());
        Ok(RocksDbStore::on(self.db.clone(), cf, prefixes, display))
    }
}
