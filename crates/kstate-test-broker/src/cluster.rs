//! The shared three-node cluster for tests of broker faults: `scripts/kafka start --nodes 3`.
//!
//! One broker with one replica cannot show what a production cluster does when a broker dies:
//! partition leaders move, the ISR shrinks, and the group and transaction coordinators move
//! with their partitions. [`cluster`] starts (or reuses) three KRaft nodes on this machine,
//! every topic replicated 3 times with `min.insync.replicas=2` and no unclean election, and
//! [`Cluster`] lets a test kill, stop, restart, pause and resume one node, and find the node
//! that leads a partition or coordinates a group or a transactional id, so that it can kill
//! exactly that node.
//!
//! The nodes are processes of `scripts/kafka` on the local JDK (a node of a container cluster
//! cannot be signalled from here), shared by every test binary like the single broker and
//! stopped after 15 idle minutes. Tests that kill nodes take [`Cluster::exclusive`]: one such
//! test at a time in a process, each beginning with every node up.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer};

use crate::{BrokerError, keep_lease_fresh, launcher_script, run_launcher, unique_topic};

/// How many nodes [`cluster`] has.
pub const CLUSTER_NODES: i32 = 3;

/// Kafka's topic of group offsets, whose partition leaders are the group coordinators.
const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// Kafka's topic of transaction state, whose partition leaders are the transaction coordinators.
const TRANSACTIONS_TOPIC: &str = "__transaction_state";
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The shared cluster: its bootstrap list and the launcher that controls its nodes.
#[derive(Debug)]
pub struct Cluster {
    bootstrap_servers: String,
    script: PathBuf,
    serial: Mutex<()>,
}

/// The process-wide cluster, started (or reused, with every node brought back up) on first use.
/// Its internal topics exist before this returns (they are created with three replicas on first
/// use, which fails while a node is down), and a thread keeps its lease fresh while this
/// process lives.
pub fn cluster() -> Result<&'static Cluster, BrokerError> {
    static CLUSTER: OnceLock<Result<Cluster, BrokerError>> = OnceLock::new();
    CLUSTER
        .get_or_init(start_cluster)
        .as_ref()
        .map_err(Clone::clone)
}

fn start_cluster() -> Result<Cluster, BrokerError> {
    let script = launcher_script();
    let mut cluster = Cluster {
        bootstrap_servers: String::new(),
        script,
        serial: Mutex::new(()),
    };
    cluster.bootstrap_servers = cluster.launcher(&["start", "--nodes", "3"])?;
    keep_lease_fresh(cluster.script.clone(), &["touch", "--nodes", "3"]);
    cluster.create_internal_topics()?;
    Ok(cluster)
}

/// A test's exclusive use of the cluster (see [`Cluster::exclusive`]).
pub struct ClusterLease<'a> {
    cluster: &'a Cluster,
    _serial: MutexGuard<'a, ()>,
}

impl std::ops::Deref for ClusterLease<'_> {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        self.cluster
    }
}

impl Cluster {
    /// The `bootstrap.servers` value to give clients: every node.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// The node ids, as brokers and the launcher's node commands name them.
    pub fn nodes(&self) -> RangeInclusive<i32> {
        1..=CLUSTER_NODES
    }

