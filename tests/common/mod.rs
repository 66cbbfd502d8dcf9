//! Helpers shared by the integration tests: the broker, changelog configs, a counting restore
//! listener.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic
#![allow(dead_code)]

use std::sync::Mutex;
use std::time::Duration;

use kstate::kstate_kafka::{
    BatchRestored, ChangelogConfig, RestoreListener, RestoreReport, RestoreStart,
};

/// A changelog config for `topic`, partition 0, on the test broker, with timeouts short enough
/// for tests.
pub fn changelog(topic: &str) -> anyhow::Result<ChangelogConfig> {
    Ok(
        ChangelogConfig::new(kstate_test_broker::bootstrap_servers()?, topic, 0)
            .open_timeout(Duration::from_secs(30))
            .delivery_timeout(Duration::from_secs(20)),
    )
}

/// Creates `topic` with `partitions` partitions and `cleanup.policy=policy` on the brokers at
/// `servers`.
pub async fn create_topic(
    servers: &str,
    topic: &str,
    partitions: i32,
    policy: &str,
) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", servers)
        .create()?;
    let new =
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)).set("cleanup.policy", policy);
    for created in admin.create_topics(&[new], &AdminOptions::new()).await? {
        created.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }
    Ok(())
}

/// Records every restore event.
#[derive(Default)]
pub struct Recorder {
    pub starts: Mutex<Vec<RestoreStart>>,
    pub batches: Mutex<Vec<BatchRestored>>,
    pub ends: Mutex<Vec<RestoreReport>>,
}

impl RestoreListener for Recorder {
    fn on_restore_start(&self, start: &RestoreStart) {
        self.starts.lock().unwrap().push(start.clone());
    }
    fn on_batch_restored(&self, batch: &BatchRestored) {
        self.batches.lock().unwrap().push(batch.clone());
    }
    fn on_restore_end(&self, report: &RestoreReport) {
        self.ends.lock().unwrap().push(report.clone());
    }
}
