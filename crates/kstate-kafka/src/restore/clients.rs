//! The Kafka clients a restore talks through, kept from one restore to the next.
//!
//! A restore needs three clients: a `read_uncommitted` metadata client (the topic check and the
//! real high watermark), an admin client (creating the topic, reading its settings) and the
//! `read_committed` consumer that replays. A new client knows no partition leader yet: on this
//! machine its first offsets query waited about 700 ms, the topic check took 160 ms and closing
//! the consumer 100 ms: about a second per store, against 90 ms to replay its 50,000 records. A
//! task runtime restores store after store on one thread (every task moved by a failover), so it
//! keeps one set and hands it to each restore ([`RestoredStore::restore_with`]); a standalone
//! open makes a set for itself.
//!
//! Concurrent restores (a task runtime's restorer threads) each need a replaying consumer of
//! their own, but can share the rest: a set made [`RestoreClients::sharing`] one
//! [`RestoreCluster`] adds only a consumer, and finds the topic checks and prefetched ends any
//! set of that cluster made.
//!
//! The replaying consumer is unassigned when a restore ends, however it ends; librdkafka drops
//! messages of a removed assignment, so the next restore reads only its own partition.
//!
//! The set also remembers, for [`TOPIC_CHECK_TTL`], which changelog topics it found as their
//! configurations require ([`crate::topic`]): a task runtime restores one store per partition of
//! the same few topics, and checking each topic again for every partition cost three round
//! trips (two metadata requests and a `DescribeConfigs`) per store. Within that time only the
//! end offsets of each partition are asked for; if that fails (the topic deleted meanwhile),
//! the restore checks the topic again before it reports anything.
//!
//! A task runtime that is handed many tasks at once asks for the ends of all their changelog
//! partitions together ([`RestoreClients::prefetch_ends`]): three `ListOffsets` requests for the
//! whole assignment instead of four for each store, which were most of a restart's time with a
//! thousand tasks. Each prefetched end serves one restore, within [`PREFETCHED_END_TTL`], and
//! only a restore that resumes after its stored position or fills an empty store: a store the
//! prefetched end would refuse, rebuild or reseed is decided again on an end captured for it
//! alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate_core::sync::lock;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};

#[cfg(doc)]
use super::RestoredStore;
use super::consumer::{EndIsNews, RestoreConsumer};
use super::end::{Watermarks, capture_ends};
use super::{CancelToken, RESTORE_FETCH_SETTINGS};
use crate::client_properties::ClientProperties;
use crate::config::ChangelogConfig;
use crate::connection::ConnectionWatch;
use crate::error::ChangelogError;
use crate::topic::{CheckedTopic, TopicFacts, create_topics, ensure_topic, kafka};

/// The clients of restores against one cluster (the same bootstrap servers and client
/// properties). Not for concurrent restores: one restore at a time uses a set. Sets made
/// [`sharing`](Self::sharing) one [`RestoreCluster`] differ only in their replaying consumer.
pub struct RestoreClients {
    cluster: Arc<RestoreCluster>,
    /// `read_committed`: replays.
    pub(crate) consumer: RestoreConsumer,
}

/// The part of [`RestoreClients`] that concurrent restores share: a metadata client, an admin
/// client, and what they learned (topics found as required, ends asked for ahead). A process's
/// restorer threads share one, so that they cost one replaying consumer each and not three
/// clients, and an end one of them prefetched serves a restore on any of them.
pub struct RestoreCluster {
    client: ClientProperties,
    /// `read_uncommitted`: metadata and the high watermark. The first contact with the cluster,
    /// so it watches for authentication and TLS failures (see [`ConnectionWatch`]).
    probe: BaseConsumer<ConnectionWatch>,
    /// Creates the topic, reads its settings.
    admin: AdminClient<DefaultClientContext>,
    /// Topics found as their configurations require, and when.
    checked: Mutex<HashMap<TopicCheck, (Instant, CheckedTopic)>>,
    /// Ends asked for ahead of their restores, and when.
    ends: Mutex<HashMap<(String, i32), (Instant, Watermarks)>>,
}

/// How long a topic found as its configuration requires is not checked again.
pub(crate) const TOPIC_CHECK_TTL: Duration = Duration::from_secs(10);

/// How long an end asked for ahead of its restore ([`RestoreClients::prefetch_ends`]) may serve
/// it. An end older than the restore is safe for a store that resumes (records written after it
/// are the store's own, or another writer's that the producer's offset checks catch), but the
/// older it is, the more a restore leaves to those checks.
pub const PREFETCHED_END_TTL: Duration = Duration::from_secs(10);

/// How long a prefetch waits for the broker at most: a prefetch is only a shortcut, and each
/// restore still has its own open timeout.
const PREFETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// A topic and what a configuration requires of it: two stores' configurations that require the
/// same share one check.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TopicCheck {
    topic: String,
    partitions: Option<i32>,
    replication_factor: i32,
    min_insync_replicas: Option<i32>,
    max_record_bytes: usize,
}

