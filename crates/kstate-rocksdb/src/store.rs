//! [`RocksDbStore`]: the [`KeyValueStore`] on RocksDB, with the write-ahead log never written.
//!
//! # Why no WAL
//! The store's durability comes from its Kafka changelog (Apache Samza, SAMZA-543: about twice the
//! rows per second without the WAL). Every write in this crate goes through the one
//! [`WriteOptions`] built by [`wal_free_write_options`], which disables the WAL; there is no
//! option, builder method or code path that turns it back on.
//!
//! # What survives what
//! - A clean [`close`](KeyValueStore::close) flushes the memtables to SST files: everything
//!   written before it survives.
//! - Dropping the store without `close` still lets RocksDB flush on shutdown (its
//!   `avoid_flush_during_shutdown` is left off), but a failure there cannot be reported: call
//!   `close` when you care.
//! - A crash (SIGKILL, power loss) loses every write since the last flush, whether explicit
//!   ([`flush`](KeyValueStore::flush), `close`) or RocksDB's own when a memtable fills. What
//!   survives is a prefix of the writes: atomic flush across the data and metadata column families
//!   makes RocksDB recover a consistent point in the write order. The changelog layer records, in
//!   the metadata column family and in the same batch as the data, which changelog offset that
//!   point corresponds to, and replays the rest.
//!
//! # Layout
//! Data lives in the `default` column family; the `kstate_meta` column family holds small
//! metadata records (the changelog position) written atomically with data through
//! [`RocksDbStore::write_with_metadata`].
//!
//! [`RocksDbStore::ingest_sorted`] writes its SST file into the store directory as
//! `kstate-ingest-<n>.sst` and has RocksDB move it in. A process killed between the two leaves
//! the file behind, and RocksDB never deletes it (the name is not one of its own), so opening a
//! store deletes such files, with a warning. It does so only once it holds the directory's
//! lock, so no other store can be writing one there.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use kstate_core::{Batch, EntryIter, Error, KeyRange, KeyValueStore, Order, Result};
use rocksdb::{
    ColumnFamilyDescriptor, DB, FlushOptions, IteratorMode, ReadOptions, WriteBatch, WriteOptions,
};

use crate::error::OpenError;
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

/// `ingest_sorted` names its files `kstate-ingest-<n>.sst`.
const INGEST_PREFIX: &str = "kstate-ingest-";
const INGEST_SUFFIX: &str = ".sst";

