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

use crate::db::OpenMode;
use crate::error::OpenError;
use crate::layout::Layout;
use crate::migrate::{self, TaskDir};
use crate::options::RocksDbOptions;
use crate::shared_db::SharedDb;
use crate::store::RocksDbStore;
use crate::task_db::TaskDb;

/// The directory of the RocksDB every task of the application shares, under the state
/// directory.
pub const SHARED_DIR: &str = "rocksdb";

/// A store of a task, named by the path the oldest layout kept it at: `<root>/<task>/<store>`
/// ([`StateDir::parse_store_path`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePath {
    /// The state directory, `<state-dir>/<app-id>`.
    pub root: PathBuf,
    /// The task.
    pub task: u32,
    /// The store's name.
    pub store: String,
}

/// One copy of a store, in the layout that holds it ([`StateDir::copies`]).
#[derive(Debug)]
pub struct StoreCopy {
    /// The layout of the RocksDB it is in.
    pub layout: Layout,
    /// The store, opened for reading.
    pub store: RocksDbStore,
}

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
        migrate::run(&part, &dir, stores, &self.options)?;
        Ok(part)
    }

    /// What `path` names when it is `<root>/<task>/<store>` of a state directory in which some
    /// layout holds task stores (`<root>/rocksdb/` or `<root>/<task>/` is a RocksDB): the path
    /// by which operators name a store of a task, whichever layout holds it.
    pub fn parse_store_path(path: &Path) -> Option<StorePath> {
        let store = path.file_name()?.to_str()?.to_string();
        let task_dir = path.parent()?;
        let task = task_dir.file_name()?.to_str()?.parse().ok()?;
        let root = task_dir.parent()?;
        let has_rocksdb = |dir: &Path| dir.join("CURRENT").is_file();
        (has_rocksdb(&root.join(SHARED_DIR)) || has_rocksdb(task_dir)).then(|| StorePath {
            root: root.to_path_buf(),
            task,
            store,
        })
    }

    /// The store `at` names, for reading: the copy the task's next [`open_task`] keeps (the
    /// shared RocksDB's once it holds metadata, else layout 2's with metadata, else layout 1's
    /// directory, else a copy without metadata). Moves nothing, creates no RocksDB and no column
    /// family, and writes no record into an older layout. No copy anywhere is
    /// [`OpenError::NoSuchStore`], naming what the task's RocksDB (or the shared one) holds.
    ///
    /// [`open_task`]: Self::open_task
    pub fn read_store(at: &StorePath, options: &RocksDbOptions) -> Result<RocksDbStore, OpenError> {
        let task_dir = at.root.join(at.task.to_string());
        let named = task_dir.join(&at.store);
        // `copies` lists the shared RocksDB's, layout 2's, then layout 1's: the first with
        // metadata, or layout 1's, is the one kept; else the older copy without metadata.
        let mut unpositioned = Vec::new();
        for copy in Self::copies(at, options)? {
            let positioned = copy
                .store
                .metadata_entries()
                .map_err(|source| OpenError::Read {
                    path: named.clone(),
                    source,
                })?;
            if copy.layout == Layout::Store || !positioned.is_empty() {
                return Ok(copy.store);
            }
            unpositioned.push(copy.store);
        }
        if let Some(store) = unpositioned.pop() {
            return Ok(store);
        }
        // No copy anywhere: name what the task's RocksDB holds, or else the shared one.
        let held = match TaskDir::open(&task_dir, options)? {
            Some(v2) => v2.stores(),
            None if at.root.join(SHARED_DIR).join("CURRENT").is_file() => {
                SharedDb::open_existing(at.root.join(SHARED_DIR), options)?.stores()
            }
            None => return Err(OpenError::NotFound { path: named }),
        };
        Err(OpenError::NoSuchStore {
            path: task_dir,
            store: at.store.clone(),
            held,
        })
    }

    /// Every copy of the store `at` names, in each layout that holds one, in this order: the
    /// shared RocksDB's (layout 3), the task's RocksDB's (2), the store's own directory (1).
    /// Moves nothing, creates no RocksDB and no column family, and writes no record into an
    /// older layout: for tools and tests that look at what older layouts left beside the copy
    /// [`read_store`](Self::read_store) reads.
    pub fn copies(at: &StorePath, options: &RocksDbOptions) -> Result<Vec<StoreCopy>, OpenError> {
        let task_dir = at.root.join(at.task.to_string());
        let mut copies = Vec::new();
        let shared_path = at.root.join(SHARED_DIR);
        if shared_path.join("CURRENT").is_file() {
            let db = SharedDb::open_existing(&shared_path, options)?;
            match db.task(at.task, &task_dir)?.store(&at.store) {
                Ok(store) => copies.push(StoreCopy {
                    layout: Layout::Shared,
                    store,
                }),
                Err(OpenError::NoSuchStore { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(store) =
            TaskDir::open(&task_dir, options)?.and_then(|v2| v2.store_handle(&at.store))
        {
            copies.push(StoreCopy {
                layout: Layout::Task,
                store,
            });
        }
        let named = task_dir.join(&at.store);
        if named.join("CURRENT").is_file() {
            copies.push(StoreCopy {
                layout: Layout::Store,
                store: RocksDbStore::open_in(&named, options, OpenMode::Legacy)?,
            });
        }
        Ok(copies)
    }

    /// Whether task `task` has state here to resume from: a metadata record in the shared
    /// RocksDB, or anything an older layout left at its directory. An unreadable RocksDB
    /// counts as state: the open reports what is wrong.
    pub fn has_state(&self, task: u32) -> bool {
        self.db.has_state(task).unwrap_or(true) || self.task_dir(task).exists()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

    use super::*;

    /// Every file under `dir` but RocksDB's info logs, with its bytes.
    fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if !path
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("LOG")
                {
                    files.push((path.clone(), std::fs::read(&path).unwrap()));
                }
            }
        }
        files.sort();
        files
    }

    /// A task another handle of the process holds (a task moving between two workers) is
    /// refused before anything is moved: the older directory is left as it was.
    #[test]
    fn a_task_held_elsewhere_in_the_process_is_not_moved_and_its_older_directory_is_untouched() {
        let (_dir, root) = crate::test_fixtures::copy("v2_with_v1_inside");
        let before = files(&root.join("0"));
        let declared = ["counts", "events"];
        let state = StateDir::open(&root, &declared, &RocksDbOptions::default()).unwrap();
        let held = state.db().task(0, root.join("0")).unwrap();
        assert!(matches!(
            state.open_task(0, &declared),
            Err(OpenError::TaskHeld { task: 0, .. })
        ));
        drop(held);
        assert_eq!(files(&root.join("0")), before);
    }
}
