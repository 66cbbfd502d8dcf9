//! tasks_per_process: what many tasks cost one process. A count-by-key application with
//! `--stores` stores per task (each counts every record of its task) runs on an input of
//! `--partitions` partitions, so the process holds that many tasks; it is started on an empty
//! state directory ("fresh"), stopped, and started again on the state it left ("restart", nothing
//! to replay but the tail the last commit left). For each start it prints the time until every
//! task is running (and, fresh, until every record is processed), the resident memory, threads,
//! open file descriptors, RocksDB instances (store directories), the budget's memtable, cache
//! and pending-write (overlays, coalescing caches) usage, and the threads by name (kstate's, RocksDB's, librdkafka's):
//!
//! ```text
//! tasks_per_process --partitions 1000 [--stores 3] \
//!     [--records-per-partition 10] [--threads 2] [--restore-threads N] [--deadline-s 600] \
//!     [--bootstrap-servers HOST:PORT] [--log LEVEL] [--floor | --standby]
//! tasks-open n=<N> start=fresh running_s=<s> processed_s=<s>
//! tasks-open n=<N> start=restart running_s=<s>
//! tasks-resources n=<N> start=<fresh|restart> rss_mb=<MB> threads=<n> fds=<n> rocksdb=<n> \
//!     memtable_mb=<MB> cache_mb=<MB> pending_mb=<MB> budget_mb=<MB>
//! tasks-threads n=<N> start=<fresh|restart> <thread name>=<n> ...
//! tasks-close n=<N> start=<fresh|restart> close_s=<s>
//! tasks-floor n=<N> topics=<stores> create_s=<s> ends_s=<s>
//! tasks-standby n=<N> running_s=<s> processed_s=<s> followed_s=<s> standbys=<n> lag=<records>
//! ```
//!
//! With `--floor` it measures only the broker's part of a fresh start, and prints `tasks-floor`:
//! `--stores` compacted topics of N partitions created in one request, and the time until the
//! end offsets of all their partitions can be listed (what a fresh start's restores wait for
//! before a task runs). A fresh start on that broker cannot be faster than its `ends_s`. (A run
//! of its own: the broker deletes the topics' files for a minute after.)
//!
//! With `--standby` two copies of the application (static members, `standby_replicas(1)`) run
//! in this process, each on a state directory of its own: each runs half the tasks and follows
//! the other half. It prints `tasks-standby`: the time until every task runs on one copy, until
//! every record is processed, and until every task has a standby on the other copy that has
//! caught up (lag 0); the standbys and their summed lag then; and the resources of the process,
//! both copies together (`start=standby`).
//!
//! Built into `$CARGO_TARGET_DIR/release/tasks_per_process` by the workspace's build (`cargo
//! build --release --workspace --all-targets`); `tasks_per_process --help` lists the flags.
//! `--deadline-s` bounds each start (default 600 s).
//!
//! The topics (input, output, changelogs), the consumer group and the state directory are
//! deleted at the end.
//! `$KAFKA_BOOTSTRAP_SERVERS` names the broker when `--bootstrap-servers` does not. Linux only
//! (it reads `/proc/self`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use kstate_bench::cli::number;
use kstate_bench::kafka::{create_topic, delete_groups, delete_topics, producer, send};
use kstate_core::BoxError;
use kstate_kafka::ClientProperties;
use kstate_rocksdb::MemoryBudget;
use kstate_task::{
    App, AppState, Context, Processor, Record, Running, StoreHandle, StoreOptions, TaskState,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// What many tasks cost one process: a count-by-key application with --stores stores per task
/// on an input of --partitions partitions, started fresh, then restarted on the state it left.
#[derive(Debug, Parser)]
#[command(name = "tasks_per_process")]
struct Cli {
    /// The input's partitions: the tasks the process holds.
    #[arg(long, value_parser = number::<i32>)]
    partitions: i32,
    /// Stores per task (each counts every record of its task).
    #[arg(long, value_parser = number::<usize>, default_value_t = 3)]
    stores: usize,
    /// Records written to every input partition before the clock starts.
    #[arg(long, value_parser = number::<u64>, default_value_t = 10)]
    records_per_partition: u64,
    /// Worker threads.
    #[arg(long, value_parser = number::<usize>, default_value_t = 2)]
    threads: usize,
    /// The process's restorer threads (default: the runtime's).
    #[arg(long, value_parser = number::<usize>)]
    restore_threads: Option<usize>,
    /// How long a start may take before the run gives up, seconds.
    #[arg(long, value_parser = number::<u64>, default_value_t = 600)]
    deadline_s: u64,
    /// Measure only the broker's part of a fresh start: --stores compacted topics of
    /// --partitions partitions created, until every partition's end offset can be listed.
    #[arg(long)]
    floor: bool,
    /// Run two copies with a standby replica each (see the module doc).
    #[arg(long, conflicts_with = "floor")]
    standby: bool,
    /// The brokers; $KAFKA_BOOTSTRAP_SERVERS when not given.
    #[arg(long, value_name = "HOST:PORT")]
    bootstrap_servers: Option<String>,
    /// The runtime's log level on stderr: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "warn")]
    log: tracing::Level,
}

/// Counts every record of its task in each of its stores.
struct CountInEvery {
    stores: Vec<StoreHandle<Vec<u8>, u64>>,
    output: String,
}

impl Processor for CountInEvery {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let mut count = 0;
        for handle in &self.stores {
            let store = ctx.store(handle);
            count = store.get(&key)?.unwrap_or(0) + 1;
            store.put(&key, &count)?;
        }
        ctx.send(&self.output, &key, Some(count.to_string().as_bytes()))?;
        Ok(())
    }
}

