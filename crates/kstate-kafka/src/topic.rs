//! Changelog topic management: create on first use, verify on every open.
//!
//! A changelog is compacted (`cleanup.policy=compact`): only the latest record per key matters, and
//! tombstones delete. An existing topic with another partition count or cleanup policy is an
//! error, never a silent write to what may be the wrong partition (a store's partition number
//! only means something if the topic is partitioned the way the task expects). So is a topic with
//! fewer replicas or a lower `min.insync.replicas` than configured, or a `max.message.bytes` below
//! the store's [`max_record_bytes`](crate::ChangelogConfig::max_record_bytes) (the broker would
//! reject records the store accepted, and poison it).
//!
//! A missing topic is created only when the caller allows it: a store that holds a position must
//! not recreate its lost changelog silently (see [`LostChangelog`](crate::LostChangelog)).

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, ConfigResource, ConfigResourceResult, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::ChangelogConfig;
use crate::connection::{ConnectionWatch, MetadataError, fetch_metadata_while};
use crate::error::ChangelogError;

/// What the store needs to know of its topic.
#[derive(Debug, Clone)]
pub(crate) struct TopicFacts {
    /// How long compaction keeps tombstones (`delete.retention.ms`), if the broker said.
    pub(crate) delete_retention: Option<Duration>,
}

/// What a topic check found.
#[derive(Debug, Clone)]
pub(crate) struct CheckedTopic {
    /// The topic's partition count.
    pub(crate) partitions: i32,
    /// The fewest replicas of any of its partitions.
    pub(crate) min_replicas: i32,
    /// What the store needs to know of it.
    pub(crate) facts: TopicFacts,
}

/// Makes sure the changelog topic exists (creating it when `create` allows), is compacted and
/// has the configured partition count and settings, asking through `probe` (a
/// `read_uncommitted` client that watches the connection) and `admin`. `Ok(None)`: it is missing
/// and was not created.
pub(crate) fn ensure_topic(
    config: &ChangelogConfig,
    probe: &BaseConsumer<ConnectionWatch>,
    admin: &AdminClient<DefaultClientContext>,
    create: bool,
    cancelled: &dyn Fn() -> bool,
) -> Result<Option<CheckedTopic>, ChangelogError> {
    let outside = match config.partitions {
        Some(n) => config.partition < 0 || config.partition >= n,
        None => config.partition < 0,
    };
    if outside {
        return Err(ChangelogError::InvalidConfig {
            topic: config.topic.clone(),
            message: format!(
                "partition {} is outside 0..{}",
                config.partition,
                config.partitions.unwrap_or(i32::MAX)
            ),
        });
    }
    // The first contact with the cluster: a wrong password or certificate ends it at once.
    let metadata = fetch_metadata_while(probe, Some(&config.topic), config.open_timeout, cancelled)
        .map_err(|e| match e {
            MetadataError::Security(failure) => ChangelogError::Security {
                bootstrap_servers: config.bootstrap_servers().to_string(),
                topic: config.topic.clone(),
                failure,
            },
            MetadataError::Timeout { error, last_error } => ChangelogError::BrokerUnreachable {
                bootstrap_servers: config.bootstrap_servers().to_string(),
                topic: config.topic.clone(),
                timeout: config.open_timeout,
                source: error,
                last_error,
            },
            MetadataError::Cancelled => cancelled_error(config),
        })?;
    let topic = metadata.topics().iter().find(|t| t.name() == config.topic);
    let exists = topic.is_some_and(|t| t.error().is_none() && !t.partitions().is_empty());
    if !exists {
        if !create {
            return Ok(None);
        }
        create_topics(&[config], admin)?;
    }
    verify_topic(config, probe, admin, cancelled).map(Some)
}

fn cancelled_error(config: &ChangelogConfig) -> ChangelogError {
    ChangelogError::Cancelled {
        topic: config.topic.clone(),
        partition: config.partition,
    }
}

pub(crate) fn kafka(
    config: &ChangelogConfig,
    operation: &'static str,
    source: KafkaError,
) -> ChangelogError {
    ChangelogError::Kafka {
        topic: config.topic.clone(),
        partition: config.partition,
        operation,
        source,
    }
}

/// Runs an admin future to completion on this thread. rdkafka's admin client drives its futures
/// from its own background thread, so parking until woken is all an executor has to do; this
/// keeps the store free of an async runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// The topic settings a changelog is created with, as `(name, value)`.
fn topic_settings(config: &ChangelogConfig) -> Vec<(&'static str, String)> {
    let mut settings = match config.retention {
        None => vec![("cleanup.policy", "compact".to_string())],
        Some(retention) => vec![
            ("cleanup.policy", "compact,delete".to_string()),
            ("retention.ms", retention.as_millis().to_string()),
        ],
    };
    if let Some(min_isr) = config.min_insync_replicas {
        settings.push(("min.insync.replicas", min_isr.to_string()));
    }
    if config.max_record_bytes > crate::config::DEFAULT_MAX_RECORD_BYTES {
        let limit = config.max_record_bytes + crate::config::RECORD_OVERHEAD;
        settings.push(("max.message.bytes", limit.to_string()));
    }
    settings
}

