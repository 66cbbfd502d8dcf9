//! [`SharedDb`]: one RocksDB for the stores of every task of a process.
//!
//! # Why one RocksDB for many tasks
//! A RocksDB instance costs about 11 ms of CPU to open (a third of it RocksDB writing, syncing
//! and reading back its OPTIONS file, which no option turns off), about 400 KB of memory and 9
//! file descriptors, however little it holds (`benches/rocksdb_open.rs`, BENCHMARKS.md, "Many
//! tasks per process"). With a RocksDB per task a process of 1,000 tasks spent 5.7 s of a
//! 6.8 s restart opening them and held 400 MB for the instances alone. Here the process opens
//! one: column family `store.<name>` holds store `name` of every task, each task's keys under
//! its 4-byte prefix (the task number, big-endian, so a task's keys are one contiguous range
//! and a scan of one task is one seek), its metadata (changelog positions) under `T‖<task>‖`.
//!
//! # What a task still has of its own
//! - **Consistency**: a write and its position are one atomic batch, and a flush is atomic
//!   across every column family, so a crash leaves each task's stores at one point of its
//!   write order, as with a RocksDB per task.
//! - **Exclusivity**: RocksDB's `LOCK` keeps other processes out of the whole RocksDB; inside
//!   the process a task is held by a lease ([`StateDir::open_task`](crate::StateDir::open_task)): a second open of a task still
//!   held (a task moving between two workers, still closing in one) is
//!   [`OpenError::TaskHeld`], which the caller waits out.
//! - **Wiping**: a rebuild of one store deletes its task's key range of the column family
//!   (a range tombstone, and the SST files wholly inside it), never another task's keys.
//!
//! # What it costs
//! A flush covers every task, so stores that flush on an interval should ask when the RocksDB
//! last flushed ([`RocksDbStore::flushed_at`](crate::RocksDbStore::flushed_at)) rather than
//! keep a clock each: one flush per interval for the process, not one per task.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kstate_core::sync::lock;
use rocksdb::{IteratorMode, ReadOptions};

use crate::db::{Db, METADATA_CF, OpenMode, store_cf};
use crate::error::OpenError;
use crate::layout::Layout;
use crate::options::RocksDbOptions;
use crate::part::{Lease, Part};
use crate::task_db::TaskDb;

/// The first byte of every task's metadata key in a shared RocksDB (the layout record's key
/// starts with `k`, so the two never meet).
const TASK_METADATA: u8 = b'T';

/// The RocksDB every task of a process keeps its stores in. Cloning shares it; its directory's
/// lock is released when the last clone, task and store handle are dropped.
#[derive(Clone)]
pub struct SharedDb {
    db: Arc<Db>,
    held: Arc<Mutex<BTreeSet<u32>>>,
}

impl std::fmt::Debug for SharedDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDb")
            .field("path", &self.db.path)
            .field("tasks_open", &lock(&self.held).len())
            .finish()
    }
}

impl SharedDb {
    /// Opens (creating if needed) the shared RocksDB in directory `path` with a column family
    /// for each of `stores` (column families it holds already are opened too).
    ///
    /// Fails with a typed [`OpenError`] naming the path: held by another process
    /// ([`OpenError::AlreadyOpen`]), a directory of another layout ([`OpenError::WrongLayout`]),
    /// a store name that cannot name a column family.
    pub fn open(
        path: impl AsRef<Path>,
        stores: &[&str],
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let families = store_families(path, stores)?;
        let db = Db::open(path, options, Layout::Shared, &families, OpenMode::Create)?;
        Ok(Self::on(db))
    }

    /// Opens the shared RocksDB that already exists at `path` with the stores it holds (for
    /// operators' tools: a mistyped path is [`OpenError::NotFound`], never a new RocksDB).
    pub fn open_existing(
        path: impl AsRef<Path>,
        options: &RocksDbOptions,
    ) -> Result<Self, OpenError> {
        let db = Db::open(
            path.as_ref(),
            options,
            Layout::Shared,
            &[],
            OpenMode::Existing,
        )?;
        Ok(Self::on(db))
    }

