//! kstate-test-broker: the one way tests, examples and benches get a real Apache Kafka broker.
//!
//! Integration tests must talk to a real broker, never librdkafka's mock cluster (it is
//! experimental and has no log compaction). [`broker`] finds one, in this order:
//!
//! 1. `KAFKA_BOOTSTRAP_SERVERS`, when set: used as it is (CI and `scripts/test` set it).
//! 2. A Docker engine, when one answers: testcontainers runs `apache/kafka` (the version pinned in
//!    `docker-compose.yml`) as one container named `kstate-test-kafka` on host port 39092, shared
//!    by every test binary and reused across runs; `docker rm -f kstate-test-kafka` removes it.
//! 3. Otherwise `scripts/kafka start`: the same broker from Maven Central jars on the local JDK.
//!    It is shared by every test binary on the machine and stops itself after 15 idle minutes;
//!    while this process lives, a thread keeps its lease fresh.
//!
//! When none works, [`broker`] returns [`BrokerError::Unavailable`] with every reason and the
//! commands that fix it: a test that needs a broker fails, it never passes or skips.
//!
//! Tests of secured clusters use [`secure_broker`]: `scripts/kafka start --secure`, a broker of
//! its own with TLS and SASL_SSL listeners (it needs the JDK in every case).
//!
//! Tests of broker faults use [`cluster`]: `scripts/kafka start --nodes 3`, three nodes whose
//! processes a test can kill, stop, restart and pause (see [`Cluster`]).
//!
//! `KSTATE_KAFKA_VERSION` ([`VERSION_ENV`]) runs all of them on another Kafka release (a 4.x or
//! 3.9.x one): `scripts/kafka` keeps each version's brokers in state directories of their own,
//! and the container gets that image tag (and a name of its own).
//!
//! Every test uses its own topics: [`unique_topic`] names them.

mod cluster;

pub use cluster::{CLUSTER_NODES, Cluster, ClusterLease, cluster};

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use testcontainers::core::{ContainerPort, WaitFor};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt, ReuseDirective};

/// The Apache Kafka version of `docker-compose.yml` and `scripts/kafka`.
pub const KAFKA_VERSION: &str = "4.1.1";

/// The environment variable naming another Kafka version to test against (as for
/// `scripts/kafka`: a 4.x or 3.9.x release).
pub const VERSION_ENV: &str = "KSTATE_KAFKA_VERSION";

/// The Kafka version the tests run against: [`VERSION_ENV`], or [`KAFKA_VERSION`].
pub fn kafka_version() -> String {
    std::env::var(VERSION_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| KAFKA_VERSION.to_string())
}

/// The environment variable naming an existing broker.
pub const BOOTSTRAP_ENV: &str = "KAFKA_BOOTSTRAP_SERVERS";

const DOCKER_HOST_PORT: u16 = 39092;
const DOCKER_CONTAINER: &str = "kstate-test-kafka";

/// Where the broker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerSource {
    /// `KAFKA_BOOTSTRAP_SERVERS`.
    Environment,
    /// A testcontainers-managed `apache/kafka` container.
    Docker,
    /// `scripts/kafka` on the local JDK.
    LocalLauncher,
}

/// A reachable broker.
pub struct Broker {
    bootstrap_servers: String,
    source: BrokerSource,
    _container: Option<Container<GenericImage>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("source", &self.source)
            .finish()
    }
}

impl Broker {
    /// The `bootstrap.servers` value to give clients.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// Where the broker came from.
    pub fn source(&self) -> BrokerSource {
        self.source
    }
}