struct Bench {
    client: ClientProperties,
    application_id: String,
    input: String,
    output: String,
    partitions: i32,
    stores: usize,
    threads: usize,
    /// The process's restorer threads; the runtime's default when not given.
    restore_threads: Option<usize>,
    /// How long a start may take before the run gives up.
    deadline: Duration,
    state_dir: tempfile::TempDir,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The runtime's warnings (and, with `--log info`, its story) go to stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(cli.log)
        .init();
    let client = kstate_bench::cluster::required(None, cli.bootstrap_servers.as_deref())?;
    let partitions = cli.partitions;
    let per_partition = cli.records_per_partition;
    let run = format!("tasks-{partitions}-{}", std::process::id());
    let bench = Bench {
        client,
        application_id: run.clone(),
        input: format!("{run}-in"),
        output: format!("{run}-out"),
        partitions,
        stores: cli.stores,
        threads: cli.threads,
        restore_threads: cli.restore_threads,
        deadline: Duration::from_secs(cli.deadline_s),
        state_dir: tempfile::tempdir()?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if cli.floor {
        return runtime.block_on(bench.broker_floor());
    }
    let rows = per_partition * partitions as u64;
    let result = runtime.block_on(bench.setup(per_partition)).and_then(|()| {
        if cli.standby {
            return bench.standby(rows);
        }
        bench.start("fresh", Some(rows))?;
        bench.start("restart", None)
    });
    let mut topics = vec![bench.input.clone(), bench.output.clone()];
    topics.extend((0..bench.stores).map(|s| format!("{}-s{s}-changelog", bench.application_id)));
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    if let Err(e) = runtime.block_on(delete_topics(bench.client.clone(), &topics)) {
        eprintln!("tasks_per_process: could not delete {topics:?}: {e}");
    }
    let group = [bench.application_id.as_str()];
    if let Err(e) = runtime.block_on(delete_groups(bench.client.clone(), &group)) {
        eprintln!("tasks_per_process: could not delete consumer group {group:?}: {e}");
    }
    result
}

impl Bench {
    /// The input, with `per_partition` records in every partition, and the output.
    async fn setup(&self, per_partition: u64) -> Result<()> {
        let started = Instant::now();
        create_topic(self.client.clone(), &self.input, self.partitions, &[]).await?;
        create_topic(self.client.clone(), &self.output, self.partitions, &[]).await?;
        let producer = producer(self.client.clone(), 5, DefaultProducerContext)?;
        for partition in 0..self.partitions {
            for i in 0..per_partition {
                let key = format!("k{}", i % 4);
                send(
                    &producer,
                    BaseRecord::to(&self.input)
                        .partition(partition)
                        .key(key.as_bytes())
                        .payload(&b"v"[..]),
                );
            }
        }
        producer.flush(Duration::from_secs(120))?;
        ensure!(producer.in_flight_count() == 0, "input not acknowledged");
        eprintln!(
            "tasks_per_process: {} partitions, {per_partition} records each, in {} ms",
            self.partitions,
            started.elapsed().as_millis()
        );
        Ok(())
    }

