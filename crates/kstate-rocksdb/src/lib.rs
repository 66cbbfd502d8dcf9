//! kstate-rocksdb: a RocksDB [`KeyValueStore`](kstate_core::KeyValueStore) that never writes
//! RocksDB's write-ahead log.
//!
//! The durability of kstate's state comes from a Kafka changelog (the `kstate-kafka` crate), as
//! in Apache Samza after SAMZA-543: with the changelog there, the WAL is pure cost. This crate is
//! the thin RocksDB layer under it:
//!
//! - [`RocksDbStore`]: the store; every write disables the WAL ([`wal_free_write_options`]).
//! - [`SharedDb`]: one RocksDB for the stores of every task of a process, a column family per
//!   store, a key prefix per task, flushed together.
//! - [`StateDir`]: an application's state directory, and the one opener of a task's stores
//!   ([`StateDir::open_task`], a [`TaskDb`]), which first moves what older layouts left
//!   ([`migrate`]).
//! - [`RocksDbOptions`]: defaults chosen by measurement, and a builder to tune them.
//! - [`MemoryBudget`]: one block cache and one write-buffer manager shared by many stores, and
//!   the account of writes held above RocksDB ([`PendingMemory`]).
//! - a metadata column family, flushed atomically with the data, for the changelog position.
//! - [`wipe`]: deleting a store directory for a rebuild, never anything that is not one.
//!
//! ```
//! use kstate_core::KeyValueStore;
//! use kstate_rocksdb::{RocksDbOptions, RocksDbStore};
//!
//! let dir = tempfile::tempdir()?;
//! let store = RocksDbStore::open(dir.path().join("partition-0"), &RocksDbOptions::default())?;
//! store.put(b"user:1", b"ada")?;
//! assert_eq!(store.get(b"user:1")?.as_deref(), Some(&b"ada"[..]));
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

mod db;
mod error;
mod layout;
pub mod migrate;
mod options;
mod part;
mod pending;
mod shared_db;
mod state_dir;
mod store;
mod task_db;
#[cfg(test)]
mod test_fixtures;
pub mod wipe;

pub use db::{METADATA_CF, wal_free_write_options};
pub use error::OpenError;
pub use layout::Layout;
pub use options::{Compression, MemoryBudget, RocksDbOptions};
pub use pending::{PendingCharge, PendingMemory};
/// The `rocksdb` crate this one is built on, for benchmarks that compare against it.
pub use rocksdb;
pub use shared_db::SharedDb;
pub use state_dir::{SHARED_DIR, StateDir, StoreCopy, StorePath};
pub use store::RocksDbStore;
pub use task_db::TaskDb;
