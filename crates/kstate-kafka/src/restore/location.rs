//! [`StoreLocation`]: where a store's RocksDB data lives, and the two steps that differ by it:
//! opening, and wiping for a rebuild (a directory of its own is renamed aside and deleted; a
//! store of a task's RocksDB, which its other stores share, is cleared). A task's stores come
//! from [`StateDir::open_task`](kstate_rocksdb::StateDir::open_task), which has moved in what
//! older layouts left for them.

use std::path::{Path, PathBuf};

use kstate_rocksdb::{RocksDbOptions, RocksDbStore, TaskDb};

use crate::error::ChangelogError;
use kstate_rocksdb::wipe;

/// Where a store lives.
#[derive(Debug, Clone)]
pub enum StoreLocation {
    /// A directory of its own (what [`LoggedStore::open`](crate::LoggedStore::open) takes).
    Directory(PathBuf),
    /// Store `name` of a task's RocksDB (what the task runtime uses).
    InTask {
        /// The task's RocksDB.
        db: TaskDb,
        /// The store's name.
        name: String,
    },
}

impl From<&Path> for StoreLocation {
    fn from(path: &Path) -> Self {
        StoreLocation::Directory(path.to_path_buf())
    }
}

impl From<PathBuf> for StoreLocation {
    fn from(path: PathBuf) -> Self {
        StoreLocation::Directory(path)
    }
}

impl From<&PathBuf> for StoreLocation {
    fn from(path: &PathBuf) -> Self {
        StoreLocation::Directory(path.clone())
    }
}

impl StoreLocation {
    /// The path that names the store in messages: its directory, or `<task directory>/<name>`
    /// (where the older layout kept it).
    pub fn path(&self) -> PathBuf {
        match self {
            StoreLocation::Directory(path) => path.clone(),
            StoreLocation::InTask { db, name } => db.path().join(name),
        }
    }

    /// Opens the store.
    pub(crate) fn open(&self, options: &RocksDbOptions) -> Result<RocksDbStore, ChangelogError> {
        match self {
            StoreLocation::Directory(path) => {
                let store = RocksDbStore::open(path, options)?;
                wipe::remove_leftover_copies(path);
                Ok(store)
            }
            StoreLocation::InTask { db, name } => Ok(db.store(name)?),
        }
    }

    /// Empties the store for a rebuild; returns the store to rebuild into.
    pub(crate) fn wipe(
        &self,
        store: RocksDbStore,
        options: &RocksDbOptions,
    ) -> Result<RocksDbStore, ChangelogError> {
        match self {
            StoreLocation::Directory(path) => {
                drop(store);
                wipe::wipe(path)?;
                Ok(RocksDbStore::open(path, options)?)
            }
            StoreLocation::InTask { .. } => {
                store.clear()?;
                Ok(store)
            }
        }
    }
}
