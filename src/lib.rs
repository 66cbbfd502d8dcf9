//! kstate: fast local key-value state for stream-processing tasks, durable through a Kafka
//! changelog instead of RocksDB's write-ahead log.
//!
//! This facade re-exports the workspace's crates; see each for its part:
//! [`kstate_core`] (the store contract, typed layer, codecs), [`kstate_rocksdb`] (the RocksDB
//! store that never writes a WAL) [`kstate_kafka`] (the changelog, restore, durability modes) and [`kstate_task`] (the stream-task
//! runtime: a consumer group of tasks with restored stores).
//!
//! ```no_run
//! use kstate::kstate_core::Store;
//! use kstate::kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
//! use kstate::kstate_rocksdb::RocksDbOptions;
//!
//! let changelog = ChangelogConfig::new("127.0.0.1:9092", "counts-changelog", 0)
//!     .durability(Durability::Group(std::time::Duration::from_millis(10)));
//! let store = LoggedStore::open(std::path::Path::new("/var/lib/my-task/counts-0"), &RocksDbOptions::default(), changelog)?;
//! let counts: Store<u64, String, _> = Store::new(store); // keys ordered numerically, values via serde
//! counts.put(&42, &"forty-two".to_string())?;
//! assert_eq!(counts.get(&42)?, Some("forty-two".to_string()));
//! counts.inner().commit()?;
//! counts.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A stream application built on these stores is in [`kstate_task`]'s docs.

pub use kstate_core;
pub use kstate_kafka;
pub use kstate_rocksdb;
pub use kstate_task;
