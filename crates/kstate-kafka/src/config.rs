//! [`ChangelogConfig`]: where a store's changelog lives and how it is written and read.

use std::sync::Arc;
use std::time::Duration;

use kstate_core::ChangelogKeys;

use crate::client_properties::ClientProperties;
use crate::durability::Durability;

/// Kafka's default limit on one record (`message.max.bytes`), less room for the batch header.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1_000_000;

/// The producer's linger in `async` and `group` mode unless set (see
/// [`ChangelogConfig::linger`]).
pub const DEFAULT_LINGER: Duration = Duration::from_millis(1);

/// Bytes a record needs on top of its key and value (record batch header and record framing).
pub(crate) const RECORD_OVERHEAD: usize = 1_024;

/// What a store that holds a changelog position does when its changelog cannot continue it: the
/// topic is missing, the partition is empty, or the stored position names another topic or
/// partition. A deleted topic, a typo in its name and a bootstrap address of the wrong cluster
/// all look like this, and the local store may be the only copy of the state left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LostChangelog {
    /// Fail the open with [`ChangelogError::ChangelogLost`](crate::ChangelogError::ChangelogLost)
    /// or [`ChangelogError::PositionMismatch`](crate::ChangelogError::PositionMismatch); create
    /// no topic and change nothing local. The default.
    #[default]
    Refuse,
    /// Create the topic if it is missing, wipe the local store and rebuild it from the changelog
    /// (an empty store when the changelog is empty).
    Rebuild,
    /// Create the topic if it is missing and write the local store's contents into the empty
    /// partition, one record per key: the local store is the best copy there is. Refused when
    /// the partition holds records.
    Reseed,
}

/// A replication factor that asks for the broker's own `default.replication.factor` (Kafka's
/// `CreateTopics` takes -1 for it, as Kafka Streams' `replication.factor` does by default).
pub const BROKER_DEFAULT_REPLICATION: i32 = -1;

/// How a [`LoggedStore`](crate::LoggedStore) talks to its changelog. Built with
/// [`ChangelogConfig::new`] and the setters; every setter has a documented default.
///
/// `Debug` shows every client property but the secrets (see [`ClientProperties`]).
#[derive(Debug, Clone)]
pub struct ChangelogConfig {
    /// The cluster, and every client's properties.
    pub(crate) client: ClientProperties,
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) partitions: Option<i32>,
    pub(crate) replication_factor: i32,
    pub(crate) min_insync_replicas: Option<i32>,
    pub(crate) durability: Durability,
    pub(crate) overlay_max_bytes: usize,
    pub(crate) overlay_max_records: usize,
    pub(crate) open_timeout: Duration,
    pub(crate) delivery_timeout: Duration,
    pub(crate) linger: Option<Duration>,
    pub(crate) restore_batch_records: usize,
    pub(crate) restore_batch_bytes: usize,
    pub(crate) bulk_chunk_records: usize,
    pub(crate) bulk_chunk_bytes: usize,
    pub(crate) flush_interval: Option<Duration>,
    pub(crate) lost_changelog: LostChangelog,
    pub(crate) max_record_bytes: usize,
    pub(crate) keys: Option<Arc<dyn ChangelogKeys>>,
    pub(crate) retention: Option<Duration>,
}

impl ChangelogConfig {
    /// The changelog of one store: `partition` of `topic` on the cluster `client` names: a
    /// bootstrap address (`"host:port,..."`) or [`ClientProperties`] with security settings.
    pub fn new(
        client: impl Into<ClientProperties>,
        topic: impl Into<String>,
        partition: i32,
    ) -> Self {
        ChangelogConfig {
            client: client.into(),
            topic: topic.into(),
            partition,
            partitions: None,
            replication_factor: BROKER_DEFAULT_REPLICATION,
            min_insync_replicas: None,
            durability: Durability::default(),
            overlay_max_bytes: 64 << 20,
            overlay_max_records: 100_000,
            open_timeout: Duration::from_secs(30),
            delivery_timeout: Duration::from_secs(60),
            linger: None,
            restore_batch_records: 10_000,
            restore_batch_bytes: 16 << 20,
            bulk_chunk_records: 250_000,
            bulk_chunk_bytes: 64 << 20,
            flush_interval: None,
            lost_changelog: LostChangelog::Refuse,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            keys: None,
            retention: None,
        }
    }

    /// The topic's partition count when this store creates it, and the count it must have when
    /// it exists. A mismatch is an error, never a write to what may be the wrong partition.
    /// Unset, an existing topic is accepted with any count that has this store's partition, and a
    /// missing topic is not created (the error says to set this): a store cannot guess how many
    /// partitions its task's input has, and the first store to create the topic would fix it.
    pub fn partitions(mut self, n: i32) -> Self {
        self.partitions = Some(n);
        self
    }

