//! [`TaskDb`]: a task's stores, its part of the RocksDB every task of a process shares
//! ([`SharedDb`](crate::SharedDb)): each store a column family, the task's keys under its
//! prefix. Handed out by [`StateDir::open_task`](crate::StateDir::open_task) alone, after what
//! older layouts left for the task has been moved in.
//!
//! # One consistent point
//! Writes skip the WAL, so what survives a crash is what was flushed. RocksDB's atomic flush
//! (on for every kstate RocksDB) flushes every column family together, and
//! [`flush`](kstate_core::KeyValueStore::flush) of any store flushes them all: after a crash the
//! task's stores and their changelog positions come back at one point of the task's write
//! order, never one store ahead of the others. The flush covers every task of the RocksDB, so
//! this holds for each.
//!
//! # Column families are fixed at open
//! The stores are named when the shared RocksDB opens; column families it already holds (a
//! store no longer declared) are opened too and left alone. Rebuilding one store of a task
//! deletes its key range of the column family ([`RocksDbStore::clear`]), never another task's
//! or another store's keys.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::db::{Db, store_cf};
use crate::error::OpenError;
use crate::part::{Part, Prefixes};
use crate::store::RocksDbStore;

/// A task's stores: its part of the RocksDB every task of the process shares. Cloning shares
/// it; the task's lease (and, with the last handle on the RocksDB, its directory's lock) is
/// released when the last clone and the last store handle are dropped.
#[derive(Clone)]
pub struct TaskDb {
    db: Arc<Db>,
    /// The task's directory: where its stores are named in messages (and where older layouts
    /// kept them).
    path: PathBuf,
    /// The task's key prefix, its metadata prefix, and its lease.
    part: Part,
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

impl TaskDb {
    /// Task `path`'s part of the shared RocksDB `db`.
    pub(crate) fn part(db: Arc<Db>, path: PathBuf, part: Part) -> Self {
        TaskDb { db, path, part }
    }

    /// The task's directory, `<state-dir>/<app-id>/<task>`: where its stores are named in
    /// messages, and where older layouts kept them.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of the RocksDB the task's stores are in.
    pub fn rocksdb_path(&self) -> &Path {
        &self.db.path
    }

    /// The stores it holds, by name, in name order (every task of the RocksDB has the same).
    pub fn stores(&self) -> Vec<String> {
        self.db.store_names()
    }

    /// A handle on store `name`, which must have been named when the shared RocksDB opened (or
    /// be held already). Errors name the store as `<directory>/<name>`.
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
        let mut metadata = self.part.metadata.clone();
        metadata.extend_from_slice(format!("{cf}/").as_bytes());
        let prefixes = Prefixes {
            keys: self.part.keys.clone(),
            metadata,
            lease: Some(self.part.lease.clone()),
        };
        Ok(RocksDbStore::on(self.db.clone(), cf, prefixes, display))
    }
}
