//! [`RocksDbOptions`] and the shared [`MemoryBudget`].
//!
//! A stream task runs one store per input partition. Kafka Streams gives every store its own block
//! cache and memtables by default, so a hundred partitions cost a hundred times the memory, a
//! standing complaint of its users. Here every store draws on a [`MemoryBudget`]: one LRU block
//! cache and one `WriteBufferManager` that charges memtable memory to that cache, so the whole
//! process stays within the cache's capacity however many stores it opens (RocksDB wiki,
//! "Write Buffer Manager", and Kafka Streams' own "bounded memory" recipe). Index and filter
//! blocks live in the cache too, so they are bounded by it as well.
//!
//! A budget also counts what is held above RocksDB: the changelog overlays of writes not yet
//! committed and the task runtime's coalescing caches draw on its pending share
//! ([`PendingMemory`]), and give memory back when it is full.
//!
//! Unless told otherwise, stores share one process-wide budget ([`MemoryBudget::process_default`]).
//!
//! The defaults follow RocksDB's tuning guide and Kafka Streams' bounded-memory recipe; the write
//! path with them is measured by `examples/rows_per_second.rs` (BENCHMARKS.md), which is also
//! how to compare alternatives:
//!
//! | option | default | why |
//! |---|---|---|
//! | memtable (`write_buffer_size`) | 16 MiB | measured: random-order puts ran 1.6x faster than with 64 MiB (a smaller skiplist), 8 MiB gained little more for twice the flushes (BENCHMARKS.md) |
//! | memtables per store | 3 | one being written, up to two being flushed |
//! | bloom filter | 10 bits/key | ~1% false positives; gets of absent keys skip SST reads |
//! | block size | 16 KiB | denser index, better compression for 100-byte values |
//! | compression | LZ4, ZSTD at the bottommost level | RocksDB's recommended pairing; SST files a restore ingests are LZ4 (below) |
//! | budget | 256 MiB: a 192 MiB block cache that holds up to 128 MiB of memtables, and 64 MiB for writes above RocksDB (overlays, coalescing caches) | one budget for all stores, whatever their number |
//! | RocksDB's log | to `tracing`, warnings and errors | no `LOG` file (one descriptor fewer per store) |
//! | memtable arena block | 16 KiB | RocksDB's default, 1 MiB, is charged to the budget for every memtable written to: a thousand tasks of three stores (and their metadata) would charge 4 GiB against a 128 MiB memtable budget and flush at every write |
//! | open SST files (`max_open_files`) | 64 per RocksDB | RocksDB's default keeps every SST file open: descriptors grow with data and stores without bound; with a cap, files also open on first read instead of all at once when the RocksDB opens |
//! | flush and compaction threads | 2 jobs | RocksDB's background pools are the process's, sized to the largest setting of any open RocksDB, not the sum: many stores share them |

use std::sync::OnceLock;

use crate::pending::PendingMemory;

use rocksdb::{
    BlockBasedOptions, Cache, DBCompressionType, InfoLogger, LogLevel, Options, WriteBufferManager,
};

/// Memory shared by many stores: one block cache, a write-buffer manager that charges
/// memtables to it, and the account of writes held above RocksDB ([`PendingMemory`]). Cloning
/// shares; create one per process (or per group of stores that should share a limit) and pass
/// it to every store's options.
#[derive(Clone)]
pub struct MemoryBudget {
    cache: Cache,
    write_buffers: WriteBufferManager,
    pending: PendingMemory,
    total_bytes: usize,
    memtable_bytes: usize,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("total_bytes", &self.total_bytes)
            .field("memtable_bytes", &self.memtable_bytes)
            .field("memtable_usage", &self.write_buffers.get_usage())
            .field("pending", &self.pending)
            .finish()
    }
}

impl MemoryBudget {
    /// A budget of `total_bytes`: a quarter for writes held above RocksDB
    /// ([`pending`](Self::pending)), the rest for the block cache, which holds the memtables, of
    /// which there may be up to `memtable_bytes`. When memtables reach their share, RocksDB
    /// flushes the largest one.
    pub fn new(total_bytes: usize, memtable_bytes: usize) -> Self {
        Self::with_pending(total_bytes, memtable_bytes, total_bytes / 4)
    }

