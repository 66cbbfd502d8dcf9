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
//! A store's data lives in one column family (`default` in a directory of its own,
//! `store.<name>` in a task's RocksDB: see [`crate::TaskDb`]); the `kstate_meta` column family
//! holds small metadata records (the changelog position) written atomically with data through
//! [`RocksDbStore::write_with_metadata`], under a per-store prefix in a task's RocksDB.
//!
//! [`RocksDbStore::ingest_sorted`] writes its SST file into the RocksDB directory as
//! `kstate-ingest-<n>.sst` and has RocksDB move it in. A process killed between the two leaves
//! the file behind, and RocksDB never deletes it (the name is not one of its own), so opening a
//! RocksDB deletes such files, with a warning. It does so only once it holds the directory's
//! lock, so no other store can be writing one there.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kstate_core::{Batch, EntryIter, Error, KeyRange, KeyValueStore, Order, Result};
use rocksdb::{FlushOptions, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::db::{Db, INGEST_PREFIX, INGEST_SUFFIX, Layout, METADATA_CF};
use crate::error::OpenError;
use crate::options::RocksDbOptions;

/// The write options of every write this crate makes: the WAL is disabled (invariant 1 in
/// DESIGN.md). Not `sync` either: there is no log to sync.
pub fn wal_free_write_options() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.disable_wal(true);
    opts
}

/// A RocksDB-backed [`KeyValueStore`] that never writes a WAL: a directory of its own
/// ([`RocksDbStore::open`]), or one column family of a task's RocksDB
/// ([`TaskDb::store`](crate::TaskDb::store)).
pub struct RocksDbStore {
    db: Arc<Db>,
    /// The column family of the data.
    cf: String,
    /// Prepended to this store's metadata keys (empty in a directory of its own).
    meta_prefix: Vec<u8>,
    name: String,
    write_opts: WriteOptions,
    closed: AtomicBool,
}

impl std::fmt::Debug for RocksDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RocksDbStore {
    /// Opens (creating if needed) the store in directory `path`, which holds this store only.
    ///
    /// Fails with a typed [`OpenError`] naming the path when the directory is already open (by
    /// this or another process), when the path is a file, when it holds a task's stores
    /// ([`OpenError::WrongLayout`]: open it with [`TaskDb`](crate::TaskDb)), or when it cannot
    /// be written.
    pub fn open(path: impl AsRef<Path>, options: &RocksDbOptions) -> Result<Self, OpenError> {
        let db = Db::open(path.as_ref(), options, Layout::Store, &[], false)?;
        let name = db.path.display().to_string();
        Ok(Self::on(
            Arc::new(db),
            rocksdb::DEFAULT_COLUMN_FAMILY_NAME.to_string(),
            Vec::new(),
            name,
        ))
    }

    /// A handle on column family `cf` of `db`.
    pub(crate) fn on(db: Arc<Db>, cf: String, meta_prefix: Vec<u8>, name: String) -> Self {
        RocksDbStore {
            db,
            cf,
            meta_prefix,
            name,
            write_opts: wal_free_write_options(),
            closed: AtomicBool::new(false),
        }
    }

    /// The RocksDB directory: the store's own, or its task's.
    pub fn path(&self) -> &Path {
        &self.db.path
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

    fn family(&self, name: &str) -> Result<&rocksdb::ColumnFamily> {
        self.db.db.cf_handle(name).ok_or_else(|| Error::Backend {
            store: self.name.clone(),
            operation: "open column family",
            source: format!("column family {name} is missing").into(),
        })
    }

    fn data_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.family(&self.cf)
    }

