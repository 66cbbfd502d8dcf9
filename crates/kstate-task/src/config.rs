//! [`AppBuilder`]: an application is an id, a cluster, co-partitioned input topics, named typed
//! stores and a processor factory. Every setting has a documented default.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kstate_kafka::{ChangelogConfig, ClientProperties, RestoreListener};
use kstate_rocksdb::RocksDbOptions;

use crate::app::App;
use crate::error::TaskError;
use crate::processor::{Processor, TaskId};

/// The group protocol the workers' consumers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    /// The classic protocol with the `cooperative-sticky` assignor: a rebalance moves only the
    /// partitions that change owner, and the others keep processing. The default.
    #[default]
    CooperativeSticky,
    /// The classic protocol with the eager `range` assignor: every rebalance revokes everything
    /// (each task's store is closed and reopened, replaying only its tail).
    Eager,
    /// KIP-848's consumer protocol (`group.protocol=consumer`, brokers 4.0 and later): the
    /// broker computes assignments incrementally.
    Consumer,
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

/// Options of one store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Changelog coalescing (Kafka Streams' record cache, Samza's CachedStore): within a commit
    /// interval only the last value of each key reaches the changelog. Off by default.
    pub coalesce: bool,
}

/// A typed handle to a store, returned by [`AppBuilder::store`] and passed to
/// [`Context::store`](crate::Context::store) and the query API. Copyable.
pub struct StoreHandle<K, V> {
    pub(crate) index: usize,
    pub(crate) name: Arc<str>,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for StoreHandle<K, V> {
    fn clone(&self) -> Self {
        StoreHandle {
            index: self.index,
            name: self.name.clone(),
            types: PhantomData,
        }
    }
}

impl<K, V> std::fmt::Debug for StoreHandle<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreHandle")
            .field("name", &self.name)
            .finish()
    }
}

impl<K, V> StoreHandle<K, V> {
    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

#[derive(Debug, Clone)]
pub(crate) struct StoreSpec {
    pub(crate) name: String,
    pub(crate) options: StoreOptions,
}

/// Makes the processor of each task.
pub type ProcessorFactory = Arc<dyn Fn(TaskId) -> Box<dyn Processor> + Send + Sync>;

/// Everything an application runs with.
#[derive(Clone)]
pub(crate) struct AppConfig {
    pub(crate) application_id: String,
    /// The cluster, and every client's properties.
    pub(crate) client: ClientProperties,
    pub(crate) inputs: Vec<String>,
    pub(crate) state_dir: PathBuf,
    pub(crate) threads: usize,
    pub(crate) commit_interval: Duration,
    pub(crate) replication_factor: i32,
    pub(crate) group_protocol: GroupProtocol,
    pub(crate) revocation_timeout: Duration,
    pub(crate) consumer_properties: BTreeMap<String, String>,
    pub(crate) rocksdb: RocksDbOptions,
    pub(crate) stores: Vec<StoreSpec>,
    pub(crate) restore_listener: Option<Arc<dyn RestoreListener>>,
    pub(crate) guarantee: ProcessingGuarantee,
    pub(crate) instance_id: String,
    pub(crate) transaction_timeout: Duration,
}

impl AppConfig {
    /// The changelog of store `store` for task `partition`.
    pub(crate) fn changelog(
        &self,
        store: &str,
        partition: i32,
        partitions: i32,
    ) -> ChangelogConfig {
        ChangelogConfig::new(
            self.client.clone(),
            format!("{}-{store}-changelog", self.application_id),
            partition,
        )
        .partitions(partitions)
        .replication_factor(self.replication_factor)
        // The task commits on its interval; the store's own timer is not running.
        .durability(kstate_kafka::Durability::Async)
    }

    /// Worker `index`'s transactional id: `<app-id>-<instance-id>-<index>`.
    pub(crate) fn transactional_id(&self, index: usize) -> String {
        format!("{}-{}-{index}", self.application_id, self.instance_id)
    }

