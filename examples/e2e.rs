//! e2e: the end-to-end and failover benchmarks' kstate side, the bare-rdkafka baseline, and the
//! measures every system is judged by (`benches/kafka-streams/compare.sh`, `failover.sh`).
//!
//! ```text
//! e2e setup    --input T --partitions P --rows N [--keys K | --unique] [--key-bytes B]
//!              [--event-time-step-ms F [--event-time-start-ms T] [--event-time-bookends-ms J]]
//! e2e output   --topic T --partitions P                        output topic (LogAppendTime)
//! e2e kstate   --input T --output T --application-id A --rows N [--threads N] [--coalesce]
//!              [--guarantee at-least-once|exactly-once]
//!              [--topology count|windowed [--emit updates|final]]
//! e2e pipe     --input T --output T --application-id A --rows N
//! e2e measure  --output T --partitions P --rows N --expect records|counts|window-updates|windows
//!              [--input T] [--json PATH]
//! e2e wait     --output T --records N [--group G --input T] [--timeout-s S]
//! e2e failover --input T --output T --kill PID [--timeout-s S] [--json PATH]
//! e2e paced    --input T --output T --rows N --rate R [--warmup W] [--keys K] [--json PATH]
//! e2e delete-topics --topics T1,T2,...
//! ```
//!
//! Every command also takes `--client-properties FILE`: librdkafka properties, one `key=value`
//! a line (`kstate_kafka::ClientProperties::from_file`), for a secured broker, e.g. the
//! `sasl_ssl.properties` that `scripts/kafka start --secure` prints. Every Kafka client the
//! command creates starts from them: the application (`kstate`: its consumers, producers,
//! restore and admin clients), the pipe's clients, and the clients that write the input and
//! read the outputs back, so that everything goes through the same listener with the same
//! security. The broker is the file's `bootstrap.servers`; `--bootstrap-servers` replaces it,
//! and `KAFKA_BOOTSTRAP_SERVERS` is used only when neither gives one. The properties are printed
//! with their secrets redacted, never the password.
//!
//! - `setup` fills a fresh input topic: N records with 16-byte values, keys drawn uniformly from
//!   K (seeded; default 10,000) or, with `--unique`, the keys `0..N` once each; keys are B bytes
//!   wide (default 8: the index big-endian; wider keys add incompressible filler, which is how
//!   the failover benchmark gets about 1 GB of state). Partitioned by murmur2 like the Java client.
//!   With `--event-time-step-ms F` (a decimal: 1.2 puts 50,000 records in a minute) record i gets
//!   the timestamp T + ⌊i·F⌋, so that event time advances and the windowed runs' windows close;
//!   T (`--event-time-start-ms`) defaults to a whole minute about F·N ms plus a minute before
//!   now, so that the whole input lies in the recent past: the window stores' changelogs keep a
//!   window for a day past its end (`cleanup.policy=compact,delete`), and records older than that
//!   would be deleted by the broker under the run. Only the absolute times move from one setup
//!   to the next: windows start at whole minutes and T is one, so every (key, window) gets the
//!   same records. The input itself is created with `retention.ms=-1` then, whatever T is.
//!   `--event-time-bookends-ms J` (J at least a window's size plus its grace) moves each
//!   partition's first record J before T and its last one J past its own time: the second record
//!   of a partition then closes the first one's window, and the last closes every window before
//!   its own, so that a system sending final window counts sends its first output when it
//!   starts on a partition and its last when it ends one, and the first-to-last output clock
//!   (`measure`) covers its whole run, as it does for one output per input.
//! - `kstate` runs the count-by-key task (the `count_by_key` example's processor) in process
//!   until it has processed and committed N records, then stops gracefully. `--guarantee
//!   exactly-once` runs it exactly-once (one transaction per worker and commit interval); the
//!   tasks' `processed` counts only records whose commit (under exactly-once: whose
//!   transaction) succeeded, and an abort's rewind does not count its records twice, so the
//!   same stop condition holds under both guarantees. `--topology windowed` counts per key in
//!   tumbling 1-minute windows with a 10 s grace (the records' timestamps are the event time) in
//!   a window store named `counts`: `--emit updates` (the default) sends every window's new count
//!   for each record (`<key>@<window start ms>` → the count, as decimal ASCII: Kafka Streams'
//!   windowed `count()` with caching off, one output per input), `--emit final` each window's
//!   final count once, when stream time passes its end plus the grace (the task of
//!   `examples/windowed_count.rs`; Kafka Streams' `emitStrategy(onWindowClose())`).
//! - `pipe` is the physical limit: the same broker work with no state. Each input record is
//!   consumed and two records produced (the output, and a record to a compacted topic standing
//!   in for the changelog) by a producer with exactly kstate's settings
//!   (`ProducerConfig::client_config`: acks=all, idempotence, lz4, the same linger) from a
//!   consumer set up as kstate's. Every 100 ms it takes the input offsets and commits them once
//!   the broker has acknowledged everything sent before them (counting delivery reports, not
//!   librdkafka's flush, which costs far more), polling on meanwhile: kstate's commit stops its
//!   worker for that wait, the pipe never stops.
//! - `measure` reads the output topic back: output topics are created with
//!   `message.timestamp.type=LogAppendTime`, so the broker stamps every output when it appends it,
//!   whoever produced it. The rate is N input records over the time from the first output's
//!   append to the last one's: start-up (group join, topic creation) is outside the clock for
//!   every system alike. `--expect records`: one output per input (caching off, the pipe);
//!   `--expect counts`: the outputs' last counts sum to N (caching on emits fewer);
//!   `--expect window-updates --input T`: one output per input and, per window, the highest
//!   count sent is the number of its records in input T (`kstate --topology windowed`, emitting
//!   updates);
//!   `--expect windows --input T`: final window counts (`kstate --topology windowed --emit final`
//!   and Kafka Streams' emit-final), checked against input T read back: every output is a closed
//!   window with its exact count, and per input partition the windows sent are all those that
//!   closed up to the last one sent (`windows=<sent>/<closed>` in its line). A system may stop
//!   before it sent the windows that closed last: Kafka Streams sends closed windows at most once
//!   a second per task, and the windows that close within a second of a task's last record wait
//!   for a record that never comes. Windows that never close nobody sends. The rate is N over
//!   first-to-last append as above; so that the first and the last output come with the first
//!   and the last records, the input has bookends (`setup --event-time-bookends-ms`). It reads
//!   with `isolation.level=read_committed` (aborted outputs of an exactly-once run do not count)
//!   and is done with a partition when the consumer's position reaches the high watermark the
//!   partition had at the start: on a transactional topic the commit markers take offsets, so
//!   the last record's offset + 1 is below it. A second line gives each output partition's
//!   first and last append, in ms after the first output of all
//!   (`e2e partitions output=T append_ms=<p>:<first>-<last>,...`): a task that starts late
//!   stretches every system's window alike, and shows there.
//! - `wait` returns once the output topic holds N records (everything processed): the sum of
//!   its partitions' high - low watermarks, which on a transactional (exactly-once) output also
//!   counts the commit markers and so comes too early there. With `--group G --input T` it also
//!   waits until consumer group G's committed offsets reach T's end offsets on every partition:
//!   under exactly-once, until every input record was processed in a committed transaction
//!   (both systems commit their input offsets in the transaction, to the group named by the
//!   application id).
//! - `failover` SIGKILLs process PID (one copy of an application that has processed its input),
//!   then writes one marker record to every input partition and waits until each partition's
//!   marker has its output. It reads the output with `isolation.level=read_committed`, so an
//!   exactly-once marker output counts once its transaction committed (an aborted one never).
//!   It prints each partition's milliseconds from the kill to the marker output's append time
//!   (`ms`, the clock), and to when the reader got it (`visible_ms`: under exactly-once also the
//!   wait for the commit), and `failover seconds=<s>` for the slowest append: the time until the
//!   survivor (or the restarted copy) has processed a record of every partition that moved to
//!   it, group detection and restore included.
//! - `paced` measures latency, while the application runs (started before, on an empty input
//!   topic created with `e2e output`, so that the input records carry the broker's append time
//!   too, and with `--rows N`). It writes W warm-up records (default 10,000) at once and waits
//!   until their outputs are back (the application is up, has joined its group and caught up),
//!   then writes the remaining N - W records at R records/s (librdkafka, linger 5 ms; keys like
//!   `setup`'s). A read_committed consumer reads the output meanwhile. Each output (key, count
//!   n) belongs to the n-th input record with that key (count-by-key, caching off: one output
//!   per input, a key's records all in one partition). Per paced record it takes two latencies,
//!   both on the broker's clock (the broker runs on this machine): `append`, from the input
//!   record's append to its output's append; `visible`, from the input's append until the
//!   reader got the output (under exactly-once this includes the wait for the transaction's
//!   commit, which `append` does not). Prints `e2e latency ... append_p50_ms=.. visible_..`.
//! - `delete-topics` deletes the named topics (missing ones are fine).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result, bail, ensure};
use kstate::kstate_core::{BoxError, WindowOptions};
use kstate::kstate_kafka::{ClientProperties, ProducerConfig};
use kstate::kstate_task::{
    App, AppBuilder, Context, ProcessingGuarantee, Processor, Record, WindowHandle,
};
use kstate_bench::flags::Flags;
use kstate_bench::kafka::{
    LOG_APPEND_TIME, Settled, append_time, create_client, create_topic, delete_topics,
    partition_count, producer, send,
};
use kstate_bench::latency::{Latency, LatencySummary};
use kstate_bench::report::{per_second, write_json};
use kstate_bench::workload::wide_key;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

