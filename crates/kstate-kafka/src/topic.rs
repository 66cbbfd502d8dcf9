//! Changelog topic management: create on first use, verify on every open.
//!
//! A changelog is compacted (`cleanup.policy=compact`): only the latest record per key matters, and
//! tombstones delete. An existing topic with another partition count or cleanup policy is an
//! error, never a silent write to what may be the wrong partition (a store's partition number
//! only means something if the topic is partitioned the way the task expects).

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::ChangelogConfig;
use crate::error::ChangelogError;

/// Makes sure the changelog topic exists, is compacted and has the configured partition count.
pub(crate) fn ensure_topic(config: &ChangelogConfig) -> Result<(), ChangelogError> {
    if config.partition < 0 || config.partition >= config.partitions {
        return Err(ChangelogError::InvalidConfig {
            topic: config.topic.clone(),
            message: format!(
                "partition {} is outside 0..{}",
                config.partition, config.partitions
            ),
        });
    }
    let probe: BaseConsumer = config
        .client_config()
        .create()
        .map_err(|source| kafka(config, "create metadata client", source))?;
    let metadata = probe
        .fetch_metadata(Some(&config.topic), config.open_timeout)
        .map_err(|source| ChangelogError::BrokerUnreachable {
            bootstrap_servers: config.bootstrap_servers.clone(),
            topic: config.topic.clone(),
            timeout: config.open_timeout,
            source,
        })?;
    let topic = metadata.topics().iter().find(|t| t.name() == config.topic);
    let exists = topic.is_some_and(|t| t.error().is_none() && !t.partitions().is_empty());
    if !exists {
        create_topic(config)?;
    }
    verify_topic(config, &probe)
}

fn kafka(config: &ChangelogConfig, operation: &'static str, source: KafkaError) -> ChangelogError {
    ChangelogError::Kafka {
        topic: config.topic.clone(),
        partition: config.partition,
        operation,
        source,
    }
}

fn admin(config: &ChangelogConfig) -> Result<AdminClient<DefaultClientContext>, ChangelogError> {
    config
        .client_config()
        .create()
        .map_err(|source| kafka(config, "create admin client", source))
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

fn create_topic(config: &ChangelogConfig) -> Result<(), ChangelogError> {
    let admin = admin(config)?;
    let min_isr = config.min_insync_replicas.map(|n| n.to_string());
    let max_message = (config.max_record_bytes > crate::config::DEFAULT_MAX_RECORD_BYTES)
        .then(|| (config.max_record_bytes + crate::config::RECORD_OVERHEAD).to_string());
    let mut topic = NewTopic::new(
        &config.topic,
        config.partitions,
        TopicReplication::Fixed(config.replication_factor),
    )
    .set("cleanup.policy", "compact");
    if let Some(min_isr) = &min_isr {
        topic = topic.set("min.insync.replicas", min_isr);
    }
    if let Some(max_message) = &max_message {
        topic = topic.set("max.message.bytes", max_message);
    }
    let options = AdminOptions::new().operation_timeout(Some(config.open_timeout));
    let results = block_on(admin.create_topics(&[topic], &options))
        .map_err(|source| kafka(config, "create changelog topic", source))?;
    for result in results {
        match result {
            Ok(_) => {
                tracing::info!(topic = %config.topic, partitions = config.partitions, "created changelog topic")
            }
            // Another task created it first: verified below like any existing topic.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(kafka(
                    config,
                    "create changelog topic",
                    KafkaError::AdminOp(code),
                ));
            }
        }
    }
    Ok(())
}

fn verify_topic(config: &ChangelogConfig, probe: &BaseConsumer) -> Result<(), ChangelogError> {
    // Metadata of a just-created topic can take a moment to show every partition.
    let deadline = std::time::Instant::now() + config.open_timeout;
    let actual = loop {
        let metadata = probe
            .fetch_metadata(Some(&config.topic), config.open_timeout)
            .map_err(|source| kafka(config, "read topic metadata", source))?;
        let count = metadata
            .topics()
            .iter()
            .find(|t| t.name() == config.topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len() as i32);
        if count > 0 || std::time::Instant::now() >= deadline {
            break count;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    if actual != config.partitions {
        return Err(ChangelogError::PartitionCountMismatch {
            topic: config.topic.clone(),
            expected: config.partitions,
            actual,
        });
    }
    let admin = admin(config)?;
    let options = AdminOptions::new().request_timeout(Some(config.open_timeout));
    let described =
        block_on(admin.describe_configs(&[ResourceSpecifier::Topic(&config.topic)], &options))
            .map_err(|source| kafka(config, "describe changelog topic", source))?;
    let policy = described
        .into_iter()
        .next()
        .and_then(Result::ok)
        .and_then(|resource| resource.get("cleanup.policy").and_then(|e| e.value.clone()))
        .unwrap_or_default();
    if !policy.split(',').any(|p| p.trim() == "compact") {
        return Err(ChangelogError::NotCompacted {
            topic: config.topic.clone(),
            actual: policy,
        });
    }
    Ok(())
}