    /// `<state-dir>/<app-id>/<p>/<store>`.
    pub(crate) fn store_dir(&self, partition: i32, store: &str) -> PathBuf {
        self.state_dir
            .join(&self.application_id)
            .join(partition.to_string())
            .join(store)
    }
}

/// Builds an [`App`].
///
/// ```no_run
/// use kstate_task::{App, StoreOptions};
///
/// let mut builder = App::builder("counter", "127.0.0.1:9092");
/// builder.input("events").state_dir("/var/lib/counter").threads(2);
/// let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
/// # let _ = counts;
/// ```
pub struct AppBuilder {
    config: AppConfig,
}

impl AppBuilder {
    pub(crate) fn new(application_id: String, client: ClientProperties) -> Self {
        AppBuilder {
            config: AppConfig {
                application_id,
                client,
                inputs: Vec::new(),
                state_dir: std::env::temp_dir().join("kstate"),
                threads: 1,
                commit_interval: Duration::from_millis(100),
                replication_factor: 1,
                group_protocol: GroupProtocol::default(),
                revocation_timeout: Duration::from_secs(30),
                consumer_properties: BTreeMap::new(),
                rocksdb: RocksDbOptions::default(),
                stores: Vec::new(),
                restore_listener: None,
                guarantee: ProcessingGuarantee::default(),
                instance_id: random_instance_id(),
                transaction_timeout: Duration::from_secs(10),
            },
        }
    }

    /// At-least-once (the default) or exactly-once processing.
    pub fn processing_guarantee(&mut self, guarantee: ProcessingGuarantee) -> &mut Self {
        self.config.guarantee = guarantee;
        self
    }

    /// This process's stable name within the application, for exactly-once: worker *i*'s
    /// transactional id is `<app-id>-<instance-id>-<i>`. A process restarted with the same
    /// instance id fences its previous incarnation and aborts that one's open transaction at
    /// once; with a new one (the default: random per start) a crashed process's open
    /// transaction holds its partitions' restores until the broker times it out
    /// ([`transaction_timeout`](Self::transaction_timeout)). Two running processes must never
    /// share an instance id: each would fence the other.
    pub fn instance_id(&mut self, id: impl Into<String>) -> &mut Self {
        self.config.instance_id = id.into();
        self
    }

    /// Exactly-once: how long the broker lets a transaction stay open before aborting it
    /// (`transaction.timeout.ms`). Default 10 s (Kafka Streams' default under exactly-once): a
    /// crashed worker's open transaction holds back its partitions' next owner at most this
    /// long. Records time out before it (at 90%).
    pub fn transaction_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.config.transaction_timeout = timeout;
        self
    }

    /// Adds an input topic. All inputs must have the same partition count (checked at start).
    pub fn input(&mut self, topic: impl Into<String>) -> &mut Self {
        self.config.inputs.push(topic.into());
        self
    }

