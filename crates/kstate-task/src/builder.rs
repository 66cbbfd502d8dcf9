//! [`AppBuilder`]: an application is an id, a cluster, co-partitioned input topics, named typed
//! stores and a processor factory. Every setting has a documented default, and [`build`]
//! refuses a combination that could not work (a protocol that cannot co-partition several
//! inputs, names that would collide as directories or topics), before anything runs.
//!
//! [`build`]: AppBuilder::build

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kstate_core::{SessionOptions, TtlOptions, WindowOptions};
use kstate_kafka::{ClientProperties, RestoreListener};
use kstate_rocksdb::RocksDbOptions;

use crate::app::App;
use crate::config::{
    AppConfig, ErrorPolicy, GroupProtocol, ProcessingGuarantee, StoreKind, StoreOptions, StoreSpec,
    changelog_topic,
};
use crate::error::TaskError;
use crate::ids::TaskId;
use crate::processor::Processor;
use crate::stores::{SessionHandle, StoreHandle, TtlHandle, WindowHandle};

impl App {
    /// An application named `application_id` (its consumer group and the prefix of its
    /// changelog topics) on the cluster `client` names: a bootstrap address (`"host:port,..."`)
    /// or [`ClientProperties`] with security settings, which every client of the application
    /// (input consumers, producers, restore and admin clients) is made with.
    pub fn builder(
        application_id: impl Into<String>,
        client: impl Into<ClientProperties>,
    ) -> AppBuilder {
        AppBuilder::new(application_id.into(), client.into())
    }
}

/// The most standby replicas ([`AppBuilder::standby_replicas`]): the placement model enumerates
/// every set of up to that many failed processes.
const MAX_STANDBY_REPLICAS: u32 = 2;

/// Kafka Streams' `task.timeout.ms` default ([`AppBuilder::task_timeout`]).
const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(300);

