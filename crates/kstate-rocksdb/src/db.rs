//! One open RocksDB and what every store handle on it shares: the column families, the options
//! SST files for ingestion are written with, and the layout it was written in.
//!
//! Three layouts exist, told apart by a record in the metadata column family
//! ([`LAYOUT_KEY`]):
//! - **store** (no record; what kstate wrote first): the directory holds one store, its data in
//!   the `default` column family, its metadata unprefixed.
//! - **task** ([`Layout::Task`]): the directory holds the stores of one stream task, each in
//!   column family `store.<name>`, each store's metadata under the prefix `store.<name>/`. One
//!   atomic flush covers every store of the task, so whatever a crash leaves is one consistent
//!   point of all of them, and the task pays for one RocksDB (its `LOCK`, `MANIFEST`, log file
//!   and directory handle) instead of one per store.
//! - **shared** ([`Layout::Shared`]): the directory holds the stores of many tasks
//!   ([`crate::SharedDb`]): column family `store.<name>` holds store `name` of every task, each
//!   task's keys under a 4-byte prefix (its number, big-endian), each task's metadata under
//!   `T‖<task>‖store.<name>/`. A process pays for one RocksDB however many tasks it runs.
//!
//! Opening a directory in the other layout's API is a typed error ([`OpenError::WrongLayout`]),
//! never a silent reinterpretation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rocksdb::{ColumnFamilyDescriptor, DB, Options, WriteOptions};

use crate::error::OpenError;
use crate::layout::{LAYOUT_KEY, Layout, SHARED_LAYOUT_VERSION, TASK_LAYOUT_VERSION};
use crate::options::RocksDbOptions;

/// The column family that holds metadata records.
pub const METADATA_CF: &str = "kstate_meta";

/// The write options of every write this crate makes: the WAL is disabled (invariant 1 in
/// DESIGN.md). Not `sync` either: there is no log to sync.
pub fn wal_free_write_options() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.disable_wal(true);
    opts
}

/// What the column families of a task's stores are named: `store.<name>`.
pub(crate) const STORE_CF_PREFIX: &str = "store.";

/// The column family of a task's store `name`.
pub(crate) fn store_cf(name: &str) -> String {
    format!("{STORE_CF_PREFIX}{name}")
}

/// `ingest_sorted` names its files `kstate-ingest-<n>.sst`.
pub(crate) const INGEST_PREFIX: &str = "kstate-ingest-";
pub(crate) const INGEST_SUFFIX: &str = ".sst";

/// Whether `name` is one `ingest_sorted` gives its files.
pub(crate) fn is_ingest_file(name: &str) -> bool {
    name.strip_prefix(INGEST_PREFIX)
        .and_then(|rest| rest.strip_suffix(INGEST_SUFFIX))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Deletes the files an `ingest_sorted` killed before its ingest left in the directory at
/// `path`, which the caller has just locked (so none of them is being written). A failure only
/// warns: the file wastes space, nothing more.
fn remove_leftover_ingest_files(path: &Path) {
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !is_file || !entry.file_name().to_str().is_some_and(is_ingest_file) {
            continue;
        }
        let file = entry.path();
        match std::fs::remove_file(&file) {
            Ok(()) => {
                tracing::warn!(path = %file.display(), "deleted an SST file an interrupted bulk load left behind");
            }
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "could not delete an SST file an interrupted bulk load left behind");
            }
        }
    }
}

/// A store of a RocksDB: its column family and its key prefix.
type StoreKey = (String, Vec<u8>);

/// An open RocksDB, shared by the handles of its stores; closed when the last one drops.
pub(crate) struct Db {
    pub(crate) db: DB,
    pub(crate) path: PathBuf,
    /// Every column family, for flushes that must cover them all.
    pub(crate) families: Vec<String>,
    /// The options SST files for ingestion are written with.
    pub(crate) sst_options: Options,
    /// Numbers `ingest_sorted`'s files.
    pub(crate) ingested: AtomicU64,
    /// Flushes started: the next one is number `flushes` ([`Db::flush_all`]).
    flushes: AtomicU64,
    /// One more than the number of the latest flush that completed (0: none yet). A write that
    /// completed when `flushes` was `n` is durable once `flushed > n`.
    flushed: AtomicU64,
    /// When the latest flush completed (or the RocksDB opened).
    flushed_at: Mutex<Instant>,
    /// Each store's latest [`Db::write_mark`], by column family and key prefix: shared by all
    /// the handles of one store.
    marks: Mutex<HashMap<StoreKey, Arc<AtomicU64>>>,
    /// The budget's account of writes held above this RocksDB ([`crate::PendingMemory`]).
    pub(crate) pending: crate::PendingMemory,
    /// Dropped ranges whose SST files are still to be deleted: only once the flush that makes
    /// their range tombstone durable has completed ([`Db::delete_files_after_flush`]).
    dropped: Mutex<Vec<DroppedRange>>,
}