    /// Replication factor when creating the topic, and the least an existing topic must have.
    /// Default [`BROKER_DEFAULT_REPLICATION`]: the broker's `default.replication.factor`, so a
    /// changelog on a production cluster is replicated as its other topics are (1 on a
    /// development broker), and an existing topic is taken with whatever replication it has.
    pub fn replication_factor(mut self, n: i32) -> Self {
        self.replication_factor = n;
        self
    }

    /// `min.insync.replicas` when creating the topic (default: the broker's).
    pub fn min_insync_replicas(mut self, n: i32) -> Self {
        self.min_insync_replicas = Some(n);
        self
    }

    /// The durability mode at open (default `group:10ms`).
    pub fn durability(mut self, mode: Durability) -> Self {
        self.durability = mode;
        self
    }

    /// Bounds of the uncommitted overlay; reaching either commits early (defaults 64 MiB and
    /// 100,000 records). Under a transaction, reaching one asks the producer's owner to commit
    /// ([`SharedProducer::commit_requested`](crate::SharedProducer::commit_requested)): nothing
    /// is applied before the transaction commits.
    pub fn overlay_bounds(mut self, max_bytes: usize, max_records: usize) -> Self {
        self.overlay_max_bytes = max_bytes.max(1);
        self.overlay_max_records = max_records.max(1);
        self
    }

    /// How long opening may wait for the broker (default 30 s). An unreachable broker is an
    /// error after this long, not a hang.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = timeout;
        self
    }

    /// How long the producer keeps retrying a record before the send fails and the store is
    /// poisoned (`message.timeout.ms`, default 60 s).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// How long the producer waits to fill a batch (`linger.ms`). The default depends on the
    /// durability mode the store opens in: 0 for `sync`, [`DEFAULT_LINGER`] for `async` and
    /// `group`.
    ///
    /// A `sync` put waits for its own record, so any linger is added to every put: 5.4 ms per put
    /// with librdkafka's 5 ms default against 0.1 ms with 0. In `async` and `group` no put waits
    /// for its record, and 1 ms of linger lets the producer send fuller batches: `logged-group`
    /// wrote 25–40% more rows/s than with 0 (BENCHMARKS.md). The producer is created once with
    /// the linger of the opening mode: a store opened in `async` or `group` and switched to
    /// `sync` later keeps 1 ms, which every `sync` put then waits out (set
    /// `linger(Duration::ZERO)` for such a store), and one opened in `sync` and switched to
    /// `group` keeps 0 and sends smaller batches. A linger set here applies in every mode.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = Some(linger);
        self
    }

    /// The producer's linger: the one set, or the default for the opening mode.
    pub(crate) fn effective_linger(&self) -> Duration {
        self.linger.unwrap_or(match self.durability {
            Durability::Sync => Duration::ZERO,
            Durability::Async | Durability::Group(_) => DEFAULT_LINGER,
        })
    }

    /// Records per RocksDB write batch during restore (default 10,000).
    pub fn restore_batch_records(mut self, n: usize) -> Self {
        self.restore_batch_records = n.max(1);
        self
    }

    /// Bytes (keys + values) per RocksDB write batch during restore (default 16 MiB); a batch
    /// ends at whichever of this and [`restore_batch_records`](Self::restore_batch_records) it
    /// reaches first, so large values cannot make a batch of 10,000 records gigabytes long.
    pub fn restore_batch_bytes(mut self, bytes: usize) -> Self {
        self.restore_batch_bytes = bytes.max(1);
        self
    }

    /// Bytes (keys + values) per SST file when restoring into an empty store (default 64 MiB);
    /// with [`bulk_chunk_records`](Self::bulk_chunk_records), whichever is reached first ends a
    /// chunk. A restore holds at most three chunks: about 200 MB at the default.
    pub fn bulk_chunk_bytes(mut self, bytes: usize) -> Self {
        self.bulk_chunk_bytes = bytes.max(1);
        self
    }

    /// How often the store flushes RocksDB's memtables, so that its durable position never lags
    /// far behind (default: a quarter of the topic's `delete.retention.ms`, 6 h for Kafka's 24 h
    /// default). RocksDB has no age-based flush, and a store whose durable position is older than
    /// `delete.retention.ms` when it restarts must be rebuilt: compaction may have removed
    /// tombstones it never saw.
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = Some(interval.max(Duration::from_millis(10)));
        self
    }

    /// What to do when the store holds a position its changelog cannot continue (default
    /// [`LostChangelog::Refuse`]).
    pub fn lost_changelog(mut self, choice: LostChangelog) -> Self {
        self.lost_changelog = choice;
        self
    }

    /// Records per SST file when restoring into an empty store (the bulk path; default 250,000,
    /// about 30 MB with 100-byte values; see also [`bulk_chunk_bytes`](Self::bulk_chunk_bytes)).
    /// A restore holds up to three chunks' worth of memory:
    /// one being read, one being written, and the buffer the writer sorts into (about 90 MB at
    /// the default; lower it where memory is tight: 100,000 measured about 5% slower).
    pub fn bulk_chunk_records(mut self, n: usize) -> Self {
        self.bulk_chunk_records = n.max(1);
        self
    }

    /// The largest key + value a write may have, in bytes (default 1,000,000, Kafka's and
    /// librdkafka's default limit). A larger write is refused with
    /// [`Error::InvalidArgument`](kstate_core::Error::InvalidArgument) before anything is sent.
    /// Raising it also raises `max.message.bytes` on a topic this store creates and the
    /// producer's `message.max.bytes`; an existing topic keeps its own limit.
    pub fn max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes.max(1);
        self
    }

    /// Maps the store's keys to the changelog's and back: a window store's local keys carry a
    /// segment prefix and derived keys its changelog does not
    /// ([`WindowChangelog`](kstate_core::WindowChangelog): Kafka Streams' format). Unset, keys
    /// are logged as they are.
    pub fn keys(mut self, keys: Arc<dyn ChangelogKeys>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Lets the broker delete records older than `retention` as well as compacting
    /// (`cleanup.policy=compact,delete`, `retention.ms`) on a topic this store creates: for a
    /// store whose data expires (a window store: its retention plus a margin,
    /// [`WindowOptions::changelog_retention`](kstate_core::WindowOptions::changelog_retention)).
    /// Unset, the topic is compacted only and keeps every key's last record.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Sets a librdkafka property on the producer, consumer and admin clients, as
    /// [`ClientProperties::set`] does on the properties given to [`new`](Self::new) (security
    /// settings, or `compression.type`, default `lz4`). The properties the changelog depends on
    /// (`acks`, `enable.idempotence`, `max.in.flight.requests.per.connection`,
    /// `message.timeout.ms`, `linger.ms`, `message.max.bytes`, `isolation.level`) are set by the
    /// store and cannot be overridden; use the dedicated setters. Nor can the restore
    /// consumer's `auto.offset.reset`, `enable.partition.eof`, `fetch.queue.backoff.ms` and
    /// `max.partition.fetch.bytes`, which were measured (BENCHMARKS.md).
    pub fn client_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.insert(key, value);
        self
    }

    /// The client properties, bootstrap servers included.
    pub fn client(&self) -> &ClientProperties {
        &self.client
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// How long an open waits for the broker and for open transactions
    /// ([`open_timeout`](Self::open_timeout)).
    pub fn opens_within(&self) -> Duration {
        self.open_timeout
    }

    pub(crate) fn bootstrap_servers(&self) -> &str {
        self.client.bootstrap_servers()
    }
}

