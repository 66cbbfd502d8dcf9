//! kstate: fast local key-value state for stream-processing tasks, durable through a Kafka
//! changelog instead of RocksDB's write-ahead log.
//!
//! An application is a consumer group of tasks; each task reads partition *p* of its inputs,
//! keeps its state in local stores restored from their changelogs, and sends outputs, all
//! committed together (at-least-once, or exactly-once in one Kafka transaction). Kafka Streams'
//! WordCount, in full (`examples/hello_count.rs` runs it against a broker):
//!
//! ```no_run
//! use kstate::{App, BoxError, Context, Processor, Record, StoreHandle, StoreOptions};
//!
//! struct WordCount(StoreHandle<String, u64>);
//!
//! impl Processor for WordCount {
//!     fn process(&mut self, ctx: &mut Context<'_>, line: &Record<'_>) -> Result<(), BoxError> {
//!         let text = std::str::from_utf8(line.value.unwrap_or_default())?;
//!         for word in text.split_whitespace().map(str::to_lowercase) {
//!             let counts = ctx.store(&self.0);
//!             let count = counts.get(&word)?.unwrap_or(0) + 1;
//!             counts.put(&word, &count)?;
//!             ctx.send("word-counts", word.as_bytes(), Some(count.to_string().as_bytes()))?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let mut builder = App::builder("word-count", "127.0.0.1:9092");
//! builder.input("lines").state_dir("/var/lib/word-count");
//! let counts = builder.store::<String, u64>("counts", StoreOptions::default());
//! let running = builder.build(move |_task| Box::new(WordCount(counts.clone())))?.start()?;
//! running.shutdown(); // a service would run until a signal: `running.run_until_signal()`
//! running.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The application API is re-exported here from [`kstate_task`], whose docs say how tasks,
//! rebalances, commits and failures work. The parts below it are crates of their own, for a
//! program that wants a store without the runtime: [`kstate_core`] (the store contract, typed
//! stores, window, session and TTL stores, codecs), [`kstate_rocksdb`] (the RocksDB store that
//! never writes a WAL) and [`kstate_kafka`] (the changelog-logged store, restore, durability
//! modes, transactions). [`rdkafka`] is the Kafka client they are built on, re-exported so that
//! an application's own producers and consumers share its librdkafka build.

pub use kstate_core;
pub use kstate_kafka;
pub use kstate_rocksdb;
pub use kstate_task;
pub use rdkafka;

pub use kstate_core::{BoxError, KeyValueStore, Store};
pub use kstate_kafka::{ClientProperties, create_topic_if_missing};
pub use kstate_task::{
    App, AppBuilder, AppState, Context, Ending, ErrorPolicy, GroupProtocol, ProcessingGuarantee,
    Processor, ProcessorFactory, QueryError, Record, Running, SessionHandle, StoreHandle,
    StoreOptions, TaskError, TaskId, TaskState, TaskStatus, TimeKind, Timer, TimerId, TtlHandle,
    WindowHandle, partition_for,
};
