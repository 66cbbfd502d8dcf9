//! What an application checks of its inputs before it starts: they exist and have one
//! partition count (task *p* is partition *p* of every input), and the liveness topic has one
//! partition.
//!
//! This is the application's first contact with the cluster, and a cluster in motion (a node
//! paused or restarting) may not answer it for a while: a client whose connection goes to a
//! node that does not answer keeps asking it. So each question is asked again with a new
//! client until the task timeout ([`AppBuilder::task_timeout`](crate::AppBuilder::task_timeout));
//! a refused login or certificate still ends the start at once. Seen on the three-node
//! cluster: a member restarted during a rolling restart followed by a node's 35 s pause gave up
//! after one client's 30 s.

use std::time::Duration;

use kstate_kafka::{ConnectionWatch, MetadataError};
use rdkafka::consumer::BaseConsumer;
use rdkafka::metadata::Metadata;

use crate::config::AppConfig;
use crate::error::TaskError;

/// How long one client is asked before a new one asks again.
const ATTEMPT: Duration = Duration::from_secs(30);

/// The inputs' common partition count; an error if one is missing or they differ.
pub(crate) fn input_partitions(config: &AppConfig) -> Result<i32, TaskError> {
    let mut counts = Vec::new();
    for topic in &config.inputs {
        let metadata = topic_metadata(config, topic, "fetch input metadata")?;
        let n = partition_count(&metadata, topic);
        if n == 0 {
            return Err(TaskError::MissingInput {
                topic: topic.clone(),
                bootstrap_servers: config.client.bootstrap_servers().to_string(),
            });
        }
        counts.push((topic.clone(), n));
    }
    if config.failure_detection.is_some() {
        // The beacons are read from partition 0 only: a topic of several partitions would
        // cover only the processes whose beacons land there, silently.
        let topic = crate::liveness::topic(&config.application_id);
        let metadata = topic_metadata(config, &topic, "fetch liveness topic metadata")?;
        let partitions = partition_count(&metadata, &topic) as usize;
        if partitions > 1 {
            return Err(TaskError::LivenessTopic { topic, partitions });
        }
    }
    let first = counts[0].1;
    if counts.iter().any(|(_, n)| *n != first) {
        let counts = counts
            .iter()
            .map(|(t, n)| format!("{t}={n}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(TaskError::NotCoPartitioned { counts });
    }
    Ok(first)
}

/// `topic`'s partitions in `metadata`; 0 if it does not exist.
fn partition_count(metadata: &Metadata, topic: &str) -> i32 {
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32)
}

/// `topic`'s metadata, asked [`ATTEMPT`] long of each new client until the task timeout.
fn topic_metadata(
    config: &AppConfig,
    topic: &str,
    operation: &'static str,
) -> Result<Metadata, TaskError> {
    let unanswered = |e: &TaskError| matches!(e, TaskError::Cluster { source, .. } if matches!(**source, MetadataError::Timeout { .. }));
    crate::start_retry::until_task_timeout(
        "the application",
        config.task_timeout,
        &|| false,
        unanswered,
        || {
            let client = metadata_client(config)?;
            kstate_kafka::fetch_metadata(&client, Some(topic), ATTEMPT).map_err(|source| {
                TaskError::Cluster {
                    operation,
                    bootstrap_servers: config.client.bootstrap_servers().to_string(),
                    source: Box::new(source),
                }
            })
        },
    )
}

fn metadata_client(config: &AppConfig) -> Result<BaseConsumer<ConnectionWatch>, TaskError> {
    config
        .client
        .client_config()
        .create_with_context(ConnectionWatch::default())
        .map_err(|source| TaskError::Consumer {
            worker: 0,
            operation: "create the metadata client",
            inputs: config.inputs.join(","),
            source: Box::new(config.client.redact_error(source)),
        })
}
