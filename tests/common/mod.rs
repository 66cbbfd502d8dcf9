//! Helpers shared by the integration tests: the broker, changelog configs, a counting restore
//! listener; `streams` for the task-runtime tests, `child` for tests that run copies of an
//! application as child processes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic
#![allow(dead_code)]

pub mod broker_faults;
pub mod child;
pub mod failures;
pub mod streams;

use std::sync::Mutex;
use std::time::Duration;

use kstate::kstate_kafka::{
    BatchRestored, ChangelogConfig, ClientProperties, RestoreListener, RestoreReport, RestoreStart,
};

/// Names a client properties file (librdkafka `key=value` lines, `bootstrap.servers` included)
/// that [`client`] reads instead of using the test broker: how `scripts/test` runs the crash
/// tests a second time over SASL_SSL (`scripts/kafka start --secure` prints such a file).
pub const CLIENT_PROPERTIES_ENV: &str = "KSTATE_TEST_CLIENT_PROPERTIES";

/// The client properties of the cluster the tests' stores use: [`CLIENT_PROPERTIES_ENV`]'s file
/// when set, else the test broker's address.
pub fn client() -> anyhow::Result<ClientProperties> {
    match std::env::var_os(CLIENT_PROPERTIES_ENV) {
        Some(path) if !path.is_empty() => Ok(ClientProperties::from_file(path)?),
        _ => Ok(ClientProperties::new(
            kstate_test_broker::bootstrap_servers()?,
        )),
    }
}

/// A changelog config for `topic`, partition 0, on the tests' cluster ([`client`]), with
/// timeouts short enough for tests.
pub fn changelog(topic: &str) -> anyhow::Result<ChangelogConfig> {
    Ok(changelog_on(client()?, topic))
}

/// [`changelog`] on the cluster `client` names.
pub fn changelog_on(client: ClientProperties, topic: &str) -> ChangelogConfig {
    ChangelogConfig::new(client, topic, 0)
        .partitions(1)
        .open_timeout(Duration::from_secs(30))
        .delivery_timeout(Duration::from_secs(20))
}

/// The start of the current minute, ms since the epoch: the base of a test's event times. A
/// record timestamped far in the past (10 s after 1970) is older than any topic's `retention.ms`,
/// so the broker's retention check (every 5 minutes) deletes it from an input before it is read,
/// or from an output before it is checked: times from now on stay. (Changelogs are not exposed:
/// their records carry the wall clock, the event time in a header.)
pub fn recent_minute() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    now - now.rem_euclid(60_000)
}

/// Creates `topic` with `partitions` partitions and `cleanup.policy=policy` on the cluster
/// `client` names.
pub async fn create_topic(
    client: impl Into<ClientProperties>,
    topic: &str,
    partitions: i32,
    policy: &str,
) -> anyhow::Result<()> {
    let settings = [("cleanup.policy", policy)];
    Ok(kstate_bench::kafka::create_topic(client, topic, partitions, &settings).await?)
}

/// Creates `topic` on the tests' cluster ([`client`]): one partition, compacted, with `settings` on top (e.g. a
/// short `delete.retention.ms` for tests that need compaction to act quickly).
pub async fn create_compacted_topic(topic: &str, settings: &[(&str, &str)]) -> anyhow::Result<()> {
    let mut all = vec![("cleanup.policy", "compact")];
    all.extend_from_slice(settings);
    Ok(kstate_bench::kafka::create_topic(client()?, topic, 1, &all).await?)
}

