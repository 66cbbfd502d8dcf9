//! [`TaskDb`]: one RocksDB for all the stores of a stream task, each store a column family.
//!
//! # Why one RocksDB per task
//! Kafka Streams opens a RocksDB per store per task; with hundreds of tasks a process holds
//! thousands of them, each with its own `LOCK`, `MANIFEST`, log file, directory handle, open
//! SST files and memtables (facebook/rocksdb#10700, #10588). Here a task's stores share one:
//! measured with 1,000 tasks of 3 stores, see BENCHMARKS.md ("Many tasks in one process").
//!
//! # One consistent point
//! Writes skip the WAL, so what survives a crash is what was flushed. RocksDB's atomic flush
//! (on for every kstate RocksDB) flushes every column family together, and
//! [`flush`](kstate_core::KeyValueStore::flush) of any store flushes them all: after a crash the
//! task's stores and their changelog positions come back at one point of the task's write
//! order, never one store ahead of the others.
//!
//! # Column families are fixed at open
//! The stores are named when the RocksDB opens ([`TaskDb::open`]); column families it already
//! holds (a store no longer declared) are opened too and left alone. Rebuilding one store wipes
//! its column family ([`RocksDbStore::clear`]), not the directory the others share.

use std::path::Path;
use std::sync::Arc;

use crate::db::{Db, Layout, STORE_CF_PREFIX, store_cf};
use crate::error::OpenError;
use crate::options::RocksDbOptions;
use crate::store::RocksDbStore;

/// The RocksDB of one task: its stores as column families. Cloning shares it; the directory's
/// lock is released when the last clone and the last store handle are dropped.
#[derive(Clone)]
pub struct TaskDb {
    db: Arc<Db>,
}

impl std::fmt::Debug for TaskDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskDb")
            .field("path", &self.db.path)
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
        let mut families = Vec::with_capacity(stores.len());
        for name in stores {
            if let Some(problem) = name_problem(name) {
                return Err(OpenError::Layout {
                    path: path.to_path_buf(),
                    message: format!("store name {name:?} {problem}"),
                });
            }
            families.push(store_cf(name));
        }
        let db = Db::open(path, options, Layout::Task, &families, false)?;
        Ok(TaskDb { db: Arc::new(db) })
    }

    /// Opens the task RocksDB that already exists at `path` with the stores it holds (for
    /// operators' tools: a mistyped path is [`OpenError::NotFound`], never a new RocksDB).
    pub fn open_existing(
        path: impl AsRef<Path>,
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        let db = Db::open(path.as_ref(), options, Layout::Task, &[], true)?;
        Ok(TaskDb { db: Arc::new(db) })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.db.path
    }

    /// The stores it holds, by name, in name order.
    pub fn stores(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .db
            .families
            .iter()
            .filter_map(|f| f.strip_prefix(STORE_CF_PREFIX).map(str::to_string))
            .collect();
        names.sort();
        names
    }

    /// A handle on store `name`, which must have been named at [`open`](Self::open) (or be held
    /// already). Errors name the store as `<directory>/<name>`.
    pub fn store(&self, name: &str) -> Result<RocksDbStore, OpenError> {
        let cf = store_cf(name);
        if !self.db.families.contains(&cf) {
            return Err(OpenError::NoSuchStore {
                path: self.db.path.clone(),
                store: name.to_string(),
                held: self.stores(),
            });
        }
        let display = self.db.path.join(name).display().to_string();
        let prefix = format!("{cf}/").into_bytes();
        Ok(RocksDbStore::on(self.db.clone(), cf, prefix, display))
    }
}