/// A range a store dropped with a range tombstone: column family, bounds with the store's
/// prefix, and the write mark of the tombstone's write.
#[derive(Debug)]
struct DroppedRange {
    cf: String,
    lower: Vec<u8>,
    upper: Vec<u8>,
    mark: u64,
}

/// How [`Db::open`] treats the directory it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode {
    /// Created if missing; its layout record written.
    Create,
    /// It must exist (operators' tools: a mistyped path is [`OpenError::NotFound`], never a new
    /// RocksDB); its layout record written if a creation was cut short.
    Existing,
    /// An older layout's directory, opened once to move what it holds into today's: it must
    /// exist, and kstate writes nothing into it (no layout record, no cleanup of leftover
    /// ingest files). RocksDB opens it read-write all the same, so that its `LOCK` is held
    /// while it is read: a read-only open takes no lock.
    Legacy,
}

impl Db {
    /// Opens the RocksDB at `path` in `layout`, as `mode` says, with column families `extra`
    /// besides those it has.
    pub(crate) fn open(
        path: &Path,
        options: &RocksDbOptions,
        layout: Layout,
        extra: &[String],
        mode: OpenMode,
    ) -> Result<Db, OpenError> {
        let must_exist = mode != OpenMode::Create;
        let path = path.to_path_buf();
        if path.exists() && !path.is_dir() {
            return Err(OpenError::NotADirectory { path });
        }
        let existed = path.join("CURRENT").is_file();
        if must_exist && !existed {
            return Err(OpenError::NotFound { path });
        }
        std::fs::create_dir_all(&path).map_err(|e| OpenError::from_io(path.clone(), e))?;
        let opts = options.to_rocksdb();
        let mut families = vec![
            rocksdb::DEFAULT_COLUMN_FAMILY_NAME.to_string(),
            METADATA_CF.to_string(),
        ];
        let mut had_store_families = false;
        if existed {
            let listed =
                DB::list_cf(&opts, &path).map_err(|e| OpenError::from_rocks(path.clone(), e))?;
            had_store_families = listed.iter().any(|f| f.starts_with(STORE_CF_PREFIX));
            families.extend(listed);
        }
        families.extend(extra.iter().cloned());
        let mut seen = std::collections::BTreeSet::new();
        families.retain(|f| seen.insert(f.clone()));
        let descriptors = families
            .iter()
            .map(|f| ColumnFamilyDescriptor::new(f, opts.clone()));
        let db = DB::open_cf_descriptors(&opts, &path, descriptors)
            .map_err(|e| OpenError::from_rocks(path.clone(), e))?;
        // No layout record: a task's RocksDB whose creation was cut short (its column families
        // are made before the record is written and flushed), a single store, or nothing yet.
        let found = match read_layout(&db, &path)? {
            Some(found) => found,
            None if had_store_families && layout != Layout::Store => layout,
            None if had_store_families => Layout::Task,
            None if existed
                && (has_any(&db, rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
                    || has_any(&db, METADATA_CF)) =>
            {
                Layout::Store
            }
            None => layout,
        };
        if found != layout {
            return Err(OpenError::WrongLayout {
                path,
                found,
                wanted: layout,
            });
        }
        if mode != OpenMode::Legacy {
            if let Some(version) = layout.version() {
                write_layout(&db, &path, version)?;
            }
            remove_leftover_ingest_files(&path);
        }
        tracing::debug!(path = %path.display(), %layout, "opened RocksDB (WAL disabled)");
        Ok(Db {
            db,
            path,
            families,
            sst_options: options.to_rocksdb_for_ingestion(),
            ingested: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            flushed_at: Mutex::new(Instant::now()),
            marks: Mutex::new(HashMap::new()),
            pending: options.budget().pending().clone(),
            dropped: Mutex::new(Vec::new()),
        })
    }

    /// The names of the stores it has column families for, in name order.
    pub(crate) fn store_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .families
            .iter()
            .filter_map(|f| f.strip_prefix(STORE_CF_PREFIX).map(str::to_string))
            .collect();
        names.sort();
        names
    }

    /// The write mark of the store in column family `cf` under key prefix `prefix`.
    pub(crate) fn store_mark(&self, cf: &str, prefix: &[u8]) -> Arc<AtomicU64> {
        kstate_core::sync::lock(&self.marks)
            .entry((cf.to_string(), prefix.to_vec()))
            .or_default()
            .clone()
    }