    /// [`new`](Self::new) with `pending_bytes` of the total for writes held above RocksDB.
    pub fn with_pending(total_bytes: usize, memtable_bytes: usize, pending_bytes: usize) -> Self {
        let pending_bytes = pending_bytes.min(total_bytes);
        let cache_bytes = total_bytes - pending_bytes;
        let memtable_bytes = memtable_bytes.min(cache_bytes);
        let cache = Cache::new_lru_cache(cache_bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            memtable_bytes,
            false,
            cache.clone(),
        );
        MemoryBudget {
            cache,
            write_buffers,
            pending: PendingMemory::new(pending_bytes),
            total_bytes,
            memtable_bytes,
        }
    }

    /// The process-wide budget stores use unless given another: 256 MiB, up to 128 MiB of it for
    /// memtables and 64 MiB for writes above RocksDB.
    pub fn process_default() -> Self {
        static DEFAULT: OnceLock<MemoryBudget> = OnceLock::new();
        DEFAULT
            .get_or_init(|| MemoryBudget::new(256 << 20, 128 << 20))
            .clone()
    }

    /// The budget's total size in bytes.
    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    /// Memory the memtables of all stores on this budget hold now, in bytes.
    pub fn memtable_usage(&self) -> usize {
        self.write_buffers.get_usage()
    }

    /// Memory the block cache holds now (data, index and filter blocks, and the memtable
    /// charge), in bytes.
    pub fn cache_usage(&self) -> usize {
        self.cache.get_usage()
    }

    /// The account of writes held above RocksDB: overlays and coalescing caches charge it.
    pub fn pending(&self) -> &PendingMemory {
        &self.pending
    }
}

/// Value compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// No compression.
    None,
    /// LZ4 on every level.
    Lz4,
    /// LZ4 on upper levels and ZSTD on the bottommost, where most data lives.
    Lz4ThenZstd,
}

/// How a [`RocksDbStore`](crate::RocksDbStore) configures RocksDB. The WAL is not an option: it
/// is off for every write, always.
#[derive(Debug, Clone)]
pub struct RocksDbOptions {
    pub(crate) memory: Option<MemoryBudget>,
    pub(crate) write_buffer_size: usize,
    pub(crate) max_write_buffers: i32,
    pub(crate) bloom_bits_per_key: f64,
    pub(crate) block_size: usize,
    pub(crate) compression: Compression,
    pub(crate) background_jobs: i32,
    pub(crate) arena_block_size: usize,
    pub(crate) max_open_files: i32,
}

impl Default for RocksDbOptions {
    fn default() -> Self {
        RocksDbOptions {
            memory: None,
            write_buffer_size: 16 << 20,
            max_write_buffers: 3,
            bloom_bits_per_key: 10.0,
            block_size: 16 << 10,
            compression: Compression::Lz4ThenZstd,
            background_jobs: 2,
            arena_block_size: 16 << 10,
            max_open_files: 64,
        }
    }
}

impl RocksDbOptions {
    /// The defaults (see the module docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Draw block cache, memtables and the pending writes above RocksDB from `budget` instead of
    /// the process-wide default.
    pub fn memory_budget(mut self, budget: MemoryBudget) -> Self {
        self.memory = Some(budget);
        self
    }

    /// The size of one memtable, in bytes.
    pub fn write_buffer_size(mut self, bytes: usize) -> Self {
        self.write_buffer_size = bytes;
        self
    }

    /// How many memtables a store may hold (at least 2: one written while another flushes).
    pub fn max_write_buffers(mut self, n: u16) -> Self {
        self.max_write_buffers = i32::from(n.max(2));
        self
    }

    /// Bloom filter bits per key; `0.0` turns the filter off.
    pub fn bloom_bits_per_key(mut self, bits: f64) -> Self {
        self.bloom_bits_per_key = bits;
        self
    }

    /// The SST data block size, in bytes.
    pub fn block_size(mut self, bytes: usize) -> Self {
        self.block_size = bytes;
        self
    }

    /// Value compression.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The memtable arena's block size, in bytes: the least memory a memtable that holds
    /// anything is charged against the budget.
    pub fn arena_block_size(mut self, bytes: usize) -> Self {
        self.arena_block_size = bytes.max(4 << 10);
        self
    }

    /// How many SST files one RocksDB keeps open (RocksDB's `max_open_files`; at least 20, its
    /// own minimum, of which 10 are for files other than SSTs); `None`: every file, always.
    pub fn max_open_files(mut self, n: Option<u32>) -> Self {
        self.max_open_files = n.map_or(-1, |n| i32::try_from(n.max(20)).unwrap_or(i32::MAX));
        self
    }

    /// How many SST files one RocksDB keeps open at most (`None`: no limit).
    pub fn open_files_cap(&self) -> Option<u32> {
        u32::try_from(self.max_open_files).ok()
    }

