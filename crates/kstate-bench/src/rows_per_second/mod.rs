//! The measuring side of `examples/rows_per_second.rs`: how many rows per second each store
//! configuration takes, from a bare RocksDB with its WAL to a logged store in each durability
//! mode, on one or more threads, and how fast the changelog restores.
//!
//! The configurations (one list, one write loop):
//! - `rocksdb-wal`: a bare `rocksdb::DB` with the store's options but the WAL **on**. The only
//!   place in the project where a WAL is ever written: it is the baseline SAMZA-543 measured
//!   against.
//! - `rocksdb-bare-nowal`: the same bare DB with the WAL off, to measure what the store adds.
//! - `rocksdb-nowal`: `kstate_rocksdb::RocksDbStore`, the store itself.
//! - `logged-async`, `logged-group`, `logged-sync`: `kstate_kafka::LoggedStore` (the store plus
//!   its Kafka changelog) in each durability mode. `async` commits when the overlay bound is
//!   reached and at the end; `group` commits every 10 ms; `sync` waits for the broker's
//!   acknowledgement of every put, so it writes at most `--sync-rows` rows.
//! - `kafka-bare-producer`: no store, only the changelog's other half: a bare rdkafka producer
//!   with exactly the settings of the producer a logged store sends through
//!   (`ProducerConfig::client_config`: acks=all, idempotence, lz4, the same linger) sends the
//!   same rows to a topic partition per thread; as for a logged store, the clock covers the send
//!   calls and the wait for the broker's last acknowledgement is the flush. With
//!   `rocksdb-bare-nowal` it brackets `logged-group`: a logged store can be no faster than either
//!   of its parts alone.
//!
//! With several threads every configuration runs one store per thread (its own directory, and
//! for the logged configurations its own partition of one changelog topic with that many
//! partitions), as a stream job runs one task per input partition; thread `t` of `n` writes rows
//! `t`, `t + n`, ..., so the total work stays the same.
//!
//! Keys are the numbers `0..rows` as 8-byte big-endian integers in a shuffled order (seeded, so
//! every configuration writes the same sequence); values are `--value-size` pseudo-random bytes.
//! The clock covers the write calls only; the flush after them is measured on its own.
//!
//! - [`args`]: the command line.
//! - [`configs`]: the configurations, and what they share within one run.
//! - [`sinks`]: where rows go: a store, a bare RocksDB, a bare producer.
//! - [`measure`]: the write loop on every thread, the restore, the ratios, the results.

pub mod args;
pub mod configs;
pub mod measure;
pub mod sinks;

pub use args::Args;
pub use configs::{CONFIGS, Config, RESTORED_CONFIG};
pub use measure::{ConfigResult, Harness, RestoreResult, RunResult, ratios};
