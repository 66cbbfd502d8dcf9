//! What an application runs with: its settings ([`AppConfig`], made by the
//! [`AppBuilder`](crate::AppBuilder)), and the choices a user makes in them — the group
//! protocol, the processing guarantee, the error policy, each store's options.
//!
//! # Why the group protocol decides correctness with several inputs
//! Task *p* is partition *p* of every input, so one member must own all of them. librdkafka has
//! no pluggable assignor (confluentinc/librdkafka#2284), so kstate cannot bring its own the way
//! Kafka Streams does; it picks assignors that co-partition by construction:
//! - the classic `range` assignor ([`GroupProtocol::Eager`]) hands out the same range of
//!   partition numbers of every topic with the same partition count and the same subscribers
//!   (librdkafka's `rd_kafka_assign_co_partitioned`, rack-aware or not);
//! - KIP-848's broker-side `range` assignor ([`GroupProtocol::Consumer`] sets
//!   `group.remote.assignor=range`) does the same for members with the same subscription.
//!
//! `cooperative-sticky` and KIP-848's default `uniform` balance topic-partitions one by one and
//! split task *p* over two members (librdkafka's own unit test assigns {t1-0, t1-2, t2-1} and
//! {t1-1, t2-0, t2-2}), so an application with several inputs refuses
//! [`GroupProtocol::CooperativeSticky`]. Left unset, the protocol is cooperative-sticky for one
//! input (only the moved partitions stop) and eager range for several. Even a co-partitioning
//! assignor can leave a member holding part of a task for a while (KIP-848 hands partitions over
//! one by one when the previous owners differ; members with different subscriptions during a
//! rolling upgrade): the worker then keeps those partitions paused and runs nothing for them
//! until it holds them all (see the `worker` module).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kstate_core::{
    SessionChangelog, SessionOptions, TtlChangelog, TtlOptions, WindowChangelog, WindowOptions,
};
use kstate_kafka::{ChangelogConfig, ClientProperties, ProducerConfig, RestoreListener};
use kstate_rocksdb::RocksDbOptions;

/// The group protocol the workers' consumers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol with the `cooperative-sticky` assignor: a rebalance moves only the
    /// partitions that change owner, and the others keep processing. One input only: it does
    /// not keep partition *p* of several inputs together. The default for one input.
    CooperativeSticky,
    /// The classic protocol with the eager `range` assignor: partition *p* of every input goes
    /// to one member, and every rebalance revokes everything (each task's store is closed and
    /// reopened, replaying only its tail). The default for several inputs.
    Eager,
    /// KIP-848's consumer protocol (`group.protocol=consumer`, brokers 4.0 and later) with the
    /// broker's `range` assignor (`group.remote.assignor=range`, co-partitioning like
    /// [`Eager`](Self::Eager)): the broker computes assignments incrementally.
    ///
    /// Crash detection takes the group's session timeout, which the broker decides:
    /// `group.consumer.session.timeout.ms` and its floor `group.consumer.min.session.timeout.ms`
    /// are both 45 s by default (a client's `session.timeout.ms` is ignored), against 6 s that
    /// the classic protocol allows — about 7x longer before a crashed member's tasks move,
    /// unless the operator lowers them.
    Consumer,
}

impl GroupProtocol {
    /// The protocol's name, as in errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            GroupProtocol::CooperativeSticky => "cooperative-sticky",
            GroupProtocol::Eager => "eager (range)",
            GroupProtocol::Consumer => "consumer (KIP-848, range)",
        }
    }

    /// Whether the protocol puts partition *p* of every input (with equal partition counts and
    /// the same subscriptions) on one member.
    pub fn co_partitions(self) -> bool {
        !matches!(self, GroupProtocol::CooperativeSticky)
    }

    /// The protocol left unset: cooperative-sticky for one input, eager range for several.
    pub(crate) fn default_for(inputs: usize) -> Self {
        if inputs > 1 {
            GroupProtocol::Eager
        } else {
            GroupProtocol::CooperativeSticky
        }
    }
}

/// What a crash may do to the effect of an input record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProcessingGuarantee {
    /// Outputs acknowledged, then stores committed, then input offsets committed: a crash
    /// replays the input since the last commit, so some records' effects on the stores and
    /// outputs may happen twice. The default.
    #[default]
    AtLeastOnce,
    /// One Kafka transaction per worker and commit interval carries the changelog records,
    /// outputs and input offsets of all the worker's tasks (EOS v2). Stores apply their writes
    /// only after the transaction commits; an abort drops them and rewinds the input. Readers
    /// with `isolation.level=read_committed` see every input record's effect exactly once, and a
    /// crash replays only the changelog tail since each store's stored offset (no wipe).
    ExactlyOnce,
}