    /// Waits until no other test of this process uses the cluster, then brings every node back
    /// up (restarting the ones down, resuming the paused) and returns the lease that holds it.
    /// A test that kills or pauses nodes takes this first.
    pub fn exclusive(&self) -> Result<ClusterLease<'_>, BrokerError> {
        let serial = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        self.heal()?;
        Ok(ClusterLease {
            cluster: self,
            _serial: serial,
        })
    }

    /// Brings every node back up: those down restart on their data, those paused resume.
    pub fn heal(&self) -> Result<(), BrokerError> {
        self.launcher(&["start", "--nodes", "3"]).map(drop)
    }

    /// Kills node `node` with SIGKILL: no shutdown, no leadership handed over; the controller
    /// notices when its broker session times out.
    pub fn kill(&self, node: i32) -> Result<(), BrokerError> {
        self.node_command("kill", node)
    }

    /// Stops node `node` gracefully (SIGTERM): it hands its leaderships over before it exits.
    pub fn stop(&self, node: i32) -> Result<(), BrokerError> {
        self.node_command("stop", node)
    }

    /// Starts node `node` again on its data and ports (stopping it first if it runs) and waits
    /// until it answers. It rejoins the ISRs once it has caught up: see
    /// [`wait_for_full_isr`](Self::wait_for_full_isr).
    pub fn restart(&self, node: i32) -> Result<(), BrokerError> {
        self.node_command("restart", node)
    }

    /// Stops node `node` with SIGSTOP: its connections stay open and nothing answers, as with a
    /// long GC pause or a dead link.
    pub fn pause(&self, node: i32) -> Result<(), BrokerError> {
        self.node_command("pause", node)
    }

    /// Continues a [`pause`](Self::pause)d node.
    pub fn resume(&self, node: i32) -> Result<(), BrokerError> {
        self.node_command("resume", node)
    }

    /// The node that leads `topic`'s `partition` now, as the cluster's metadata says (after a
    /// kill, the dead node until the controller fences it).
    pub fn leader(&self, topic: &str, partition: i32) -> Result<i32, BrokerError> {
        let (leader, _) = self.partition_state(topic, partition)?;
        leader.ok_or_else(|| BrokerError::Cluster {
            command: format!("leader of {topic}/{partition}"),
            message: "the partition has no leader".into(),
        })
    }

    /// The in-sync replicas of `topic`'s `partition`.
    pub fn isr(&self, topic: &str, partition: i32) -> Result<Vec<i32>, BrokerError> {
        Ok(self.partition_state(topic, partition)?.1)
    }

    /// The node that coordinates consumer group `group`: the leader of its partition of
    /// `__consumer_offsets` (Kafka's `partitionFor`: `abs(group.hashCode()) % partitions`).
    pub fn group_coordinator(&self, group: &str) -> Result<i32, BrokerError> {
        self.coordinator(OFFSETS_TOPIC, group)
    }

    /// The node that coordinates transactional id `id`: the leader of its partition of
    /// `__transaction_state` (Kafka's `partitionFor`, as for groups).
    pub fn transaction_coordinator(&self, id: &str) -> Result<i32, BrokerError> {
        self.coordinator(TRANSACTIONS_TOPIC, id)
    }

    /// Waits until every partition of `topic` has every replica in its ISR (a restarted node has
    /// caught up), or `timeout` passes.
    pub fn wait_for_full_isr(&self, topic: &str, timeout: Duration) -> Result<(), BrokerError> {
        self.wait_in_sync(Some(topic), timeout)
    }

    /// Waits until every partition of every topic has every replica in its ISR: the cluster can
    /// lose any one node again.
    pub fn wait_until_in_sync(&self, timeout: Duration) -> Result<(), BrokerError> {
        self.wait_in_sync(None, timeout)
    }

    fn wait_in_sync(&self, topic: Option<&str>, timeout: Duration) -> Result<(), BrokerError> {
        let deadline = Instant::now() + timeout;
        loop {
            let short: Vec<String> = match self.metadata(topic) {
                Ok(metadata) => metadata
                    .topics()
                    .iter()
                    .flat_map(|t| t.partitions().iter().map(move |p| (t.name(), p)))
                    .filter(|(_, p)| p.isr().len() < p.replicas().len())
                    .map(|(t, p)| format!("{t}/{} isr {:?}", p.id(), p.isr()))
                    .collect(),
                // A node that just came back may refuse a request or two.
                Err(e) => vec![e.to_string()],
            };
            if short.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(BrokerError::Cluster {
                    command: format!(
                        "wait for the full ISR of {}",
                        topic.unwrap_or("every topic")
                    ),
                    message: format!(
                        "still short after {timeout:?}: {}",
                        short.into_iter().take(10).collect::<Vec<_>>().join(", ")
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn coordinator(&self, topic: &str, key: &str) -> Result<i32, BrokerError> {
        let metadata = self.metadata(Some(topic))?;
        let partitions = metadata
            .topics()
            .first()
            .map(|t| t.partitions().len())
            .unwrap_or_default();
        if partitions == 0 {
            return Err(BrokerError::Cluster {
                command: format!("coordinator of {key:?}"),
                message: format!("{topic} has no partitions yet"),
            });
        }
        let partition = coordinator_partition(key, partitions as i32);
        self.leader(topic, partition)
    }

    fn partition_state(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<(Option<i32>, Vec<i32>), BrokerError> {
        let metadata = self.metadata(Some(topic))?;
        metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .map(|p| {
                let leader = (p.leader() >= 0).then_some(p.leader());
                (leader, p.isr().to_vec())
            })
            .ok_or_else(|| BrokerError::Cluster {
                command: format!("metadata of {topic}/{partition}"),
                message: "no such partition".into(),
            })
    }

    fn metadata(&self, topic: Option<&str>) -> Result<Metadata, BrokerError> {
        let failed = |message: String| BrokerError::Cluster {
            command: format!("metadata of {}", topic.unwrap_or("the cluster")),
            message,
        };
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap_servers)
            .create()
            .map_err(|e| failed(e.to_string()))?;
        consumer
            .fetch_metadata(topic, METADATA_TIMEOUT)
            .map_err(|e| failed(e.to_string()))
    }

    /// Creates `__consumer_offsets` and `__transaction_state` while every node is up: a group's
    /// first offset lookup and a transactional producer's first id ask for them.
    fn create_internal_topics(&self) -> Result<(), BrokerError> {
        let failed = |message: String| BrokerError::Cluster {
            command: "create the internal topics".into(),
            message,
        };
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("transactional.id", unique_topic("cluster-warmup"))
            .create()
            .map_err(|e| failed(e.to_string()))?;
        producer
            .init_transactions(Duration::from_secs(60))
            .map_err(|e| failed(format!("init_transactions: {e}")))?;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("group.id", unique_topic("cluster-warmup"))
            .create()
            .map_err(|e| failed(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self
                .metadata(Some(OFFSETS_TOPIC))
                .map(|m| m.topics().iter().all(|t| !t.partitions().is_empty()))
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            // Asks the group's coordinator, which creates the offsets topic.
            let _ = consumer.committed_offsets(Default::default(), Duration::from_secs(5));
            if Instant::now() >= deadline {
                return Err(failed(format!("{OFFSETS_TOPIC} was not created in 60 s")));
            }
        }
    }

    fn node_command(&self, command: &str, node: i32) -> Result<(), BrokerError> {
        self.launcher(&[command, &node.to_string()]).map(drop)
    }

    /// Runs the launcher on the cluster's state directory (its default, whatever
    /// `KSTATE_KAFKA_STATE_DIR` names for the single broker); returns its last stdout line.
    fn launcher(&self, args: &[&str]) -> Result<String, BrokerError> {
        let failed = |message: String| BrokerError::Cluster {
            command: args.join(" "),
            message,
        };
        run_launcher(
            Command::new(&self.script)
                .args(args)
                .env_remove("KSTATE_KAFKA_STATE_DIR")
                .env_remove("KSTATE_KAFKA_BROKER_PROPERTIES"),
        )
        .map_err(failed)
    }
}

/// The partition of an internal topic of `partitions` that holds `key`: Kafka's
/// `Utils.abs(key.hashCode()) % partitions`, with Java's `String.hashCode` over UTF-16 units.
fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    let hash = key.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    // Kafka's Utils.abs: Integer.MIN_VALUE maps to 0.
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions
}

#[cfg(test)]
mod tests {
    use super::coordinator_partition;

    #[test]
    fn coordinator_partitions_follow_javas_string_hash() {
        // "kstate".hashCode() in Java (jshell): -1121890554.
        assert_eq!(coordinator_partition("kstate", 50), 1121890554 % 50);
        assert_eq!(coordinator_partition("", 3), 0);
        // "polygenelubricants".hashCode() is Integer.MIN_VALUE, which Kafka maps to 0.
        assert_eq!(coordinator_partition("polygenelubricants", 50), 0);
    }
}