impl TopicCheck {
    fn of(config: &ChangelogConfig) -> Self {
        TopicCheck {
            topic: config.topic.clone(),
            partitions: config.partitions,
            replication_factor: config.replication_factor,
            min_insync_replicas: config.min_insync_replicas,
            max_record_bytes: config.max_record_bytes,
        }
    }
}

impl std::fmt::Debug for RestoreClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreClients")
            .field("client", &self.cluster.client)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RestoreCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreCluster")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl RestoreCluster {
    /// The shared clients for the cluster `config` names, with its client properties.
    pub fn new(config: &ChangelogConfig) -> Result<Self, ChangelogError> {
        let client = &config.client;
        let failed = |operation, source| kafka(config, operation, client.redact_error(source));
        let probe = client
            .client_config()
            .set("isolation.level", "read_uncommitted")
            .create_with_context(ConnectionWatch::default())
            .map_err(|source| failed("create metadata client", source))?;
        let admin = client
            .client_config()
            .create()
            .map_err(|source| failed("create admin client", source))?;
        Ok(RestoreCluster {
            client: client.clone(),
            probe,
            admin,
            checked: Mutex::default(),
            ends: Mutex::default(),
        })
    }

    /// Whether these clients talk to the cluster `config` names, as `config` would.
    pub fn suits(&self, config: &ChangelogConfig) -> bool {
        self.client == config.client
    }
}

impl RestoreClients {
    /// Clients for the cluster `config` names, with its client properties.
    pub fn new(config: &ChangelogConfig) -> Result<Self, ChangelogError> {
        Self::sharing(Arc::new(RestoreCluster::new(config)?), config)
    }

    /// A set that shares `cluster`'s clients and what they learned, with a replaying consumer
    /// of its own. `cluster` must [suit](RestoreCluster::suits) `config`: an
    /// [`InvalidConfig`](ChangelogError::InvalidConfig) error otherwise.
    pub fn sharing(
        cluster: Arc<RestoreCluster>,
        config: &ChangelogConfig,
    ) -> Result<Self, ChangelogError> {
        Self::with_settings(cluster, config, &[])
    }