#[path = "shared/count_by_key.rs"]
mod count;
#[path = "shared/windowed_count.rs"]
mod windowed;

const COMMANDS: &str = "setup|output|kstate|pipe|measure|wait|failover|paced|delete-topics";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args
        .next()
        .with_context(|| format!("usage: e2e {COMMANDS} ..."))?;
    let flags = Flags::parse(args)?;
    // The runtime's warnings (and, with `--log info`, its story) go to stderr.
    let level: tracing::Level = flags.optional("log").unwrap_or("warn").parse()?;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .init();
    let client = client_properties(&flags)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match command.as_str() {
        "setup" => runtime.block_on(setup(&client, &flags)),
        "output" => Ok(runtime.block_on(create_topic(
            client,
            &flags.get("topic")?,
            flags.number("partitions", None)?,
            LOG_APPEND_TIME,
        ))?),
        "kstate" => run_kstate(&client, &flags),
        "pipe" => runtime.block_on(pipe(&client, &flags)),
        "measure" => measure(&client, &flags),
        "wait" => wait(&client, &flags),
        "failover" => failover(&client, &flags),
        "paced" => paced(&client, &flags),
        "delete-topics" => {
            let topics = flags.get("topics")?;
            let topics: Vec<&str> = topics.split(',').filter(|t| !t.is_empty()).collect();
            Ok(runtime.block_on(delete_topics(client, &topics))?)
        }
        other => bail!("unknown command {other}: {COMMANDS}"),
    }
}

/// The cluster and its security (see the module docs): `--client-properties FILE`, whose
/// `bootstrap.servers` `--bootstrap-servers` replaces; `KAFKA_BOOTSTRAP_SERVERS` when neither
/// names the brokers.
fn client_properties(flags: &Flags) -> Result<ClientProperties> {
    let file = flags
        .optional("client-properties")
        .map(std::path::Path::new);
    Ok(kstate_bench::cluster::required(
        file,
        flags.optional("bootstrap-servers"),
    )?)
}

/// A fresh input topic with `rows` records (see the module docs).
async fn setup(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let input = flags.get("input")?;
    let partitions: i32 = flags.number("partitions", None)?;
    let rows: u64 = flags.number("rows", None)?;
    let keys: u64 = flags.number("keys", Some(10_000))?;
    let unique = flags.switch("unique");
    let key_bytes: usize = flags.number("key-bytes", Some(8))?;
    let event_time = EventTime::from_flags(flags, rows)?;
    eprintln!("e2e setup: cluster {client}");
    let settings: &[(&str, &str)] = match event_time {
        Some(_) => &[("retention.ms", "-1")],
        None => &[],
    };
    create_topic(client.clone(), &input, partitions, settings).await?;
    let producer = producer(client.clone(), 5, DefaultProducerContext)?;
    // Record i's key and partition; the same sequence on every call.
    let records = || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(543);
        (0..rows).map(move |i| {
            let index = if unique { i } else { rng.random_range(0..keys) };
            let key = wide_key(index, key_bytes);
            let partition = kstate::kstate_task::partition_for(&key, partitions);
            (key, partition)
        })
    };
    // Each partition's last record, for the closing bookend.
    let mut last_of = vec![None; partitions as usize];
    if event_time.is_some_and(|t| t.bookends_ms.is_some()) {
        for (i, (_, partition)) in records().enumerate() {
            last_of[partition as usize] = Some(i);
        }
    }
    let mut first_seen = vec![false; partitions as usize];
    let started = Instant::now();
    for (i, (key, partition)) in records().enumerate() {
        let value = [b'v'; 16];
        let mut record = BaseRecord::to(&input)
            .partition(partition)
            .key(&key[..])
            .payload(&value[..]);
        if let Some(time) = &event_time {
            let first = !std::mem::replace(&mut first_seen[partition as usize], true);
            let last = last_of[partition as usize] == Some(i);
            record = record.timestamp(time.of(i as u64, first, last));
        }
        send(&producer, record);
    }
    producer.flush(Duration::from_secs(300))?;
    ensure!(producer.in_flight_count() == 0, "input not acknowledged");
    let distinct = if unique { rows } else { keys };
    eprintln!(
        "e2e setup: {rows} records over {distinct} keys of {} bytes into {input} ({partitions} \
         partitions) in {} ms",
        key_bytes.max(8),
        started.elapsed().as_millis()
    );
    if let Some(time) = event_time {
        eprintln!(
            "e2e setup: event time {} ms + {} ms per record, up to {} ms{}",
            time.start_ms,
            time.step_ms,
            time.of(rows.max(1) - 1, false, false),
            match time.bookends_ms {
                Some(j) => format!("; each partition's first record {j} ms before, its last after"),
                None => String::new(),
            }
        );
    }
    Ok(())
}