/// Kafka's longest topic name.
const MAX_TOPIC_NAME: usize = 249;

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
    group_protocol: Option<GroupProtocol>,
    instance_id_set: bool,
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
                restore_threads: None,
                commit_interval: Duration::from_millis(100),
                replication_factor: kstate_kafka::BROKER_DEFAULT_REPLICATION,
                group_protocol: GroupProtocol::CooperativeSticky,
                revocation_timeout: Duration::from_secs(30),
                consumer_properties: BTreeMap::new(),
                rocksdb: RocksDbOptions::default(),
                stores: Vec::new(),
                restore_listener: None,
                guarantee: ProcessingGuarantee::default(),
                instance_id: random_instance_id(),
                static_membership: false,
                standby_replicas: 0,
                failure_detection: None,
                transaction_timeout: Duration::from_secs(10),
                error_policy: ErrorPolicy::default(),
                task_timeout: DEFAULT_TASK_TIMEOUT,
            },
            group_protocol: None,
            instance_id_set: false,
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
    ///
    /// With [`static_membership`](Self::static_membership) it also names each worker's group
    /// member (`group.instance.id`).
    pub fn instance_id(&mut self, id: impl Into<String>) -> &mut Self {
        self.config.instance_id = id.into();
        self.instance_id_set = true;
        self
    }

    /// Static group membership (KIP-345): worker *i*'s `group.instance.id` is
    /// `<app-id>-<instance-id>-<i>`, so a process restarted with the same
    /// [`instance_id`](Self::instance_id) within the session timeout gets its tasks back without
    /// a rebalance, and its stores replay only the tail. Needs an explicit instance id (two
    /// running processes must never share one) and the classic protocol (librdkafka 2.12 treats
    /// a KIP-848 broker's `UNRELEASED_INSTANCE_ID`, the answer to a restart before the crashed
    /// member's session expired, as fatal). A static member that stops does not leave the
    /// group: its tasks move only after the session timeout (`session.timeout.ms`). Off by
    /// default.
    pub fn static_membership(&mut self, on: bool) -> &mut Self {
        self.config.static_membership = on;
        self
    }

    /// Standby replicas: with `1`, each process keeps warm copies of the tasks it would receive
    /// if any one other process failed, following their changelogs, so that a failover replays
    /// only the records of the last moments instead of the task's whole state (Kafka Streams'
    /// `num.standby.replicas`); with `2`, also those it would receive if any two failed at
    /// once. `0` (the default): none. At most 2 (the model enumerates every set of failed
    /// processes, which grows as the number of processes to the power `n`); after a failure the
    /// standbys are placed again for the group that is left, so failures one after another are
    /// covered by `1` once the new standbys have caught up.
    ///
    /// librdkafka has no pluggable assignor, so standbys go where the group's assignor will put
    /// each task: they need [`static_membership`](Self::static_membership) and the eager
    /// `range` assignor ([`GroupProtocol::Eager`], the default when standbys are on), whose
    /// assignment every process can compute from the members' instance ids
    /// ([`placement`](crate::placement)). A task can have a standby on more than one process
    /// (a failure also shifts the ranges next to the failed member's). A process follows all its
    /// standby stores on a few consumers, one per store of a task however many tasks it follows
    /// ([`FollowerGroup`](kstate_kafka::FollowerGroup)). [`Running::standbys`](crate::Running::standbys)
    /// shows them.
    pub fn standby_replicas(&mut self, n: u32) -> &mut Self {
        self.config.standby_replicas = n;
        self
    }

    /// Failure detection that does not wait for the session timeout: each process writes a
    /// liveness beacon to the topic `<app-id>-liveness` every quarter of `timeout` and reads
    /// everyone's; when a process that was beaconing stays silent for `timeout`, the others
    /// remove its workers from the group themselves (the `LeaveGroup` request of Kafka's admin
    /// `removeMembersFromConsumerGroup`), and the group rebalances at once instead of after
    /// `session.timeout.ms` (6 s at the least). Each worker heartbeats every `timeout / 2`
    /// (at most 1 s; `heartbeat.interval.ms` overrides it), so the survivors join that
    /// rebalance quickly.
    ///
    /// Silence is read from the beacons' log, by the append times of a process's own beacons
    /// (the topic is created with `message.timestamp.type=LogAppendTime`): a process that was
    /// starved or paused itself, or reads late, does not take the others' unread beacons for
    /// silence, and a stall of the topic's partition (its leader moving) is not silence either.
    /// A process that was merely paused for longer than `timeout` is removed like a dead one
    /// and fenced: its transactions and offset commits are refused (the group's generation
    /// moved on), and it rejoins when it resumes.
    ///
    /// Only the members a process announced in its own beacons are removed, each by its member
    /// id and `group.instance.id` together: a process that restarted meanwhile has new member
    /// ids, which the coordinator does not remove by the old ones. Needs
    /// [`static_membership`](Self::static_membership) and a `PLAINTEXT` listener (librdkafka
    /// has no member removal call, and kstate's own speaks plain TCP). Off by default.
    pub fn failure_detection(&mut self, timeout: Duration) -> &mut Self {
        self.config.failure_detection = Some(timeout);
        self
    }

    /// What happens to a record that cannot be processed: [`ErrorPolicy::Fail`] (the
    /// default), [`ErrorPolicy::LogAndContinue`] or [`ErrorPolicy::DeadLetter`].
    pub fn error_policy(&mut self, policy: ErrorPolicy) -> &mut Self {
        self.config.error_policy = policy;
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

    /// How long a task may keep failing to start because the cluster is in motion (Kafka
    /// Streams' `task.timeout.ms`, KIP-572, with its default of 5 minutes). A restore whose
    /// broker did not answer within its open timeout, a start that could not learn where its
    /// inputs start, a seek refused while the group rebalances: each is tried again, with new
    /// clients, until the task has failed to start for this long (under exactly-once a
    /// worker's transactional producer whose init met a moving coordinator too); then the application fails
    /// with [`TaskError::TimedOut`](crate::TaskError::TimedOut). The application's start asks
    /// for its inputs' metadata for as long. A refused login or certificate fails at once
    /// whatever this is; `Duration::ZERO` fails at the first such failure.
    pub fn task_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.config.task_timeout = timeout;
        self
    }

    /// Adds an input topic. All inputs must have the same partition count (checked at start):
    /// task *p* is partition *p* of every input, and runs only where all of them are assigned.
    pub fn input(&mut self, topic: impl Into<String>) -> &mut Self {
        self.config.inputs.push(topic.into());
        self
    }

    /// Where the stores live: every task's in one RocksDB at `<dir>/<app-id>/rocksdb/`, which
    /// one running instance of the application holds (a second instance on the same directory
    /// fails to start, naming it: give each its own). Default: `kstate` in the system's
    /// temporary directory (set it: a temporary directory may not survive a reboot, and then
    /// every restart restores in full).
    pub fn state_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.config.state_dir = dir.into();
        self
    }

    /// Worker threads, each one member of the consumer group. Default 1.
    pub fn threads(&mut self, n: usize) -> &mut Self {
        self.config.threads = n;
        self
    }

    /// Restorer threads of the process, shared by its workers: how many new tasks restore at
    /// once. Default: as many as [`threads`](Self::threads), at least 2. A restore with little
    /// to replay mostly waits for the broker, so a few side by side ready a large assignment (a
    /// start, a failover) several times sooner; each thread keeps its own Kafka clients (a
    /// replaying consumer, a metadata client and an admin client). At least 1.
    pub fn restore_threads(&mut self, n: usize) -> &mut Self {
        self.config.restore_threads = Some(n.max(1));
        self
    }

    /// How often each worker commits its tasks. Default 100 ms: a commit is one producer flush
    /// and one RocksDB write batch per store.
    pub fn commit_interval(&mut self, interval: Duration) -> &mut Self {
        self.config.commit_interval = interval;
        self
    }

    /// The replication factor of the topics the application creates (changelogs, the liveness
    /// topic), and the least an existing changelog must have. Default
    /// [`BROKER_DEFAULT_REPLICATION`](kstate_kafka::BROKER_DEFAULT_REPLICATION): the broker's
    /// `default.replication.factor`, as Kafka Streams' `replication.factor` defaults to (3 on
    /// a production cluster configured so, 1 on a development broker).
    pub fn replication_factor(&mut self, n: i32) -> &mut Self {
        self.config.replication_factor = n;
        self
    }

    /// The consumer group protocol. Default: [`GroupProtocol::CooperativeSticky`] for one input,
    /// [`GroupProtocol::Eager`] for several (which cooperative-sticky cannot co-partition: it
    /// is refused for them).
    pub fn group_protocol(&mut self, protocol: GroupProtocol) -> &mut Self {
        self.group_protocol = Some(protocol);
        self
    }

    /// The most a commit may wait for the broker: the outputs' and changelogs'
    /// acknowledgements, the offsets, the transaction (under exactly-once, at most the
    /// transaction timeout). A revocation whose commit does not complete in time drops its
    /// tasks without a commit (their input is then replayed by the next owner). A shutdown is
    /// bounded by it too: the last offset commit's answer is waited for up to this long, leaving
    /// the group until the same deadline (at least 1 s), and a consumer that has not closed by
    /// then (the broker does not answer) finishes closing on a thread of its own, so that
    /// `Running::wait` returns. Default 30 s.
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
        let handle = StoreHandle::new(self.config.stores.len(), &name);
        self.config.stores.push(StoreSpec {
            name,
            options,
            kind: StoreKind::KeyValue,
        });
        handle
    }

    /// Declares a window store of every task ([`kstate_core::WindowStore`]): values per key and
    /// window, kept for the options' retention behind stream time, segments dropped by range
    /// delete. Its changelog, `<app-id>-<name>-changelog`, is Kafka Streams' window changelog
    /// (`cleanup.policy=compact,delete`, retention + 1 day).
    pub fn window_store(
        &mut self,
        name: impl Into<String>,
        options: WindowOptions,
    ) -> WindowHandle {
        let name = name.into();
        let handle = WindowHandle::new(self.config.stores.len(), &name, options);
        self.config.stores.push(StoreSpec {
            name,
            options: StoreOptions::default(),
            kind: StoreKind::Window(options),
        });
        handle
    }

    /// Declares a session store of every task ([`kstate_core::SessionStore`]); its changelog is
    /// Kafka Streams' session changelog.
    pub fn session_store(
        &mut self,
        name: impl Into<String>,
        options: SessionOptions,
    ) -> SessionHandle {
        let name = name.into();
        let handle = SessionHandle::new(self.config.stores.len(), &name, options);
        self.config.stores.push(StoreSpec {
            name,
            options: StoreOptions::default(),
            kind: StoreKind::Session(options),
        });
        handle
    }

    /// Declares a TTL store of every task ([`kstate_core::TtlStore`]): keys expire after the
    /// options' time to live, and each commit sweeps up to 10,000 of them (their tombstones are
    /// part of that commit).
    pub fn ttl_store(&mut self, name: impl Into<String>, options: TtlOptions) -> TtlHandle {
        let name = name.into();
        let handle = TtlHandle::new(self.config.stores.len(), &name, options);
        self.config.stores.push(StoreSpec {
            name,
            options: StoreOptions::default(),
            kind: StoreKind::Ttl(options),
        });
        handle
    }

    /// The application, with `factory` making each task's processor.
    pub fn build(
        &self,
        factory: impl Fn(TaskId) -> Box<dyn Processor> + Send + Sync + 'static,
    ) -> Result<App, TaskError> {
        Ok(App::new(self.resolved()?, Arc::new(factory)))
    }

    /// The configuration the application runs with, checked.
    pub(crate) fn resolved(&self) -> Result<AppConfig, TaskError> {
        let mut config = self.config.clone();
        config.group_protocol = self.checked_protocol()?;
        self.check(&config)?;
        Ok(config)
    }

    /// The protocol to run: the one set, or the default for the inputs; refused if it cannot
    /// keep partition *p* of several inputs together.
    fn checked_protocol(&self) -> Result<GroupProtocol, TaskError> {
        let c = &self.config;
        let protocol = self.group_protocol.unwrap_or_else(|| {
            if c.standby_replicas > 0 {
                GroupProtocol::Eager
            } else {
                GroupProtocol::default_for(c.inputs.len())
            }
        });
        if c.inputs.len() > 1 {
            let overridden = ["partition.assignment.strategy", "group.remote.assignor"]
                .iter()
                .any(|key| {
                    c.consumer_properties
                        .get(*key)
                        .is_some_and(|v| v != "range")
                });
            if !protocol.co_partitions() || overridden {
                return Err(TaskError::CannotCoPartition {
                    protocol: if overridden {
                        "set by consumer properties"
                    } else {
                        protocol.name()
                    },
                    inputs: c.inputs.clone(),
                });
            }
        }
        Ok(protocol)
    }

    fn check(&self, c: &AppConfig) -> Result<(), TaskError> {
        let invalid = |m: String| Err(TaskError::InvalidConfig(m));
        if let Some(problem) = name_problem(&c.application_id) {
            return invalid(format!(
                "application id {:?} {problem} (it names the consumer group, a directory and the changelog topics)",
                c.application_id
            ));
        }
        if c.inputs.is_empty() {
            return invalid("no input topic".into());
        }
        let mut inputs = BTreeSet::new();
        for input in &c.inputs {
            if !inputs.insert(input) {
                return invalid(format!("input topic {input:?} is given twice"));
            }
        }
        if c.threads == 0 {
            return invalid("threads must be at least 1".into());
        }
        if c.commit_interval.is_zero() {
            return invalid("the commit interval must be above zero".into());
        }
        if c.guarantee == ProcessingGuarantee::ExactlyOnce
            && (c.transaction_timeout < Duration::from_secs(1)
                || c.transaction_timeout <= c.commit_interval)
        {
            return invalid(format!(
                "the transaction timeout ({:?}) must be at least 1 s and above the commit interval ({:?})",
                c.transaction_timeout, c.commit_interval
            ));
        }
        if (c.guarantee == ProcessingGuarantee::ExactlyOnce || c.static_membership)
            && let Some(problem) = name_problem(&c.instance_id)
        {
            return invalid(format!(
                "instance id {:?} {problem} (it names transactional ids and group members)",
                c.instance_id
            ));
        }
        if c.static_membership {
            if !self.instance_id_set {
                return invalid(
                    "static membership needs an instance id of this process's own (AppBuilder::instance_id): with a random one every start would be a new static member"
                        .into(),
                );
            }
            if c.group_protocol == GroupProtocol::Consumer {
                return invalid(
                    "static membership needs the classic protocol: under GroupProtocol::Consumer librdkafka fails a restarted member whose predecessor's session has not expired (UNRELEASED_INSTANCE_ID)"
                        .into(),
                );
            }
        }
        if c.standby_replicas > MAX_STANDBY_REPLICAS {
            return invalid(format!(
                "{} standby replicas: at most {MAX_STANDBY_REPLICAS} are supported (a standby of every task that up to that many failures at once would bring here)",
                c.standby_replicas
            ));
        }
        if c.standby_replicas > 0 {
            if !c.static_membership || c.group_protocol != GroupProtocol::Eager {
                return invalid(format!(
                    "standby replicas need static membership and GroupProtocol::Eager (the range assignor over instance ids, whose assignment after a failure can be computed); this application has static membership {} and the {} protocol",
                    if c.static_membership { "on" } else { "off" },
                    c.group_protocol.name()
                ));
            }
            if c.consumer_properties.contains_key("client.id") {
                return invalid(
                    "standby replicas need each worker's client.id to be its group.instance.id (how the other processes see the group's members): do not set client.id".into(),
                );
            }
        }
        if let Some(timeout) = c.failure_detection {
            if !c.static_membership {
                return invalid(
                    "failure detection needs static membership: members are removed by their group.instance.id".into(),
                );
            }
            if timeout < Duration::from_millis(100) {
                return invalid(format!(
                    "the failure detection timeout ({timeout:?}) must be at least 100 ms"
                ));
            }
            let protocol = c.client.get("security.protocol").unwrap_or("plaintext");
            if !protocol.eq_ignore_ascii_case("plaintext") {
                return invalid(format!(
                    "failure detection removes members with a request of its own over plain TCP: security.protocol {protocol} is not supported"
                ));
            }
            if c.consumer_properties.contains_key("client.id") {
                return invalid(
                    "failure detection needs each worker's client.id to be its group.instance.id (how the other processes find a dead process's members): do not set client.id".into(),
                );
            }
        }
        if let ErrorPolicy::DeadLetter(topic) = &c.error_policy
            && let Some(problem) = name_problem(topic)
        {
            return invalid(format!("dead-letter topic {topic:?} {problem}"));
        }
        // Kafka refuses a topic whose name collides with another's once '.' and '_' are
        // treated alike: such stores would fail at their first restore.
        let mut names = BTreeSet::new();
        let mut topics: BTreeMap<String, &str> = BTreeMap::new();
        for store in &c.stores {
            if !names.insert(store.name.as_str()) {
                return invalid(format!("store {:?} is declared twice", store.name));
            }
            if let Some(problem) = name_problem(&store.name) {
                return invalid(format!(
                    "store name {:?} {problem} (it names a directory and a topic)",
                    store.name
                ));
            }
            let checked = match &store.kind {
                StoreKind::Window(options) => options.validate(&store.name),
                StoreKind::Session(options) => options.validate(&store.name),
                StoreKind::Ttl(options) => options.validate(&store.name),
                StoreKind::KeyValue => Ok(()),
            };
            if let Err(e) = checked {
                return invalid(e.to_string());
            }
            let topic = changelog_topic(&c.application_id, &store.name);
            if topic.len() > MAX_TOPIC_NAME {
                return invalid(format!(
                    "the changelog topic of store {:?}, {topic}, is longer than Kafka's {MAX_TOPIC_NAME} characters",
                    store.name
                ));
            }
            if let Some(other) = topics.insert(topic.replace('.', "_"), &store.name) {
                return invalid(format!(
                    "stores {other:?} and {:?} have changelog topics that Kafka treats as the same name ('.' and '_' collide)",
                    store.name
                ));
            }
        }
        Ok(())
    }
}

