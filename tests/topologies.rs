//! Applications with several inputs: task *p* is partition *p* of every input, so it must run on
//! one worker only, the one that owns partition *p* of every input. Topologies (the processors
//! are below):
//! - **merge-count**: inputs A and B (and C), co-partitioned, key `k` written to partition
//!   `k % P` of whichever input; the count per key over all inputs is kept in a store and
//!   `(key, count)` goes to the output, same partition. With a second store (**several
//!   stores**), the count per (input, key) is kept too and sent to a second output.
//! - **repartition**: input `data`; each record is re-keyed (`key-k` → `r-{k % 24}`) and sent to
//!   the partition of its new key (Kafka's partitioner) of an internal repartition topic, which
//!   the application also reads; records from there are counted per new key.
//!
//! A `read_committed` reader of each output must see, for every key, exactly `1, 2, ..., n`
//! with `n` its true count (no duplicate, no gap: `check_exact_sequences`).
//!
//! At-least-once, no crash, three members in this process (each its own state directory), the
//! group protocol left at its default for two inputs and for three inputs with two stores, and
//! set to `Eager` and to `Consumer` (KIP-848) for two inputs: exact sequences (without a crash
//! at-least-once repeats nothing), checked again a few commit intervals after the final counts
//! (a late duplicate); each task ran on one member at a time throughout (sampled every 20 ms)
//! and at the end the members' tasks cover every partition exactly once; no member fails.
//!
//! Exactly-once under SIGKILL: three copies of this test binary run the application as child
//! processes (`child_topology`; `common::child`) while a producer writes, and are killed and
//! restarted at random; then, the group settled, one leaves cleanly and stays away past the
//! session timeout while the producer writes again, so that the others take over its tasks
//! while keeping theirs, and comes back. Two inputs with the default protocol; three inputs with
//! two stores and two threads per copy; the repartition topology; two inputs with
//! `GroupProtocol::Consumer` on a broker of its own whose consumer-group session timeout is
//! 6 s. Exact sequences, no copy exits by itself or fails, every copy stops cleanly on SIGTERM,
//! and no log names a foreign write (two writers of one changelog partition).
//!
//! The zombie timer test: one copy ticks (a wall-clock timer writing a store and sending an
//! output, no input records) and is paused right after a commit, with nothing open in its
//! transaction; a second copy takes over every task; the first is resumed when its timer is
//! overdue. None of the paused processor's ticks may become visible after the takeover, and the
//! second copy goes on and never fails.
//!
//! On the three-node cluster (`*_on_a_cluster_*`: replication 3, `min.insync.replicas=2`), the
//! same chaos with three inputs and two stores, and with the repartition topology, while nodes
//! fail too: the leader of a changelog or an input partition or the transaction or group
//! coordinator is killed and comes back, every node restarts in turn, a node stalls past the
//! request timeout. No copy may fail on a broker's loss, and every count is exact; a foreign
//! write is allowed only when a restore again followed it (a broker's fault can delay a killed
//! copy's last records until after the next owner's restore). The three
//! inputs run at-least-once through the same faults too: there a record taken again after a
//! kill counts twice, so every key's last count must reach its true count (nothing lost), and a
//! copy that saw another's late changelog write must have restored again. CI inflicts
//! one changelog leader kill and one rolling restart per test; `KSTATE_BROKER_FAULTS`
//! (`scripts/topology-kills --broker-faults`) draws that many faults of every kind.
//!
//! CI runs at least 6 kills and 15 s of chaos per exactly-once test; `KSTATE_TOPOLOGY_KILLS`
//! and `KSTATE_TOPOLOGY_SECONDS` run longer (`scripts/topology-kills`), `KSTATE_TOPOLOGY_SEED`
//! repeats a run's kills.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use common::broker_faults::{BrokerFault, Targets, broker_faults};
use common::child::{self, ChildEnv, Copies};
use common::streams::{check_exact_sequences, env_number, last_counts, read_topic, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, AppBuilder, AppState, Context, GroupProtocol, ProcessingGuarantee, Processor, Record,
    Running, StoreHandle, StoreOptions, TaskState, TimeKind, Timer, partition_for,
};
use kstate_test_broker::{Cluster, unique_topic};
use rand::{Rng, SeedableRng};

/// Partitions of every topic: not a multiple of the three members, so that an assignor that
/// balances partitions without co-partitioning them cannot co-partition by chance.
const PARTITIONS: i32 = 8;
/// Keys of the inputs: `key-0` .. `key-239`, key `k` in partition `k % PARTITIONS`.
const KEYS: usize = 240;
/// New keys of the repartition topology: `r-0` .. `r-23`.
const REKEYS: usize = 24;
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_secs(180);
/// The in-process runs' waits: they are done in seconds.
const IN_PROCESS_WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Topologies

/// Counts per key over every input; with `per_input`, also per (input, key) in a second store.
struct MergeCount {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
    per_input: Option<(StoreHandle<Vec<u8>, u64>, String)>,
}

/// The key of the per-(input, key) store and output.
fn per_input_key(topic: &str, key: &[u8]) -> Vec<u8> {
    let mut k = topic.as_bytes().to_vec();
    k.push(b'|');
    k.extend_from_slice(key);
    k
}

/// Adds one to `key`'s count in `store`; the new count.
fn increment(
    ctx: &Context<'_>,
    store: &StoreHandle<Vec<u8>, u64>,
    key: &Vec<u8>,
) -> Result<u64, BoxError> {
    let counts = ctx.store(store);
    let n = counts.get(key)?.unwrap_or(0) + 1;
    counts.put(key, &n)?;
    Ok(n)
}