/// `setup`'s event time (see the module docs).
#[derive(Clone, Copy)]
struct EventTime {
    /// Record 0's timestamp.
    start_ms: i64,
    /// Added per record.
    step_ms: f64,
    /// Each partition's first record this much before record 0's time, its last this much after
    /// its own.
    bookends_ms: Option<i64>,
}

impl EventTime {
    /// From `--event-time-step-ms`, `--event-time-start-ms`, `--event-time-bookends-ms`.
    fn from_flags(flags: &Flags, rows: u64) -> Result<Option<Self>> {
        let Some(step) = flags.optional("event-time-step-ms") else {
            return Ok(None);
        };
        let step_ms: f64 = step
            .parse()
            .with_context(|| format!("--event-time-step-ms {step} is not a number"))?;
        ensure!(
            step_ms.is_finite() && step_ms >= 0.0,
            "--event-time-step-ms must be ≥ 0"
        );
        let bookends_ms = match flags.optional("event-time-bookends-ms") {
            Some(j) => Some(
                j.parse::<i64>()
                    .ok()
                    .filter(|j| *j > 0)
                    .with_context(|| format!("--event-time-bookends-ms {j}: a positive number"))?,
            ),
            None => None,
        };
        let minute = 60_000;
        let start_ms = match flags.optional("event-time-start-ms") {
            Some(start) => start
                .parse()
                .with_context(|| format!("--event-time-start-ms {start} is not a number"))?,
            None => {
                let span = (rows as f64 * step_ms).ceil() as i64 + bookends_ms.unwrap_or(0);
                (now_ms()? - span - minute).div_euclid(minute) * minute
            }
        };
        Ok(Some(EventTime {
            start_ms,
            step_ms,
            bookends_ms,
        }))
    }

    /// Record `i`'s timestamp; `first` and `last`: whether it is its partition's first or last.
    fn of(&self, i: u64, first: bool, last: bool) -> i64 {
        let time = self.start_ms + (i as f64 * self.step_ms) as i64;
        match self.bookends_ms {
            Some(j) if first => self.start_ms - j,
            Some(j) if last => time + j,
            _ => time,
        }
    }
}

/// The windowed runs' windows, as Kafka Streams' side has them (`KafkaStreamsBench.E2E_WINDOWS`):
/// tumbling, one minute, a grace of 10 s.
fn e2e_windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10))
}

/// What `kstate --topology --emit` runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// Count by key, every count sent (or the latest per commit, coalescing).
    Count,
    /// Count by key and window, every window's new count sent.
    WindowedUpdates,
    /// Count by key and window, each window's final count sent once.
    WindowedFinal,
}

impl Topology {
    fn from_flags(flags: &Flags) -> Result<Self> {
        let emit = flags.optional("emit").unwrap_or("updates");
        Ok(
            match (flags.optional("topology").unwrap_or("count"), emit) {
                ("count", "updates") => Topology::Count,
                ("windowed", "updates") => Topology::WindowedUpdates,
                ("windowed", "final") => Topology::WindowedFinal,
                ("count", _) => bail!("--emit {emit} needs --topology windowed"),
                (topology, emit) => {
                    bail!(
                        "--topology {topology} --emit {emit}: count, or windowed with updates \
                         or final"
                    )
                }
            },
        )
    }

    fn describe(self) -> &'static str {
        match self {
            Topology::Count => "count",
            Topology::WindowedUpdates => "windowed, emit updates",
            Topology::WindowedFinal => "windowed, emit final",
        }
    }
}

/// Counts records per key and window and sends each record's window's new count: Kafka
/// Streams' `windowedBy(..).count()` with caching off. A record for a window that closed (end
/// plus grace at or before stream time) is late: not counted, as Kafka Streams drops it.
struct WindowedUpdates {
    counts: WindowHandle,
    windows: WindowOptions,
    output: String,
}

/// A stored count: 8 bytes big-endian, Kafka Streams' `Long` serde, as the final count's store
/// (`examples/shared/windowed_count.rs`) keeps them.
fn decode_count(count: &[u8]) -> Result<i64, BoxError> {
    Ok(i64::from_be_bytes(count.try_into().map_err(|_| {
        format!("a count of {} bytes, not 8", count.len())
    })?))
}