/// The settings of a [`SharedProducer`](crate::SharedProducer) that is not one store's own: a
/// task runtime's worker producer, which carries many stores' changelogs and the task's outputs.
/// Errors of such a producer name its cluster, not a topic it may never write.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub(crate) client: ClientProperties,
    pub(crate) delivery_timeout: Duration,
    pub(crate) linger: Duration,
    pub(crate) max_record_bytes: usize,
    pub(crate) init_timeout: Duration,
}

impl ProducerConfig {
    /// A producer on the cluster `client` names, with the changelog defaults: delivery timeout
    /// 60 s, linger [`DEFAULT_LINGER`], records up to [`DEFAULT_MAX_RECORD_BYTES`], and 30 s for
    /// a transactional producer's `init_transactions` (plus its transaction timeout).
    pub fn new(client: impl Into<ClientProperties>) -> Self {
        ProducerConfig {
            client: client.into(),
            delivery_timeout: Duration::from_secs(60),
            linger: DEFAULT_LINGER,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            init_timeout: Duration::from_secs(30),
        }
    }

    /// How long a record is retried before it fails (`message.timeout.ms`), and the longest a
    /// send waits for room in the producer's queue.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// `linger.ms`.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// The largest record the producer takes (its `message.max.bytes` is at least this plus
    /// framing, and at least librdkafka's default of 1,000,000).
    pub fn max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes.max(1);
        self
    }

    /// How long `init_transactions` may wait for the broker, on top of the transaction timeout.
    pub fn init_timeout(mut self, timeout: Duration) -> Self {
        self.init_timeout = timeout;
        self
    }

    /// The client properties, bootstrap servers included.
    pub fn client(&self) -> &ClientProperties {
        &self.client
    }
}

impl From<&ChangelogConfig> for ProducerConfig {
    /// A store's own producer: the changelog's client, delivery timeout, linger (by its opening
    /// durability mode) and record limit.
    fn from(config: &ChangelogConfig) -> Self {
        ProducerConfig {
            client: config.client.clone(),
            delivery_timeout: config.delivery_timeout,
            linger: config.effective_linger(),
            max_record_bytes: config.max_record_bytes,
            init_timeout: config.open_timeout,
        }
    }
}