    /// How many flushes and compactions one RocksDB may run at once. The threads that run them
    /// are the process's: RocksDB's pools grow to the largest setting of any open RocksDB and
    /// every RocksDB shares them, so a thousand stores do not mean a thousand threads.
    pub fn background_jobs(mut self, n: u16) -> Self {
        self.background_jobs = i32::from(n.max(1));
        self
    }

    /// The budget this configuration draws on.
    pub fn budget(&self) -> MemoryBudget {
        self.memory
            .clone()
            .unwrap_or_else(MemoryBudget::process_default)
    }

    /// The options [`RocksDbStore::ingest_sorted`](crate::RocksDbStore::ingest_sorted) writes
    /// SST files with: those of [`to_rocksdb`](Self::to_rocksdb), but LZ4 where they would use
    /// ZSTD. RocksDB's SST writer uses the bottommost compression, and a profile of a bulk restore
    /// spent 13% of its time in ZSTD; a restore is a task's downtime, so it writes LZ4, and
    /// compaction rewrites the files with ZSTD as they merge with later writes.
    pub(crate) fn to_rocksdb_for_ingestion(&self) -> Options {
        let mut opts = self.to_rocksdb();
        if self.compression == Compression::Lz4ThenZstd {
            opts.set_bottommost_compression_type(DBCompressionType::Lz4);
        }
        opts
    }

    /// The RocksDB options this configuration stands for, for both column families (data and
    /// metadata). Public so that benchmarks can run a bare `rocksdb::DB` with identical settings;
    /// a store opened from them directly is not a kstate store.
    pub fn to_rocksdb(&self) -> Options {
        let budget = self.budget();
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&budget.cache);
        table.set_block_size(self.block_size);
        if self.bloom_bits_per_key > 0.0 {
            table.set_bloom_filter(self.bloom_bits_per_key, false);
        }
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);

        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // Invariant 3 (DESIGN.md): data and metadata flush together, so that after a crash the
        // recovered DB is a consistent prefix. RocksDB only promises prefix recovery for WAL-less
        // writes across column families with atomic flush.
        opts.set_atomic_flush(true);
        opts.set_block_based_table_factory(&table);
        opts.set_write_buffer_manager(&budget.write_buffers);
        opts.set_write_buffer_size(self.write_buffer_size);
        opts.set_max_write_buffer_number(self.max_write_buffers);
        opts.set_max_background_jobs(self.background_jobs);
        opts.set_arena_block_size(self.arena_block_size);
        opts.set_max_open_files(self.max_open_files);
        // RocksDB opens a column family's first SST files on threads it starts and joins for
        // each column family at every open (16 by default, however few the files: with a capped
        // `max_open_files` at most 16 files, usually a handful). For a task's RocksDB of three
        // stores that was 75 threads started per open, most of the open's 54 ms; the files are
        // opened in line instead, and the opens of many tasks run side by side on the restorer
        // threads.
        opts.set_max_file_opening_threads(1);
        opts.set_level_compaction_dynamic_level_bytes(true);
        opts.set_bytes_per_sync(1 << 20);
        // RocksDB's own log goes to `tracing` (target `rocksdb`), warnings and errors only,
        // instead of a LOG file per store: a file descriptor and a directory entry fewer for
        // each of a process's hundreds or thousands of stores. No periodic statistics dump
        // either (every 10 minutes per store by default).
        opts.set_info_logger(tracing_logger());
        opts.set_stats_dump_period_sec(0);
        match self.compression {
            Compression::None => opts.set_compression_type(DBCompressionType::None),
            Compression::Lz4 => opts.set_compression_type(DBCompressionType::Lz4),
            Compression::Lz4ThenZstd => {
                opts.set_compression_type(DBCompressionType::Lz4);
                opts.set_bottommost_compression_type(DBCompressionType::Zstd);
            }
        }
        opts
    }
}

/// A RocksDB logger that writes to `tracing`: RocksDB's warnings as warnings, its errors as
/// errors, under target `rocksdb`. The header RocksDB writes at every open (its version and
/// every option, whatever the level) goes to `trace`.
fn tracing_logger() -> InfoLogger {
    InfoLogger::new_callback_logger(LogLevel::Warn, |level, message| {
        let message = message.trim_end();
        match level {
            LogLevel::Error | LogLevel::Fatal => tracing::error!(target: "rocksdb", "{message}"),
            LogLevel::Warn => tracing::warn!(target: "rocksdb", "{message}"),
            LogLevel::Debug | LogLevel::Info | LogLevel::Header => {
                tracing::trace!(target: "rocksdb", "{message}")
            }
        }
    })
}
