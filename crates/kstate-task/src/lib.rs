//! kstate-task: the stream-task runtime. An application is a consumer group of tasks, each with
//! its own restored stores, committed together; more processes with the same application id
//! share the partitions (the distributed engine is Kafka's consumer group).
//!
//! - Task *p* is partition *p* of every input topic (co-partitioned; checked at start), and runs
//!   only on a worker that holds all of them, one worker at a time: with several inputs the
//!   group protocol must co-partition ([`GroupProtocol`]; `build()` refuses one that does not).
//!   Every task of the process keeps its stores in one RocksDB, `<state-dir>/<app-id>/rocksdb/`
//!   (a [`SharedDb`](kstate_rocksdb::SharedDb): store `s` is a column family, task *p*'s keys
//!   are under its prefix, and one atomic flush covers them all), store `s` logged to
//!   `<app-id>-<s>-changelog` partition *p*. What older layouts left (a RocksDB per task at
//!   `<p>/`, or per store at `<p>/<s>/`) moves in when the task first opens
//!   ([`StateDir::open_task`](kstate_rocksdb::StateDir::open_task)).
//! - A record that cannot be processed goes to the application's [`ErrorPolicy`]; a panic fails
//!   the application with [`TaskError::Panicked`], and nothing of the record is committed under
//!   exactly-once.
//! - `threads` workers, each one group member with one producer shared by all its tasks' stores
//!   and outputs, and restorer threads: new partitions are paused and restored while the worker
//!   keeps processing its other tasks (the `worker` module's docs say how rebalances are
//!   handled).
//! - At-least-once commit every `commit_interval`: outputs acknowledged, stores committed, input
//!   offsets committed. After a crash the input replays from the last committed offset, so state
//!   may hold some records' effects twice; the stores always restore to exactly what their
//!   changelogs acknowledged.
//! - Or exactly-once ([`ProcessingGuarantee::ExactlyOnce`]): one Kafka transaction per worker and
//!   commit interval carries the changelog records, outputs and input offsets of all its tasks;
//!   stores apply their writes only after it commits, and an abort drops them and rewinds the
//!   input. A crash never wipes a store: restore replays the committed tail since its stored
//!   offset.
//!
//! ```no_run
//! use kstate_task::{App, Context, Processor, Record, StoreHandle, StoreOptions};
//!
//! struct Count(StoreHandle<Vec<u8>, u64>);
//!
//! impl Processor for Count {
//!     fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), kstate_core::BoxError> {
//!         let key = record.key.unwrap_or_default().to_vec();
//!         let counts = ctx.store(&self.0);
//!         let n = counts.get(&key)?.unwrap_or(0) + 1;
//!         counts.put(&key, &n)?;
//!         ctx.send("counts-out", &key, Some(n.to_string().as_bytes()))?;
//!         Ok(())
//!     }
//! }
//!
//! let mut builder = App::builder("counter", "127.0.0.1:9092");
//! builder.input("events").state_dir("/var/lib/counter");
//! let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
//! let running = builder.build(move |_task| Box::new(Count(counts.clone())))?.start()?;
//! running.shutdown();
//! running.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

// The crate reads bottom-up: names → the processor API → a task → the worker → the app.
mod app;
mod builder;
mod cache;
mod config;
mod error;
mod ids;
mod input_check;
mod liveness;
mod open_files;
mod partitioner;
pub mod placement;
mod processor;
mod query;
mod readiness;
mod restorer;
mod shared;
mod signals;
mod standby;
mod start_retry;
mod status;
mod stores;
mod task;
mod timers;
mod worker;

pub use app::{App, Running};
pub use builder::AppBuilder;
pub use config::{
    ErrorPolicy, GroupProtocol, ParseGuaranteeError, ProcessingGuarantee, StoreOptions,
};
pub use error::{ProcessorStep, TaskError};
pub use ids::{Record, TaskId, TimerId};
pub use partitioner::partition_for;
pub use processor::{Context, Processor, ProcessorFactory};
pub use query::{QueryError, Queryable, SessionQuery, StoreQuery, WindowQuery};
pub use readiness::Readiness;
pub use shared::AppState;
pub use signals::Ending;
pub use standby::StandbyStatus;
pub use status::{RestoreProgress, TaskState, TaskStatus};
pub use stores::{
    SessionHandle, StoreHandle, TaskSessionStore, TaskTtlStore, TaskWindowStore, TtlHandle,
    WindowHandle,
};
pub use timers::{TimeKind, Timer};