/// Why no broker could be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// Every way to get a broker failed.
    #[error(
        "no Kafka broker for the tests.\n  {BOOTSTRAP_ENV}: not set\n  Docker: {docker}\n  scripts/kafka: {launcher}\n\
         Fix one of them: start a broker and `export {BOOTSTRAP_ENV}=host:port`; or start a Docker engine; \
         or install Java 17+ and Maven (`apt-get install -y openjdk-17-jre-headless maven`) so that \
         scripts/kafka can run the broker from its jars. `scripts/test` does the last for you."
    )]
    Unavailable {
        /// Why Docker did not give one.
        docker: String,
        /// Why the local launcher did not give one.
        launcher: String,
    },

    /// `scripts/kafka` or a metadata request failed for the shared cluster.
    #[error("the test cluster ({command}): {message}")]
    Cluster {
        /// What was asked: the launcher's arguments, or the metadata looked up.
        command: String,
        /// What went wrong.
        message: String,
    },

    /// `scripts/kafka` failed for a private broker.
    #[error("scripts/kafka {command} failed for a private broker in {state_dir}: {message}")]
    Launcher {
        /// The launcher command.
        command: &'static str,
        /// The private state directory.
        state_dir: String,
        /// What it printed.
        message: String,
    },
}

/// The process-wide broker, found (and if need be started) on first use.
pub fn broker() -> Result<&'static Broker, BrokerError> {
    static BROKER: OnceLock<Result<Broker, BrokerError>> = OnceLock::new();
    BROKER
        .get_or_init(find_broker)
        .as_ref()
        .map_err(Clone::clone)
}

/// The bootstrap servers of [`broker`].
pub fn bootstrap_servers() -> Result<String, BrokerError> {
    Ok(broker()?.bootstrap_servers().to_string())
}

/// A topic name no other test, process or run uses: `kstate-<prefix>-<pid>-<time>-<n>`.
pub fn unique_topic(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "kstate-{prefix}-{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn find_broker() -> Result<Broker, BrokerError> {
    if let Ok(servers) = std::env::var(BOOTSTRAP_ENV)
        && !servers.trim().is_empty()
    {
        return Ok(Broker {
            bootstrap_servers: servers.trim().to_string(),
            source: BrokerSource::Environment,
            _container: None,
        });
    }
    let docker = match docker_broker() {
        Ok(broker) => return Ok(broker),
        Err(reason) => reason,
    };
    tracing::info!(%docker, "no Docker engine for Kafka; using scripts/kafka");
    let launcher = match launcher_broker() {
        Ok(broker) => return Ok(broker),
        Err(reason) => reason,
    };
    Err(BrokerError::Unavailable { docker, launcher })
}

fn docker_engine_present() -> bool {
    std::env::var_os("DOCKER_HOST").is_some()
        || ["/var/run/docker.sock", "/run/docker.sock"]
            .iter()
            .any(|p| std::path::Path::new(p).exists())
}