impl std::fmt::Display for ProcessingGuarantee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProcessingGuarantee::AtLeastOnce => "at-least-once",
            ProcessingGuarantee::ExactlyOnce => "exactly-once",
        })
    }
}

/// Text that names no [`ProcessingGuarantee`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown processing guarantee {0:?}: expected at-least-once or exactly-once")]
pub struct ParseGuaranteeError(pub String);

impl std::str::FromStr for ProcessingGuarantee {
    type Err = ParseGuaranteeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "at-least-once" => Ok(ProcessingGuarantee::AtLeastOnce),
            "exactly-once" => Ok(ProcessingGuarantee::ExactlyOnce),
            other => Err(ParseGuaranteeError(other.to_string())),
        }
    }
}

/// What happens to an input record that cannot be processed: the processor returned an error
/// for it (a store value that does not decode among them), or one of its outputs can never be
/// sent (larger than `message.max.bytes`, to a partition the topic lacks). Failures that are not
/// the record's (a broker that does not answer, a denied write, a store that disagrees with its
/// changelog, a panic) always fail the application.
///
/// Under exactly-once the record's partial effects are undone first (the transaction aborts and
/// the task starts again from its committed input), and the skip or the dead-letter record is
/// part of the transaction that carries the record's offset: a record is skipped exactly once.
/// Under at-least-once the effects the record had before it failed (store writes, outputs)
/// stay.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// The application fails with the error (nothing of the record is committed). The default.
    #[default]
    Fail,
    /// The record is logged (`warn`), counted (`kstate_task_skipped_records`) and skipped.
    LogAndContinue,
    /// The record is written to this topic (Kafka Streams 4.1's dead-letter queue, KIP-1034):
    /// its key and value, with headers naming the error, the task, and the input topic,
    /// partition and offset; then skipped. The topic must exist.
    DeadLetter(String),
}

/// Options of one store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Changelog coalescing (Kafka Streams' record cache, Samza's CachedStore): within a commit
    /// interval only the last value of each key reaches the changelog. Off by default.
    pub coalesce: bool,
}

/// What a store holds, and so how it is laid out and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    /// Keys and values.
    KeyValue,
    /// Values per key and time window ([`kstate_core::WindowStore`]).
    Window(WindowOptions),
    /// Sessions per key ([`kstate_core::SessionStore`]).
    Session(SessionOptions),
    /// Keys that expire ([`kstate_core::TtlStore`]).
    Ttl(TtlOptions),
}

#[derive(Debug, Clone)]
pub(crate) struct StoreSpec {
    pub(crate) name: String,
    pub(crate) options: StoreOptions,
    pub(crate) kind: StoreKind,
}

/// How long the transaction coordinator may take, after a transaction timed out, to abort it
/// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s by default): a crashed
/// member's open transaction holds its partitions' last stable offset up to the transaction
/// timeout plus this.
const TRANSACTION_CLEANUP_INTERVAL: Duration = Duration::from_secs(10);

/// Everything an application runs with.
#[derive(Clone)]
pub(crate) struct AppConfig {
    pub(crate) application_id: String,
    /// The cluster, and every client's properties.
    pub(crate) client: ClientProperties,
    pub(crate) inputs: Vec<String>,
    pub(crate) state_dir: PathBuf,
    pub(crate) threads: usize,
    /// The process's restorer threads, if set ([`AppConfig::restore_threads`]).
    pub(crate) restore_threads: Option<usize>,
    pub(crate) commit_interval: Duration,
    pub(crate) replication_factor: i32,
    /// Resolved at build: never cooperative-sticky with several inputs.
    pub(crate) group_protocol: GroupProtocol,
    pub(crate) revocation_timeout: Duration,
    pub(crate) consumer_properties: BTreeMap<String, String>,
    pub(crate) rocksdb: RocksDbOptions,
    pub(crate) stores: Vec<StoreSpec>,
    pub(crate) restore_listener: Option<Arc<dyn RestoreListener>>,
    pub(crate) guarantee: ProcessingGuarantee,
    pub(crate) instance_id: String,
    /// `group.instance.id` per worker (KIP-345), from the instance id.
    pub(crate) static_membership: bool,
    /// Standby replicas ([`crate::AppBuilder::standby_replicas`]): 0 to 2.
    pub(crate) standby_replicas: u32,
    /// Failure detection by liveness beacons ([`crate::AppBuilder::failure_detection`]): how
    /// long a process may stay silent before the others remove its members from the group.
    pub(crate) failure_detection: Option<Duration>,
    pub(crate) transaction_timeout: Duration,
    pub(crate) error_policy: ErrorPolicy,
    /// How long a task may keep failing to start while the cluster is in motion, and the
    /// application's start may keep asking for its inputs ([`crate::AppBuilder::task_timeout`]).
    pub(crate) task_timeout: Duration,
}