/// Whether `name` is one `ingest_sorted` gives its files.
fn is_ingest_file(name: &str) -> bool {
    name.strip_prefix(INGEST_PREFIX)
        .and_then(|rest| rest.strip_suffix(INGEST_SUFFIX))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Deletes the files an `ingest_sorted` killed before its ingest left in the store directory at
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

/// A RocksDB-backed [`KeyValueStore`] that never writes a WAL.
pub struct RocksDbStore {
    db: DB,
    /// The options SST files for ingestion are written with.
    sst_options: rocksdb::Options,
    ingested: std::sync::atomic::AtomicU64,
    path: PathBuf,
    name: String,
    write_opts: WriteOptions,
    closed: AtomicBool,
}

impl std::fmt::Debug for RocksDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RocksDbStore {
    /// Opens (creating if needed) the store in directory `path`.
    ///
    /// Fails with a typed [`OpenError`] naming the path when the directory is already open (by
    /// this or another process), when the path is a file, or when it cannot be written.
    pub fn open(path: impl AsRef<Path>, options: &RocksDbOptions) -> Result<Self, OpenError> {
        let path = path.as_ref().to_path_buf();
        if path.exists() && !path.is_dir() {
            return Err(OpenError::NotADirectory { path });
        }
        std::fs::create_dir_all(&path).map_err(|e| OpenError::from_io(path.clone(), e))?;
        let opts = options.to_rocksdb();
        let families = [
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(METADATA_CF, opts.clone()),
        ];
        let db = DB::open_cf_descriptors(&opts, &path, families)
            .map_err(|e| OpenError::from_rocks(path.clone(), e))?;
        remove_leftover_ingest_files(&path);
        tracing::debug!(path = %path.display(), "opened RocksDB store (WAL disabled)");
        Ok(RocksDbStore {
            db,
            sst_options: options.to_rocksdb_for_ingestion(),
            ingested: std::sync::atomic::AtomicU64::new(0),
            name: path.display().to_string(),
            path,
            write_opts: wal_free_write_options(),
            closed: AtomicBool::new(false),
        })
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed {
                store: self.name.clone(),
            });
        }
        Ok(())
    }

    fn backend(&self, operation: &'static str, e: rocksdb::Error) -> Error {
        Error::backend(self.name.clone(), operation, e)
    }

    fn metadata_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(METADATA_CF)
            .ok_or_else(|| Error::Backend {
                store: self.name.clone(),
                operation: "open metadata column family",
                source: format!("column family {METADATA_CF} is missing").into(),
            })
    }

    /// Applies `data` (key → value, or `None` to delete; later entries win) and `metadata` (to
    /// the metadata column family) in one atomic RocksDB write: after a crash both or neither are
    /// there. Takes borrowed entries, so callers holding them elsewhere (an overlay, a restore
    /// chunk) do not copy them first.
    pub fn write_with_metadata<'e>(
        &self,
        data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
        metadata: &[(&[u8], Option<&[u8]>)],
    ) -> Result<()> {
        self.check_open()?;
        let meta = self.metadata_cf()?;
        let mut wb = to_write_batch(data);
        for (k, v) in metadata {
            match v {
                Some(v) => wb.put_cf(meta, k, v),
                None => wb.delete_cf(meta, k),
            }
        }
        self.db
            .write_opt(wb, &self.write_opts)
            .map_err(|e| self.backend("write", e))
    }

    /// Bulk load: writes `entries` (sorted by key, strictly ascending; `None` deletes) into one
    /// SST file and ingests it. Much faster than a `WriteBatch` for large loads (no memtable
    /// skiplist inserts, which dominate a random-order restore's profile), and newer than every
    /// entry already in the store. Not atomic with metadata: callers write their position after
    /// it, so a crash in between leaves data ahead of its position, which a changelog replay
    /// tolerates (replaying records again converges on the same state).
    pub fn ingest_sorted<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
    ) -> Result<()> {
        self.check_open()?;
        let n = self.ingested.fetch_add(1, Ordering::Relaxed);
        let file = self.path.join(format!("{INGEST_PREFIX}{n}{INGEST_SUFFIX}"));
        let written = self.write_sst(&file, entries);
        let result = match written {
            Ok(0) => Ok(()),
            Ok(_) => {
                let mut ingest = rocksdb::IngestExternalFileOptions::default();
                ingest.set_move_files(true);
                self.db
                    .ingest_external_file_opts(&ingest, vec![&file])
                    .map_err(|e| self.backend("ingest SST", e))
            }
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&file); // moved on success; a leftover otherwise
        result
    }

    /// Writes `entries` to an SST file at `file`; returns how many.
    fn write_sst<'e>(
        &self,
        file: &Path,
        entries: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
    ) -> Result<usize> {
        let mut entries = entries.into_iter().peekable();
        if entries.peek().is_none() {
            return Ok(0);
        }
        let failed = |e| self.backend("write SST for ingestion", e);
        let mut writer = rocksdb::SstFileWriter::create(&self.sst_options);
        writer.open(file).map_err(failed)?;
        let mut previous: Option<&[u8]> = None;
        let mut count = 0;
        for (key, value) in entries {
            if previous.is_some_and(|p| p >= key) {
                return Err(Error::InvalidArgument {
                    store: self.name.clone(),
                    message: format!(
                        "ingest_sorted needs strictly ascending keys; {} is followed by {}",
                        kstate_core::HexBytes(previous.unwrap_or_default()),
                        kstate_core::HexBytes(key)
                    ),
                });
            }
            match value {
                Some(v) => writer.put(key, v),
                None => writer.delete(key),
            }
            .map_err(failed)?;
            previous = Some(key);
            count += 1;
        }
        writer.finish().map_err(failed)?;
        Ok(count)
    }

    /// The metadata record under `key`.
    pub fn metadata(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        self.db
            .get_cf(self.metadata_cf()?, key)
            .map_err(|e| self.backend("read metadata", e))
    }

    /// A RocksDB property of the data column family (e.g. `rocksdb.stats`), for diagnostics.
    pub fn property(&self, name: &str) -> Result<Option<String>> {
        self.check_open()?;
        self.db
            .property_value(name)
            .map_err(|e| self.backend("read property", e))
    }
}

