//! e2e: the end-to-end and failover benchmarks' kstate side, the bare-rdkafka baseline, and the
//! measures every system is judged by (`benches/kafka-streams/compare.sh`, `failover.sh`).
//!
//! ```text
//! e2e setup    --input T --partitions P --rows N [--keys K | --unique] [--key-bytes B]
//! e2e output   --topic T --partitions P                        output topic (LogAppendTime)
//! e2e kstate   --input T --output T --application-id A --rows N [--threads N] [--coalesce]
//!              [--guarantee at-least-once|exactly-once]
//! e2e pipe     --input T --output T --application-id A --rows N
//! e2e measure  --output T --partitions P --rows N --expect records|counts [--json PATH]
//! e2e wait     --output T --records N [--group G --input T] [--timeout-s S]
//! e2e failover --input T --output T --kill PID [--timeout-s S] [--json PATH]
//! ```
//!
//! - `setup` fills a fresh input topic: N records with 16-byte values, keys drawn uniformly from
//!   K (seeded; default 10,000) or, with `--unique`, the keys `0..N` once each; keys are B bytes
//!   wide (default 8: the index big-endian; wider keys add incompressible filler, which is how
//!   the failover benchmark gets about 1 GB of state). Partitioned by murmur2 like the Java client.
//! - `kstate` runs the count-by-key task (the `count_by_key` example's processor) in process
//!   until it has processed and committed N records, then stops gracefully. `--guarantee
//!   exactly-once` runs it exactly-once (one transaction per worker and commit interval); the
//!   tasks' `processed` counts only records whose commit (under exactly-once: whose
//!   transaction) succeeded, and an abort's rewind does not count its records twice, so the
//!   same stop condition holds under both guarantees.
//! - `pipe` is the physical limit: the same broker work with no state. Each input record is
//!   consumed and two records produced (the output, and a record to a compacted topic standing
//!   in for the changelog), idempotent with acks=all; every 100 ms it waits until the broker
//!   acknowledged everything sent (counting delivery reports, as kstate's commit does; not
//!   librdkafka's flush, which costs far more) and commits the input offsets.
//! - `measure` reads the output topic back: output topics are created with
//!   `message.timestamp.type=LogAppendTime`, so the broker stamps every output when it appends it,
//!   whoever produced it. The rate is N input records over the time from the first output's
//!   append to the last one's: start-up (group join, topic creation) is outside the clock for
//!   every system alike. `--expect records`: one output per input (caching off, the pipe);
//!   `--expect counts`: the outputs' last counts sum to N (caching on emits fewer). It reads
//!   with `isolation.level=read_committed` (aborted outputs of an exactly-once run do not count)
//!   and is done with a partition when the consumer's position reaches the high watermark the
//!   partition had at the start: on a transactional topic the commit markers take offsets, so
//!   the last record's offset + 1 is below it.
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
//!
//! Needs `--bootstrap-servers` or `KAFKA_BOOTSTRAP_SERVERS`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail, ensure};
use kstate::kstate_task::{App, ProcessingGuarantee};
use kstate_bench::flags::Flags;
use kstate_bench::kafka::{
    LOG_APPEND_TIME, Settled, append_time, create_topic, partition_count, producer, send,
};
use kstate_bench::report::{per_second, write_json};
use kstate_bench::workload::wide_key;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[path = "shared/count_by_key.rs"]
mod count;

const COMMANDS: &str = "setup|output|kstate|pipe|measure|wait|failover";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args
        .next()
        .with_context(|| format!("usage: e2e {COMMANDS} ..."))?;
    let flags = Flags::parse(args)?;
    let servers = match flags.optional("bootstrap-servers") {
        Some(s) => s.to_string(),
        None => std::env::var("KAFKA_BOOTSTRAP_SERVERS")
            .context("--bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS is required")?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match command.as_str() {
        "setup" => runtime.block_on(setup(&servers, &flags)),
        "output" => Ok(runtime.block_on(create_topic(
            &servers,
            &flags.get("topic")?,
            flags.number("partitions", None)?,
            LOG_APPEND_TIME,
        ))?),
        "kstate" => run_kstate(&servers, &flags),
        "pipe" => runtime.block_on(pipe(&servers, &flags)),
        "measure" => measure(&servers, &flags),
        "wait" => wait(&servers, &flags),
        "failover" => failover(&servers, &flags),
        other => bail!("unknown command {other}: {COMMANDS}"),
    }
}