    /// As [`sharing`](Self::sharing), with `overrides` of the replaying consumer's
    /// [`RESTORE_FETCH_SETTINGS`] (a follower's fetch wait).
    pub(crate) fn with_settings(
        cluster: Arc<RestoreCluster>,
        config: &ChangelogConfig,
        overrides: &[(&str, &str)],
    ) -> Result<Self, ChangelogError> {
        if !cluster.suits(config) {
            return Err(ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: format!(
                    "the shared restore clients were made for another cluster or other client \
                     properties ({cluster:?}); the changelog's are {:?}",
                    config.client
                ),
            });
        }
        let client = &config.client;
        let mut consumer = client.client_config();
        for (key, value) in RESTORE_FETCH_SETTINGS.iter().chain(overrides) {
            consumer.set(*key, *value);
        }
        let consumer = consumer
            .set("group.id", "kstate-restore")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            // If the log start moves past the position while restoring, fail instead of
            // skipping records silently; the next open then sees the truncation and rebuilds.
            .set("auto.offset.reset", "error")
            .create_with_context(EndIsNews)
            .map_err(|source| {
                kafka(
                    config,
                    "create restore consumer",
                    client.redact_error(source),
                )
            })?;
        Ok(RestoreClients { cluster, consumer })
    }

    /// The clients and knowledge this set shares with others.
    pub fn cluster(&self) -> &Arc<RestoreCluster> {
        &self.cluster
    }

    /// The `read_uncommitted` metadata client.
    pub(crate) fn probe(&self) -> &BaseConsumer<ConnectionWatch> {
        &self.cluster.probe
    }

    /// Creates the topics of `changelogs` that do not exist yet, all in one request, and checks
    /// them as a restore does; returns the topics it created. Each restore would create its own
    /// topic otherwise, one after another: with a thousand tasks of three stores, three
    /// 1,000-partition topics took 3, 10 and 10 s in turn (BENCHMARKS.md). Topics found are
    /// checked (and remembered for 10 s) as a restore checks them.
    ///
    /// Only for changelogs of stores known to hold no changelog position, such as those of a
    /// task with no local state: a store that holds one never creates its missing changelog
    /// ([`LostChangelog`](crate::LostChangelog)); its restore refuses, and creating the topic
    /// for it here would change what the refusal finds. `changelogs` must
    /// [suit](Self::suits) these clients.
    ///
    /// A new topic's partitions may have no leader yet when this returns (10–16 s for three
    /// topics of 1,000 partitions on one broker): a [`prefetch_ends`](Self::prefetch_ends) right
    /// after it may find no end for them, or fail; the task runtime asks again until it has
    /// every end, as a restore waits for its own.
    ///
    /// A `cancel`led call returns [`ChangelogError::Cancelled`] within a second, not after the
    /// open timeout the broker's silence would take.
    pub fn create_missing_topics(
        &self,
        changelogs: &[ChangelogConfig],
        cancel: Option<&CancelToken>,
    ) -> Result<Vec<String>, ChangelogError> {
        let mut asked = std::collections::HashSet::new();
        let mut missing = Vec::new();
        for config in changelogs {
            if asked.insert(TopicCheck::of(config))
                && self.checked(config).is_none()
                && self.ensure_topic(config, false, cancel)?.is_none()
            {
                missing.push(config);
            }
        }
        create_topics(&missing, &self.cluster.admin)?;
        for config in &missing {
            // Verifies (waiting for the new topic's metadata) and remembers it; `create` only
            // in case its metadata does not show it yet, which creating again finds existing.
            self.ensure_topic(config, true, cancel)?;
        }
        Ok(missing.iter().map(|c| c.topic.clone()).collect())
    }

    /// Asks for the ends of all of `changelogs`' partitions at once, for their restores through
    /// these clients within [`PREFETCHED_END_TTL`]; returns how many were found. Each topic is
    /// checked first, as a restore checks it (but never created). A partition the answer
    /// leaves out (its topic missing or not as required, no leader yet, an open transaction below its
    /// end) is asked for by its own restore, as without a prefetch; so is every partition if
    /// this fails, which is why a caller may ignore the error. `changelogs` must
    /// [suit](Self::suits) these clients.
    /// A `cancel`led call stops checking topics within a second.
    pub fn prefetch_ends(
        &self,
        changelogs: &[ChangelogConfig],
        cancel: Option<&CancelToken>,
    ) -> Result<usize, ChangelogError> {
        // Only topics found as required: a missing topic is left to the restores, which may
        // create it (and a client that was asked about it before it existed fails to find its
        // partitions afterwards).
        let mut usable: HashMap<TopicCheck, bool> = HashMap::new();
        let changelogs: Vec<&ChangelogConfig> = changelogs
            .iter()
            .filter(|c| {
                *usable.entry(TopicCheck::of(c)).or_insert_with(|| {
                    self.checked(c).is_some()
                        || matches!(self.ensure_topic(c, false, cancel), Ok(Some(_)))
                })
            })
            .collect();
        let Some(first) = changelogs.first() else {
            return Ok(0);
        };
        let partitions: Vec<(&str, i32)> = changelogs
            .iter()
            .map(|c| (c.topic.as_str(), c.partition))
            .collect();
        let at = Instant::now();
        let ends = capture_ends(
            &partitions,
            &self.cluster.probe,
            &self.consumer,
            first.open_timeout.min(PREFETCH_TIMEOUT),
        )
        .map_err(|source| kafka(first, "prefetch end offsets", source))?;
        let found = ends.len();
        let mut known = lock(&self.cluster.ends);
        known.retain(|_, (when, _)| when.elapsed() < PREFETCHED_END_TTL);
        known.extend(ends.into_iter().map(|(key, end)| (key, (at, end))));
        Ok(found)
    }

    /// The prefetched end of `config`'s partition, if one younger than [`PREFETCHED_END_TTL`]
    /// is here; it serves one restore only.
    pub(crate) fn take_prefetched_end(&self, config: &ChangelogConfig) -> Option<Watermarks> {
        let mut known = lock(&self.cluster.ends);
        let (at, end) = known.remove(&(config.topic.clone(), config.partition))?;
        (at.elapsed() < PREFETCHED_END_TTL).then_some(end)
    }

    /// What a check of `config`'s topic found less than [`TOPIC_CHECK_TTL`] ago, if its
    /// partition is there with enough replicas.
    pub(crate) fn checked(&self, config: &ChangelogConfig) -> Option<TopicFacts> {
        let checked = lock(&self.cluster.checked);
        let (at, topic) = checked.get(&TopicCheck::of(config))?;
        let fits =
            config.partition < topic.partitions && topic.min_replicas >= config.replication_factor;
        (at.elapsed() < TOPIC_CHECK_TTL && fits).then(|| topic.facts.clone())
    }

    /// Makes sure `config`'s topic exists (creating it when `create` allows) as `config`
    /// requires ([`crate::topic`]), and remembers it for [`TOPIC_CHECK_TTL`]. `Ok(None)`: it is
    /// missing and was not created.
    pub(crate) fn ensure_topic(
        &self,
        config: &ChangelogConfig,
        create: bool,
        cancel: Option<&CancelToken>,
    ) -> Result<Option<TopicFacts>, ChangelogError> {
        let cancelled = || cancel.is_some_and(CancelToken::is_cancelled);
        let (probe, admin) = (&self.cluster.probe, &self.cluster.admin);
        let Some(checked) = ensure_topic(config, probe, admin, create, &cancelled)? else {
            return Ok(None);
        };
        let facts = checked.facts.clone();
        lock(&self.cluster.checked).insert(TopicCheck::of(config), (Instant::now(), checked));
        Ok(Some(facts))
    }

    /// Whether these clients talk to the cluster `config` names, as `config` would.
    pub fn suits(&self, config: &ChangelogConfig) -> bool {
        self.cluster.suits(config)
    }
}

/// Unassigns the replaying consumer when the restore that assigned it ends.
pub(crate) struct Unassign<'a>(pub(crate) &'a RestoreConsumer);

impl Drop for Unassign<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.unassign() {
            tracing::warn!(error = %e, "could not unassign the restore consumer");
        }
    }
}