/// The one place mutations become a RocksDB `WriteBatch` (later entries win).
fn to_write_batch<'e>(data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>) -> WriteBatch {
    let mut wb = WriteBatch::default();
    for (k, v) in data {
        match v {
            Some(v) => wb.put(k, v),
            None => wb.delete(k),
        }
    }
    wb
}

impl KeyValueStore for RocksDbStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        self.db.get(key).map_err(|e| self.backend("get", e))
    }

    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.check_open()?;
        self.db
            .multi_get(keys)
            .into_iter()
            .map(|r| r.map_err(|e| self.backend("multi_get", e)))
            .collect()
    }

    /// Overridden only to skip building a [`Batch`]: the same single-key write RocksDB makes for
    /// a one-entry batch.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check_open()?;
        self.db
            .put_opt(key, value, &self.write_opts)
            .map_err(|e| self.backend("put", e))
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        self.check_open()?;
        self.db
            .delete_opt(key, &self.write_opts)
            .map_err(|e| self.backend("delete", e))
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.check_open()?;
        if batch.is_empty() {
            return Ok(());
        }
        self.db
            .write_opt(
                to_write_batch(
                    batch
                        .mutations()
                        .iter()
                        .map(|(k, v)| (k.as_slice(), v.as_deref())),
                ),
                &self.write_opts,
            )
            .map_err(|e| self.backend("write", e))
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.check_open()?;
        if range.is_empty() {
            return Ok(Box::new(std::iter::empty()));
        }
        // The normal form is exactly RocksDB's bounds: lower inclusive, upper exclusive. With
        // both set, SeekToFirst/SeekToLast land on the first/last key inside them.
        let mut read = ReadOptions::default();
        if let Some(lower) = &range.lower {
            read.set_iterate_lower_bound(lower.clone());
        }
        if let Some(upper) = &range.upper {
            read.set_iterate_upper_bound(upper.clone());
        }
        let mode = match order {
            Order::Forward => IteratorMode::Start,
            Order::Reverse => IteratorMode::End,
        };
        let name = &self.name;
        Ok(Box::new(self.db.iterator_opt(mode, read).map(
            move |item| {
                item.map(|(k, v)| (k.into_vec(), v.into_vec()))
                    .map_err(|e| Error::backend(name.clone(), "scan", e))
            },
        )))
    }

    fn approximate_len(&self) -> Result<u64> {
        self.check_open()?;
        Ok(self
            .db
            .property_int_value(rocksdb::properties::ESTIMATE_NUM_KEYS)
            .map_err(|e| self.backend("estimate entry count", e))?
            .unwrap_or(0))
    }

    fn flush(&self) -> Result<()> {
        self.check_open()?;
        let data = self
            .db
            .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
            .ok_or_else(|| Error::Backend {
                store: self.name.clone(),
                operation: "flush",
                source: "default column family is missing".into(),
            })?;
        let mut opts = FlushOptions::default();
        opts.set_wait(true);
        self.db
            .flush_cfs_opt(&[data, self.metadata_cf()?], &opts)
            .map_err(|e| self.backend("flush", e))
    }

    /// Flushes, then refuses further operations. The directory's lock is released when the
    /// handle is dropped.
    fn close(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.flush()?;
        self.closed.store(true, Ordering::Release);
        tracing::debug!(path = %self.path.display(), "closed RocksDB store");
        Ok(())
    }
}