    /// Where the stores live: `<dir>/<app-id>/<partition>/<store>`. Default: the system's
    /// temporary directory + `kstate` (set it: a temporary directory may not survive a reboot,
    /// and then every restart restores in full).
    pub fn state_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.config.state_dir = dir.into();
        self
    }

    /// Worker threads, each one member of the consumer group. Default 1.
    pub fn threads(&mut self, n: usize) -> &mut Self {
        self.config.threads = n;
        self
    }

    /// How often each worker commits its tasks. Default 100 ms: a commit is one producer flush
    /// and one RocksDB write batch per store.
    pub fn commit_interval(&mut self, interval: Duration) -> &mut Self {
        self.config.commit_interval = interval;
        self
    }

    /// The changelog topics' replication factor when created, and the least they must have.
    /// Default 1 (a development cluster); production clusters want 3.
    pub fn replication_factor(&mut self, n: i32) -> &mut Self {
        self.config.replication_factor = n;
        self
    }

    /// The consumer group protocol. Default: cooperative-sticky.
    pub fn group_protocol(&mut self, protocol: GroupProtocol) -> &mut Self {
        self.config.group_protocol = protocol;
        self
    }

    /// The most a revocation may take to commit and close its tasks before they are dropped
    /// without a commit (their input is then replayed by the next owner). Default 30 s.
    pub fn revocation_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.config.revocation_timeout = timeout;
        self
    }

    /// A librdkafka property for every client: input consumers, transactional producers,
    /// changelog producers, restore and admin clients (security settings, for example); the same
    /// as setting it on the [`ClientProperties`] given to [`App::builder`](crate::App::builder).
    pub fn client_property(
        &mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> &mut Self {
        self.config.client.insert(key, value);
        self
    }

    /// A librdkafka property for the input consumers only.
    pub fn consumer_property(
        &mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> &mut Self {
        self.config
            .consumer_properties
            .insert(key.into(), value.into());
        self
    }

    /// RocksDB options for every store. Default: [`RocksDbOptions::default`], whose memory
    /// budget is shared by all the process's stores.
    pub fn rocksdb_options(&mut self, options: RocksDbOptions) -> &mut Self {
        self.config.rocksdb = options;
        self
    }

    /// Also tells `listener` about every store restore (start and end offsets, whether it was
    /// rebuilt, each batch), besides the progress kept for [`Running::tasks`](crate::Running::tasks).
    pub fn restore_listener(&mut self, listener: Arc<dyn RestoreListener>) -> &mut Self {
        self.config.restore_listener = Some(listener);
        self
    }

    /// Declares a store of every task, with keys `K` and values `V` (bincode); its changelog is
    /// `<app-id>-<name>-changelog`.
    pub fn store<K, V>(
        &mut self,
        name: impl Into<String>,
        options: StoreOptions,
    ) -> StoreHandle<K, V> {
        let name = name.into();
        self.config.stores.push(StoreSpec {
            name: name.clone(),
            options,
        });
        StoreHandle {
            index: self.config.stores.len() - 1,
            name: name.into(),
            types: PhantomData,
        }
    }

    /// The application, with `factory` making each task's processor.
    pub fn build(
        &self,
        factory: impl Fn(TaskId) -> Box<dyn Processor> + Send + Sync + 'static,
    ) -> Result<App, TaskError> {
        let c = &self.config;
        let invalid = |m: String| Err(TaskError::InvalidConfig(m));
        if c.application_id.is_empty()
            || !c
                .application_id
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
        {
            return invalid(format!(
                "application id {:?} must be non-empty ASCII letters, digits, '.', '_' or '-' (it names the consumer group and the changelog topics)",
                c.application_id
            ));
        }
        if c.inputs.is_empty() {
            return invalid("no input topic".into());
        }
        if c.threads == 0 {
            return invalid("threads must be at least 1".into());
        }
        if c.commit_interval.is_zero() {
            return invalid("the commit interval must be above zero".into());
        }
        if c.guarantee == ProcessingGuarantee::ExactlyOnce {
            if c.instance_id.is_empty()
                || !c
                    .instance_id
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
            {
                return invalid(format!(
                    "instance id {:?} must be non-empty ASCII letters, digits, '.', '_' or '-' (it names transactional ids)",
                    c.instance_id
                ));
            }
            if c.transaction_timeout < Duration::from_secs(1)
                || c.transaction_timeout <= c.commit_interval
            {
                return invalid(format!(
                    "the transaction timeout ({:?}) must be at least 1 s and above the commit interval ({:?})",
                    c.transaction_timeout, c.commit_interval
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for store in &c.stores {
            if !names.insert(store.name.as_str()) {
                return invalid(format!("store {:?} is declared twice", store.name));
            }
            if store.name.is_empty()
                || !store
                    .name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
            {
                return invalid(format!(
                    "store name {:?} must be non-empty ASCII letters, digits, '.', '_' or '-' (it names a directory and a topic)",
                    store.name
                ));
            }
        }
        Ok(App::new(c.clone(), Arc::new(factory)))
    }
}

/// A fresh instance id: the process id and the start time, enough to tell two processes apart.
fn random_instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("p{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}