impl Processor for WindowedUpdates {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let time = record
            .timestamp
            .ok_or("a record without a timestamp cannot be windowed")?;
        let key = record.key.unwrap_or_default();
        let counts = ctx.window_store(&self.counts);
        counts.observe(time)?;
        let now = counts.stream_time().unwrap_or(time);
        for start in self.windows.windows_containing(time) {
            if self.windows.closes_at(start) <= now {
                continue;
            }
            let count = match counts.get(key, start)? {
                Some(bytes) => decode_count(&bytes)? + 1,
                None => 1,
            };
            counts.put(key, start, Some(&count.to_be_bytes()))?;
            let mut out = key.to_vec();
            out.extend_from_slice(format!("@{start}").as_bytes());
            ctx.send(&self.output, &out, Some(count.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

/// Declares the `counts` window store and builds the application with a `WindowedUpdates` per
/// task sending to `output`.
fn build_windowed_updates(builder: &mut AppBuilder, output: &str) -> Result<App> {
    let windows = e2e_windows();
    let counts = builder.window_store("counts", windows);
    let output = output.to_string();
    Ok(builder.build(move |_task| {
        Box::new(WindowedUpdates {
            counts: counts.clone(),
            windows,
            output: output.clone(),
        })
    })?)
}

fn run_kstate(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let rows: u64 = flags.number("rows", None)?;
    let coalesce = flags.switch("coalesce");
    let topology = Topology::from_flags(flags)?;
    ensure!(
        !coalesce || topology == Topology::Count,
        "--coalesce is for --topology count only"
    );
    let guarantee = match flags.optional("guarantee") {
        Some(text) => text.parse::<ProcessingGuarantee>()?,
        None => ProcessingGuarantee::default(),
    };
    let state_dir = tempfile::tempdir()?;
    eprintln!("e2e kstate: cluster {client}");
    let mut builder = App::builder(flags.get("application-id")?, client.clone());
    builder
        .input(flags.get("input")?)
        .state_dir(state_dir.path())
        .threads(flags.number("threads", Some(1))?)
        .processing_guarantee(guarantee);
    let output = flags.get("output")?;
    let app = match topology {
        Topology::Count => count::build(&mut builder, &output, coalesce)?.0,
        Topology::WindowedUpdates => build_windowed_updates(&mut builder, &output)?,
        Topology::WindowedFinal => windowed::build(&mut builder, e2e_windows(), &output)?.0,
    };
    let started = Instant::now();
    let running = app.start()?;
    let deadline = started + Duration::from_secs(1800);
    loop {
        // `processed` counts committed records only (see the module docs), whatever the guarantee.
        let processed: u64 = running.tasks().iter().map(|t| t.processed).sum();
        if processed >= rows {
            break;
        }
        if let kstate::kstate_task::AppState::Failed(message) = running.state() {
            bail!("kstate failed: {message}");
        }
        ensure!(
            Instant::now() < deadline,
            "kstate processed {processed} of {rows}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    running.shutdown();
    running.wait()?;
    eprintln!(
        "kstate e2e processed {rows} records in {} ms from start ({}, coalescing {}, {guarantee})",
        elapsed.as_millis(),
        topology.describe(),
        if coalesce { "on" } else { "off" }
    );
    Ok(())
}

/// The bare pipe: consume one, produce two, and every 100 ms commit the input offsets once the
/// broker acknowledged everything sent before them, without pausing the consumption meanwhile:
/// the most the broker and rdkafka allow this loop, a limit for kstate's end-to-end rate.
async fn pipe(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let rows: u64 = flags.number("rows", None)?;
    let input = flags.get("input")?;
    let output = flags.get("output")?;
    let app = flags.get("application-id")?;
    let shadow = format!("{app}-shadow-changelog");
    let partitions = partition_count(client.clone(), &input)?;
    create_topic(
        client.clone(),
        &shadow,
        partitions,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    let consumer: BaseConsumer = create_client(
        client,
        &[
            ("group.id", app.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            // As kstate's input consumers.
            ("isolation.level", "read_committed"),
            ("fetch.wait.max.ms", "100"),
            // Unlike them, 8 MiB per partition and fetch instead of 1: with 1 MiB this loop
            // drains what a fetch brought and waits for the next one, about half its time (it
            // ran at 287-294k records/s, 429-442k with 8 MiB; kstate ran the same with either,
            // BENCHMARKS.md "The pipe as a limit").
            ("max.partition.fetch.bytes", "8388608"),
        ],
        "pipe consumer",
    )?;
    consumer.subscribe(&[&input])?;
    // Exactly the producer settings kstate's workers send with (acks=all, idempotence, lz4,
    // its linger).
    let producer: ThreadedProducer<Settled> = ProducerConfig::new(client.clone())
        .client_config()
        .create_with_context(Settled::default())
        .context("pipe producer")?;
    let mut sent = 0u64;
    let mut offsets: BTreeMap<i32, i64> = BTreeMap::new();
    // A commit taken but not yet sent: the records it waits for, and the offsets it commits.
    let mut pending: Option<(u64, TopicPartitionList)> = None;
    let mut next_commit = Instant::now() + Duration::from_millis(100);
    let (mut seen, started) = (0u64, Instant::now());
    while seen < rows {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let m = message?;
            let key = m.key().unwrap_or_default();
            let value = m.payload().unwrap_or_default();
            send(
                &producer,
                BaseRecord::to(&output)
                    .partition(m.partition())
                    .key(key)
                    .payload(b"1"),
            );
            send(
                &producer,
                BaseRecord::to(&shadow)
                    .partition(m.partition())
                    .key(key)
                    .payload(value),
            );
            sent += 2;
            offsets.insert(m.partition(), m.offset() + 1);
            seen += 1;
        }
        if let Some((needed, _)) = &pending
            && producer.context().settled()? >= *needed
            && let Some((_, tpl)) = pending.take()
        {
            consumer.commit(&tpl, CommitMode::Async)?;
        }
        if pending.is_none() && Instant::now() >= next_commit {
            pending = Some((sent, offset_list(&input, &offsets)?));
            next_commit = Instant::now() + Duration::from_millis(100);
        }
    }
    producer
        .context()
        .wait_for(sent, Duration::from_secs(60))
        .context("pipe")?;
    consumer.commit(&offset_list(&input, &offsets)?, CommitMode::Sync)?;
    eprintln!(
        "pipe processed {rows} records in {} ms from start",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// `offsets` (partition to next offset) of `topic`, as a commit takes them.
fn offset_list(topic: &str, offsets: &BTreeMap<i32, i64>) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    Ok(tpl)
}

/// A consumer outside any application's group, for reading outputs back: committed records
/// only (librdkafka's default, stated here because `measure` depends on it).
fn reader(client: &ClientProperties) -> Result<BaseConsumer> {
    Ok(create_client(
        client,
        &[
            ("group.id", "kstate-e2e-measure"),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
        ],
        "reader",
    )?)
}

/// What `measure --json` writes.
#[derive(serde::Serialize)]
struct MeasureResult {
    output: String,
    rows: u64,
    outputs: u64,
    first_to_last_ms: i64,
    records_per_sec: f64,
    /// (outputs appended so far, ms since the first) at every 100 ms of append time.
    progress: Vec<(u64, f64)>,
}

/// How long `measure` waits without its position moving. Longer than a transaction timeout
/// (10 s for both systems), so that a transaction left open is aborted before it gives up.
const MEASURE_STALL: Duration = Duration::from_secs(30);

/// Reads the output back; prints `e2e ... records_per_sec=<r>` over first-to-last append time.
fn measure(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let output = flags.get("output")?;
    let partitions: i32 = flags.number("partitions", None)?;
    let rows: u64 = flags.number("rows", None)?;
    let expect = flags.get("expect")?;
    ensure!(
        ["records", "counts", "windows", "window-updates"].contains(&expect.as_str()),
        "--expect {expect}: records, counts, windows or window-updates"
    );
    let final_windows = expect == "windows";
    // The input, against which windowed outputs are checked.
    let windowed_input = match expect.as_str() {
        "windows" | "window-updates" => Some(WindowedInput::read(client, &flags.get("input")?)?),
        _ => None,
    };
    let consumer = reader(client)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(&output, p, Duration::from_secs(30))?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(&output, p, Offset::Offset(low))?;
        }
    }
    consumer.assign(&tpl)?;
    let (mut records, mut counts) = (0u64, HashMap::<Vec<u8>, u64>::new());
    // Every output (key, count), for `--expect windows`.
    let mut outputs = Vec::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    // Each partition's first and last append time: a task that starts late stretches the
    // window of all of them.
    let mut spans: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
    // Outputs per 100 ms of append time, for the progress points.
    let mut per_tick: BTreeMap<i64, u64> = BTreeMap::new();
    // Done with a partition once the position (the next offset to read, past commit markers
    // and aborted records too) reaches its high watermark; checked whenever the consumer is idle
    // and every few thousand records.
    let mut last_progress = (Instant::now(), None::<i64>);
    let mut since_check = 0u32;
    while !ends.is_empty() {
        let message = consumer.poll(Duration::from_millis(100));
        since_check += 1;
        if message.is_none() || since_check >= 4096 {
            since_check = 0;
            let mut total = 0;
            for element in consumer.position()?.elements() {
                if let Offset::Offset(position) = element.offset() {
                    total += position;
                    if ends
                        .get(&element.partition())
                        .is_some_and(|end| position >= *end)
                    {
                        ends.remove(&element.partition());
                    }
                }
            }
            if last_progress.1 != Some(total) {
                last_progress = (Instant::now(), Some(total));
            }
            ensure!(
                last_progress.0.elapsed() < MEASURE_STALL,
                "reading {output} stalled: no progress for {MEASURE_STALL:?}, partitions {:?} \
                 not at their high watermarks {:?}",
                ends.keys().collect::<Vec<_>>(),
                ends.values().collect::<Vec<_>>()
            );
        }
        let Some(message) = message else {
            continue;
        };
        let m = message?;
        let appended = append_time(&m)?;
        (first, last) = (first.min(appended), last.max(appended));
        let span = spans.entry(m.partition()).or_insert((appended, appended));
        *span = (span.0.min(appended), span.1.max(appended));
        *per_tick.entry(appended / 100).or_default() += 1;
        records += 1;
        let count = m
            .payload()
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.parse::<u64>().ok());
        if final_windows {
            let count =
                count.with_context(|| format!("{output}: an output that is not a count"))?;
            outputs.push((m.key().unwrap_or_default().to_vec(), count));
        } else if let Some(n) = count {
            let e = counts
                .entry(m.key().unwrap_or_default().to_vec())
                .or_insert(0);
            *e = (*e).max(n);
        }
    }
    let mut windows_line = String::new();
    match (expect.as_str(), &windowed_input) {
        ("records", _) => ensure!(
            records == rows,
            "{output}: {records} outputs for {rows} inputs"
        ),
        ("counts", _) => {
            let total: u64 = counts.values().sum();
            ensure!(
                total == rows,
                "{output}: the last counts sum to {total}, not {rows}"
            );
        }
        ("window-updates", Some(input)) => {
            ensure!(
                records == rows,
                "{output}: {records} outputs for {rows} inputs"
            );
            let windows = input.check_updates(&output, &counts)?;
            windows_line = format!(" windows={windows}");
        }
        (_, Some(input)) => {
            ensure!(
                input.records == rows,
                "the input holds {} records, not {rows}",
                input.records
            );
            let check = input.check(&output, &outputs)?;
            windows_line = format!(
                " windows={}/{} duplicates={}",
                check.sent, check.closed, check.duplicates
            );
        }
        _ => unreachable!("--expect was checked above"),
    }
    let first_tick = per_tick.keys().next().copied().unwrap_or_default();
    let mut done = 0;
    let progress = per_tick
        .iter()
        .map(|(tick, n)| {
            done += n;
            (done, ((tick - first_tick) * 100) as f64)
        })
        .collect();
    let first_to_last_ms = last - first;
    let result = MeasureResult {
        records_per_sec: per_second(rows, first_to_last_ms.max(1) as f64),
        output,
        rows,
        outputs: records,
        first_to_last_ms,
        progress,
    };
    println!(
        "e2e output={} outputs={}{windows_line} first_to_last_ms={} records_per_sec={:.0}",
        result.output, result.outputs, result.first_to_last_ms, result.records_per_sec
    );
    // Per partition, its first and last output's append time after the first output of all.
    let spans: Vec<String> = spans
        .iter()
        .map(|(p, (a, b))| format!("{p}:{}-{}", a - first, b - first))
        .collect();
    println!(
        "e2e partitions output={} append_ms={}",
        result.output,
        spans.join(",")
    );
    if let Some(path) = flags.optional("json") {
        write_json(path.as_ref(), &result)?;
    }
    Ok(())
}

/// The windowed runs' input read back: what each window's final count must be, and when it
/// closes.
struct WindowedInput {
    records: u64,
    /// Every (key, window start)'s count, closed or not.
    counts: HashMap<(Vec<u8>, i64), u64>,
    /// Each key's input partition: windows close by their partition's stream time.
    partition_of: HashMap<Vec<u8>, i32>,
    /// Per input partition, its stream time at the end: its latest record's timestamp.
    stream_time: BTreeMap<i32, i64>,
}

/// What `WindowedInput::check` found.
struct WindowCheck {
    /// Distinct windows sent.
    sent: usize,
    /// Windows that closed (all input partitions).
    closed: usize,
    /// Windows sent more than once (with the same count; at-least-once allows it).
    duplicates: usize,
}

impl WindowedInput {
    fn read(client: &ClientProperties, topic: &str) -> Result<Self> {
        let windows = e2e_windows();
        let partitions = partition_count(client.clone(), topic)?;
        ensure!(partitions > 0, "{topic} does not exist");
        let consumer = reader(client)?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for p in 0..partitions {
            let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(30))?;
            if high > low {
                ends.insert(p, high);
                tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
            }
        }
        consumer.assign(&tpl)?;
        let mut input = WindowedInput {
            records: 0,
            counts: HashMap::new(),
            partition_of: HashMap::new(),
            stream_time: BTreeMap::new(),
        };
        let started = Instant::now();
        while !ends.is_empty() {
            ensure!(
                started.elapsed() < Duration::from_secs(300),
                "reading {topic} back took more than 5 minutes"
            );
            let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = message?;
            let time = m
                .timestamp()
                .to_millis()
                .with_context(|| format!("{topic}: a record without a timestamp"))?;
            let key = m.key().unwrap_or_default().to_vec();
            let now = input.stream_time.entry(m.partition()).or_insert(time);
            *now = (*now).max(time);
            let now = *now;
            for start in windows.windows_containing(time) {
                // A late record counts nowhere, in either system.
                if windows.closes_at(start) > now {
                    *input.counts.entry((key.clone(), start)).or_default() += 1;
                }
            }
            input.partition_of.insert(key, m.partition());
            input.records += 1;
            if ends
                .get(&m.partition())
                .is_some_and(|end| m.offset() + 1 >= *end)
            {
                ends.remove(&m.partition());
            }
        }
        Ok(input)
    }

    /// Checks the highest count `topic` sent for each window (`<key>@<start>`) against the
    /// input: one per input record (closed or not, late records aside), every window's the
    /// count of its records. Returns the number of windows.
    fn check_updates(&self, topic: &str, highest: &HashMap<Vec<u8>, u64>) -> Result<usize> {
        for (output, count) in highest {
            let (key, start) = window_of(topic, output)?;
            let expected = self.counts.get(&(key.clone(), start)).copied();
            ensure!(
                expected == Some(*count),
                "{topic}: window {start} of key {key:?} counted up to {count}; the input has \
                 {expected:?}"
            );
        }
        ensure!(
            highest.len() == self.counts.len(),
            "{topic}: {} windows have counts, the input has {}",
            highest.len(),
            self.counts.len()
        );
        Ok(highest.len())
    }

    /// Checks `outputs` (`<key>@<start>`, count) of `topic` as final window counts (see the
    /// module docs).
    fn check(&self, topic: &str, outputs: &[(Vec<u8>, u64)]) -> Result<WindowCheck> {
        let windows = e2e_windows();
        let closed = |key: &[u8], start: i64| {
            self.partition_of
                .get(key)
                .and_then(|p| self.stream_time.get(p))
                .is_some_and(|now| windows.closes_at(start) <= *now)
        };
        let mut sent: HashMap<(Vec<u8>, i64), u64> = HashMap::new();
        let mut duplicates = 0;
        // Per input partition, the latest window close among the windows sent.
        let mut sent_until: BTreeMap<i32, i64> = BTreeMap::new();
        for (output, count) in outputs {
            let (key, start) = window_of(topic, output)?;
            let expected = self.counts.get(&(key.clone(), start)).copied();
            ensure!(
                expected == Some(*count) && closed(&key, start),
                "{topic}: window {start} of key {key:?} sent with count {count}; the input has \
                 {expected:?}{}",
                if closed(&key, start) {
                    ""
                } else {
                    ", and it never closed"
                }
            );
            let p = self.partition_of[&key];
            let until = sent_until.entry(p).or_insert(i64::MIN);
            *until = (*until).max(windows.closes_at(start));
            if sent.insert((key, start), *count).is_some() {
                duplicates += 1;
            }
        }
        ensure!(
            !sent.is_empty(),
            "{topic}: no window was sent, so there is no clock (a run that ends within a second \
             of its start may send none: Kafka Streams sends closed windows once a second)"
        );
        // Per (input partition, window start): windows sent, windows closed; and how many
        // closed before a window of their partition that was sent, but were never sent.
        let mut per_start: BTreeMap<(i32, i64), (usize, usize)> = BTreeMap::new();
        let (mut closed_windows, mut skipped) = (0, 0);
        for (key, start) in self.counts.keys() {
            if !closed(key, *start) {
                continue;
            }
            closed_windows += 1;
            let p = self.partition_of[key];
            let was_sent = sent.contains_key(&(key.clone(), *start));
            let tally = per_start.entry((p, *start)).or_default();
            tally.0 += usize::from(was_sent);
            tally.1 += 1;
            let sent_up_to = sent_until.get(&p).copied().unwrap_or(i64::MIN);
            if !was_sent && windows.closes_at(*start) <= sent_up_to {
                skipped += 1;
            }
        }
        if skipped > 0 {
            let tallies: Vec<String> = per_start
                .iter()
                .map(|((p, start), (sent, closed))| format!("{p}:{start}={sent}/{closed}"))
                .collect();
            bail!(
                "{topic}: {skipped} windows closed before windows of their partition that were \
                 sent, but were never sent; sent/closed per partition:window start: {}",
                tallies.join(" ")
            );
        }
        Ok(WindowCheck {
            sent: sent.len(),
            closed: closed_windows,
            duplicates,
        })
    }
}

/// An output key `<key>@<window start>` split.
fn window_of(topic: &str, output: &[u8]) -> Result<(Vec<u8>, i64)> {
    let at = output
        .iter()
        .rposition(|b| *b == b'@')
        .with_context(|| format!("{topic}: an output key without @<window start>"))?;
    let start = std::str::from_utf8(&output[at + 1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{topic}: an output key without @<window start>"))?;
    Ok((output[..at].to_vec(), start))
}

/// Waits until the output topic holds `--records` records and, with `--group`, until that
/// group's committed offsets reach `--input`'s end offsets.
fn wait(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let output = flags.get("output")?;
    let records: i64 = flags.number("records", None)?;
    let timeout = Duration::from_secs(flags.number("timeout-s", Some(1800))?);
    let partitions = partition_count(client.clone(), &output)?;
    ensure!(partitions > 0, "{output} does not exist");
    let consumer = reader(client)?;
    // The group's committed offsets, read by a consumer that names the group but never joins it
    // (no subscribe): OffsetFetch only.
    let group = match flags.optional("group") {
        Some(group) => {
            let input = flags.get("input")?;
            let input_partitions = partition_count(client.clone(), &input)?;
            ensure!(input_partitions > 0, "{input} does not exist");
            let offsets: BaseConsumer = create_client(
                client,
                &[("group.id", group), ("enable.auto.commit", "false")],
                "offsets client",
            )?;
            Some((group.to_string(), input, input_partitions, offsets))
        }
        None => None,
    };
    let started = Instant::now();
    let mut held_at = None;
    loop {
        let mut held = 0;
        for p in 0..partitions {
            let (low, high) = consumer.fetch_watermarks(&output, p, Duration::from_secs(30))?;
            held += high - low;
        }
        if held >= records && held_at.is_none() {
            held_at = Some(started.elapsed());
            eprintln!(
                "e2e wait: {output} holds {held} records after {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let behind = match (&group, held_at) {
            (Some((group, input, input_partitions, offsets)), Some(_)) => {
                let behind = committed_behind(offsets, input, *input_partitions)?;
                if behind == 0 {
                    eprintln!(
                        "e2e wait: group {group} committed the end of {input} after {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                }
                behind
            }
            _ => 0,
        };
        if held_at.is_some() && behind == 0 {
            return Ok(());
        }
        ensure!(
            started.elapsed() < timeout,
            "after {timeout:?}: {output} holds {held} of {records} records; {behind} input \
             records not committed by the group"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// How many of `input`'s records lie beyond the committed offsets of the group `consumer`
/// names (its `group.id`); a partition with no committed offset counts in full.
fn committed_behind(consumer: &BaseConsumer, input: &str, partitions: i32) -> Result<i64> {
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(input, p, Duration::from_secs(30))?;
        ends.insert(p, high);
        tpl.add_partition(input, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
    let mut behind = 0;
    for (p, end) in ends {
        let at = match committed.find_partition(input, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => 0,
        };
        behind += (end - at).max(0);
    }
    Ok(behind)
}

/// Markers' keys start with this; no input record's does (setup's keys start with an 8-byte
/// index).
const MARKER_PREFIX: &str = "kstate-failover-marker-";

/// A marker key for each of `partitions` partitions: one that murmur2 hashes to it, so that a
/// system whose output is partitioned by key (Kafka Streams' `to`) writes the marker's output to
/// the same partition number as one that keeps the input's (kstate's `send`).
fn marker_keys(partitions: i32) -> Vec<Vec<u8>> {
    let mut keys = vec![Vec::new(); partitions as usize];
    let mut missing = partitions;
    for n in 0u64.. {
        let key = format!("{MARKER_PREFIX}{n}").into_bytes();
        let p = kstate::kstate_task::partition_for(&key, partitions) as usize;
        if keys[p].is_empty() {
            keys[p] = key;
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
    }
    keys
}

/// What `failover --json` writes.
#[derive(serde::Serialize)]
struct FailoverResult {
    input: String,
    output: String,
    killed_pid: u32,
    /// Per input partition: ms from the SIGKILL to the append of its marker's output.
    partition_ms: BTreeMap<i32, i64>,
    /// Per input partition: ms from the SIGKILL until the (read_committed) reader got it.
    visible_ms: BTreeMap<i32, i64>,
    seconds: f64,
}

/// SIGKILLs `--kill`, then times each partition's marker until its output appears.
fn failover(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let input = flags.get("input")?;
    let output = flags.get("output")?;
    let pid: u32 = flags.number("kill", None)?;
    let timeout = Duration::from_secs(flags.number("timeout-s", Some(600))?);
    let partitions = partition_count(client.clone(), &input)?;
    ensure!(partitions > 0, "{input} does not exist");
    let consumer = reader(client)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(&output, p, Duration::from_secs(30))?;
        tpl.add_partition_offset(&output, p, Offset::Offset(high))?;
    }
    let producer = producer(client.clone(), 0, Settled::default())?;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .context("run kill")?;
    let killed_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    ensure!(killed.success(), "kill -KILL {pid} failed: {killed}");
    let markers = marker_keys(partitions);
    for (p, key) in markers.iter().enumerate() {
        send(
            &producer,
            BaseRecord::to(&input)
                .partition(p as i32)
                .key(&key[..])
                .payload(&b"m"[..]),
        );
    }
    producer
        .context()
        .wait_for(partitions as u64, Duration::from_secs(30))
        .context("markers")?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let (mut partition_ms, mut visible_ms) = (BTreeMap::new(), BTreeMap::new());
    while partition_ms.len() < partitions as usize {
        ensure!(
            started.elapsed() < timeout,
            "after {timeout:?} only partitions {:?} of {partitions} have their marker's output",
            partition_ms.keys().collect::<Vec<_>>()
        );
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = message?;
        if m.key() == Some(&markers[m.partition() as usize][..])
            && !partition_ms.contains_key(&m.partition())
        {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
            partition_ms.insert(m.partition(), append_time(&m)? - killed_at);
            visible_ms.insert(m.partition(), now - killed_at);
        }
    }
    let slowest = partition_ms.values().copied().max().unwrap_or_default();
    let slowest_visible = visible_ms.values().copied().max().unwrap_or_default();
    for (p, ms) in &partition_ms {
        println!(
            "failover partition={p} ms={ms} visible_ms={}",
            visible_ms[p]
        );
    }
    let result = FailoverResult {
        input,
        output,
        killed_pid: pid,
        seconds: slowest as f64 / 1e3,
        partition_ms,
        visible_ms,
    };
    println!(
        "failover seconds={:.3} partitions={partitions} killed_at_ms={killed_at} visible_s={:.3}",
        result.seconds,
        slowest_visible as f64 / 1e3
    );
    if let Some(path) = flags.optional("json") {
        write_json(path.as_ref(), &result)?;
    }
    Ok(())
}

/// What `paced --json` writes.
#[derive(serde::Serialize)]
struct PacedResult {
    input: String,
    output: String,
    rows: u64,
    warmup: u64,
    /// The rate asked for, records/s.
    rate: f64,
    /// The rate the paced records reached the input at (first to last append), records/s.
    input_rate: f64,
    /// Input append to output append, per paced record.
    append: LatencySummary,
    /// Input append until the read_committed reader got the output, per paced record.
    visible: LatencySummary,
    /// Per second of input append time since the first paced record: (second, records, visible
    /// p50 ms, visible max ms). A latency that grows second after second is a system that does
    /// not keep up with the rate; a flat one with spikes is one that does.
    per_second: Vec<(u64, u64, f64, f64)>,
}

/// A timestamp on the machine's wall clock (the broker's clock too: it runs here), ms.
fn now_ms() -> Result<i64> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64)
}

/// An output as the reader got it: the broker's append time and when the reader had it, ms.
#[derive(Clone, Copy)]
struct Seen {
    appended: i64,
    visible: i64,
}

/// How long `paced` waits for a new output before it gives up (the application died or hangs).
const PACED_STALL: Duration = Duration::from_secs(90);

/// Sets the flag when dropped: stops the paced writer whichever way `paced` returns.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Warm-up, then `rate` records/s into the input while reading the output (see the module docs).
fn paced(client: &ClientProperties, flags: &Flags) -> Result<()> {
    let input = flags.get("input")?;
    let output = flags.get("output")?;
    let rows: u64 = flags.number("rows", None)?;
    let rate: f64 = flags.number("rate", None)?;
    let warmup: u64 = flags.number("warmup", Some(10_000))?;
    let keys: u64 = flags.number("keys", Some(10_000))?;
    ensure!(rate > 0.0, "--rate must be positive");
    ensure!(warmup > 0 && warmup < rows, "--warmup must be in 1..{rows}");
    let partitions = partition_count(client.clone(), &input)?;
    ensure!(partitions > 0, "{input} does not exist");
    let output_partitions = partition_count(client.clone(), &output)?;
    ensure!(output_partitions > 0, "{output} does not exist");
    eprintln!(
        "e2e paced: {warmup} warm-up records, then {} at {rate} records/s into {input}; cluster \
         {client}",
        rows - warmup
    );

    // The reader, assigned before anything is written.
    let consumer = reader(client)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..output_partitions {
        tpl.add_partition_offset(&output, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let producer = producer(client.clone(), 5, Settled::default())?;

    let (warm, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    let mut outputs: HashMap<(Vec<u8>, u64), Seen> = HashMap::new();
    let paced_rows = rows - warmup;
    let write = || -> Result<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(543);
        let mut write_one = |value: &[u8]| {
            let key = wide_key(rng.random_range(0..keys), 8);
            let partition = kstate::kstate_task::partition_for(&key, partitions);
            send(
                &producer,
                BaseRecord::to(&input)
                    .partition(partition)
                    .key(&key[..])
                    .payload(value),
            );
        };
        for _ in 0..warmup {
            write_one(&[b'w'; 16]);
        }
        while !warm.load(Ordering::Acquire) {
            ensure!(!stop.load(Ordering::Acquire), "stopped during the warm-up");
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        let mut sent = 0u64;
        while sent < paced_rows {
            ensure!(
                !stop.load(Ordering::Acquire),
                "stopped after {sent} paced records"
            );
            let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(paced_rows);
            while sent < due {
                write_one(&[b'p'; 16]);
                sent += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let seconds = started.elapsed().as_secs_f64();
        producer
            .context()
            .wait_for(rows, Duration::from_secs(60))
            .context("paced input")?;
        Ok(seconds)
    };
    let read = |outputs: &mut HashMap<(Vec<u8>, u64), Seen>| -> Result<()> {
        let _stop = StopOnDrop(&stop);
        let mut last_new = Instant::now();
        while (outputs.len() as u64) < rows {
            if outputs.len() as u64 >= warmup && !warm.load(Ordering::Acquire) {
                eprintln!("e2e paced: the warm-up's {warmup} outputs are back; pacing");
                warm.store(true, Ordering::Release);
            }
            ensure!(
                last_new.elapsed() < PACED_STALL,
                "{output}: no new output for {PACED_STALL:?}; {} of {rows} outputs read",
                outputs.len()
            );
            let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = message?;
            let visible = now_ms()?;
            let count = m
                .payload()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .with_context(|| format!("{output}: an output that is not a count"))?;
            let key = m.key().unwrap_or_default().to_vec();
            let appended = append_time(&m)?;
            // At-least-once may deliver an output twice: the first one counts.
            if let std::collections::hash_map::Entry::Vacant(e) = outputs.entry((key, count)) {
                e.insert(Seen { appended, visible });
                last_new = Instant::now();
            }
        }
        Ok(())
    };
    let paced_seconds = std::thread::scope(|scope| -> Result<f64> {
        let writer = scope.spawn(write);
        let read_result = read(&mut outputs);
        let written = writer
            .join()
            .map_err(|_| anyhow::anyhow!("the paced writer panicked"))?;
        read_result?;
        written
    })?;

    // The input back, with its append times: per key, its records in order.
    let inputs = read_all(client, &input, partitions)?;
    let (mut append, mut visible) = (Latency::new(), Latency::new());
    let (mut first_paced, mut last_paced) = (i64::MAX, i64::MIN);
    let mut by_second: BTreeMap<i64, Latency> = BTreeMap::new();
    for ((key, count), seen) in &outputs {
        let Some(&(input_appended, warm_up)) = inputs
            .get(key)
            .and_then(|records| records.get((*count as usize).wrapping_sub(1)))
        else {
            bail!("{output}: an output with count {count} has no such input record");
        };
        if warm_up {
            continue;
        }
        (first_paced, last_paced) = (
            first_paced.min(input_appended),
            last_paced.max(input_appended),
        );
        let ms = |to: i64| Duration::from_millis((to - input_appended).max(0) as u64);
        append.record(ms(seen.appended));
        visible.record(ms(seen.visible));
        by_second
            .entry(input_appended / 1000)
            .or_default()
            .record(ms(seen.visible));
    }
    let first_second = by_second.keys().next().copied().unwrap_or_default();
    let per_second_latency = by_second
        .iter()
        .map(|(second, latency)| {
            let summary = latency.summary();
            (
                (second - first_second) as u64,
                summary.calls,
                summary.p50_us / 1e3,
                summary.max_us / 1e3,
            )
        })
        .collect();
    ensure!(
        append.calls() == paced_rows,
        "{} paced outputs matched, {paced_rows} paced inputs",
        append.calls()
    );
    let result = PacedResult {
        input,
        output,
        rows,
        warmup,
        rate,
        input_rate: per_second(paced_rows, (last_paced - first_paced).max(1) as f64),
        append: append.summary(),
        visible: visible.summary(),
        per_second: per_second_latency,
    };
    let ms = |us: f64| us / 1e3;
    println!(
        "e2e latency output={} paced={paced_rows} rate={:.0} input_rate={:.0} written_s={:.1} \
         append_p50_ms={:.0} append_p99_ms={:.0} append_p999_ms={:.0} append_max_ms={:.0} \
         visible_p50_ms={:.0} visible_p99_ms={:.0} visible_p999_ms={:.0} visible_max_ms={:.0}",
        result.output,
        result.rate,
        result.input_rate,
        paced_seconds,
        ms(result.append.p50_us),
        ms(result.append.p99_us),
        ms(result.append.p999_us),
        ms(result.append.max_us),
        ms(result.visible.p50_us),
        ms(result.visible.p99_us),
        ms(result.visible.p999_us),
        ms(result.visible.max_us),
    );
    if let Some(path) = flags.optional("json") {
        write_json(path.as_ref(), &result)?;
    }
    Ok(())
}

/// Per key, its input records in offset order: (append time, written during the warm-up).
type InputsByKey = HashMap<Vec<u8>, Vec<(i64, bool)>>;

/// Every record of `topic` up to its current end, by key. A key's records are all in one
/// partition, so the order of arrival is their order.
fn read_all(client: &ClientProperties, topic: &str, partitions: i32) -> Result<InputsByKey> {
    let consumer = reader(client)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(30))?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
        }
    }
    consumer.assign(&tpl)?;
    let mut records = InputsByKey::new();
    let started = Instant::now();
    while !ends.is_empty() {
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "reading {topic} back took more than 5 minutes"
        );
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = message?;
        let warm_up = m.payload().and_then(|v| v.first()) == Some(&b'w');
        records
            .entry(m.key().unwrap_or_default().to_vec())
            .or_default()
            .push((append_time(&m)?, warm_up));
        if ends
            .get(&m.partition())
            .is_some_and(|end| m.offset() + 1 >= *end)
        {
            ends.remove(&m.partition());
        }
    }
    Ok(records)
}
