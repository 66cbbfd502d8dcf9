//! The Kafka side: connection flags shared by every subcommand that talks to a broker, the
//! changelog's watermarks, and the changelog folded up to an offset (what a store at that offset
//! must hold).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kstate_kafka::{ChangelogConfig, ClientProperties, ConnectionWatch};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

/// How to reach the cluster.
#[derive(Clone, clap::Args)]
pub(crate) struct KafkaArgs {
    /// The brokers (host:port,...); replaces the properties file's `bootstrap.servers`. When
    /// neither names them: $KAFKA_BOOTSTRAP_SERVERS (an explicit file wins over the
    /// environment, so a shell's local broker never receives a secured cluster's credentials).
    #[arg(long, value_name = "HOST:PORT")]
    bootstrap_servers: Option<String>,
    /// A file of librdkafka client properties (`key=value` lines), e.g. the one a managed Kafka
    /// service hands out with `security.protocol`, `sasl.*` and `ssl.*`. Keeps secrets off the
    /// command line, where any user of the machine can read them.
    #[arg(long, env = "KSTATE_CLIENT_PROPERTIES", value_name = "FILE")]
    client_properties_file: Option<PathBuf>,
    /// A librdkafka property for every client, e.g. `security.protocol=SSL` (repeatable;
    /// applied last: overrides the file and `--bootstrap-servers`).
    #[arg(long = "client-property", value_name = "KEY=VALUE", value_parser = parse_property)]
    client_properties: Vec<(String, String)>,
    /// [`client`](Self::client)'s answer, resolved once per command: every client of the
    /// command then sees the same properties file contents.
    #[arg(skip)]
    resolved: std::sync::OnceLock<ClientProperties>,
}

/// Secrets stay out of `{:?}`: the properties are shown as [`ClientProperties`] shows them.
impl std::fmt::Debug for KafkaArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = ClientProperties::default();
        for (key, value) in &self.client_properties {
            shown.insert(key, value);
        }
        f.debug_struct("KafkaArgs")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("client_properties_file", &self.client_properties_file)
            .field("client_properties", &shown)
            .finish()
    }
}

/// `$KAFKA_BOOTSTRAP_SERVERS`, the brokers when neither a flag nor a properties file names them.
fn environment_servers() -> Option<String> {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").ok()
}

fn parse_property(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        // Not the text: it may be a secret given without its key.
        _ => Err("expected KEY=VALUE with a non-empty key".to_string()),
    }
}

/// How long a broker may take to answer a metadata or offsets query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

impl KafkaArgs {
    /// Whether the cluster was named at all (some subcommands work without one).
    pub(crate) fn given(&self) -> bool {
        self.bootstrap_servers.is_some()
            || self.client_properties_file.is_some()
            || environment_servers().is_some()
    }

    /// The client properties: the cluster as [`ClientProperties::from_sources`] resolves the
    /// file, `--bootstrap-servers` and `$KAFKA_BOOTSTRAP_SERVERS`, then `--client-property`.
    pub(crate) fn client(&self) -> Result<ClientProperties> {
        if let Some(client) = self.resolved.get() {
            return Ok(client.clone());
        }
        let mut client = ClientProperties::from_sources(
            self.client_properties_file.as_deref(),
            self.bootstrap_servers.as_deref(),
            environment_servers().as_deref(),
        )?;
        for (key, value) in &self.client_properties {
            client.insert(key, value);
        }
        if client.bootstrap_servers().is_empty() {
            bail!(
                "this subcommand talks to Kafka: give --bootstrap-servers (or set \
                 KAFKA_BOOTSTRAP_SERVERS), or a --client-properties-file with bootstrap.servers"
            );
        }
        Ok(self.resolved.get_or_init(|| client).clone())
    }

    /// A changelog config for `topic`/`partition` with these connection settings.
    pub(crate) fn changelog(&self, topic: &str, partition: i32) -> Result<ChangelogConfig> {
        Ok(ChangelogConfig::new(self.client()?, topic, partition))
    }