/// Deletes `topic` and waits until the broker no longer lists it.
pub async fn delete_topic(topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client = client()?;
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        client.client_config().create()?;
    admin.delete_topics(&[topic], &AdminOptions::new()).await?;
    let probe: BaseConsumer = client.client_config().create()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let metadata = probe.fetch_metadata(None, Duration::from_secs(10))?;
        if !metadata.topics().iter().any(|t| t.name() == topic) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{topic} was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `topic` again, compacted and empty, retrying until its deletion has completed.
pub async fn recreate_topic(topic: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match create_compacted_topic(topic, &[]).await {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(e.context(format!("could not recreate {topic}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
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

/// The state a changelog partition describes: its records from the beginning up to `end`
/// (exclusive) folded in offset order, the last record of each key winning and a tombstone
/// removing the key. Read with `read_committed`, as restore reads.
pub fn fold_changelog(
    topic: &str,
    partition: i32,
    end: i64,
) -> anyhow::Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    fold_changelog_at(client()?, topic, partition, end)
}

/// [`fold_changelog`] on the cluster `client` names.
pub fn fold_changelog_at(
    client: impl Into<ClientProperties>,
    topic: &str,
    partition: i32,
    end: i64,
) -> anyhow::Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = client
        .into()
        .client_config()
        .set("group.id", "kstate-test-fold")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut folded = std::collections::BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "folding {topic}/{partition} up to {end} timed out"
        );
        let position = consumer
            .position()?
            .find_partition(topic, partition)
            .and_then(|p| match p.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        if position.is_some_and(|p| p >= end) || end == 0 {
            return Ok(folded);
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.offset() < end => {
                let key = m.key().unwrap_or_default().to_vec();
                match m.payload() {
                    Some(value) => folded.insert(key, value.to_vec()),
                    None => folded.remove(&key),
                };
            }
            Some(Ok(_)) => return Ok(folded),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

/// The high watermark of `topic`/`partition` (read_uncommitted: the real end of the log).
pub fn high_watermark(topic: &str, partition: i32) -> anyhow::Result<i64> {
    high_watermark_at(client()?, topic, partition)
}

/// [`high_watermark`] on the cluster `client` names.
pub fn high_watermark_at(
    client: impl Into<ClientProperties>,
    topic: &str,
    partition: i32,
) -> anyhow::Result<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = client
        .into()
        .client_config()
        .set("isolation.level", "read_uncommitted")
        .create()?;
    Ok(consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(20))?
        .1)
}

/// Puts `key-<i>` (four digits) = `value-<i>` for every `i` in `range`, one changelog record
/// each.
pub fn write_keys(
    store: &kstate::kstate_kafka::LoggedStore,
    range: std::ops::Range<u32>,
) -> anyhow::Result<()> {
    use kstate::kstate_core::KeyValueStore;
    for i in range {
        store.put(
            format!("key-{i:04}").as_bytes(),
            format!("value-{i}").as_bytes(),
        )?;
    }
    Ok(())
}

/// Every entry of `store`, in key order.
pub fn contents(
    store: &impl kstate::kstate_core::KeyValueStore,
) -> anyhow::Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    Ok(store.all()?.collect::<Result<_, _>>()?)
}

/// Opens the logged store at `path` with a [`Recorder`] listening, and returns it with the
/// restore's report (checked to agree with the store's own).
pub fn open_reporting(
    path: &std::path::Path,
    config: ChangelogConfig,
) -> anyhow::Result<(
    kstate::kstate_kafka::LoggedStore,
    kstate::kstate_kafka::RestoreReport,
)> {
    let recorder = std::sync::Arc::new(Recorder::default());
    let hooks = kstate::kstate_kafka::OpenHooks {
        listener: Some(recorder.clone()),
        record_check: None,
        cancel: None,
    };
    let store = kstate::kstate_kafka::LoggedStore::open_with(
        path,
        &kstate::kstate_rocksdb::RocksDbOptions::default(),
        config,
        hooks,
    )?;
    let report = recorder
        .ends
        .lock()
        .unwrap()
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no restore end event"))?;
    anyhow::ensure!(
        &report == store.restore_report(),
        "the listener and the report disagree"
    );
    Ok((store, report))
}

/// Every log line of this test process (kstate's, and librdkafka's through rdkafka's
/// `tracing`) at `level` and above, from the first call on: a global subscriber, so the first
/// call's level holds for the whole test binary.
pub fn captured_logs(level: tracing::Level) -> &'static Mutex<Vec<u8>> {
    use std::io::Write;
    use std::sync::OnceLock;
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        struct Capture;
        impl Write for Capture {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                if let Some(logs) = LOGS.get() {
                    logs.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(bytes);
                }
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(|| Capture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        Mutex::new(Vec::new())
    })
}

/// The release directory the test binaries are in (`$CARGO_TARGET_DIR/release`).
fn release_dir() -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context as _;
    let exe = std::env::current_exe()?;
    let release = exe
        .parent()
        .and_then(std::path::Path::parent)
        .context("test binary has no target directory")?;
    Ok(release.to_path_buf())
}

/// A service binary of kstate-bench (`count_by_key`, `windowed_count`), built by
/// `cargo test --release --workspace` (kstate-bench's own test needs them) in the release
/// directory.
pub fn service_binary(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let binary = release_dir()?.join(name);
    anyhow::ensure!(
        binary.exists(),
        "{} is missing: build it with `cargo test --release --workspace` (which builds \
         kstate-bench's binaries) or `cargo build --release --workspace --bin {name}`",
        binary.display()
    );
    Ok(binary)
}

/// An example's binary, built by `cargo test --release` (which builds the examples) in the
/// release directory's `examples/`.
pub fn example_binary(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let binary = release_dir()?.join("examples").join(name);
    anyhow::ensure!(
        binary.exists(),
        "{} is missing: build it with `cargo test --release` (which builds the examples) or \
         `cargo build --release --example {name}`",
        binary.display()
    );
    Ok(binary)
}