impl Processor for MergeCount {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let n = increment(ctx, &self.counts, &key)?;
        ctx.send(&self.output, &key, Some(n.to_string().as_bytes()))?;
        if let Some((store, output)) = &self.per_input {
            let key = per_input_key(record.topic, &key);
            let n = increment(ctx, store, &key)?;
            ctx.send(output, &key, Some(n.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

/// `key-k` → `r-{k % REKEYS}`.
fn rekey(key: &[u8]) -> Result<Vec<u8>, BoxError> {
    let k: usize = std::str::from_utf8(key)?
        .strip_prefix("key-")
        .ok_or("a key without the key- prefix")?
        .parse()?;
    Ok(format!("r-{}", k % REKEYS).into_bytes())
}

/// Re-keys `data` records into `repartition` (by the new key's partition); counts the records
/// read back from `repartition` per new key.
struct Repartition {
    data: String,
    repartition: String,
    partitions: i32,
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
}

impl Processor for Repartition {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default();
        if record.topic == self.data {
            let new_key = rekey(key)?;
            let partition = partition_for(&new_key, self.partitions);
            ctx.send_to(&self.repartition, partition, &new_key, record.value)?;
        } else {
            let key = key.to_vec();
            let n = increment(ctx, &self.counts, &key)?;
            ctx.send(&self.output, &key, Some(n.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

/// What an application runs: its inputs, outputs and processor.
#[derive(Debug, Clone)]
enum Topology {
    /// merge-count over `inputs`; `per_input_output` set: the second store and its output.
    Merge {
        inputs: Vec<String>,
        output: String,
        per_input_output: Option<String>,
    },
    /// repartition: reads `data` and `repartition`.
    Repartition {
        data: String,
        repartition: String,
        output: String,
    },
}

impl Topology {
    fn inputs(&self) -> Vec<String> {
        match self {
            Topology::Merge { inputs, .. } => inputs.clone(),
            Topology::Repartition {
                data, repartition, ..
            } => vec![data.clone(), repartition.clone()],
        }
    }

    /// Every output with its true counts' name: `(topic, per-input?)`.
    fn outputs(&self) -> Vec<String> {
        match self {
            Topology::Merge {
                output,
                per_input_output,
                ..
            } => std::iter::once(output.clone())
                .chain(per_input_output.clone())
                .collect(),
            Topology::Repartition { output, .. } => vec![output.clone()],
        }
    }

    /// Every topic the test creates.
    fn topics(&self) -> Vec<String> {
        let mut topics = self.inputs();
        topics.extend(self.outputs());
        topics
    }

    /// Declares the inputs and stores on `builder` and builds the application.
    fn build(&self, builder: &mut AppBuilder) -> anyhow::Result<App> {
        for input in self.inputs() {
            builder.input(input);
        }
        let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
        let app = match self.clone() {
            Topology::Merge {
                output,
                per_input_output,
                ..
            } => {
                let per_input = per_input_output.map(|o| {
                    let store = builder.store::<Vec<u8>, u64>("per-input", StoreOptions::default());
                    (store, o)
                });
                builder.build(move |_| {
                    Box::new(MergeCount {
                        counts: counts.clone(),
                        output: output.clone(),
                        per_input: per_input.clone(),
                    })
                })?
            }
            Topology::Repartition {
                data,
                repartition,
                output,
            } => builder.build(move |_| {
                Box::new(Repartition {
                    data: data.clone(),
                    repartition: repartition.clone(),
                    partitions: PARTITIONS,
                    counts: counts.clone(),
                    output: output.clone(),
                })
            })?,
        };
        Ok(app)
    }

    /// For a child: the `KIND`, `INPUTS`, `OUTPUT` and `OUTPUT2` variables.
    fn to_env(&self) -> Vec<(&'static str, String)> {
        match self {
            Topology::Merge {
                inputs,
                output,
                per_input_output,
            } => vec![
                ("KIND", "merge".into()),
                ("INPUTS", inputs.join(",")),
                ("OUTPUT", output.clone()),
                ("OUTPUT2", per_input_output.clone().unwrap_or_default()),
            ],
            Topology::Repartition {
                data,
                repartition,
                output,
            } => vec![
                ("KIND", "repartition".into()),
                ("INPUTS", format!("{data},{repartition}")),
                ("OUTPUT", output.clone()),
                ("OUTPUT2", String::new()),
            ],
        }
    }

    fn from_env(env: &ChildEnv) -> anyhow::Result<Topology> {
        let inputs = env.list("INPUTS")?;
        let output = env.var("OUTPUT")?;
        match env.var("KIND")?.as_str() {
            "merge" => Ok(Topology::Merge {
                inputs,
                output,
                per_input_output: Some(env.var("OUTPUT2")?).filter(|o| !o.is_empty()),
            }),
            "repartition" => {
                let [data, repartition] = <[String; 2]>::try_from(inputs)
                    .map_err(|i| anyhow::anyhow!("repartition takes two inputs, not {i:?}"))?;
                Ok(Topology::Repartition {
                    data,
                    repartition,
                    output,
                })
            }
            other => bail!("unknown topology {other}"),
        }
    }

    /// A batch of input records, `(topic, partition, key)`, starting at record number `first`:
    /// key `k = i * 31 % KEYS` in partition `k % PARTITIONS`; merge-count spreads the records
    /// over its inputs so that every key comes from each of them in turn.
    fn batch(&self, first: usize, n: usize) -> Vec<(String, i32, Vec<u8>)> {
        (first..first + n)
            .map(|i| {
                let k = i * 31 % KEYS;
                let topic = match self {
                    Topology::Merge { inputs, .. } => inputs[(i / KEYS + i) % inputs.len()].clone(),
                    Topology::Repartition { data, .. } => data.clone(),
                };
                (
                    topic,
                    (k as i32) % PARTITIONS,
                    format!("key-{k}").into_bytes(),
                )
            })
            .collect()
    }

    /// Writes `batch` and adds it to `truth`.
    fn produce(
        &self,
        inputs: &mut InputProducer,
        batch: &[(String, i32, Vec<u8>)],
        truth: &mut Truth,
    ) -> anyhow::Result<()> {
        inputs.write(batch)?;
        for (topic, _, key) in batch {
            match self {
                Topology::Merge {
                    output,
                    per_input_output,
                    ..
                } => {
                    truth.add(output, key.clone());
                    if let Some(o) = per_input_output {
                        truth.add(o, per_input_key(topic, key));
                    }
                }
                Topology::Repartition { output, .. } => {
                    truth.add(output, rekey(key).map_err(|e| anyhow::anyhow!("{e}"))?)
                }
            }
        }
        Ok(())
    }
}

/// Writes the input records (idempotent, acks=all) and waits until each batch is acknowledged.
struct InputProducer {
    producer: rdkafka::producer::ThreadedProducer<kstate_bench::kafka::Settled>,
    sent: u64,
}

impl InputProducer {
    fn new(servers: &str) -> anyhow::Result<InputProducer> {
        Ok(InputProducer {
            producer: kstate_bench::kafka::producer(servers, 5, Default::default())?,
            sent: 0,
        })
    }

    /// Writes `(topic, partition, key)` records with the value `v`; returns once all are
    /// acknowledged (an error if one was not delivered).
    fn write(&mut self, batch: &[(String, i32, Vec<u8>)]) -> anyhow::Result<()> {
        use rdkafka::producer::{BaseRecord, Producer};
        for (topic, partition, key) in batch {
            kstate_bench::kafka::send(
                &self.producer,
                BaseRecord::to(topic)
                    .partition(*partition)
                    .key(&key[..])
                    .payload(&b"v"[..]),
            );
            self.sent += 1;
        }
        self.producer
            .context()
            .wait_for(self.sent, Duration::from_secs(60))?;
        Ok(())
    }
}

/// A thread writing batches of 100 input records every 50 ms until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<(Truth, usize)>>,
}

impl Writer {
    /// Starts writing at record number `first`.
    fn start(servers: &str, topology: &Topology, first: usize) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (servers, topology, stopped) = (servers.to_string(), topology.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut truth = Truth::default();
            let mut inputs = InputProducer::new(&servers)?;
            let mut next = first;
            while !stopped.load(Ordering::Acquire) {
                let batch = topology.batch(next, 100);
                topology.produce(&mut inputs, &batch, &mut truth)?;
                next += batch.len();
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok((truth, next))
        });
        Writer { stop, thread }
    }

    /// Stops it: what it wrote, and the next record number.
    fn stop(self) -> anyhow::Result<(Truth, usize)> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("producer thread")
    }
}

/// The true count of every key of every output.
#[derive(Debug, Default)]
struct Truth(BTreeMap<String, BTreeMap<Vec<u8>, u64>>);

impl Truth {
    fn merge(&mut self, other: Truth) {
        for (output, counts) in other.0 {
            let mine = self.0.entry(output).or_default();
            for (key, n) in counts {
                *mine.entry(key).or_insert(0) += n;
            }
        }
    }

    fn add(&mut self, output: &str, key: Vec<u8>) {
        *self
            .0
            .entry(output.to_string())
            .or_default()
            .entry(key)
            .or_insert(0) += 1;
    }

    fn records(&self) -> u64 {
        self.0.values().flat_map(|t| t.values()).sum()
    }

    /// Whether every key's last count in every output has reached its true count.
    fn reached(&self, servers: &str) -> anyhow::Result<bool> {
        for (output, truth) in &self.0 {
            let counts = last_counts(&read_topic(servers, output, PARTITIONS)?);
            if !truth
                .iter()
                .all(|(k, n)| counts.get(k).is_some_and(|c| c >= n))
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Up to 10 keys whose last count in an output is below their true count: (output, key,
    /// true count, last count).
    fn short(&self, servers: &str) -> anyhow::Result<String> {
        let mut short = Vec::new();
        for (output, truth) in &self.0 {
            let counts = last_counts(&read_topic(servers, output, PARTITIONS)?);
            for (k, n) in truth {
                if counts.get(k).is_none_or(|c| c < n) && short.len() < 10 {
                    short.push((
                        output.clone(),
                        String::from_utf8_lossy(k).to_string(),
                        *n,
                        counts.get(k).copied(),
                    ));
                }
            }
        }
        Ok(format!(
            "keys short (output, key, true, counted): {short:?}"
        ))
    }

    /// At-least-once: every key's last count in every output at least its true count, and no
    /// key that was never written. Says how many keys counted some record twice.
    fn check_at_least(&self, servers: &str) -> anyhow::Result<String> {
        let (mut keys, mut over, mut extra) = (0, 0, 0u64);
        for (output, truth) in &self.0 {
            let counts = last_counts(&read_topic(servers, output, PARTITIONS)?);
            let short: Vec<_> = truth
                .iter()
                .filter(|(k, n)| counts.get(*k).is_none_or(|c| c < n))
                .take(10)
                .map(|(k, n)| (String::from_utf8_lossy(k).to_string(), *n, counts.get(k)))
                .collect();
            anyhow::ensure!(
                short.is_empty(),
                "records lost at-least-once: keys of {output} below their true count (key, \
                 true, counted): {short:?}"
            );
            let unknown: Vec<_> = counts.keys().filter(|k| !truth.contains_key(*k)).collect();
            anyhow::ensure!(
                unknown.is_empty(),
                "{} keys in {output} were never written, e.g. {:?}",
                unknown.len(),
                String::from_utf8_lossy(unknown[0])
            );
            for (k, n) in truth {
                keys += 1;
                if counts[k] > *n {
                    over += 1;
                    extra += counts[k] - n;
                }
            }
        }
        Ok(format!(
            "{over} of {keys} keys counted some record twice ({extra} counts over)"
        ))
    }

    /// [`check_exact_sequences`] on every output.
    fn check_exact(&self, servers: &str) -> anyhow::Result<()> {
        for (output, truth) in &self.0 {
            check_exact_sequences(servers, output, PARTITIONS, truth)?;
        }
        Ok(())
    }
}

fn merge(name: &str, inputs: usize, per_input: bool) -> Topology {
    Topology::Merge {
        inputs: (0..inputs)
            .map(|i| unique_topic(&format!("{name}-in{i}")))
            .collect(),
        output: unique_topic(&format!("{name}-out")),
        per_input_output: per_input.then(|| unique_topic(&format!("{name}-out-per-input"))),
    }
}

fn repartition(name: &str) -> Topology {
    Topology::Repartition {
        data: unique_topic(&format!("{name}-data")),
        repartition: unique_topic(&format!("{name}-repartition")),
        output: unique_topic(&format!("{name}-out")),
    }
}

async fn create_topics(servers: &str, topology: &Topology) -> anyhow::Result<()> {
    for topic in topology.topics() {
        common::create_topic(servers, &topic, PARTITIONS, "delete").await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// At-least-once, in process

/// Which members hold each task now (restoring or running), and in which state.
fn owners(members: &[Running]) -> BTreeMap<i32, Vec<(usize, TaskState)>> {
    let mut owners: BTreeMap<i32, Vec<(usize, TaskState)>> = BTreeMap::new();
    for (m, member) in members.iter().enumerate() {
        for task in member.tasks() {
            owners
                .entry(task.task.partition)
                .or_default()
                .push((m, task.state));
        }
    }
    owners
}

/// An error naming the first failed member.
fn check_members(members: &[Running]) -> anyhow::Result<()> {
    for (m, member) in members.iter().enumerate() {
        match member.state() {
            AppState::Running => {}
            state => bail!("member {m} is {state:?}; tasks: {:?}", owners(members)),
        }
    }
    Ok(())
}

/// Three members of `topology` in this process, at-least-once, `protocol` (or the default),
/// while 6,000 records are written: exact counts, each task on one member at a time, every task
/// on exactly one member at the end, no member failed.
async fn in_process(
    name: &str,
    topology: Topology,
    protocol: Option<GroupProtocol>,
) -> anyhow::Result<()> {
    if std::env::var_os("KSTATE_TOPOLOGY_LOG").is_some() {
        child::init_logging();
    }
    let servers = kstate_test_broker::bootstrap_servers()?;
    create_topics(&servers, &topology).await?;
    let app_id = unique_topic(name);
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let mut members = Vec::new();
    for dir in &dirs {
        let mut builder = App::builder(app_id.clone(), servers.clone());
        builder
            .state_dir(dir.path())
            .threads(1)
            .commit_interval(COMMIT_INTERVAL);
        if let Some(protocol) = protocol {
            builder.group_protocol(protocol);
        }
        members.push(topology.build(&mut builder)?.start()?);
    }
    let members = &members[..];

    // Throughout: no task on two members at once.
    let stop = AtomicBool::new(false);
    let doubled_seen = std::sync::Mutex::new(None::<String>);
    let check = || -> anyhow::Result<()> {
        if let Some(doubled) = doubled_seen.lock().unwrap().clone() {
            bail!("{doubled}");
        }
        check_members(members)
    };
    let outcome: anyhow::Result<()> = std::thread::scope(|scope| {
        let monitor = scope.spawn(|| {
            let mut samples = 0u64;
            while !stop.load(Ordering::Acquire) {
                samples += 1;
                let doubled: BTreeMap<_, _> = owners(members)
                    .into_iter()
                    .filter(|(_, o)| o.len() > 1)
                    .collect();
                if !doubled.is_empty() {
                    let message = format!(
                        "tasks on two members at once (task: [(member, state)]): {doubled:?}"
                    );
                    *doubled_seen.lock().unwrap() = Some(message.clone());
                    return Err(anyhow::anyhow!(message));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(samples)
        });
        let run = || -> anyhow::Result<()> {
            // Half the input while the members join, half once each of them runs tasks.
            let mut truth = Truth::default();
            let mut inputs = InputProducer::new(&servers)?;
            topology.produce(&mut inputs, &topology.batch(0, 3_000), &mut truth)?;
            let waited = wait_for(
                "the group to settle: every member running tasks, every task running",
                IN_PROCESS_WAIT,
                || {
                    check()?;
                    let owners = owners(members);
                    let running = |m: usize| {
                        owners
                            .values()
                            .any(|o| o.iter().any(|&(o, s)| o == m && s == TaskState::Running))
                    };
                    Ok(owners.len() == PARTITIONS as usize
                        && owners
                            .values()
                            .all(|o| o.iter().any(|(_, s)| *s == TaskState::Running))
                        && (0..members.len()).all(running))
                },
            );
            waited.map_err(|e| {
                anyhow::anyhow!(
                    "{e}; tasks (task: [(member, state)]): {:?}",
                    owners(members)
                )
            })?;
            topology.produce(&mut inputs, &topology.batch(3_000, 3_000), &mut truth)?;
            let waited = wait_for("every key's final count", IN_PROCESS_WAIT, || {
                check()?;
                truth.reached(&servers)
            });
            waited.map_err(|e| {
                let short = truth.short(&servers).unwrap_or_else(|e| e.to_string());
                anyhow::anyhow!(
                    "{e}; {short}; tasks (task: [(member, state)]): {:?}",
                    owners(members)
                )
            })?;
            // A late duplicate would show within a few commit intervals.
            std::thread::sleep(COMMIT_INTERVAL * 5 + Duration::from_secs(1));
            truth.check_exact(&servers)?;
            let waited = wait_for(
                "every task running on exactly one member",
                Duration::from_secs(30),
                || {
                    check()?;
                    let owners = owners(members);
                    Ok(owners.len() == PARTITIONS as usize
                        && owners
                            .values()
                            .all(|o| o.len() == 1 && o[0].1 == TaskState::Running))
                },
            );
            waited.map_err(|e| {
                anyhow::anyhow!(
                    "{e}; tasks (task: [(member, state)]): {:?}",
                    owners(members)
                )
            })?;
            check()
        };
        let outcome = run();
        stop.store(true, Ordering::Release);
        let monitored = monitor.join().expect("monitor thread");
        outcome?;
        let samples = monitored?;
        eprintln!("{name}: {samples} samples of the members' tasks, none doubled");
        Ok(())
    });
    for member in members {
        member.shutdown();
    }
    let mut stopped = Vec::new();
    for (m, member) in members.iter().enumerate() {
        stopped.push((m, member.wait()));
    }
    outcome?;
    for (m, result) in stopped {
        result.with_context(|| format!("member {m} failed"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_two_inputs_default_protocol_runs_each_task_once_and_counts_exactly()
-> anyhow::Result<()> {
    let name = "topo-alo-2";
    in_process(name, merge(name, 2, false), None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_three_inputs_two_stores_default_protocol_runs_each_task_once_and_counts_exactly()
-> anyhow::Result<()> {
    let name = "topo-alo-3";
    in_process(name, merge(name, 3, true), None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_two_inputs_eager_protocol_runs_each_task_once_and_counts_exactly()
-> anyhow::Result<()> {
    let name = "topo-alo-eager";
    in_process(name, merge(name, 2, false), Some(GroupProtocol::Eager)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_two_inputs_kip_848_protocol_runs_each_task_once_and_counts_exactly()
-> anyhow::Result<()> {
    let name = "topo-alo-848";
    in_process(name, merge(name, 2, false), Some(GroupProtocol::Consumer)).await
}

// ---------------------------------------------------------------------------------------------
// Exactly-once under SIGKILL, in child processes

/// The application of the exactly-once tests, in a child process: `KSTATE_CHILD_*` carry the
/// cluster, application id, topology, threads, guarantee, group protocol and consumer
/// properties; the instance id is `copy-<slot>`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of the exactly-once tests of this file, which start it; fails alone"]
async fn child_topology() -> anyhow::Result<()> {
    let env = ChildEnv::get("child_topology")?;
    child::init_logging();
    let slot: usize = env.parse("SLOT")?;
    let topology = Topology::from_env(&env)?;
    let mut builder = App::builder(env.var("APP_ID")?, env.var("SERVERS")?);
    builder
        .state_dir(env.var("STATE_DIR")?)
        .threads(env.parse("THREADS")?)
        .commit_interval(Duration::from_millis(env.parse("COMMIT_MS")?))
        .processing_guarantee(env.parse::<ProcessingGuarantee>("GUARANTEE")?)
        .instance_id(format!("copy-{slot}"));
    match env.var("PROTOCOL")?.as_str() {
        "default" => {}
        "eager" => {
            builder.group_protocol(GroupProtocol::Eager);
        }
        "consumer" => {
            builder.group_protocol(GroupProtocol::Consumer);
        }
        other => bail!("unknown group protocol {other}"),
    }
    for property in env.list("CONSUMER_PROPERTIES")? {
        let (key, value) = property
            .split_once('=')
            .with_context(|| format!("consumer property {property}: expected KEY=VALUE"))?;
        builder.consumer_property(key, value);
    }
    let running = topology.build(&mut builder)?.start()?;
    child::run_until_sigterm(running, &format!("{}: copy {slot}", env.parent())).await
}

/// A chaos run.
struct Chaos {
    name: &'static str,
    topology: Topology,
    /// Exactly-once: every count exact. At-least-once: nothing lost (below).
    guarantee: ProcessingGuarantee,
    threads: usize,
    /// `default`, `eager` or `consumer`.
    protocol: &'static str,
    /// `None`: the shared broker.
    servers: Option<String>,
    /// On the cluster: what is done to its nodes during the kills, one after another.
    broker_faults: Option<BrokerFaults>,
}

/// The cluster a chaos run is on, and the faults it inflicts on its nodes.
struct BrokerFaults {
    cluster: &'static Cluster,
    faults: Vec<BrokerFault>,
}

/// How long the copy stopped with SIGTERM stays away, and how long the others then run with it
/// back: past the session timeout (6 s).
const AWAY: Duration = Duration::from_secs(8);

/// Three copies run `chaos.topology` exactly-once while a producer writes; copies are SIGKILLed
/// and restarted at random for at least `KSTATE_TOPOLOGY_SECONDS` (15) and
/// `KSTATE_TOPOLOGY_KILLS` (6) kills. Once every count has caught up, the producer writes again
/// while one copy is stopped with SIGTERM (it must exit 0) and started again `AWAY` later. Then: every key's final count, exact sequences, every
/// copy alive and stopping cleanly, no foreign write in any log.
async fn chaos(chaos: Chaos) -> anyhow::Result<()> {
    // One chaos run at a time in this binary: each has three copies and a producer, those on
    // the cluster three nodes more; two at once on two cores starve the brokers.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = chaos.name;
    let min_kills = env_number("KSTATE_TOPOLOGY_KILLS").unwrap_or(6) as usize;
    let seconds = env_number("KSTATE_TOPOLOGY_SECONDS").unwrap_or(15);
    let seed = env_number("KSTATE_TOPOLOGY_SEED").unwrap_or_else(|| rand::rng().random());
    eprintln!(
        "{name}: at least {seconds} s and {min_kills} kills, seed {seed} (KSTATE_TOPOLOGY_SEED \
         to repeat)"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let servers = match (&chaos.servers, &chaos.broker_faults) {
        (Some(servers), _) => servers.clone(),
        (None, Some(faults)) => faults.cluster.bootstrap_servers().to_string(),
        (None, None) => kstate_test_broker::bootstrap_servers()?,
    };
    let topology = chaos.topology;
    create_topics(&servers, &topology).await?;
    let app_id = unique_topic(name);
    let (cluster, mut faults) = match chaos.broker_faults {
        Some(BrokerFaults { cluster, faults }) => (Some(cluster), faults),
        None => (None, Vec::new()),
    };
    let mut env = vec![
        ("SERVERS", servers.clone()),
        ("APP_ID", app_id.clone()),
        ("THREADS", chaos.threads.to_string()),
        ("COMMIT_MS", COMMIT_INTERVAL.as_millis().to_string()),
        ("GUARANTEE", chaos.guarantee.to_string()),
        ("PROTOCOL", chaos.protocol.to_string()),
        (
            "CONSUMER_PROPERTIES",
            if chaos.protocol == "consumer" {
                // KIP-848: the broker sets the session timeout and heartbeat interval.
                String::new()
            } else {
                "session.timeout.ms=6000,heartbeat.interval.ms=1000".into()
            },
        ),
    ];
    env.extend(topology.to_env());
    let mut copies = Copies::new(name, "child_topology", &env, 3)?;
    for slot in 0..3 {
        copies.spawn(slot)?;
    }

    let wait_for_counts = |copies: &mut Copies, truth: &Truth, when: &str| -> anyhow::Result<()> {
        let what = format!("every key's count to reach its true count {when}");
        let waited = wait_for(&what, WAIT, || {
            copies.check_alive()?;
            truth.reached(&servers)
        });
        waited.map_err(|e| {
            let short = truth.short(&servers).unwrap_or_else(|e| e.to_string());
            anyhow::anyhow!("{e}; {short}\n{}", copies.logs())
        })
    };

    // Random kills while the producer writes.
    let started = Instant::now();
    let producer = Writer::start(&servers, &topology, 0);
    let mut kills = 0;
    let mut inflicted = Vec::new();
    let killing = (|| -> anyhow::Result<()> {
        while started.elapsed() < Duration::from_secs(seconds)
            || kills < min_kills
            || !faults.is_empty()
        {
            std::thread::sleep(Duration::from_millis(rng.random_range(1_000..3_000)));
            // After a copy kill or two, so that every topic exists and the copies work.
            if kills >= 2
                && let (Some(cluster), Some(fault)) = (cluster, faults.pop())
            {
                let targets = Targets {
                    app_id: app_id.clone(),
                    changelog: format!("{app_id}-counts-changelog"),
                    inputs: topology.inputs(),
                    partitions: PARTITIONS,
                    copies: 3,
                };
                let what = fault.inflict(cluster, &targets, &mut rng)?;
                eprintln!("{name}: {what} ({:.0?})", started.elapsed());
                inflicted.push(what);
                copies.check_alive()?;
            }
            let slot = rng.random_range(0..3);
            copies.kill(slot)?;
            kills += 1;
            std::thread::sleep(Duration::from_millis(rng.random_range(0..1_000)));
            copies.spawn(slot)?;
        }
        Ok(())
    })();
    let (mut truth, written) = producer.stop()?;
    killing?;
    eprintln!(
        "{name}: {} input records, {kills} kills and {} broker faults in {:.0?}",
        truth.records(),
        inflicted.len(),
        started.elapsed()
    );
    wait_for_counts(&mut copies, &truth, "after the kills")?;

    // The group is settled: one copy leaves cleanly and stays away past the session timeout
    // while the producer writes, so that the others take its tasks over while keeping theirs,
    // then comes back and gets some of them back.
    let producer = Writer::start(&servers, &topology, written);
    let leaving = (|| -> anyhow::Result<()> {
        let slot = rng.random_range(0..3);
        let status = copies.stop(slot)?;
        anyhow::ensure!(
            status.success(),
            "copy {slot} exited {status} on SIGTERM\n{}",
            copies.logs()
        );
        std::thread::sleep(AWAY);
        copies.check_alive()?;
        copies.spawn(slot)?;
        std::thread::sleep(AWAY);
        Ok(())
    })();
    let (more, _) = producer.stop()?;
    leaving?;
    truth.merge(more);
    wait_for_counts(&mut copies, &truth, "after a copy left and came back")?;
    // A late duplicate would show within a few commit intervals.
    std::thread::sleep(COMMIT_INTERVAL * 5 + Duration::from_secs(1));
    copies.check_alive()?;
    match chaos.guarantee {
        ProcessingGuarantee::ExactlyOnce => {
            truth
                .check_exact(&servers)
                .map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
            copies.stop_all()?;
            if cluster.is_some() {
                // A broker's fault can delay a killed copy's last records until after the
                // next owner's restore (seen: an earlier instance's records of its open
                // transaction landing after the end the restore read, then its abort marker):
                // the owner must take them for another writer's and restore again.
                copies.check_foreign_writes_recovered(&copies.all())?;
            } else {
                copies.check_no_foreign_writes(&copies.all())?;
            }
        }
        ProcessingGuarantee::AtLeastOnce => {
            let over = truth
                .check_at_least(&servers)
                .map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
            eprintln!("{name}: nothing lost; {over}");
            copies.stop_all()?;
            // No fencing at-least-once: a copy that went on after it lost its tasks may still
            // write to their changelogs, and whoever restored them must restore again.
            copies.check_foreign_writes_recovered(&copies.all())?;
        }
    }
    assert!(kills >= min_kills, "only {kills} kills");
    copies.finished();
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_two_inputs_through_random_kills_counts_every_record_once()
-> anyhow::Result<()> {
    let name = "topo-eos-2";
    chaos(Chaos {
        name,
        topology: merge(name, 2, false),
        guarantee: ProcessingGuarantee::ExactlyOnce,
        threads: 1,
        protocol: "default",
        servers: None,
        broker_faults: None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_three_inputs_two_stores_two_threads_through_random_kills_counts_every_record_once()
-> anyhow::Result<()> {
    let name = "topo-eos-3";
    chaos(Chaos {
        name,
        topology: merge(name, 3, true),
        guarantee: ProcessingGuarantee::ExactlyOnce,
        threads: 2,
        protocol: "default",
        servers: None,
        broker_faults: None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_repartition_through_random_kills_counts_every_record_once()
-> anyhow::Result<()> {
    let name = "topo-eos-rep";
    chaos(Chaos {
        name,
        topology: repartition(name),
        guarantee: ProcessingGuarantee::ExactlyOnce,
        threads: 1,
        protocol: "default",
        servers: None,
        broker_faults: None,
    })
    .await
}

/// On the three-node cluster (replication 3, min.insync.replicas=2): besides the copies' kills,
/// nodes die (the leader of a changelog or an input partition, a transaction or group
/// coordinator), restart one by one, or stall; no copy may fail, and every count is exact.
async fn chaos_on_a_cluster(
    name: &'static str,
    topology: Topology,
    guarantee: ProcessingGuarantee,
) -> anyhow::Result<()> {
    let cluster = kstate_test_broker::cluster()?;
    let _only_user = cluster.exclusive()?;
    let seed = env_number("KSTATE_TOPOLOGY_SEED").unwrap_or_else(|| rand::rng().random());
    chaos(Chaos {
        name,
        topology,
        guarantee,
        threads: 1,
        protocol: "default",
        servers: None,
        broker_faults: Some(BrokerFaults {
            cluster,
            faults: broker_faults(seed)?,
        }),
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_three_inputs_two_stores_on_a_cluster_through_broker_faults_counts_every_record_once()
-> anyhow::Result<()> {
    let name = "topo-eos-cluster-3";
    chaos_on_a_cluster(name, merge(name, 3, true), ProcessingGuarantee::ExactlyOnce).await
}

/// At-least-once on the cluster through the same faults: every record counted (each key's last
/// count at least its true count; a record taken again after a kill counts twice), no copy
/// failed, every copy stops cleanly.
#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_three_inputs_two_stores_on_a_cluster_through_broker_faults_loses_no_record()
-> anyhow::Result<()> {
    let name = "topo-alo-cluster-3";
    chaos_on_a_cluster(name, merge(name, 3, true), ProcessingGuarantee::AtLeastOnce).await
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_repartition_on_a_cluster_through_broker_faults_counts_every_record_once()
-> anyhow::Result<()> {
    let name = "topo-eos-cluster-rep";
    chaos_on_a_cluster(name, repartition(name), ProcessingGuarantee::ExactlyOnce).await
}

/// KIP-848 on a broker of its own: its default consumer-group session timeout (45 s) would make
/// every kill cost 45 s.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_two_inputs_kip_848_protocol_through_random_kills_counts_every_record_once()
-> anyhow::Result<()> {
    let broker = kstate_test_broker::PrivateBroker::start_with(&[
        ("group.consumer.session.timeout.ms", "6000"),
        ("group.consumer.min.session.timeout.ms", "6000"),
        ("group.consumer.heartbeat.interval.ms", "1000"),
        ("group.consumer.min.heartbeat.interval.ms", "1000"),
    ])?;
    let name = "topo-eos-848";
    chaos(Chaos {
        name,
        topology: merge(name, 2, false),
        guarantee: ProcessingGuarantee::ExactlyOnce,
        threads: 1,
        protocol: "consumer",
        servers: Some(broker.bootstrap_servers().to_string()),
        broker_faults: None,
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// A zombie whose timer commits an otherwise empty transaction

const TICK: Duration = Duration::from_secs(2);
const ZOMBIE_PARTITIONS: i32 = 2;

/// Every `TICK` (wall clock): the store's `ticks` count goes up by one and `tick` →
/// `"<slot> <processor> <count>"` goes to the output; `processor` numbers the processors this
/// process made.
struct Ticker {
    slot: usize,
    processor: u64,
    ticks: StoreHandle<Vec<u8>, u64>,
    output: String,
}

impl Processor for Ticker {
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), BoxError> {
        ctx.schedule(TimeKind::WallClock, TICK);
        Ok(())
    }

    fn process(&mut self, _: &mut Context<'_>, _: &Record<'_>) -> Result<(), BoxError> {
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut Context<'_>, _: &Timer) -> Result<(), BoxError> {
        let n = increment(ctx, &self.ticks, &b"ticks".to_vec())?;
        let value = format!("{} {} {n}", self.slot, self.processor);
        ctx.send(&self.output, b"tick", Some(value.as_bytes()))?;
        Ok(())
    }
}

/// The ticking application in a child process (exactly-once, instance id `copy-<slot>`,
/// session timeout 6 s).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a child process of the zombie timer test of this file, which starts it; fails alone"]
async fn child_ticker() -> anyhow::Result<()> {
    let env = ChildEnv::get("child_ticker")?;
    child::init_logging();
    let slot: usize = env.parse("SLOT")?;
    let mut builder = App::builder(env.var("APP_ID")?, env.var("SERVERS")?);
    builder
        .input(env.var("INPUT")?)
        .state_dir(env.var("STATE_DIR")?)
        .commit_interval(COMMIT_INTERVAL)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .instance_id(format!("copy-{slot}"))
        .consumer_property("session.timeout.ms", "6000")
        .consumer_property("heartbeat.interval.ms", "1000");
    let ticks = builder.store::<Vec<u8>, u64>("ticks", StoreOptions::default());
    let output = env.var("OUTPUT")?;
    let made = AtomicU64::new(0);
    let app = builder.build(move |_| {
        Box::new(Ticker {
            slot,
            processor: made.fetch_add(1, Ordering::Relaxed),
            ticks: ticks.clone(),
            output: output.clone(),
        })
    })?;
    child::run_until_sigterm(app.start()?, &format!("{}: copy {slot}", env.parent())).await
}

/// A tick read back: partition, offset, slot, processor.
#[derive(Debug, Clone, Copy)]
struct Tick {
    partition: i32,
    offset: i64,
    slot: usize,
    processor: u64,
}

fn ticks(servers: &str, output: &str) -> anyhow::Result<Vec<Tick>> {
    let mut ticks = Vec::new();
    for (partition, offset, _, value) in read_topic(servers, output, ZOMBIE_PARTITIONS)? {
        let value = String::from_utf8(value.unwrap_or_default())?;
        let mut fields = value.split(' ');
        let mut next = || fields.next().with_context(|| format!("tick {value:?}"));
        let (slot, processor) = (next()?.parse()?, next()?.parse()?);
        ticks.push(Tick {
            partition,
            offset,
            slot,
            processor,
        });
    }
    ticks.sort_by_key(|t| (t.partition, t.offset));
    Ok(ticks)
}

/// Watermark queries: per partition, the last stable offset (what a `read_committed` reader
/// may read up to) and the high watermark. They differ while a transaction is open.
struct Watermarks {
    uncommitted: rdkafka::consumer::BaseConsumer,
    committed: rdkafka::consumer::BaseConsumer,
}

impl Watermarks {
    fn new(servers: &str) -> anyhow::Result<Watermarks> {
        let client = |isolation| -> anyhow::Result<rdkafka::consumer::BaseConsumer> {
            Ok(rdkafka::ClientConfig::new()
                .set("bootstrap.servers", servers)
                .set("isolation.level", isolation)
                .create()?)
        };
        Ok(Watermarks {
            uncommitted: client("read_uncommitted")?,
            committed: client("read_committed")?,
        })
    }

    /// Per partition of `topic`: (last stable offset, high watermark).
    fn get(&self, topic: &str) -> anyhow::Result<Vec<(i64, i64)>> {
        use rdkafka::consumer::Consumer;
        let timeout = Duration::from_secs(10);
        (0..ZOMBIE_PARTITIONS)
            .map(|p| {
                let high = self.uncommitted.fetch_watermarks(topic, p, timeout)?.1;
                let stable = self.committed.fetch_watermarks(topic, p, timeout)?.1;
                Ok((stable, high))
            })
            .collect()
    }

    /// Whether no transaction is open on any partition of `topic`.
    fn quiet(&self, topic: &str) -> anyhow::Result<bool> {
        Ok(self.get(topic)?.iter().all(|(stable, high)| stable == high))
    }

    /// The sum of `topic`'s last stable offsets: it grows with every commit that wrote there.
    fn committed(&self, topic: &str) -> anyhow::Result<i64> {
        Ok(self.get(topic)?.iter().map(|(stable, _)| stable).sum())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_copy_whose_timer_fires_after_it_lost_its_tasks_makes_nothing_visible()
-> anyhow::Result<()> {
    let name = "topo-zombie-timer";
    let servers = kstate_test_broker::bootstrap_servers()?;
    let app_id = unique_topic(name);
    let (input, output) = (
        unique_topic("zombie-timer-in"),
        unique_topic("zombie-timer-out"),
    );
    common::create_topic(&servers, &input, ZOMBIE_PARTITIONS, "delete").await?;
    common::create_topic(&servers, &output, ZOMBIE_PARTITIONS, "delete").await?;
    let changelog = format!("{app_id}-ticks-changelog");
    let env = [
        ("SERVERS", servers.clone()),
        ("APP_ID", app_id),
        ("INPUT", input),
        ("OUTPUT", output.clone()),
    ];
    let mut copies = Copies::new(name, "child_ticker", &env, 2)?;
    let (a, b) = (0, 1);
    copies.spawn(a)?;
    let waited = wait_for("copy A's ticks on every partition", WAIT, || {
        copies.check_alive()?;
        let ticks = ticks(&servers, &output)?;
        Ok((0..ZOMBIE_PARTITIONS).all(|p| ticks.iter().any(|t| t.partition == p && t.slot == a)))
    });
    waited.map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;

    // Pause A right after one of its commits: nothing open in its transaction, its timers due
    // again one tick later.
    let marks = Watermarks::new(&servers)?;
    let mut paused = false;
    for _ in 0..10 {
        let before = marks.committed(&output)?;
        let deadline = Instant::now() + TICK * 3;
        while marks.committed(&output)? == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        copies.pause(a)?;
        if marks.quiet(&output)? && marks.quiet(&changelog)? {
            paused = true;
            break;
        }
        copies.resume(a)?;
    }
    anyhow::ensure!(
        paused,
        "could not pause copy A with nothing open in its transaction\n{}",
        copies.logs()
    );
    let paused_at = Instant::now();
    let before = ticks(&servers, &output)?;
    let zombie: BTreeMap<i32, u64> = before
        .iter()
        .filter(|t| t.slot == a)
        .map(|t| (t.partition, t.processor))
        .collect();

    // B takes over every task once A's session times out; A's timers are overdue by then.
    copies.spawn(b)?;
    let waited = wait_for("copy B's ticks on every partition", WAIT, || {
        copies.check_alive()?;
        let ticks = ticks(&servers, &output)?;
        Ok(
            (0..ZOMBIE_PARTITIONS).all(|p| ticks.iter().any(|t| t.partition == p && t.slot == b))
                && paused_at.elapsed() > TICK * 2,
        )
    });
    waited.map_err(|e| anyhow::anyhow!("{e}\n{}", copies.logs()))?;
    let resumed_marks = marks.get(&output)?;
    copies.resume(a)?;
    eprintln!(
        "{name}: A paused {:.1?}, resumed; its paused processors: {zombie:?}",
        paused_at.elapsed()
    );
    // A's overdue ticks would commit at once; B's next ticks meet them in the changelog.
    std::thread::sleep(TICK * 4);

    let after = ticks(&servers, &output)?;
    let mut problems = Vec::new();
    for p in 0..ZOMBIE_PARTITIONS {
        let takeover = after
            .iter()
            .find(|t| t.partition == p && t.slot == b)
            .map(|t| t.offset)
            .context("no tick of B")?;
        let visible: Vec<Tick> = after
            .iter()
            .filter(|t| {
                t.partition == p
                    && t.offset > takeover
                    && t.slot == a
                    && zombie.get(&p) == Some(&t.processor)
            })
            .copied()
            .collect();
        if !visible.is_empty() {
            problems.push(format!(
                "partition {p}: ticks of copy A's paused processor became visible after copy B \
                 took over at offset {takeover}: {visible:?}"
            ));
        }
    }
    let b_went_on = after
        .iter()
        .any(|t| t.slot == b && t.offset >= resumed_marks[t.partition as usize].0);
    if !b_went_on {
        problems.push("copy B sent no tick after copy A was resumed".into());
    }
    if let Err(e) = copies.check_slot_alive(b) {
        problems.push(e.to_string());
    }
    // A's aborted records land in B's changelog partitions after B's restore: B's stores see
    // another writer, and B restores those tasks again (nothing of A's is committed).
    if let Err(e) = copies.check_foreign_writes_recovered(&[b]) {
        problems.push(e.to_string());
    }
    // What became of A is not this test's subject: it is reported, not checked.
    match copies.check_slot_alive(a) {
        Ok(()) => eprintln!("{name}: copy A is running"),
        Err(e) => eprintln!("{name}: {e}"),
    }
    if !problems.is_empty() {
        bail!("{}\n{}", problems.join("\n"), copies.logs());
    }
    let status = copies.stop(b)?;
    anyhow::ensure!(
        status.success(),
        "copy B exited {status} on SIGTERM\n{}",
        copies.logs()
    );
    if copies.copies[a].is_running() {
        eprintln!("{name}: copy A exited {} on SIGTERM", copies.stop(a)?);
    }
    copies.finished();
    Ok(())
}