impl AppConfig {
    /// The changelog of store `store` for task `partition`.
    ///
    /// Under exactly-once a record is retried, and a send waits for room in the producer's
    /// queue, at most 90% of the transaction timeout (a wait as long as the transaction timeout
    /// would make the broker abort the transaction and fence the producer: the record must fail
    /// first, so that the abort is ours), and a restore waits for a crashed member's open
    /// transaction as long as the broker may take to abort it.
    pub(crate) fn changelog(
        &self,
        store: &StoreSpec,
        partition: i32,
        partitions: i32,
    ) -> ChangelogConfig {
        let config = ChangelogConfig::new(
            self.client.clone(),
            changelog_topic(&self.application_id, &store.name),
            partition,
        );
        // Window and session stores log Kafka Streams' formats, on topics that also delete by
        // time (their data expires); a TTL store's sweep writes tombstones, so compaction
        // alone keeps its topic bounded.
        let config = match &store.kind {
            StoreKind::KeyValue => config,
            StoreKind::Window(options) => config
                .keys(Arc::new(WindowChangelog::new(options)))
                .retention(options.changelog_retention()),
            StoreKind::Session(options) => config
                .keys(Arc::new(SessionChangelog::new(options)))
                .retention(options.changelog_retention()),
            StoreKind::Ttl(_) => config.keys(Arc::new(TtlChangelog)),
        };
        let config = config
            .partitions(partitions)
            .replication_factor(self.replication_factor)
            .delivery_timeout(self.delivery_timeout())
            // The task commits on its interval; the store's own timer is not running.
            .durability(kstate_kafka::Durability::Async);
        match self.guarantee {
            ProcessingGuarantee::AtLeastOnce => config,
            ProcessingGuarantee::ExactlyOnce => config.open_timeout(self.restore_open_timeout()),
        }
    }

    /// Exactly-once: how long a restore may wait for the broker, and for an open transaction
    /// holding the changelog's last stable offset: at least 30 s, and at least twice the
    /// transaction timeout plus the coordinator's cleanup interval.
    pub(crate) fn restore_open_timeout(&self) -> Duration {
        (self.transaction_timeout * 2 + TRANSACTION_CLEANUP_INTERVAL).max(Duration::from_secs(30))
    }

    /// How long an output or changelog record may wait for room in the producer's queue, and
    /// be retried before it fails.
    pub(crate) fn delivery_timeout(&self) -> Duration {
        match self.guarantee {
            ProcessingGuarantee::AtLeastOnce => Duration::from_secs(60),
            ProcessingGuarantee::ExactlyOnce => self.transaction_timeout * 9 / 10,
        }
    }

    /// The most one commit may take: the revocation timeout, and under exactly-once no more
    /// than the transaction timeout (the broker aborts a transaction open that long).
    pub(crate) fn commit_timeout(&self) -> Duration {
        match self.guarantee {
            ProcessingGuarantee::AtLeastOnce => self.revocation_timeout,
            ProcessingGuarantee::ExactlyOnce => {
                self.revocation_timeout.min(self.transaction_timeout)
            }
        }
    }

    /// The worker producers' settings.
    pub(crate) fn producer_config(&self) -> ProducerConfig {
        ProducerConfig::new(self.client.clone()).delivery_timeout(self.delivery_timeout())
    }

    /// Worker `index`'s transactional id: `<app-id>-<instance-id>-<index>`.
    pub(crate) fn transactional_id(&self, index: usize) -> String {
        format!("{}-{}-{index}", self.application_id, self.instance_id)
    }

    /// Worker `index`'s `group.instance.id` under static membership:
    /// `<app-id>-<instance-id>-<index>`.
    pub(crate) fn group_instance_id(&self, index: usize) -> Option<String> {
        self.static_membership
            .then(|| format!("{}-{}-{index}", self.application_id, self.instance_id))
    }

    /// The process's restorer threads: as set, else as many as workers, at least 2 (so that the
    /// tasks a failover moves restore side by side even with one worker).
    pub(crate) fn restore_threads(&self) -> usize {
        self.restore_threads.unwrap_or(self.threads.max(2))
    }

    /// `<state-dir>/<app-id>`: the application's state directory ([`kstate_rocksdb::StateDir`]:
    /// the RocksDB every task of the process keeps its stores in, and where older layouts kept
    /// them).
    pub(crate) fn state_root(&self) -> PathBuf {
        self.state_dir.join(&self.application_id)
    }

    /// What the consumer does where a partition has no committed offset
    /// (`auto.offset.reset`: `earliest` unless a consumer property says otherwise).
    pub(crate) fn starts_at_latest(&self) -> bool {
        self.consumer_properties
            .get("auto.offset.reset")
            .is_some_and(|v| matches!(v.as_str(), "latest" | "largest" | "end"))
    }
}

/// `<app-id>-<store>-changelog`.
pub(crate) fn changelog_topic(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}