fn docker_broker() -> Result<Broker, String> {
    if !docker_engine_present() {
        return Err("no engine (DOCKER_HOST unset, no /var/run/docker.sock)".into());
    }
    let listeners = format!("PLAINTEXT://127.0.0.1:{DOCKER_HOST_PORT}");
    let version = kafka_version();
    let container = GenericImage::new("apache/kafka", version.as_str())
        .with_wait_for(WaitFor::message_on_stdout("Kafka Server started"))
        .with_mapped_port(DOCKER_HOST_PORT, ContainerPort::Tcp(9092))
        .with_container_name(if version == KAFKA_VERSION {
            DOCKER_CONTAINER.to_string()
        } else {
            format!("{DOCKER_CONTAINER}-{version}")
        })
        .with_reuse(ReuseDirective::Always)
        .with_startup_timeout(Duration::from_secs(180))
        // The settings of docker-compose.yml; the listener advertises the host port.
        .with_env_var("KAFKA_NODE_ID", "1")
        .with_env_var("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env_var(
            "KAFKA_LISTENERS",
            "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
        )
        .with_env_var("KAFKA_ADVERTISED_LISTENERS", listeners)
        .with_env_var(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        )
        .with_env_var("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env_var("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env_var("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .with_env_var("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env_var("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "1")
        .with_env_var("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env_var("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "1")
        .with_env_var(
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
            "1",
        )
        .with_env_var("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR", "1")
        .with_env_var("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env_var("KAFKA_LOG_CLEANER_BACKOFF_MS", "1000")
        .with_env_var("KAFKA_LOG_CLEANER_DEDUPE_BUFFER_SIZE", "33554432")
        .with_env_var("KAFKA_HEAP_OPTS", "-Xmx512m -Xms512m")
        .start()
        .map_err(|e| format!("testcontainers could not start apache/kafka:{version}: {e}"))?;
    Ok(Broker {
        bootstrap_servers: format!("127.0.0.1:{DOCKER_HOST_PORT}"),
        source: BrokerSource::Docker,
        _container: Some(container),
    })
}

/// The launcher's path inside a checkout.
const LAUNCHER: &str = "scripts/kafka";

/// `scripts/kafka` of the checkout being run: found at run time from the package directory
/// cargo names (`CARGO_MANIFEST_DIR`, set for tests and benches) or the working directory, and
/// their parents up to the workspace root (the directory with `Cargo.lock`). Not from the
/// compile-time `env!("CARGO_MANIFEST_DIR")`: a target directory shared between checkouts
/// reuses this crate's build, path and all, and would run another checkout's script, or one
/// that no longer exists.
pub fn launcher_script() -> PathBuf {
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
    ];
    starts
        .iter()
        .flatten()
        .find_map(|start| {
            for dir in start.ancestors() {
                let script = dir.join(LAUNCHER);
                if script.is_file() {
                    return Some(script);
                }
                if dir.join("Cargo.lock").is_file() {
                    return None; // the workspace root: nothing above it is ours
                }
            }
            None
        })
        .unwrap_or_else(|| PathBuf::from(LAUNCHER))
}

fn launcher_broker() -> Result<Broker, String> {
    let script = launcher_script();
    let address = run_launcher(Command::new(&script).arg("start"))?;
    if address.is_empty() {
        return Err(format!("{} start printed no address", script.display()));
    }
    keep_lease_fresh(script, &["touch"]);
    Ok(Broker {
        bootstrap_servers: address,
        source: BrokerSource::LocalLauncher,
        _container: None,
    })
}

/// Runs `command` (the launcher with its arguments) and returns the last line it printed on
/// stdout; when it cannot run or fails, says why with the last 15 lines of its stderr.
fn run_launcher(command: &mut Command) -> Result<String, String> {
    let what = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let output = command
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(format!(
            "{what} failed ({}):\n{}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(stdout.lines().last().unwrap_or_default().trim().to_string())
}

/// The shared secured broker: `scripts/kafka start --secure` (its own state directory, beside
/// the plain shared broker), with a TLS listener and a SASL_SSL listener (SCRAM-SHA-512) whose
/// throwaway CA, certificates and user password are made at each start. Needs a JDK even where
/// the plain broker comes from Docker or `KAFKA_BOOTSTRAP_SERVERS`: there is no secured
/// container here. While this process lives, a thread keeps its lease fresh.
#[derive(Debug, Clone)]
pub struct SecureBroker {
    sasl_ssl: PathBuf,
}

impl SecureBroker {
    /// The librdkafka client properties of the SASL_SSL listener (bootstrap servers, protocol,
    /// mechanism, user, password, CA), one `key=value` per line; the file is readable by its
    /// owner only.
    pub fn sasl_ssl_properties(&self) -> PathBuf {
        self.sasl_ssl.clone()
    }

    /// The client properties of the TLS listener (no SASL).
    pub fn ssl_properties(&self) -> PathBuf {
        self.sasl_ssl.with_file_name("ssl.properties")
    }

    /// The CA certificate (PEM) that signed the broker's certificate.
    pub fn ca_pem(&self) -> PathBuf {
        self.sasl_ssl.with_file_name("ca.pem")
    }
}

/// The process-wide secured broker, started (or reused) on first use.
pub fn secure_broker() -> Result<&'static SecureBroker, BrokerError> {
    static BROKER: OnceLock<Result<SecureBroker, BrokerError>> = OnceLock::new();
    BROKER
        .get_or_init(start_secure_broker)
        .as_ref()
        .map_err(Clone::clone)
}

fn start_secure_broker() -> Result<SecureBroker, BrokerError> {
    let script = launcher_script();
    let failed = |message: String| BrokerError::Launcher {
        command: "start --secure",
        state_dir: "the default secure state directory".to_string(),
        message,
    };
    let path = PathBuf::from(
        run_launcher(Command::new(&script).args(["start", "--secure"])).map_err(failed)?,
    );
    if !path.is_file() {
        return Err(failed(format!(
            "{} start --secure printed no client properties file (got {})",
            script.display(),
            path.display()
        )));
    }
    keep_lease_fresh(script, &["touch", "--secure"]);
    Ok(SecureBroker { sasl_ssl: path })
}

/// A broker of a test's own, for tests that kill it: `scripts/kafka` in a private state
/// directory (so it needs a JDK even where the shared broker comes from Docker). Dropping it stops
/// the broker and removes the directory.
pub struct PrivateBroker {
    state_dir: PathBuf,
    bootstrap_servers: String,
    /// `KSTATE_KAFKA_BROKER_PROPERTIES` for the launcher.
    properties: String,
}

impl PrivateBroker {
    /// Starts the broker and waits until it answers.
    pub fn start() -> Result<Self, BrokerError> {
        Self::start_with(&[])
    }

    /// Starts the broker with extra broker `properties` (e.g. a short
    /// `producer.id.expiration.ms`) and waits until it answers.
    pub fn start_with(properties: &[(&str, &str)]) -> Result<Self, BrokerError> {
        let state_dir = std::env::temp_dir().join(unique_topic("private-broker"));
        let mut broker = PrivateBroker {
            state_dir,
            bootstrap_servers: String::new(),
            properties: properties
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
        };
        broker.bootstrap_servers = broker.launcher("start")?;
        Ok(broker)
    }

    /// The `bootstrap.servers` value to give clients.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// Kills the broker with SIGKILL: no shutdown, no goodbye to its clients.
    pub fn kill(&self) -> Result<(), BrokerError> {
        self.signal("KILL")
    }

    /// Stops the broker with SIGSTOP: connections stay open and nothing answers, as with a
    /// broker stuck in a long GC pause or behind a dead network link. [`resume`](Self::resume)
    /// continues it.
    pub fn pause(&self) -> Result<(), BrokerError> {
        self.signal("STOP")
    }

    /// Continues a [`pause`](Self::pause)d broker (SIGCONT).
    pub fn resume(&self) -> Result<(), BrokerError> {
        self.signal("CONT")
    }

    fn signal(&self, signal: &'static str) -> Result<(), BrokerError> {
        let failed = |message: String| BrokerError::Launcher {
            command: signal,
            state_dir: self.state_dir.display().to_string(),
            message,
        };
        let pid = std::fs::read_to_string(self.state_dir.join("broker.pid"))
            .map_err(|e| failed(e.to_string()))?;
        let status = Command::new("kill")
            .args([format!("-{signal}").as_str(), pid.trim()])
            .status()
            .map_err(|e| failed(e.to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(failed(format!(
                "kill -{signal} {} exited with {status}",
                pid.trim()
            )))
        }
    }

    fn launcher(&self, command: &'static str) -> Result<String, BrokerError> {
        let failed = |message: String| BrokerError::Launcher {
            command,
            state_dir: self.state_dir.display().to_string(),
            message,
        };
        let script = launcher_script();
        let output = Command::new(&script)
            .arg(command)
            .env("KSTATE_KAFKA_STATE_DIR", &self.state_dir)
            .env("KSTATE_KAFKA_IDLE_SECS", "600")
            .env("KSTATE_KAFKA_BROKER_PROPERTIES", &self.properties)
            .output()
            .map_err(|e| failed(format!("cannot run {}: {e}", script.display())))?;
        if !output.status.success() {
            return Err(failed(String::from_utf8_lossy(&output.stderr).into_owned()));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        Ok(stdout.lines().last().unwrap_or_default().trim().to_string())
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        // A paused broker would not hear the stop.
        let _ = self.resume();
        if let Err(e) = self.launcher("stop") {
            tracing::warn!(error = %e, "could not stop the private broker");
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// The launcher stops an idle broker; while this process lives, it is not idle.
fn keep_lease_fresh(script: PathBuf, touch: &'static [&'static str]) {
    let spawned = std::thread::Builder::new()
        .name("kafka-lease".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(60));
                if let Err(e) = Command::new(&script).args(touch).output() {
                    tracing::warn!(error = %e, "could not refresh the broker lease");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the broker lease thread");
    }
}
