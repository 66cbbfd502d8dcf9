//! kstate's benchmark binaries and the measuring harness they share.
//!
//! The binaries (`src/bin`, built into `$CARGO_TARGET_DIR/release/<name>`) are the kstate side
//! of the benchmarks in `benches/kafka-streams` and of BENCHMARKS.md:
//!
//! - `e2e`: the end-to-end, latency and failover comparisons with Kafka Streams: the input,
//!   kstate's count-by-key and windowed runs, the bare rdkafka pipe, and the measures every
//!   system is judged by (`compare.sh`, `failover.sh`, `benches/e2e-ab.sh`).
//! - `window_compat`: a Kafka Streams window changelog restored into kstate window stores
//!   (`window-compat.sh`, run by `scripts/test`).
//! - `window_ops`: what a window store costs: fetches, segment drops, restores.
//! - `tasks_per_process`: what many tasks cost one process (`tasks.sh`).
//! - `count_by_key`, `windowed_count`: the benchmarks' tasks ([`topology`]) as services, which the
//!   runtime's tests (`tests/task_failover.rs`, `tests/services.rs`) and `failover.sh` run as
//!   processes of their own.
//!
//! They and `examples/rows_per_second.rs` (store configurations, rows/s: its harness is
//! [`rows_per_second`]) measure different things but report them the same way: SAMZA-543
//! progress lines, latency percentiles from one histogram, a JSON file for `benches/chart.py`.
//! That code lives here once, in a workspace crate (not published, not part of kstate's API) so
//! that its pieces can be tested, and so that the benchmarks stay out of `examples/`, which teach
//! one idea each.
//!
//! - [`latency`]: call latencies in an HDR histogram, summarised as p50/p99/p99.9/max.
//! - [`progress`]: rows done so far across threads, printed and kept as chart points.
//! - [`report`]: writes a result as pretty JSON.
//! - [`workload`]: the seeded rows every configuration writes, and wide unique keys.
//! - [`cli`]: the command-line pieces every program shares (clap derive): the cluster flags and
//!   counts with digit separators.
//! - [`cluster`]: the Kafka cluster (and its security) a command line names.
//! - [`kafka`]: topics, an acknowledged producer, and broker append times of an output topic.
//! - [`rows_per_second`]: the store configurations `examples/rows_per_second.rs` times, and how.
//! - [`topology`]: the stream tasks the benchmarks (and the task runtime's tests) run.

pub mod cli;
pub mod cluster;
pub mod error;
pub mod kafka;
pub mod latency;
pub mod progress;
pub mod report;
pub mod rows_per_second;
pub mod topology;
pub mod workload;

pub use error::BenchError;
