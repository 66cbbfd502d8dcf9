//! The broker the tests use is a real Apache Kafka broker, and the client can do the three things
//! the changelog builds on: produce and consume, create a compacted topic, and notice a dead
//! broker instead of hanging.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::time::{Duration, Instant};

mod common;

use anyhow::{Context, Result, bail, ensure};
use kstate_test_broker::{PrivateBroker, bootstrap_servers, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

fn client_config(servers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", servers);
    config
}

#[tokio::test]
async fn records_produced_are_consumed_in_order() -> Result<()> {
    let servers = bootstrap_servers()?;
    let topic = unique_topic("smoke");
    common::create_topic(&servers, &topic, 1, "delete").await?;

    let producer: FutureProducer = client_config(&servers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create()?;
    for i in 0..20u32 {
        let key = format!("key-{i}");
        let value = format!("value-{i}");
        producer
            .send(
                FutureRecord::to(&topic)
                    .partition(0)
                    .key(&key)
                    .payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .with_context(|| format!("produce record {i}"))?;
    }

    let consumer: BaseConsumer = client_config(&servers)
        .set("group.id", unique_topic("smoke-group"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(&topic, 0, Offset::Beginning)?;
    consumer.assign(&assignment)?;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 20 && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message?;
            seen.push((
                String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned(),
                String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            ));
        }
    }
    let want: Vec<_> = (0..20)
        .map(|i| (format!("key-{i}"), format!("value-{i}")))
        .collect();
    assert_eq!(seen, want);
    Ok(())
}

#[tokio::test]
async fn a_compacted_topic_reports_its_cleanup_policy() -> Result<()> {
    let servers = bootstrap_servers()?;
    let topic = unique_topic("compact");
    common::create_topic(&servers, &topic, 1, "compact").await?;
    let admin: AdminClient<DefaultClientContext> = client_config(&servers).create()?;
    let results = admin
        .describe_configs(&[ResourceSpecifier::Topic(&topic)], &AdminOptions::new())
        .await?;
    let resource = results
        .into_iter()
        .next()
        .context("no describe result")?
        .map_err(|e| anyhow::anyhow!("describe {topic}: {e}"))?;
    let policy = resource.get("cleanup.policy").and_then(|e| e.value.clone());
    assert_eq!(policy.as_deref(), Some("compact"));
    Ok(())
}

/// Needs its own broker to kill: a [`PrivateBroker`] (a JDK is needed even when the other tests
/// use Docker).
#[tokio::test]
async fn a_killed_broker_fails_delivery_within_the_message_timeout() -> Result<()> {
    let broker = PrivateBroker::start()?;
    let servers = broker.bootstrap_servers();
    let topic = unique_topic("killed");
    common::create_topic(servers, &topic, 1, "delete").await?;
    let producer: FutureProducer = client_config(servers)
        .set("acks", "all")
        .set("message.timeout.ms", "3000")
        .create()?;
    producer
        .send(
            FutureRecord::to(&topic)
                .partition(0)
                .key("k")
                .payload("before"),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .context("produce while the broker is up")?;

    broker.kill()?;
    let start = Instant::now();
    let result = producer
        .send(
            FutureRecord::to(&topic)
                .partition(0)
                .key("k")
                .payload("after"),
            Duration::from_secs(10),
        )
        .await;
    let waited = start.elapsed();
    let error = match result {
        Ok(delivery) => bail!("delivery to a killed broker succeeded: {delivery:?}"),
        Err((err, _)) => err.to_string(),
    };
    // No hang: the error arrives within the message timeout plus slack for a loaded machine.
    ensure!(
        waited < Duration::from_secs(30),
        "waited {waited:?} for the delivery error"
    );
    assert!(
        error.contains("timed out") || error.contains("transport"),
        "unexpected delivery error: {error}"
    );
    Ok(())
}