    fn on(db: Db) -> Self {
        SharedDb {
            db: Arc::new(db),
            held: Arc::default(),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.db.path
    }

    /// The store names it has column families for, in name order.
    pub fn stores(&self) -> Vec<String> {
        self.db.store_names()
    }

    /// Task `task`'s stores, named in messages as `<path>/<store>` (`path`: where the task's
    /// directory would be, and where the older layouts kept it). Fails with
    /// [`OpenError::TaskHeld`] while another handle of this process holds the task.
    pub(crate) fn task(&self, task: u32, path: impl Into<PathBuf>) -> Result<TaskDb, OpenError> {
        if !lock(&self.held).insert(task) {
            return Err(OpenError::TaskHeld {
                path: self.db.path.clone(),
                task,
            });
        }
        let lease = Arc::new(Lease {
            held: self.held.clone(),
            task,
        });
        let part = Part {
            keys: task.to_be_bytes().to_vec(),
            metadata: task_metadata_prefix(task),
            lease,
        };
        Ok(TaskDb::part(self.db.clone(), path.into(), part))
    }

    /// Whether task `task` holds any metadata record (a changelog position): whether it has
    /// local state to resume from.
    pub fn has_state(&self, task: u32) -> Result<bool, OpenError> {
        let prefix = task_metadata_prefix(task);
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(task_metadata_prefix_end(task));
        let mut entries = self.db.db.iterator_cf_opt(
            self.metadata_cf()?,
            read,
            IteratorMode::From(&prefix, rocksdb::Direction::Forward),
        );
        match entries.next() {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(OpenError::from_rocks(self.db.path.clone(), e)),
        }
    }

    /// The tasks that hold metadata records, in order: what a process left here.
    pub fn tasks(&self) -> Result<Vec<u32>, OpenError> {
        let mut tasks = Vec::new();
        let mut from = vec![TASK_METADATA];
        let meta = self.metadata_cf()?;
        loop {
            let mut read = ReadOptions::default();
            read.set_iterate_upper_bound(vec![TASK_METADATA + 1]);
            let next = self
                .db
                .db
                .iterator_cf_opt(
                    meta,
                    read,
                    IteratorMode::From(&from, rocksdb::Direction::Forward),
                )
                .next();
            let key = match next {
                None => return Ok(tasks),
                Some(Ok((key, _))) => key,
                Some(Err(e)) => return Err(OpenError::from_rocks(self.db.path.clone(), e)),
            };
            let Some(task) = key
                .get(1..5)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
            else {
                return Ok(tasks);
            };
            tasks.push(task);
            match task.checked_add(1) {
                Some(next) => from = task_metadata_prefix(next),
                None => return Ok(tasks),
            }
        }
    }

    fn metadata_cf(&self) -> Result<&rocksdb::ColumnFamily, OpenError> {
        self.db
            .db
            .cf_handle(METADATA_CF)
            .ok_or_else(|| OpenError::Layout {
                path: self.db.path.clone(),
                message: format!("column family {METADATA_CF} is missing"),
            })
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
fn store_families(path: &Path, stores: &[&str]) -> Result<Vec<String>, OpenError> {
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

/// `T‖<task>`: the prefix of task `task`'s metadata keys.
fn task_metadata_prefix(task: u32) -> Vec<u8> {
    let mut prefix = vec![TASK_METADATA];
    prefix.extend_from_slice(&task.to_be_bytes());
    prefix
}

/// The first key past task `task`'s metadata.
fn task_metadata_prefix_end(task: u32) -> Vec<u8> {
    match task.checked_add(1) {
        Some(next) => task_metadata_prefix(next),
        None => vec![TASK_METADATA + 1],
    }
}