/// Creates the changelog topics of `configs` (distinct topics) in one `CreateTopics` request: the
/// broker works on them together, where one request after another waits for each in turn. A
/// topic another client created first is no error; it is verified like any existing topic.
pub(crate) fn create_topics(
    configs: &[&ChangelogConfig],
    admin: &AdminClient<DefaultClientContext>,
) -> Result<(), ChangelogError> {
    let Some(&first) = configs.first() else {
        return Ok(());
    };
    let mut partitions = Vec::with_capacity(configs.len());
    for config in configs {
        let Some(n) = config.partitions else {
            return Err(ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: "the topic does not exist, and creating it needs its partition count: \
                          set ChangelogConfig::partitions to the task input's partition count"
                    .into(),
            });
        };
        partitions.push(n);
    }
    let settings: Vec<_> = configs.iter().map(|c| topic_settings(c)).collect();
    let topics: Vec<NewTopic<'_>> = configs
        .iter()
        .zip(&partitions)
        .zip(&settings)
        .map(|((config, &n), settings)| {
            settings.iter().fold(
                NewTopic::new(
                    &config.topic,
                    n,
                    TopicReplication::Fixed(config.replication_factor),
                ),
                |topic, (name, value)| topic.set(name, value),
            )
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(first.open_timeout));
    let results = block_on(admin.create_topics(&topics, &options))
        .map_err(|source| kafka(first, "create changelog topic", source))?;
    // One result per topic, named.
    let config_of = |name: &str| configs.iter().find(|c| c.topic == name).copied();
    for result in results {
        match result {
            Ok(name) => tracing::info!(topic = %name, "created changelog topic"),
            // Another task created it first: verified below like any existing topic.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(kafka(
                    config_of(&name).unwrap_or(first),
                    "create changelog topic",
                    KafkaError::AdminOp(code),
                ));
            }
        }
    }
    Ok(())
}