/// A fresh input topic with `rows` records (see the module docs).
async fn setup(servers: &str, flags: &Flags) -> Result<()> {
    let input = flags.get("input")?;
    let partitions: i32 = flags.number("partitions", None)?;
    let rows: u64 = flags.number("rows", None)?;
    let keys: u64 = flags.number("keys", Some(10_000))?;
    let unique = flags.switch("unique");
    let key_bytes: usize = flags.number("key-bytes", Some(8))?;
    create_topic(servers, &input, partitions, &[]).await?;
    let producer = producer(servers, 5, DefaultProducerContext)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(543);
    let started = Instant::now();
    for i in 0..rows {
        let index = if unique { i } else { rng.random_range(0..keys) };
        let key = wide_key(index, key_bytes);
        let partition = kstate::kstate_task::partition_for(&key, partitions);
        let value = [b'v'; 16];
        send(
            &producer,
            BaseRecord::to(&input)
                .partition(partition)
                .key(&key[..])
                .payload(&value[..]),
        );
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
    Ok(())
}

fn run_kstate(servers: &str, flags: &Flags) -> Result<()> {
    let rows: u64 = flags.number("rows", None)?;
    let coalesce = flags.switch("coalesce");
    let guarantee = match flags.optional("guarantee") {
        Some(text) => text.parse::<ProcessingGuarantee>()?,
        None => ProcessingGuarantee::default(),
    };
    let state_dir = tempfile::tempdir()?;
    let mut builder = App::builder(flags.get("application-id")?, servers);
    builder
        .input(flags.get("input")?)
        .state_dir(state_dir.path())
        .threads(flags.number("threads", Some(1))?)
        .processing_guarantee(guarantee);
    let (app, _) = count::build(&mut builder, &flags.get("output")?, coalesce)?;
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
        "kstate e2e processed {rows} records in {} ms from start (coalescing {}, {guarantee})",
        elapsed.as_millis(),
        if coalesce { "on" } else { "off" }
    );
    Ok(())
}

/// The bare pipe: consume one, produce two, commit every 100 ms once everything is acknowledged.
async fn pipe(servers: &str, flags: &Flags) -> Result<()> {
    let rows: u64 = flags.number("rows", None)?;
    let input = flags.get("input")?;
    let output = flags.get("output")?;
    let app = flags.get("application-id")?;
    let shadow = format!("{app}-shadow-changelog");
    let partitions = partition_count(servers, &input)?;
    create_topic(
        servers,
        &shadow,
        partitions,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", &app)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&input])?;
    let producer = producer(servers, 1, Settled::default())?;
    let mut sent = 0u64;
    let mut offsets: BTreeMap<i32, i64> = BTreeMap::new();
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
        if Instant::now() >= next_commit || seen == rows {
            producer
                .context()
                .wait_for(sent, Duration::from_secs(60))
                .context("pipe")?;
            let mut tpl = TopicPartitionList::new();
            for (p, o) in &offsets {
                tpl.add_partition_offset(&input, *p, Offset::Offset(*o))?;
            }
            if tpl.count() > 0 {
                consumer.commit(&tpl, CommitMode::Async)?;
            }
            next_commit = Instant::now() + Duration::from_millis(100);
        }
    }
    eprintln!(
        "pipe processed {rows} records in {} ms from start",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// A consumer outside any application's group, for reading outputs back: committed records
/// only (librdkafka's default, stated here because `measure` depends on it).
fn reader(servers: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "kstate-e2e-measure")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?)
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
fn measure(servers: &str, flags: &Flags) -> Result<()> {
    let output = flags.get("output")?;
    let partitions: i32 = flags.number("partitions", None)?;
    let rows: u64 = flags.number("rows", None)?;
    let expect = flags.get("expect")?;
    let consumer = reader(servers)?;
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
    let (mut first, mut last) = (i64::MAX, i64::MIN);
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
        *per_tick.entry(appended / 100).or_default() += 1;
        records += 1;
        if let Some(n) = m
            .payload()
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.parse::<u64>().ok())
        {
            let e = counts
                .entry(m.key().unwrap_or_default().to_vec())
                .or_insert(0);
            *e = (*e).max(n);
        }
    }
    match expect.as_str() {
        "records" => ensure!(
            records == rows,
            "{output}: {records} outputs for {rows} inputs"
        ),
        "counts" => {
            let total: u64 = counts.values().sum();
            ensure!(
                total == rows,
                "{output}: the last counts sum to {total}, not {rows}"
            );
        }
        other => bail!("--expect {other}: records or counts"),
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
        "e2e output={} outputs={} first_to_last_ms={} records_per_sec={:.0}",
        result.output, result.outputs, result.first_to_last_ms, result.records_per_sec
    );
    if let Some(path) = flags.optional("json") {
        write_json(path.as_ref(), &result)?;
    }
    Ok(())
}

/// Waits until the output topic holds `--records` records and, with `--group`, until that
/// group's committed offsets reach `--input`'s end offsets.
fn wait(servers: &str, flags: &Flags) -> Result<()> {
    let output = flags.get("output")?;
    let records: i64 = flags.number("records", None)?;
    let timeout = Duration::from_secs(flags.number("timeout-s", Some(1800))?);
    let partitions = partition_count(servers, &output)?;
    ensure!(partitions > 0, "{output} does not exist");
    let consumer = reader(servers)?;
    // The group's committed offsets, read by a consumer that names the group but never joins it
    // (no subscribe): OffsetFetch only.
    let group = match flags.optional("group") {
        Some(group) => {
            let input = flags.get("input")?;
            let input_partitions = partition_count(servers, &input)?;
            ensure!(input_partitions > 0, "{input} does not exist");
            let offsets: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", servers)
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .create()?;
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
fn failover(servers: &str, flags: &Flags) -> Result<()> {
    let input = flags.get("input")?;
    let output = flags.get("output")?;
    let pid: u32 = flags.number("kill", None)?;
    let timeout = Duration::from_secs(flags.number("timeout-s", Some(600))?);
    let partitions = partition_count(servers, &input)?;
    ensure!(partitions > 0, "{input} does not exist");
    let consumer = reader(servers)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = consumer.fetch_watermarks(&output, p, Duration::from_secs(30))?;
        tpl.add_partition_offset(&output, p, Offset::Offset(high))?;
    }
    let producer = producer(servers, 0, Settled::default())?;
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
