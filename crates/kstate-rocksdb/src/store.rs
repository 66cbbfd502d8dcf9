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
//! A store's data lives in one column family: `default` in a directory of its own, or
//! `store.<name>` of the RocksDB many tasks share ([`crate::SharedDb`]), under its task's key
//! prefix ([`crate::TaskDb`]). The `kstate_meta` column family holds small metadata records
//! (the changelog position) written atomically with data through
//! [`RocksDbStore::write_with_metadata`], under the task's and the store's prefix in a shared
//! RocksDB.
//!
//! # Flushes a shared RocksDB does once
//! A flush covers every store of the RocksDB, so a store whose every write is already in a
//! completed flush does not flush again ([`flush`](KeyValueStore::flush) returns at once): when
//! a thousand tasks of one RocksDB close, the first flush makes them all durable, and the rest
//! cost nothing. [`RocksDbStore::flushed_at`] tells a caller with a flush interval when the
//! RocksDB last flushed, whichever store asked.
//!
//! [`RocksDbStore::ingest_sorted`] writes its SST file into the RocksDB directory as
//! `kstate-ingest-<n>.sst` and has RocksDB move it in. A process killed between the two leaves
//! the file behind, and RocksDB never deletes it (the name is not one of its own), so opening a
//! RocksDB deletes such files, with a warning. It does so only once it holds the directory's
//! lock, so no other store can be writing one there.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use kstate_core::{Batch, EntryIter, Error, KeyRange, KeyValueStore, Order, Result};
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::db::{Db, INGEST_PREFIX, INGEST_SUFFIX, METADATA_CF, OpenMode, wal_free_write_options};
use crate::error::OpenError;
use crate::layout::Layout;
use crate::options::RocksDbOptions;
use crate::part::{Lease, Prefixes};

/// A RocksDB-backed [`KeyValueStore`] that never writes a WAL: a directory of its own
/// ([`RocksDbStore::open`]), or a task's key range of one column family of the RocksDB many
/// tasks share ([`TaskDb::store`](crate::TaskDb::store)).
pub struct RocksDbStore {
    db: Arc<Db>,
    /// The column family of the data.
    cf: String,
    /// Prepended to this store's keys: its task's, in a RocksDB many tasks share (else empty).
    key_prefix: Vec<u8>,
    /// Prepended to this store's metadata keys (empty in a directory of its own).
    meta_prefix: Vec<u8>,
    name: String,
    write_opts: WriteOptions,
    closed: AtomicBool,
    /// [`Db::write_mark`] after this store's latest write through any of its handles (0: none
    /// since the RocksDB opened).
    written: Arc<AtomicU64>,
    /// Keeps its task open in a shared RocksDB while this handle lives.
    _lease: Option<Arc<Lease>>,
}

impl std::fmt::Debug for RocksDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RocksDbStore {
    /// The account of its budget ([`RocksDbOptions::memory_budget`]) that layers above this
    /// store charge for the writes they hold ([`PendingMemory`](crate::PendingMemory)).
    pub fn pending_memory(&self) -> &crate::PendingMemory {
        &self.db.pending
    }

    /// Opens (creating if needed) the store in directory `path`, which holds this store only.
    ///
    /// Fails with a typed [`OpenError`] naming the path when the directory is already open (by
    /// this or another process), when the path is a file, when it holds the stores of tasks
    /// ([`OpenError::WrongLayout`]: open them with [`StateDir`](crate::StateDir)), or when it
    /// cannot be written.
    pub fn open(path: impl AsRef<Path>, options: &RocksDbOptions) -> Result<Self, OpenError> {
        Self::open_in(path.as_ref(), options, OpenMode::Create)
    }

    /// The store directory at `path`, opened as `mode` says.
    pub(crate) fn open_in(
        path: &Path,
        options: &RocksDbOptions,
        mode: OpenMode,
    ) -> Result<Self, OpenError> {
        let db = Db::open(path, options, Layout::Store, &[], mode)?;
        let name = db.path.display().to_string();
        Ok(Self::on(
            Arc::new(db),
            rocksdb::DEFAULT_COLUMN_FAMILY_NAME.to_string(),
            Prefixes::default(),
            name,
        ))
    }

