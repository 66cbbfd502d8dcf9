//! [`StateDir`]: an application's state directory, `<state-dir>/<app-id>`, and the one way to
//! open a task's stores in it: [`StateDir::open_task`], which moves what older layouts left
//! for the task ([`crate::migrate`]) before it hands the task over. The runtime's restorer and
//! standbys, and the operators' tools, open tasks through it, so that where a task's data lives
//! is decided here alone.
//!
//! ```text
//! <state-dir>/<app-id>/
//!   rocksdb/          the process's RocksDB: every task's stores (layout 3)
//!   <task>/           what older layouts left: the task's RocksDB (layout 2),
//!   <task>/<store>/   or a RocksDB per store (layout 1); moved at the task's first open
//! ```

use std::path::{Path, PathBuf};

use crate::error::OpenError;
use crate::migrate::{self, Source};
use crate::options::RocksDbOptions;
use crate::shared_db::SharedDb;
use crate::task_db::TaskDb;

/// The directory of the RocksDB every task of the application shares, under the state
/// directory.
pub const SHARED_DIR: &str = "rocksdb";

/// An application's state directory and its shared RocksDB.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
    db: SharedDb,
    options: RocksDbOptions,
}

impl StateDir {
    /// Opens (creating if needed) the state directory `root` with a column family for each of
    /// `stores` in its shared RocksDB.
    pub fn open(
        root: impl Into<PathBuf>,
        stores: &[&str],
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        let root = root.into();
        let db = SharedDb::open(root.join(SHARED_DIR), stores, options)?;
        Ok(StateDir {
            root,
            db,
            options: options.clone(),
        })
    }

    /// Opens the state directory `root` whose shared RocksDB exists (for operators' tools: a
    /// mistyped path is [`OpenError::NotFound`], never a new RocksDB).
    pub fn open_existing(
        root: impl Into<PathBuf>,
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        let root = root.into();
        let db = SharedDb::open_existing(root.join(SHARED_DIR), options)?;
        Ok(StateDir {
            root,
            db,
            options: options.clone(),
        })
    }

    /// `<state-dir>/<app-id>`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The shared RocksDB.
    pub fn db(&self) -> &SharedDb {
        &self.db
    }

    /// Where task `task`'s directory is: what names its stores in messages, and where older
    /// layouts kept it.
    pub fn task_dir(&self, task: u32) -> PathBuf {
        self.root.join(task.to_string())
    }

    /// Task `task`'s stores: its part of the shared RocksDB, after what older layouts left for
    /// `stores` has been moved into it ([`crate::migrate`]). Fails with
    /// [`OpenError::TaskHeld`] while another handle of this process holds the task (the
    /// caller decides whether to wait), and never waits itself.
    pub fn open_task(&self, task: u32, stores: &[&str]) -> Result<TaskDb, OpenError> {
        let dir = self.task_dir(task);
        let part = self.db.task(task, &dir)?;
        let moved = migrate::run(&part, &dir, stores, &self.options)?;
        for (store, source) in moved {
            if source != Source::Current && source != Source::Nothing {
                tracing::debug!(task, store, ?source, "moved into the shared RocksDB");
            }
        }
        Ok(part)
    }

    /// Whether task `task` has state here to resume from: a metadata record in the shared
    /// RocksDB, or anything an older layout left at its directory. An unreadable RocksDB
    /// counts as state: the open reports what is wrong.
    pub fn has_state(&self, task: u32) -> bool {
        self.db.has_state(task).unwrap_or(true) || self.task_dir(task).exists()
    }
}