    /// What a write that just completed records ([`Db::is_durable`] takes it): the number the
    /// next flush will have, plus one.
    pub(crate) fn write_mark(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst) + 1
    }

    /// Whether every write that recorded `mark` (0: none) is in a completed flush: a flush that
    /// started after the write completed has completed since.
    pub(crate) fn is_durable(&self, mark: u64) -> bool {
        mark == 0 || self.flushed.load(Ordering::SeqCst) >= mark
    }

    /// When the latest flush completed (or the RocksDB opened).
    pub(crate) fn flushed_at(&self) -> Instant {
        *kstate_core::sync::lock(&self.flushed_at)
    }

    /// Deletes the SST files wholly inside `lower..upper` of column family `cf` once the write
    /// whose mark is `mark` (the range tombstone) is durable, so that the disk space comes back
    /// without waiting for a compaction. Never before: deleting files is durable at once (in the
    /// MANIFEST) while the tombstone, without a WAL, is not until a flush, so a crash in between
    /// would bring back a store that lost part of a range it still holds by its durable position.
    pub(crate) fn delete_files_after_flush(
        &self,
        cf: &str,
        lower: Vec<u8>,
        upper: Vec<u8>,
        mark: u64,
    ) {
        kstate_core::sync::lock(&self.dropped).push(DroppedRange {
            cf: cf.to_string(),
            lower,
            upper,
            mark,
        });
    }

    /// Deletes the files of the dropped ranges whose tombstones are durable now. A failure only
    /// warns: the files are dead weight a compaction removes.
    fn delete_dropped_files(&self) {
        let durable: Vec<DroppedRange> = {
            let mut dropped = kstate_core::sync::lock(&self.dropped);
            let (durable, waiting) = std::mem::take(&mut *dropped)
                .into_iter()
                .partition(|range| self.is_durable(range.mark));
            *dropped = waiting;
            durable
        };
        for range in durable {
            let Some(cf) = self.db.cf_handle(&range.cf) else {
                continue;
            };
            if let Err(e) = self
                .db
                .delete_file_in_range_cf(cf, &range.lower, &range.upper)
            {
                tracing::warn!(path = %self.path.display(), error = %e, "could not delete the files of a dropped range; a compaction will");
            }
        }
    }

    /// Flushes every column family at once (atomic flush) and waits for it, then deletes the
    /// files of the ranges dropped before it.
    pub(crate) fn flush_all(&self) -> Result<(), rocksdb::Error> {
        let number = self.flushes.fetch_add(1, Ordering::SeqCst);
        let families: Vec<&rocksdb::ColumnFamily> = self
            .families
            .iter()
            .filter_map(|f| self.db.cf_handle(f))
            .collect();
        let mut opts = rocksdb::FlushOptions::default();
        opts.set_wait(true);
        self.db.flush_cfs_opt(&families, &opts)?;
        self.flushed.fetch_max(number + 1, Ordering::SeqCst);
        *kstate_core::sync::lock(&self.flushed_at) = Instant::now();
        self.delete_dropped_files();
        Ok(())
    }
}

/// Whether column family `cf` holds any key (a store-layout directory's data or metadata).
fn has_any(db: &DB, cf: &str) -> bool {
    db.cf_handle(cf).is_some_and(|cf| {
        db.iterator_cf(cf, rocksdb::IteratorMode::Start)
            .next()
            .is_some()
    })
}

fn meta<'d>(db: &'d DB, path: &Path) -> Result<&'d rocksdb::ColumnFamily, OpenError> {
    db.cf_handle(METADATA_CF).ok_or_else(|| OpenError::Layout {
        path: path.to_path_buf(),
        message: format!("column family {METADATA_CF} is missing"),
    })
}

fn read_layout(db: &DB, path: &Path) -> Result<Option<Layout>, OpenError> {
    let value = db
        .get_cf(meta(db, path)?, LAYOUT_KEY)
        .map_err(|e| OpenError::from_rocks(path.to_path_buf(), e))?;
    match value {
        None => Ok(None),
        Some(v) if v == TASK_LAYOUT_VERSION.to_be_bytes() => Ok(Some(Layout::Task)),
        Some(v) if v == SHARED_LAYOUT_VERSION.to_be_bytes() => Ok(Some(Layout::Shared)),
        Some(v) => Err(OpenError::Layout {
            path: path.to_path_buf(),
            message: format!(
                "layout version {} (this kstate knows {TASK_LAYOUT_VERSION} and \
                 {SHARED_LAYOUT_VERSION}): written by a newer kstate?",
                kstate_core::HexBytes(&v)
            ),
        }),
    }
}

/// Marks a RocksDB with its layout `version`, durably, before any store writes to it.
fn write_layout(db: &DB, path: &Path, version: u32) -> Result<(), OpenError> {
    let failed = |e| OpenError::from_rocks(path.to_path_buf(), e);
    let meta = meta(db, path)?;
    if db.get_cf(meta, LAYOUT_KEY).map_err(failed)?.is_some() {
        return Ok(());
    }
    db.put_cf_opt(
        meta,
        LAYOUT_KEY,
        version.to_be_bytes(),
        &wal_free_write_options(),
    )
    .map_err(failed)?;
    let mut flush = rocksdb::FlushOptions::default();
    flush.set_wait(true);
    db.flush_cf_opt(meta, &flush).map_err(failed)
}
