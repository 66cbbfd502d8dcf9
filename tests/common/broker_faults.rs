//! Faults inflicted on the nodes of the three-node cluster (`kstate_test_broker::cluster`)
//! during a chaos run, besides the application's own kills: the leader of a changelog or an
//! input partition, a transaction or group coordinator SIGKILLed and restarted, a rolling
//! restart, a node paused past the clients' request timeout. Shared by the chaos runs of
//! `topologies.rs` and `windowed_count.rs`, so that every topology meets the same faults.

use std::time::{Duration, Instant};

use kstate_test_broker::{BrokerError, Cluster};
use rand::{Rng, SeedableRng};

/// A broker fault of a chaos run on the cluster. Each ends with every node back and in sync, so
/// that the next one is one node down at a time (min.insync.replicas=2 of 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerFault {
    /// SIGKILL the leader of a random partition of the changelog; restart it a few seconds
    /// later.
    ChangelogLeader,
    /// The same for a random partition of a random input (a repartition topic included).
    InputLeader,
    /// The same for the transaction coordinator of a random copy's producer.
    TransactionCoordinator,
    /// The same for the application's group coordinator.
    GroupCoordinator,
    /// Every node in turn stopped gracefully and started again, each back in sync before the
    /// next.
    RollingRestart,
    /// A random node paused (SIGSTOP) past the clients' request timeout (30 s), then resumed.
    Pause,
}

/// Every kind, for runs that draw them at random.
pub const ALL_BROKER_FAULTS: [BrokerFault; 6] = [
    BrokerFault::ChangelogLeader,
    BrokerFault::InputLeader,
    BrokerFault::TransactionCoordinator,
    BrokerFault::GroupCoordinator,
    BrokerFault::RollingRestart,
    BrokerFault::Pause,
];

/// How long a node inflicted a fault on takes to be back in every ISR before the next fault.
const BACK_IN_SYNC: Duration = Duration::from_secs(180);

/// What an application under faults is made of, for choosing whom to kill.
pub struct Targets {
    /// The application id (its group).
    pub app_id: String,
    /// The changelog whose leaders [`BrokerFault::ChangelogLeader`] kills.
    pub changelog: String,
    /// The inputs whose leaders [`BrokerFault::InputLeader`] kills.
    pub inputs: Vec<String>,
    /// Partitions of each of them.
    pub partitions: i32,
    /// The copies, each with instance id `copy-<slot>` and one thread: transactional ids
    /// `<app_id>-copy-<slot>-0`.
    pub copies: usize,
}

impl BrokerFault {
    /// The fault's name in `KSTATE_BROKER_FAULTS`.
    pub fn name(self) -> &'static str {
        match self {
            BrokerFault::ChangelogLeader => "changelog-leader",
            BrokerFault::InputLeader => "input-leader",
            BrokerFault::TransactionCoordinator => "transaction-coordinator",
            BrokerFault::GroupCoordinator => "group-coordinator",
            BrokerFault::RollingRestart => "rolling-restart",
            BrokerFault::Pause => "pause",
        }
    }

    /// Inflicts the fault on `cluster`, choosing among `targets`, and waits until every node is
    /// back in sync. Returns what it did.
    pub fn inflict(
        self,
        cluster: &Cluster,
        targets: &Targets,
        rng: &mut impl Rng,
    ) -> anyhow::Result<String> {
        let victim = match self {
            BrokerFault::ChangelogLeader => {
                let partition = rng.random_range(0..targets.partitions);
                victim(|| cluster.leader(&targets.changelog, partition))?
            }
            BrokerFault::InputLeader => {
                let input = &targets.inputs[rng.random_range(0..targets.inputs.len())];
                let partition = rng.random_range(0..targets.partitions);
                victim(|| cluster.leader(input, partition))?
            }
            BrokerFault::TransactionCoordinator => {
                let copy = rng.random_range(0..targets.copies);
                let id = format!("{}-copy-{copy}-0", targets.app_id);
                victim(|| cluster.transaction_coordinator(&id))?
            }
            BrokerFault::GroupCoordinator => victim(|| cluster.group_coordinator(&targets.app_id))?,
            BrokerFault::RollingRestart => {
                for node in cluster.nodes() {
                    cluster.restart(node)?;
                    cluster.wait_until_in_sync(BACK_IN_SYNC)?;
                }
                return Ok("rolling restart of every node".into());
            }
            BrokerFault::Pause => {
                let node = rng.random_range(cluster.nodes());
                cluster.pause(node)?;
                std::thread::sleep(Duration::from_secs(35));
                cluster.resume(node)?;
                cluster.wait_until_in_sync(BACK_IN_SYNC)?;
                return Ok(format!("node {node} paused for 35 s"));
            }
        };
        cluster.kill(victim)?;
        let down = Duration::from_millis(rng.random_range(2_000..8_000));
        std::thread::sleep(down);
        cluster.restart(victim)?;
        cluster.wait_until_in_sync(BACK_IN_SYNC)?;
        Ok(format!(
            "{self:?}: node {victim} killed, back after {down:.1?}"
        ))
    }
}

/// The node `find` names, asked again for up to a minute while it names none: the application
/// creates its changelogs as its tasks first open, and a fault drawn early can come before
/// (seen in CI: "metadata of ...-counts-changelog/5: no such partition").
fn victim(mut find: impl FnMut() -> Result<i32, BrokerError>) -> anyhow::Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match find() {
            Ok(node) => return Ok(node),
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The broker faults of a run on the cluster, popped from the end: `KSTATE_BROKER_FAULTS`
/// random ones of every kind when it is a number (`scripts/topology-kills --broker-faults N`), the
/// ones it names in order when it is a list (`input-leader,pause`), or CI's short run: one
/// changelog leader killed, then a rolling restart.
pub fn broker_faults(seed: u64) -> anyhow::Result<Vec<BrokerFault>> {
    let Ok(asked) = std::env::var("KSTATE_BROKER_FAULTS") else {
        return Ok(vec![
            BrokerFault::RollingRestart,
            BrokerFault::ChangelogLeader,
        ]);
    };
    if let Ok(n) = asked.parse::<usize>() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        return Ok((0..n)
            .map(|_| ALL_BROKER_FAULTS[rng.random_range(0..ALL_BROKER_FAULTS.len())])
            .collect());
    }
    let mut named = asked
        .split(',')
        .map(|name| {
            ALL_BROKER_FAULTS
                .into_iter()
                .find(|fault| fault.name() == name.trim())
                .ok_or_else(|| {
                    let known: Vec<_> = ALL_BROKER_FAULTS.iter().map(|f| f.name()).collect();
                    anyhow::anyhow!(
                        "KSTATE_BROKER_FAULTS: no fault named {name:?} (a number, or a list of {})",
                        known.join(", ")
                    )
                })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    named.reverse();
    Ok(named)
}