/// Why `name` cannot name a group, a directory or a topic, if it cannot.
fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if !name
        .chars()
        .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
    {
        Some("must be ASCII letters, digits, '.', '_' or '-'")
    } else if name.chars().all(|ch| ch == '.') {
        Some("must not be only dots (it would name this or the parent directory)")
    } else {
        None
    }
}

/// A fresh instance id: the process id and the start time, enough to tell two processes apart.
fn random_instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("p{}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Record;
    use crate::processor::Context;

    struct Nothing;

    impl Processor for Nothing {
        fn process(
            &mut self,
            _: &mut Context<'_>,
            _: &Record<'_>,
        ) -> Result<(), kstate_core::BoxError> {
            Ok(())
        }
    }

    fn nothing(_: TaskId) -> Box<dyn Processor> {
        Box::new(Nothing)
    }

    fn builder(inputs: &[&str]) -> AppBuilder {
        let mut b = App::builder("app", "127.0.0.1:1");
        for input in inputs {
            b.input(*input);
        }
        b
    }

    fn refusal(builder: &AppBuilder) -> TaskError {
        match builder.build(nothing) {
            Ok(_) => panic!("built"),
            Err(e) => e,
        }
    }

    #[test]
    fn several_inputs_default_to_a_protocol_that_co_partitions_them() {
        let b = builder(&["a", "b"]);
        b.build(nothing).expect("builds");
        assert_eq!(b.checked_protocol().unwrap(), GroupProtocol::Eager);
        assert_eq!(
            builder(&["a"]).checked_protocol().unwrap(),
            GroupProtocol::CooperativeSticky
        );
    }

    #[test]
    fn cooperative_sticky_is_refused_for_several_inputs_with_the_protocols_to_use() {
        let mut b = builder(&["a", "b"]);
        b.group_protocol(GroupProtocol::CooperativeSticky);
        let error = refusal(&b);
        assert!(
            matches!(error, TaskError::CannotCoPartition { .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains("GroupProtocol::Eager"),
            "{error}"
        );
        let mut b = builder(&["a", "b"]);
        b.consumer_property("partition.assignment.strategy", "cooperative-sticky");
        assert!(matches!(refusal(&b), TaskError::CannotCoPartition { .. }));
        let mut b = builder(&["a", "b"]);
        b.group_protocol(GroupProtocol::Consumer)
            .consumer_property("group.remote.assignor", "uniform");
        assert!(matches!(refusal(&b), TaskError::CannotCoPartition { .. }));
        for protocol in [GroupProtocol::Eager, GroupProtocol::Consumer] {
            let mut b = builder(&["a", "b", "c"]);
            b.group_protocol(protocol);
            b.build(nothing).expect("co-partitions");
        }
    }

    #[test]
    fn store_and_application_names_that_would_break_directories_or_topics_are_refused() {
        for name in [".", "..", "...", "", "a/b"] {
            let mut b = builder(&["in"]);
            b.store::<u64, u64>(name, StoreOptions::default());
            assert!(
                matches!(refusal(&b), TaskError::InvalidConfig(_)),
                "store {name:?}"
            );
            let mut b = App::builder(name, "127.0.0.1:1");
            b.input("in");
            assert!(
                matches!(refusal(&b), TaskError::InvalidConfig(_)),
                "app {name:?}"
            );
        }
        let mut b = builder(&["in"]);
        b.store::<u64, u64>("a.b", StoreOptions::default());
        b.store::<u64, u64>("a_b", StoreOptions::default());
        let error = refusal(&b);
        assert!(error.to_string().contains("collide"), "{error}");
        let mut b = builder(&["in"]);
        b.store::<u64, u64>("x".repeat(240), StoreOptions::default());
        assert!(refusal(&b).to_string().contains("249"));
        let mut b = builder(&["in", "in"]);
        b.group_protocol(GroupProtocol::Eager);
        assert!(refusal(&b).to_string().contains("twice"));
    }

    #[test]
    fn standbys_need_static_members_the_range_assignor_and_their_client_ids() {
        let mut b = builder(&["in"]);
        b.standby_replicas(1);
        assert!(refusal(&b).to_string().contains("static membership"));
        b.instance_id("host-1").static_membership(true);
        // Left unset, the protocol is the eager range assignor's, even with one input.
        b.build(nothing).expect("builds");
        assert_eq!(
            b.resolved().expect("resolves").group_protocol,
            GroupProtocol::Eager
        );
        b.group_protocol(GroupProtocol::CooperativeSticky);
        assert!(refusal(&b).to_string().contains("GroupProtocol::Eager"));
        b.group_protocol(GroupProtocol::Eager);
        b.consumer_property("client.id", "mine");
        assert!(refusal(&b).to_string().contains("client.id"));
        let mut b = builder(&["in"]);
        b.instance_id("host-1")
            .static_membership(true)
            .standby_replicas(3);
        assert!(refusal(&b).to_string().contains("at most 2"));
    }

    #[test]
    fn failure_detection_needs_static_members_plain_tcp_and_their_client_ids() {
        let mut b = builder(&["in"]);
        b.failure_detection(Duration::from_secs(1));
        assert!(refusal(&b).to_string().contains("static membership"));
        b.instance_id("host-1").static_membership(true);
        b.build(nothing).expect("builds");
        b.failure_detection(Duration::from_millis(10));
        assert!(refusal(&b).to_string().contains("at least 100 ms"));
        b.failure_detection(Duration::from_secs(1))
            .consumer_property("client.id", "mine");
        assert!(refusal(&b).to_string().contains("client.id"));
        let mut b = App::builder(
            "app",
            ClientProperties::new("127.0.0.1:1").set("security.protocol", "SSL"),
        );
        b.input("in")
            .instance_id("host-1")
            .static_membership(true)
            .failure_detection(Duration::from_secs(1));
        assert!(refusal(&b).to_string().contains("security.protocol SSL"));
    }

    #[test]
    fn static_membership_needs_an_instance_id_and_the_classic_protocol() {
        let mut b = builder(&["in"]);
        b.static_membership(true);
        assert!(refusal(&b).to_string().contains("instance id"));
        b.instance_id("host-1");
        b.build(nothing).expect("builds");
        assert_eq!(
            b.config.group_instance_id(1).as_deref(),
            Some("app-host-1-1")
        );
        b.group_protocol(GroupProtocol::Consumer);
        assert!(refusal(&b).to_string().contains("classic protocol"));
    }

    #[test]
    fn a_long_transaction_timeout_gives_restores_time_for_a_crashed_members_transaction() {
        let mut b = builder(&["in"]);
        b.processing_guarantee(ProcessingGuarantee::ExactlyOnce)
            .transaction_timeout(Duration::from_secs(60));
        let config = b.resolved().unwrap();
        let changelog_wait = config.restore_open_timeout();
        // The broker aborts a crashed member's transaction up to the transaction timeout plus
        // its cleanup interval (10 s) after its last write: a restore must outwait that.
        assert!(
            changelog_wait >= Duration::from_secs(70),
            "{changelog_wait:?}"
        );
        // And every wait inside a transaction is shorter than the transaction timeout.
        assert!(config.delivery_timeout() < config.transaction_timeout);
        assert!(config.commit_timeout() <= config.transaction_timeout);
    }
}