    fn metadata_cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.family(METADATA_CF)
    }

    fn meta_key(&self, key: &[u8]) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.meta_prefix.len() + key.len());
        full.extend_from_slice(&self.meta_prefix);
        full.extend_from_slice(key);
        full
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
        let mut wb = to_write_batch(self.data_cf()?, data);
        for (k, v) in metadata {
            let k = self.meta_key(k);
            match v {
                Some(v) => wb.put_cf(meta, k, v),
                None => wb.delete_cf(meta, k),
            }
        }
        self.db
            .db
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
        let n = self.db.ingested.fetch_add(1, Ordering::Relaxed);
        let file = self
            .db
            .path
            .join(format!("{INGEST_PREFIX}{n}{INGEST_SUFFIX}"));
        let written = self.write_sst(&file, entries);
        let result = match written {
            Ok(0) => Ok(()),
            Ok(_) => {
                let mut ingest = rocksdb::IngestExternalFileOptions::default();
                ingest.set_move_files(true);
                self.db
                    .db
                    .ingest_external_file_cf_opts(self.data_cf()?, &ingest, vec![&file])
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
        let mut writer = rocksdb::SstFileWriter::create(&self.db.sst_options);
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
            .db
            .get_cf(self.metadata_cf()?, self.meta_key(key))
            .map_err(|e| self.backend("read metadata", e))
    }

    /// Every metadata record of this store, keys without the store's prefix, in key order.
    pub fn metadata_entries(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check_open()?;
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(self.meta_prefix.clone());
        if let Some(upper) = prefix_successor(&self.meta_prefix) {
            read.set_iterate_upper_bound(upper);
        }
        let mut entries = Vec::new();
        for item in self
            .db
            .db
            .iterator_cf_opt(self.metadata_cf()?, read, IteratorMode::Start)
        {
            let (k, v) = item.map_err(|e| self.backend("read metadata", e))?;
            entries.push((k[self.meta_prefix.len()..].to_vec(), v.into_vec()));
        }
        Ok(entries)
    }

    /// Deletes every entry and every metadata record of this store, in one atomic write, then
    /// flushes, so that a crash never brings back data without its position or a position
    /// without its data. Used to rebuild one store of a task's RocksDB, whose directory the
    /// task's other stores share (a store in a directory of its own is wiped by deleting the
    /// directory).
    pub fn clear(&self) -> Result<()> {
        self.check_open()?;
        let data = self.data_cf()?;
        let meta = self.metadata_cf()?;
        let mut wb = WriteBatch::default();
        let first = self.edge_key(IteratorMode::Start)?;
        let last = self.edge_key(IteratorMode::End)?;
        if let (Some(first), Some(last)) = (&first, &last) {
            wb.delete_range_cf(data, first, last);
            wb.delete_cf(data, last);
        }
        for (key, _) in self.metadata_entries()? {
            wb.delete_cf(meta, self.meta_key(&key));
        }
        self.db
            .db
            .write_opt(wb, &self.write_opts)
            .map_err(|e| self.backend("clear", e))?;
        self.flush()?;
        if let (Some(first), Some(last)) = (first, last) {
            // Durable now; the files wholly inside the range go at once, the rest in compaction.
            self.db
                .db
                .delete_file_in_range_cf(data, first, last)
                .map_err(|e| self.backend("delete cleared files", e))?;
        }
        Ok(())
    }

    /// The first or last key of the store.
    fn edge_key(&self, mode: IteratorMode<'_>) -> Result<Option<Vec<u8>>> {
        match self.db.db.iterator_cf(self.data_cf()?, mode).next() {
            None => Ok(None),
            Some(item) => Ok(Some(
                item.map_err(|e| self.backend("scan", e))?.0.into_vec(),
            )),
        }
    }

    /// A RocksDB property of the data column family (e.g. `rocksdb.stats`), for diagnostics.
    pub fn property(&self, name: &str) -> Result<Option<String>> {
        self.check_open()?;
        self.db
            .db
            .property_value_cf(self.data_cf()?, name)
            .map_err(|e| self.backend("read property", e))
    }
}

/// The smallest key greater than every key that starts with `prefix` (`None`: there is none).
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut upper = prefix.to_vec();
    while let Some(last) = upper.pop() {
        if last < u8::MAX {
            upper.push(last + 1);
            return Some(upper);
        }
    }
    None
}

/// The one place mutations become a RocksDB `WriteBatch` (later entries win).
fn to_write_batch<'e>(
    cf: &rocksdb::ColumnFamily,
    data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
) -> WriteBatch {
    let mut wb = WriteBatch::default();
    for (k, v) in data {
        match v {
            Some(v) => wb.put_cf(cf, k, v),
            None => wb.delete_cf(cf, k),
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
        self.db
            .db
            .get_cf(self.data_cf()?, key)
            .map_err(|e| self.backend("get", e))
    }

    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.check_open()?;
        let cf = self.data_cf()?;
        self.db
            .db
            .multi_get_cf(keys.iter().map(|k| (cf, *k)))
            .into_iter()
            .map(|r| r.map_err(|e| self.backend("multi_get", e)))
            .collect()
    }

    /// Overridden only to skip building a [`Batch`]: the same single-key write RocksDB makes for
    /// a one-entry batch.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check_open()?;
        self.db
            .db
            .put_cf_opt(self.data_cf()?, key, value, &self.write_opts)
            .map_err(|e| self.backend("put", e))
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        self.check_open()?;
        self.db
            .db
            .delete_cf_opt(self.data_cf()?, key, &self.write_opts)
            .map_err(|e| self.backend("delete", e))
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.check_open()?;
        if batch.is_empty() {
            return Ok(());
        }
        let wb = to_write_batch(
            self.data_cf()?,
            batch
                .mutations()
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_deref())),
        );
        self.db
            .db
            .write_opt(wb, &self.write_opts)
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
        Ok(Box::new(
            self.db
                .db
                .iterator_cf_opt(self.data_cf()?, read, mode)
                .map(move |item| {
                    item.map(|(k, v)| (k.into_vec(), v.into_vec()))
                        .map_err(|e| Error::backend(name.clone(), "scan", e))
                }),
        ))
    }

    fn approximate_len(&self) -> Result<u64> {
        self.check_open()?;
        Ok(self
            .db
            .db
            .property_int_value_cf(self.data_cf()?, rocksdb::properties::ESTIMATE_NUM_KEYS)
            .map_err(|e| self.backend("estimate entry count", e))?
            .unwrap_or(0))
    }

    /// Flushes every column family of the RocksDB at once (atomic flush): in a task's RocksDB
    /// the metadata column family holds every store's position, so flushing it without every
    /// store's data would make a position durable ahead of its data.
    fn flush(&self) -> Result<()> {
        self.check_open()?;
        let families = self
            .db
            .families
            .iter()
            .map(|f| self.family(f))
            .collect::<Result<Vec<_>>>()?;
        let mut opts = FlushOptions::default();
        opts.set_wait(true);
        self.db
            .db
            .flush_cfs_opt(&families, &opts)
            .map_err(|e| self.backend("flush", e))
    }

    /// Flushes, then refuses further operations. The directory's lock is released when the
    /// last handle on its RocksDB is dropped.
    fn close(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.flush()?;
        self.closed.store(true, Ordering::Release);
        tracing::debug!(store = %self.name, "closed RocksDB store");
        Ok(())
    }
}