    /// A consumer that has reached the cluster (a wrong password or certificate is an error
    /// at once, not a timeout).
    fn consumer(&self, isolation: &str, topic: &str) -> Result<BaseConsumer<ConnectionWatch>> {
        let client = self.client()?;
        let consumer: BaseConsumer<ConnectionWatch> = client
            .client_config()
            .set("group.id", "kstate-cli")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", isolation)
            .create_with_context(ConnectionWatch::default())
            .map_err(|e| client.redact_error(e))
            .context("creating a Kafka client")?;
        kstate_kafka::fetch_metadata(&consumer, Some(topic), QUERY_TIMEOUT)
            .with_context(|| format!("reaching {}", client.bootstrap_servers()))?;
        Ok(consumer)
    }

    /// The partition's low and high watermarks (the real end: read_uncommitted).
    pub(crate) fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        let servers = self.client()?.bootstrap_servers().to_string();
        self.consumer("read_uncommitted", topic)?
            .fetch_watermarks(topic, partition, QUERY_TIMEOUT)
            .with_context(|| format!("asking {servers} for the offsets of {topic}/{partition}"))
    }

    /// The changelog `topic`/`partition` folded up to `end` (exclusive), read_committed as
    /// restore reads it: each key's last value, tombstones removing keys.
    pub(crate) fn fold(
        &self,
        topic: &str,
        partition: i32,
        end: i64,
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        let mut folded = BTreeMap::new();
        let (low, high) = self.watermarks(topic, partition)?;
        if end > high {
            bail!(
                "{topic}/{partition} ends at offset {high}, before the store's position {}: the \
                 changelog lost records the store holds",
                end - 1
            );
        }
        if end <= low {
            return Ok(folded);
        }
        let consumer = self.consumer("read_committed", topic)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(low))?;
        consumer.assign(&tpl)?;
        let bar = ProgressBar::new((end - low) as u64).with_style(bar_style("records read"));
        let started = Instant::now();
        let mut last_progress = (low, Instant::now());
        loop {
            let position = match consumer.position()?.find_partition(topic, partition) {
                Some(p) => match p.offset() {
                    Offset::Offset(o) => o,
                    _ => low,
                },
                None => low,
            };
            bar.set_position((position - low) as u64);
            bar.set_message(rate_message(
                (position - low) as u64,
                started.elapsed(),
                None,
            ));
            if position >= end {
                break;
            }
            if position != last_progress.0 {
                last_progress = (position, Instant::now());
            } else if last_progress.1.elapsed() > QUERY_TIMEOUT {
                bail!(
                    "reading {topic}/{partition} stalled at offset {position} (an open transaction?)"
                );
            }
            for _ in 0..1024 {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) if m.offset() < end => {
                        let key = m.key().unwrap_or_default().to_vec();
                        match m.payload() {
                            Some(value) => folded.insert(key, value.to_vec()),
                            None => folded.remove(&key),
                        };
                    }
                    Some(Ok(_)) | None => break,
                    Some(Err(e)) => {
                        return Err(e).with_context(|| format!("reading {topic}/{partition}"));
                    }
                }
            }
        }
        bar.finish_and_clear();
        Ok(folded)
    }
}

/// The progress bar style of long reads: records, the rates the caller puts in the message,
/// ETA.
pub(crate) fn bar_style(unit: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{{bar:20}} {{human_pos}}/{{human_len}} {unit} ({{msg}}ETA {{eta}})"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// `1234567 records/s, ` for a bar's message.
pub(crate) fn rate_message(records: u64, elapsed: Duration, bytes: Option<u64>) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let mut message = format!("{:.0} records/s, ", records as f64 / secs);
    if let Some(bytes) = bytes {
        message.push_str(&format!("{:.1} MB/s, ", bytes as f64 / 1e6 / secs));
    }
    message
}