    /// Creates `stores` compacted topics of `partitions` partitions in one request, times it
    /// and the wait until every partition's end offset can be listed, prints `tasks-floor` and
    /// deletes the topics.
    async fn broker_floor(&self) -> Result<()> {
        let topics: Vec<String> = (0..self.stores)
            .map(|s| format!("{}-floor-{s}", self.application_id))
            .collect();
        let admin: AdminClient<DefaultClientContext> = self.client.client_config().create()?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| {
                NewTopic::new(
                    t,
                    self.partitions,
                    TopicReplication::Fixed(kstate_kafka::BROKER_DEFAULT_REPLICATION),
                )
                .set("cleanup.policy", "compact")
            })
            .collect();
        let started = Instant::now();
        for result in admin.create_topics(&new, &AdminOptions::new()).await? {
            result.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
        }
        let created = started.elapsed();
        let consumer: BaseConsumer = self.client.client_config().create()?;
        let mut list = TopicPartitionList::new();
        for topic in &topics {
            for p in 0..self.partitions {
                list.add_partition_offset(topic, p, Offset::End)?;
            }
        }
        let wanted = list.count();
        loop {
            let listed = consumer
                .offsets_for_times(list.clone(), Duration::from_secs(5))
                .map_or(0, |ends| {
                    ends.elements()
                        .iter()
                        .filter(|e| e.error().is_ok() && matches!(e.offset(), Offset::Offset(_)))
                        .count()
                });
            if listed == wanted {
                break;
            }
            ensure!(
                started.elapsed() < self.deadline,
                "the floor's topics: {listed} of {wanted} ends listed in {:?}",
                self.deadline
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        println!(
            "tasks-floor n={} topics={} create_s={:.2} ends_s={:.2}",
            self.partitions,
            topics.len(),
            created.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        delete_topics(self.client.clone(), &names).await?;
        Ok(())
    }

    /// The application, on the bench's state directory.
    fn app(&self) -> Result<App> {
        self.app_on(self.state_dir.path(), None)
    }

    /// The application on `state_dir`; with `copy`, a static member of that instance id with a
    /// standby replica.
    fn app_on(&self, state_dir: &Path, copy: Option<&str>) -> Result<App> {
        let mut builder = App::builder(&self.application_id, self.client.clone());
        builder
            .input(&self.input)
            .state_dir(state_dir)
            .threads(self.threads);
        if let Some(copy) = copy {
            builder
                .instance_id(copy)
                .static_membership(true)
                .standby_replicas(1);
        }
        if let Some(n) = self.restore_threads {
            builder.restore_threads(n);
        }
        let stores: Vec<StoreHandle<Vec<u8>, u64>> = (0..self.stores)
            .map(|s| builder.store(format!("s{s}"), StoreOptions::default()))
            .collect();
        let output = self.output.clone();
        Ok(builder.build(move |_task| {
            Box::new(CountInEvery {
                stores: stores.clone(),
                output: output.clone(),
            })
        })?)
    }

    /// Starts the application, waits until every task runs (and, given `rows`, until that many
    /// records are processed), prints what it measured and stops it.
    fn start(&self, name: &str, rows: Option<u64>) -> Result<()> {
        let app = self.app()?;
        let started = Instant::now();
        let running = app.start()?;
        let result = self.measure(name, rows, started, &running);
        let stopping = Instant::now();
        running.shutdown();
        running.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
        println!(
            "tasks-close n={} start={name} close_s={:.2}",
            self.partitions,
            stopping.elapsed().as_secs_f64()
        );
        result
    }

    fn measure(
        &self,
        name: &str,
        rows: Option<u64>,
        started: Instant,
        running: &Running,
    ) -> Result<()> {
        let n = self.partitions as usize;
        let copies = std::slice::from_ref(running);
        let until = |done: &dyn Fn(&[Running]) -> bool, what: &str| {
            self.until(&format!("{name} start"), started, copies, done, what)
        };
        let all_running = until(&|c| every_task_running(c, n), "every task running")?;
        let mut line = format!(
            "tasks-open n={n} start={name} running_s={:.2}",
            all_running.as_secs_f64()
        );
        if let Some(rows) = rows {
            // The group's committed input offsets, not the tasks' own counts: a task that moved
            // between the workers in a rebalance counts only what it processed where it runs now.
            let group = self.group_reader()?;
            let processed = until(
                &|_| self.all_committed(&group, rows),
                "every record processed",
            )?;
            line += &format!(" processed_s={:.2}", processed.as_secs_f64());
        }
        println!("{line}");
        self.resources(n, name, &[self.state_dir.path().to_path_buf()])
    }

    /// Prints what the process holds: memory, threads, descriptors, RocksDB instances under
    /// `dirs`, the memory budget's use, and the threads by name.
    fn resources(&self, n: usize, name: &str, dirs: &[std::path::PathBuf]) -> Result<()> {
        let budget = MemoryBudget::process_default();
        let mb = |bytes: usize| bytes as f64 / f64::from(1 << 20);
        let mut rocksdb = 0;
        for dir in dirs {
            rocksdb += rocksdb_instances(dir)?;
        }
        println!(
            "tasks-resources n={n} start={name} rss_mb={:.0} threads={} fds={} rocksdb={} \
             memtable_mb={:.0} cache_mb={:.0} pending_mb={:.1} budget_mb={:.0}",
            mb(rss_bytes()?),
            proc_status("Threads")?,
            std::fs::read_dir("/proc/self/fd")?.count(),
            rocksdb,
            mb(budget.memtable_usage()),
            mb(budget.cache_usage()),
            mb(budget.pending().usage()),
            mb(budget.total_bytes()),
        );
        println!("tasks-threads n={n} start={name} {}", thread_kinds()?);
        Ok(())
    }

    /// Two copies with a standby replica each: the times until every task runs, every record
    /// is processed and every task has a caught-up standby; then the resources of both.
    fn standby(&self, rows: u64) -> Result<()> {
        let n = self.partitions as usize;
        let dirs = [
            self.state_dir.path().join("a"),
            self.state_dir.path().join("b"),
        ];
        let started = Instant::now();
        let mut copies = Vec::new();
        for (dir, copy) in dirs.iter().zip(["a", "b"]) {
            copies.push(self.app_on(dir, Some(copy))?.start()?);
        }
        let group = self.group_reader()?;
        let result = (|| -> Result<()> {
            let until = |done: &dyn Fn(&[Running]) -> bool, what: &str| {
                self.until("standby run", started, &copies, done, what)
            };
            let running = until(&|c| every_task_running(c, n), "every task running")?;
            let processed = until(
                &|_| self.all_committed(&group, rows),
                "every record processed",
            )?;
            let followed = until(
                &|copies| {
                    let standbys: Vec<_> = copies.iter().flat_map(Running::standbys).collect();
                    standbys.len() >= n && standbys.iter().all(|s| s.lag == Some(0))
                },
                "every task followed and caught up",
            )?;
            let standbys: Vec<_> = copies.iter().flat_map(Running::standbys).collect();
            println!(
                "tasks-standby n={n} running_s={:.2} processed_s={:.2} followed_s={:.2} \
                 standbys={} lag={}",
                running.as_secs_f64(),
                processed.as_secs_f64(),
                followed.as_secs_f64(),
                standbys.len(),
                standbys.iter().filter_map(|s| s.lag).sum::<i64>(),
            );
            self.resources(n, "standby", &dirs)
        })();
        let stopping = Instant::now();
        for copy in &copies {
            copy.shutdown();
        }
        for copy in copies {
            copy.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        println!(
            "tasks-close n={n} start=standby close_s={:.2}",
            stopping.elapsed().as_secs_f64()
        );
        result
    }

    /// Waits until `done` holds for `copies`, at most the deadline from `started`; returns the
    /// time since `started`. A copy that failed, or the deadline, ends the `run` with an error.
    fn until(
        &self,
        run: &str,
        started: Instant,
        copies: &[Running],
        done: &dyn Fn(&[Running]) -> bool,
        what: &str,
    ) -> Result<Duration> {
        let deadline = started + self.deadline;
        loop {
            if done(copies) {
                return Ok(started.elapsed());
            }
            for copy in copies {
                if let AppState::Failed(e) = copy.state() {
                    bail!("{run} failed: {e}");
                }
            }
            ensure!(
                Instant::now() < deadline,
                "{run}: not {what} in {:?}",
                self.deadline
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the group committed `rows` input records.
    fn all_committed(&self, group: &BaseConsumer, rows: u64) -> bool {
        self.committed_total(group).is_ok_and(|total| total >= rows)
    }

    /// A client of the application's consumer group that only reads its committed offsets.
    fn group_reader(&self) -> Result<BaseConsumer> {
        let mut config = self.client.client_config();
        config
            .set("group.id", &self.application_id)
            .set("enable.auto.commit", "false");
        Ok(config.create()?)
    }

    /// The sum of the group's committed offsets over the input's partitions (every partition
    /// starts at 0): the records processed and committed.
    fn committed_total(&self, group: &BaseConsumer) -> Result<u64> {
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.input, p);
        }
        let committed = group.committed_offsets(tpl, Duration::from_secs(10))?;
        Ok(committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => u64::try_from(o).unwrap_or(0),
                _ => 0,
            })
            .sum())
    }
}

/// Whether `copies` run `n` tasks between them, every one running.
fn every_task_running(copies: &[Running], n: usize) -> bool {
    let tasks: Vec<_> = copies.iter().flat_map(Running::tasks).collect();
    tasks.len() == n && tasks.iter().all(|t| t.state == TaskState::Running)
}

/// A field of `/proc/self/status`, its first number.
fn proc_status(field: &str) -> Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .with_context(|| format!("no {field} in /proc/self/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("no number")?
        .parse()?)
}

/// This process's threads by kind: each name (`/proc/self/task/*/comm`) without the numbers
/// that tell threads of one kind apart, e.g. `kstate-restorer=4 rdk:broker=40`.
fn thread_kinds() -> Result<String> {
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        let comm = std::fs::read_to_string(entry?.path().join("comm")).unwrap_or_default();
        let kind = comm
            .trim()
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
            .to_string();
        *kinds.entry(kind).or_default() += 1;
    }
    Ok(kinds
        .iter()
        .map(|(kind, n)| format!("{kind}={n}"))
        .collect::<Vec<_>>()
        .join(" "))
}

fn rss_bytes() -> Result<usize> {
    Ok(proc_status("VmRSS")? << 10)
}

/// Directories under `dir` that hold a RocksDB (a `CURRENT` file).
fn rocksdb_instances(dir: &Path) -> Result<usize> {
    let mut count = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            } else if entry.file_name() == "CURRENT" {
                count += 1;
            }
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["tasks_per_process", "--partitions", "1000", "--floor"]);
        let cli = cli.ok();
        assert_eq!(
            cli.as_ref().map(|c| (c.stores, c.threads, c.deadline_s)),
            Some((3, 2, 600))
        );
        assert!(cli.is_some_and(|c| c.floor && c.records_per_partition == 10));
    }
}
