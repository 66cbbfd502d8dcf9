//! The configurations `rows_per_second` measures (the module docs of
//! [`rows_per_second`](super) say what each is), and what they share within one run.

use std::path::Path;
use std::time::Duration;

use kstate_kafka::{ChangelogConfig, ClientProperties, Durability, LoggedStore};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

use super::sinks::{BareProducer, BareRocks, RowSink, StoreSink};
use crate::BenchError;

/// How a configuration opens one of its sinks in a fresh directory.
type OpenSink =
    fn(&Path, &RocksDbOptions, Slot, &RunContext) -> Result<Box<dyn RowSink>, BenchError>;

/// One configuration: a name and how to open its sinks.
pub struct Config {
    /// Its name on the command line and in the output.
    pub name: &'static str,
    /// Whether it needs a Kafka cluster (it is skipped without one).
    pub needs_broker: bool,
    open: OpenSink,
}

impl Config {
    /// Opens the sink of thread `slot` in `dir`.
    pub(super) fn open(
        &self,
        dir: &Path,
        options: &RocksDbOptions,
        slot: Slot,
        context: &RunContext,
    ) -> Result<Box<dyn RowSink>, BenchError> {
        (self.open)(dir, options, slot, context)
    }
}

/// The durability mode of `logged-group` (and the producer linger `kafka-bare-producer` copies).
const GROUP: Durability = Durability::Group(Duration::from_millis(10));

/// Every configuration, in the order a run measures them.
pub const CONFIGS: &[Config] = &[
    Config {
        name: "rocksdb-wal",
        needs_broker: false,
        open: |dir, opts, _, _| Ok(Box::new(BareRocks::open(dir, opts, true)?)),
    },
    Config {
        name: "rocksdb-bare-nowal",
        needs_broker: false,
        open: |dir, opts, _, _| Ok(Box::new(BareRocks::open(dir, opts, false)?)),
    },
    Config {
        name: "rocksdb-nowal",
        needs_broker: false,
        open: |dir, opts, _, _| {
            let store = RocksDbStore::open(dir, opts)
                .map_err(BenchError::store(format!("open {}", dir.display())))?;
            Ok(Box::new(StoreSink(store)))
        },
    },
    Config {
        name: "logged-async",
        needs_broker: true,
        open: |dir, opts, slot, cx| cx.logged(dir, opts, slot, "logged-async", Durability::Async),
    },
    Config {
        name: "logged-group",
        needs_broker: true,
        open: |dir, opts, slot, cx| cx.logged(dir, opts, slot, "logged-group", GROUP),
    },
    Config {
        name: "logged-sync",
        needs_broker: true,
        open: |dir, opts, slot, cx| cx.logged(dir, opts, slot, "logged-sync", Durability::Sync),
    },
    Config {
        name: "kafka-bare-producer",
        needs_broker: true,
        open: |_, _, slot, cx| {
            let config = cx.changelog(slot, "kafka-bare-producer", GROUP)?;
            Ok(Box::new(BareProducer::open(&config, slot.partitions()?)?))
        },
    },
];

/// The configuration whose changelog the restore measurement replays.
pub const RESTORED_CONFIG: &str = "logged-group";

/// The configuration called `name`.
pub fn config(name: &str) -> Option<&'static Config> {
    CONFIGS.iter().find(|c| c.name == name)
}

/// Every configuration's name, comma-separated.
pub fn names() -> String {
    CONFIGS
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which of a configuration's stores a sink is: thread `index` of `threads`.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// The thread, and the changelog partition.
    pub index: usize,
    /// Threads of the run, and partitions of its changelog topic.
    pub threads: usize,
}

impl Slot {
    /// The changelog partition of this thread.
    fn partition(self) -> Result<i32, BenchError> {
        to_i32(self.index)
    }

    /// The changelog topic's partitions: one per thread.
    pub fn partitions(self) -> Result<i32, BenchError> {
        to_i32(self.threads)
    }
}

fn to_i32(n: usize) -> Result<i32, BenchError> {
    i32::try_from(n).map_err(|_| BenchError::Flag {
        flag: "--threads",
        reason: format!("{n} is more partitions than a topic has"),
    })
}

/// What configurations share within one run.
pub struct RunContext {
    /// The cluster and its security, when there is one: every client of the run starts from
    /// these properties (`--client-property` included).
    pub cluster: Option<ClientProperties>,
    /// Makes this run's changelog topics unique.
    pub run_id: String,
    /// The changelog topic of `logged-group`, when the caller names it (so that another system
    /// can restore the very same records); used at the first thread count, whose changelog the
    /// restore measurement replays.
    pub restore_topic: Option<String>,
    /// The first thread count.
    pub restore_threads: usize,
    /// `ChangelogConfig::linger` for the logged configurations, when set.
    pub linger: Option<Duration>,
}

impl RunContext {
    /// The changelog topic of `config` when it runs on `threads` threads (one partition each).
    pub fn topic(&self, config: &str, threads: usize) -> String {
        match &self.restore_topic {
            Some(topic) if config == RESTORED_CONFIG && threads == self.restore_threads => {
                topic.clone()
            }
            _ => format!("kstate-rows-per-second-{}-{config}-t{threads}", self.run_id),
        }
    }

    /// The cluster, which every logged configuration needs.
    pub fn cluster(&self) -> Result<&ClientProperties, BenchError> {
        self.cluster.as_ref().ok_or(BenchError::NoCluster)
    }

    /// The changelog of configuration `name`'s store in `slot`, in durability `mode`.
    fn changelog(
        &self,
        slot: Slot,
        name: &str,
        mode: Durability,
    ) -> Result<ChangelogConfig, BenchError> {
        let mut config = ChangelogConfig::new(
            self.cluster()?.clone(),
            self.topic(name, slot.threads),
            slot.partition()?,
        )
        .partitions(slot.partitions()?)
        .durability(mode);
        if let Some(linger) = self.linger {
            config = config.linger(linger);
        }
        Ok(config)
    }

    fn logged(
        &self,
        dir: &Path,
        opts: &RocksDbOptions,
        slot: Slot,
        name: &str,
        mode: Durability,
    ) -> Result<Box<dyn RowSink>, BenchError> {
        let config = self.changelog(slot, name, mode)?;
        let store = LoggedStore::open(dir, opts, config)
            .map_err(BenchError::store(format!("{name}: open {}", dir.display())))?;
        Ok(Box::new(StoreSink(store)))
    }
}
