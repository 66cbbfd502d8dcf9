//! The measuring harness of kstate's benchmark examples.
//!
//! `examples/rows_per_second.rs` (store configurations, rows/s) and `examples/e2e.rs` (the
//! end-to-end and failover comparisons with Kafka Streams) measure different things but report
//! them the same way: SAMZA-543 progress lines, latency percentiles from one histogram, a JSON
//! file for `benches/chart.py`. That code lives here once instead of in each example. It is a
//! workspace crate (not published, not part of kstate's API) so that its pieces can be tested.
//!
//! - [`latency`]: call latencies in an HDR histogram, summarised as p50/p99/p99.9/max.
//! - [`progress`]: rows done so far across threads, printed and kept as chart points.
//! - [`report`]: writes a result as pretty JSON.
//! - [`workload`]: the seeded rows every configuration writes, and wide unique keys.
//! - [`flags`]: `--name value` command lines.
//! - [`cluster`]: the Kafka cluster (and its security) a command line names.
//! - [`kafka`]: topics, an acknowledged producer, and broker append times of an output topic.

pub mod cluster;
pub mod error;
pub mod flags;
pub mod kafka;
pub mod latency;
pub mod progress;
pub mod report;
pub mod workload;

pub use error::BenchError;