    /// A handle on column family `cf` of `db`, its keys and metadata under `prefixes`.
    pub(crate) fn on(db: Arc<Db>, cf: String, prefixes: Prefixes, name: String) -> Self {
        let written = db.store_mark(&cf, &prefixes.keys);
        RocksDbStore {
            written,
            db,
            cf,
            key_prefix: prefixes.keys,
            meta_prefix: prefixes.metadata,
            name,
            write_opts: wal_free_write_options(),
            closed: AtomicBool::new(false),
            _lease: prefixes.lease,
        }
    }

    /// When the RocksDB this store is in last completed a flush (or opened): a flush of any of
    /// its stores counts, since a flush covers them all.
    pub fn flushed_at(&self) -> Instant {
        self.db.flushed_at()
    }

    /// Records that a write completed (see [`Db::write_mark`]).
    fn wrote(&self) {
        self.written.store(self.db.write_mark(), Ordering::SeqCst);
    }

    /// `key` under this store's key prefix.
    fn key<'k>(&self, key: &'k [u8]) -> Cow<'k, [u8]> {
        if self.key_prefix.is_empty() {
            Cow::Borrowed(key)
        } else {
            let mut full = Vec::with_capacity(self.key_prefix.len() + key.len());
            full.extend_from_slice(&self.key_prefix);
            full.extend_from_slice(key);
            Cow::Owned(full)
        }
    }

    /// Read options bounded to `range` of this store's keys (all of them, under its prefix, for
    /// an unbounded side).
    fn bounded(&self, range: &KeyRange) -> ReadOptions {
        let mut read = ReadOptions::default();
        match &range.lower {
            Some(lower) => read.set_iterate_lower_bound(self.key(lower).into_owned()),
            None if !self.key_prefix.is_empty() => {
                read.set_iterate_lower_bound(self.key_prefix.clone())
            }
            None => {}
        }
        match &range.upper {
            Some(upper) => read.set_iterate_upper_bound(self.key(upper).into_owned()),
            None => {
                if let Some(upper) = prefix_successor(&self.key_prefix) {
                    read.set_iterate_upper_bound(upper);
                }
            }
        }
        read
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
        self.write_after_drops(&[], data, metadata)
    }

    /// [`write_with_metadata`](Self::write_with_metadata) after dropping `drops` (as
    /// [`drop_range`](KeyValueStore::drop_range) does), all in one atomic RocksDB write: the
    /// drops come first, so `data` lands even inside a dropped range. How a changelog-backed
    /// store applies a commit whose writes include segment drops: a drop is as durable as the
    /// commit that decided it, never more.
    pub fn write_after_drops<'e>(
        &self,
        drops: &[KeyRange],
        data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
        metadata: &[(&[u8], Option<&[u8]>)],
    ) -> Result<()> {
        self.check_open()?;
        let data_cf = self.data_cf()?;
        let mut bounds = Vec::with_capacity(drops.len());
        for range in drops {
            if let Some(b) = self.drop_bounds(range)? {
                bounds.push(b);
            }
        }
        let meta = self.metadata_cf()?;
        let mut wb = WriteBatch::default();
        for (lower, upper) in &bounds {
            wb.delete_range_cf(data_cf, lower, upper);
        }
        self.add_to_write_batch(&mut wb, data_cf, data);
        for (k, v) in metadata {
            let k = self.meta_key(k);
            match v {
                Some(v) => wb.put_cf(meta, k, v),
                None => wb.delete_cf(meta, k),
            }
        }
        if wb.is_empty() {
            return Ok(());
        }
        self.write_batch(
            wb,
            if bounds.is_empty() {
                "write"
            } else {
                "drop range"
            },
        )?;
        let mark = self.written.load(Ordering::SeqCst);
        for (lower, upper) in bounds {
            self.db
                .delete_files_after_flush(&self.cf, lower, upper, mark);
        }
        Ok(())
    }

    /// `range`'s bounds in RocksDB's keys (with the store's prefix), `None` if it holds no key.
    fn drop_bounds(&self, range: &KeyRange) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if range.is_empty() {
            return Ok(None);
        }
        let lower = match &range.lower {
            Some(lower) => self.key(lower).into_owned(),
            None => self.key_prefix.clone(),
        };
        // An unbounded upper side ends after the store's last key: RocksDB wants an end key.
        let upper = match &range.upper {
            Some(upper) => self.key(upper).into_owned(),
            None => match prefix_successor(&self.key_prefix) {
                Some(upper) if !self.key_prefix.is_empty() => upper,
                _ => match self.edge_key(IteratorMode::End)? {
                    Some(mut last) => {
                        last.push(0);
                        last
                    }
                    None => return Ok(None),
                },
            },
        };
        Ok((lower < upper).then_some((lower, upper)))
    }

    /// Writes `wb`, and records that this store wrote.
    fn write_batch(&self, wb: WriteBatch, operation: &'static str) -> Result<()> {
        self.db
            .db
            .write_opt(wb, &self.write_opts)
            .map_err(|e| self.backend(operation, e))?;
        self.wrote();
        Ok(())
    }

    /// The one place mutations become a RocksDB `WriteBatch` (later entries win).
    fn to_write_batch<'e>(
        &self,
        cf: &rocksdb::ColumnFamily,
        data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
    ) -> WriteBatch {
        let mut wb = WriteBatch::default();
        self.add_to_write_batch(&mut wb, cf, data);
        wb
    }

    fn add_to_write_batch<'e>(
        &self,
        wb: &mut WriteBatch,
        cf: &rocksdb::ColumnFamily,
        data: impl IntoIterator<Item = (&'e [u8], Option<&'e [u8]>)>,
    ) {
        for (k, v) in data {
            let k = self.key(k);
            match v {
                Some(v) => wb.put_cf(cf, k, v),
                None => wb.delete_cf(cf, k),
            }
        }
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
                let ingested = self
                    .db
                    .db
                    .ingest_external_file_cf_opts(self.data_cf()?, &ingest, vec![&file])
                    .map_err(|e| self.backend("ingest SST", e));
                self.wrote();
                ingested
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
        let mut full = self.key_prefix.clone();
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
            full.truncate(self.key_prefix.len());
            full.extend_from_slice(key);
            match value {
                Some(v) => writer.put(&full, v),
                None => writer.delete(&full),
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
        self.write_batch(wb, "clear")?;
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

    /// The first or last key of the store (with its prefix).
    fn edge_key(&self, mode: IteratorMode<'_>) -> Result<Option<Vec<u8>>> {
        let read = self.bounded(&KeyRange::all());
        match self
            .db
            .db
            .iterator_cf_opt(self.data_cf()?, read, mode)
            .next()
        {
            None => Ok(None),
            Some(item) => Ok(Some(
                item.map_err(|e| self.backend("scan", e))?.0.into_vec(),
            )),
        }
    }

    /// The bytes this store's SST files take: its column family's, or, for a task's store in a
    /// shared RocksDB, RocksDB's estimate of its key range's share (flushed data only).
    pub fn sst_bytes(&self) -> Result<u64> {
        self.check_open()?;
        let cf = self.data_cf()?;
        if self.key_prefix.is_empty() {
            return Ok(self
                .db
                .db
                .property_int_value_cf(cf, rocksdb::properties::TOTAL_SST_FILES_SIZE)
                .map_err(|e| self.backend("read property", e))?
                .unwrap_or_default());
        }
        let upper = prefix_successor(&self.key_prefix).unwrap_or_else(|| vec![u8::MAX; 16]);
        Ok(self
            .db
            .db
            .get_approximate_sizes_cf(cf, &[rocksdb::Range::new(&self.key_prefix, &upper)])
            .first()
            .copied()
            .unwrap_or_default())
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

/// How many entries of a task's store in a shared RocksDB `approximate_len` counts before it
/// estimates instead.
const COUNTED_LEN: usize = 10_000;

impl KeyValueStore for RocksDbStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        self.db
            .db
            .get_cf(self.data_cf()?, self.key(key))
            .map_err(|e| self.backend("get", e))
    }

    fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.check_open()?;
        let cf = self.data_cf()?;
        self.db
            .db
            .multi_get_cf(keys.iter().map(|k| (cf, self.key(k))))
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
            .put_cf_opt(self.data_cf()?, self.key(key), value, &self.write_opts)
            .map_err(|e| self.backend("put", e))?;
        self.wrote();
        Ok(())
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        self.check_open()?;
        self.db
            .db
            .delete_cf_opt(self.data_cf()?, self.key(key), &self.write_opts)
            .map_err(|e| self.backend("delete", e))?;
        self.wrote();
        Ok(())
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.check_open()?;
        if batch.is_empty() {
            return Ok(());
        }
        let wb = self.to_write_batch(
            self.data_cf()?,
            batch
                .mutations()
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_deref())),
        );
        self.write_batch(wb, "write")
    }

    /// One range tombstone; the SST files wholly inside the range are deleted after the next
    /// flush, so the disk space comes back without waiting for a compaction (Flink's rescale
    /// does the same). Both take the same time whatever the range holds. Without a WAL the
    /// tombstone is durable at the next flush; a crash before it brings the range back, with
    /// every file of it: what survives a crash is a prefix of the writes, the drop included.
    fn drop_range(&self, range: &KeyRange) -> Result<()> {
        self.write_after_drops(std::slice::from_ref(range), std::iter::empty(), &[])
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.check_open()?;
        if range.is_empty() {
            return Ok(Box::new(std::iter::empty()));
        }
        // The normal form is exactly RocksDB's bounds: lower inclusive, upper exclusive. With
        // both set, SeekToFirst/SeekToLast land on the first/last key inside them.
        let read = self.bounded(range);
        let mode = match order {
            Order::Forward => IteratorMode::Start,
            Order::Reverse => IteratorMode::End,
        };
        let name = &self.name;
        let prefix = self.key_prefix.len();
        Ok(Box::new(
            self.db
                .db
                .iterator_cf_opt(self.data_cf()?, read, mode)
                .map(move |item| {
                    item.map(|(k, v)| (k[prefix..].to_vec(), v.into_vec()))
                        .map_err(|e| Error::backend(name.clone(), "scan", e))
                }),
        ))
    }

    /// RocksDB's estimate for a store with a column family of its own. A task's store in a
    /// shared RocksDB is counted while it is small (up to 10,000 entries), else
    /// estimated as the column family's estimate times the task's share of its SST files.
    fn approximate_len(&self) -> Result<u64> {
        self.check_open()?;
        let cf = self.data_cf()?;
        let int_property = |name: &rocksdb::properties::PropName| {
            self.db
                .db
                .property_int_value_cf(cf, name)
                .map_err(|e| self.backend("estimate entry count", e))
                .map(Option::unwrap_or_default)
        };
        let whole = int_property(rocksdb::properties::ESTIMATE_NUM_KEYS)?;
        if self.key_prefix.is_empty() {
            return Ok(whole);
        }
        let counted = self
            .scan(&KeyRange::all(), Order::Forward)?
            .take(COUNTED_LEN + 1);
        let mut n = 0u64;
        for entry in counted {
            entry?;
            n += 1;
        }
        if n <= COUNTED_LEN as u64 {
            return Ok(n);
        }
        let upper = prefix_successor(&self.key_prefix).unwrap_or_else(|| vec![u8::MAX; 16]);
        let mine = self
            .db
            .db
            .get_approximate_sizes_cf(cf, &[rocksdb::Range::new(&self.key_prefix, &upper)])
            .first()
            .copied()
            .unwrap_or_default();
        let files = int_property(rocksdb::properties::LIVE_SST_FILES_SIZE)?;
        let share = if files == 0 {
            1.0
        } else {
            (mine as f64 / files as f64).min(1.0)
        };
        Ok(((whole as f64 * share) as u64).max(n))
    }

    /// Flushes every column family of the RocksDB at once (atomic flush): in a task's RocksDB
    /// the metadata column family holds every store's position, so flushing it without every
    /// store's data would make a position durable ahead of its data. Returns at once when every
    /// write of this store is in a flush that completed already (another store's, in a shared
    /// RocksDB).
    fn flush(&self) -> Result<()> {
        self.check_open()?;
        if self.db.is_durable(self.written.load(Ordering::SeqCst)) {
            return Ok(());
        }
        self.db.flush_all().map_err(|e| self.backend("flush", e))
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