fn verify_topic(
    config: &ChangelogConfig,
    probe: &BaseConsumer<ConnectionWatch>,
    admin: &AdminClient<DefaultClientContext>,
    cancelled: &dyn Fn() -> bool,
) -> Result<CheckedTopic, ChangelogError> {
    // Metadata of a just-created topic can take a moment to show every partition.
    let deadline = std::time::Instant::now() + config.open_timeout;
    let (actual, replicas, min_replicas, brokers) = loop {
        let metadata =
            fetch_metadata_while(probe, Some(&config.topic), config.open_timeout, cancelled)
                .map_err(|e| match e {
                    MetadataError::Timeout { error, .. } => {
                        kafka(config, "read topic metadata", error)
                    }
                    MetadataError::Cancelled => cancelled_error(config),
                    MetadataError::Security(failure) => ChangelogError::Security {
                        bootstrap_servers: config.bootstrap_servers().to_string(),
                        topic: config.topic.clone(),
                        failure,
                    },
                })?;
        let brokers = metadata.brokers().len();
        let (count, replicas, min_replicas) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == config.topic && t.error().is_none())
            .map_or((0, 0, 0), |t| {
                let replicas = t
                    .partitions()
                    .iter()
                    .find(|p| p.id() == config.partition)
                    .map_or(0, |p| p.replicas().len() as i32);
                let min_replicas = t
                    .partitions()
                    .iter()
                    .map(|p| p.replicas().len() as i32)
                    .min()
                    .unwrap_or(0);
                (t.partitions().len() as i32, replicas, min_replicas)
            });
        if count > 0 || std::time::Instant::now() >= deadline {
            break (count, replicas, min_replicas, brokers);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let settings = |problem: String| ChangelogError::TopicSettings {
        topic: config.topic.clone(),
        problem,
    };
    match config.partitions {
        Some(expected) if actual != expected => {
            return Err(ChangelogError::PartitionCountMismatch {
                topic: config.topic.clone(),
                expected,
                actual,
            });
        }
        None if config.partition >= actual => {
            return Err(settings(format!(
                "it has {actual} partitions, so partition {} does not exist",
                config.partition
            )));
        }
        _ => {}
    }
    if replicas < config.replication_factor {
        return Err(settings(format!(
            "partition {} has {replicas} replicas, fewer than the configured replication factor \
             {}",
            config.partition, config.replication_factor
        )));
    }
    // Asked again while the cluster is in motion (the broker asked died a moment ago), each
    // time for a few seconds at most so that a later ask can go to another broker: a topic's
    // settings unread would read as not compacted.
    // After a failed ask, each ask goes through a fresh admin client: librdkafka sends
    // DescribeConfigs to the broker its metadata names as the controller (KRaft names any live
    // broker), and a client whose named broker was just killed kept asking it until the open
    // timed out (tests/cluster_faults.rs in CI).
    // A broker can answer a just-created topic's DescribeConfigs before it has its settings
    // (seen in CI on the cluster: "cleanup.policy=\"\"" for a topic created compacted a moment
    // before): such an answer is asked again until the open timeout, like an error of a cluster
    // in motion; an error that is not one fails, naming its code.
    let deadline = std::time::Instant::now() + config.open_timeout;
    let mut asked = 0;
    let resource = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let answer = crate::retry_in_motion(left, |left| {
            asked += 1;
            let fresh: AdminClient<DefaultClientContext>;
            let admin = if asked == 1 {
                admin
            } else {
                fresh = config
                    .client
                    .client_config()
                    .create()
                    .map_err(|e| config.client.redact_error(e))?;
                &fresh
            };
            let options = AdminOptions::new().request_timeout(Some(left.min(DESCRIBE_ATTEMPT)));
            let topic = ResourceSpecifier::Topic(&config.topic);
            described(block_on(admin.describe_configs(&[topic], &options))?)
        })
        .map_err(|source| kafka(config, "describe changelog topic", source))?;
        match answer {
            Described::Settings(resource) => break Some(resource),
            Described::NotYet if std::time::Instant::now() >= deadline => break None,
            Described::NotYet => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    let setting = |name: &str| {
        resource
            .as_ref()
            .and_then(|r| r.get(name).and_then(|e| e.value.clone()))
    };
    let number = |name: &str| setting(name).and_then(|v| v.parse::<i64>().ok());
    let policy = setting("cleanup.policy").unwrap_or_default();
    if !policy.split(',').any(|p| p.trim() == "compact") {
        return Err(ChangelogError::NotCompacted {
            topic: config.topic.clone(),
            actual: policy,
        });
    }
    if let (Some(wanted), Some(actual)) =
        (config.min_insync_replicas, number("min.insync.replicas"))
        && actual < i64::from(wanted)
    {
        return Err(settings(format!(
            "min.insync.replicas={actual}, below the configured {wanted}"
        )));
    }
    if let Some(problem) = replication_warning(brokers, min_replicas, number("min.insync.replicas"))
    {
        warn_once(&config.topic, &problem);
    }
    let needed = (config.max_record_bytes + crate::config::RECORD_OVERHEAD) as i64;
    if let Some(limit) = number("max.message.bytes")
        && limit < needed
    {
        return Err(settings(format!(
            "max.message.bytes={limit}, but the store accepts records of up to {} bytes \
             (ChangelogConfig::max_record_bytes) and needs {needed}: the broker would reject \
             them; raise the topic's limit or lower max_record_bytes",
            config.max_record_bytes
        )));
    }
    Ok(CheckedTopic {
        partitions: actual,
        min_replicas,
        facts: TopicFacts {
            delete_retention: number("delete.retention.ms")
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        },
    })
}

/// How long one ask for a changelog's settings waits before it is asked again.
const DESCRIBE_ATTEMPT: Duration = Duration::from_secs(5);

/// A topic's DescribeConfigs, as [`verify_topic`] takes it.
#[derive(Debug)]
enum Described {
    /// The topic's settings, its cleanup policy among them.
    Settings(ConfigResource),
    /// An answer without the topic's settings: the broker has not applied its creation yet.
    NotYet,
}

/// What one DescribeConfigs of one topic answered: its settings, not yet, or its error (one of
/// a cluster in motion is asked again by [`crate::retry_in_motion`], others fail).
fn described(answer: Vec<ConfigResourceResult>) -> Result<Described, KafkaError> {
    match answer.into_iter().next() {
        Some(Ok(resource))
            if resource
                .get("cleanup.policy")
                .is_some_and(|e| e.value.is_some()) =>
        {
            Ok(Described::Settings(resource))
        }
        Some(Ok(_)) | None => Ok(Described::NotYet),
        Some(Err(code)) => Err(KafkaError::AdminOp(code)),
    }
}

/// On a cluster of at least this many brokers a changelog is expected to survive the loss of
/// one: three replicas and `min.insync.replicas` of two (Kafka Streams' production advice).
const PRODUCTION_BROKERS: usize = 3;

/// What is wrong with a changelog's replication on a cluster of `brokers` (its partitions'
/// fewest replicas, its `min.insync.replicas`), if anything: on three brokers or more, fewer
/// than three replicas or a `min.insync.replicas` below two lets one broker's loss lose
/// acknowledged writes. A smaller cluster is a test or development one: nothing to say.
fn replication_warning(brokers: usize, replicas: i32, min_isr: Option<i64>) -> Option<String> {
    if brokers < PRODUCTION_BROKERS {
        return None;
    }
    let mut problems = Vec::new();
    if replicas < PRODUCTION_BROKERS as i32 {
        problems.push(format!("{replicas} replicas"));
    }
    if let Some(min_isr) = min_isr
        && min_isr < 2
    {
        problems.push(format!("min.insync.replicas={min_isr}"));
    }
    (!problems.is_empty()).then(|| {
        format!(
            "{} on a cluster of {brokers} brokers: losing one broker can lose acknowledged \
             writes; give the changelog 3 replicas and min.insync.replicas=2",
            problems.join(" and ")
        )
    })
}

/// Logs `problem` of `topic` at `warn`, once per topic in this process (every task of a store
/// opens the same topic).
fn warn_once(topic: &str, problem: &str) {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(topic.to_string());
    if first {
        tracing::warn!(topic, "changelog replication: {problem}");
    }
}

/// Creates topic `name` with `partitions`, `replication` and `settings` unless it exists (the
/// task runtime's own small topics, such as its liveness beacons'; not a changelog, which
/// a store's open checks).
pub fn create_topic_if_missing(
    client: &crate::ClientProperties,
    name: &str,
    partitions: i32,
    replication: i32,
    settings: &[(&str, &str)],
    timeout: Duration,
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = client
        .client_config()
        .create()
        .map_err(|e| client.redact_error(e))?;
    let topic = settings.iter().fold(
        NewTopic::new(name, partitions, TopicReplication::Fixed(replication)),
        |topic, (key, value)| topic.set(key, value),
    );
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    for result in block_on(admin.create_topics([&topic], &options))? {
        match result {
            Ok(name) => tracing::info!(topic = %name, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::admin::{ConfigEntry, ConfigSource, OwnedResourceSpecifier};

    fn topic_settings_answer(entries: &[(&str, Option<&str>)]) -> ConfigResourceResult {
        Ok(ConfigResource {
            specifier: OwnedResourceSpecifier::Topic("changelog".into()),
            entries: entries
                .iter()
                .map(|(name, value)| ConfigEntry {
                    name: (*name).into(),
                    value: value.map(Into::into),
                    source: ConfigSource::DynamicTopic,
                    is_read_only: false,
                    is_default: false,
                    is_sensitive: false,
                })
                .collect(),
        })
    }

    /// CI on the three-node cluster: a topic created compacted a moment before was described
    /// without its settings, and the check failed with "cleanup.policy=\"\"". Such an answer is
    /// asked again; a refusal fails, naming its code.
    #[test]
    fn a_description_without_the_topics_settings_is_not_yet_one() {
        let settings = described(vec![topic_settings_answer(&[(
            "cleanup.policy",
            Some("compact"),
        )])]);
        assert!(
            matches!(settings, Ok(Described::Settings(_))),
            "{settings:?}"
        );
        for not_yet in [
            vec![],
            vec![topic_settings_answer(&[])],
            vec![topic_settings_answer(&[("cleanup.policy", None)])],
        ] {
            let answer = described(not_yet);
            assert!(matches!(answer, Ok(Described::NotYet)), "{answer:?}");
        }
        let refused = described(vec![Err(RDKafkaErrorCode::TopicAuthorizationFailed)]);
        assert!(
            matches!(
                refused,
                Err(KafkaError::AdminOp(
                    RDKafkaErrorCode::TopicAuthorizationFailed
                ))
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_changelog_that_one_broker_loss_can_lose_is_warned_about_on_a_production_cluster() {
        // One or two brokers: a development cluster, whatever the topic.
        assert_eq!(replication_warning(1, 1, Some(1)), None);
        assert_eq!(replication_warning(2, 1, Some(1)), None);
        // Three brokers: 3 replicas and min.insync.replicas 2 is what survives one loss.
        assert_eq!(replication_warning(3, 3, Some(2)), None);
        assert_eq!(replication_warning(5, 3, None), None);
        let few = replication_warning(3, 1, Some(2)).unwrap();
        assert!(
            few.contains("1 replicas") && few.contains("3 brokers"),
            "{few}"
        );
        let low = replication_warning(3, 3, Some(1)).unwrap();
        assert!(low.contains("min.insync.replicas=1"), "{low}");
        let both = replication_warning(4, 2, Some(1)).unwrap();
        assert!(
            both.contains("2 replicas and min.insync.replicas=1"),
            "{both}"
        );
    }
}
