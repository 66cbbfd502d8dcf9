//! kstate: fast local key-value state for stream-processing tasks, durable through a Kafka
//! changelog instead of RocksDB's write-ahead log.
//!
//! This facade re-exports the workspace's crates; see each for its part:
//! [`kstate_core`] (the store contract, typed layer, codecs), [`kstate_rocksdb`] (the RocksDB
//! store that never writes a WAL) [`kstate_kafka`] (the changelog, restore, durability modes) and [`kstate_task`] (the stream-task
//! runtime: a consumer group of tasks with restored stores).

pub use kstate_core;
pub use kstate_kafka;
pub use kstate_rocksdb;
pub use kstate_task;
