//! e2e: the end-to-end benchmark's kstate side, its bare-rdkafka baseline, and the one measure
//! both it and Kafka Streams are judged by (`benches/kafka-streams/compare.sh`).
//!
//! ```text
//! e2e setup   --input T --partitions P --rows N [--keys K]     fresh input topic, N records
//! e2e output  --topic T --partitions P                         output topic (LogAppendTime)
//! e2e kstate  --input T --output T --application-id A --rows N [--threads N] [--coalesce]
//! e2e pipe    --input T --output T --application-id A --rows N
//! e2e measure --output T --partitions P --rows N --expect records|counts
//! ```
//!
//! - `kstate` runs the count-by-key task (the `count_by_key` example's processor) in process
//!   until it has processed and committed N records, then stops gracefully.
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
//!   `--expect counts`: the outputs' last counts sum to N (caching on emits fewer).
//!
//! Needs `--bootstrap-servers` or `KAFKA_BOOTSTRAP_SERVERS`.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kstate::kstate_task::App;
use rand::{Rng, SeedableRng};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, Producer, ProducerContext, ThreadedProducer,
};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[path = "shared/count_by_key.rs"]
mod count;

struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(args: impl Iterator<Item = String>) -> Result<Self> {
        let mut map = HashMap::new();
        let mut args = args.peekable();
        while let Some(flag) = args.next() {
            let name = flag
                .strip_prefix("--")
                .with_context(|| format!("unexpected argument {flag}"))?
                .to_string();
            let value = match args.peek() {
                Some(v) if !v.starts_with("--") => args.next().unwrap_or_default(),
                _ => "true".into(),
            };
            map.insert(name, value);
        }
        Ok(Flags(map))
    }

    fn get(&self, name: &str) -> Result<String> {
        self.0
            .get(name)
            .cloned()
            .with_context(|| format!("--{name} is required"))
    }

    fn number<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T> {
        match (self.0.get(name), default) {
            (Some(v), _) => v
                .parse()
                .map_err(|_| anyhow::anyhow!("--{name} {v}: not a number")),
            (None, Some(d)) => Ok(d),
            (None, None) => bail!("--{name} is required"),
        }
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args
        .next()
        .context("usage: e2e setup|output|kstate|pipe|measure ...")?;
    let flags = Flags::parse(args)?;
    let servers = match flags.0.get("bootstrap-servers") {
        Some(s) => s.clone(),
        None => std::env::var("KAFKA_BOOTSTRAP_SERVERS")
            .context("--bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS is required")?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match command.as_str() {
        "setup" => runtime.block_on(setup(&servers, &flags)),
        "output" => runtime.block_on(create_topic(
            &servers,
            &flags.get("topic")?,
            flags.number("partitions", None)?,
            &[("message.timestamp.type", "LogAppendTime")],
        )),
        "kstate" => run_kstate(&servers, &flags),
        "pipe" => runtime.block_on(pipe(&servers, &flags)),
        "measure" => measure(&servers, &flags),
        other => bail!("unknown command {other}: setup|output|kstate|pipe|measure"),
    }
}

async fn create_topic(
    servers: &str,
    topic: &str,
    partitions: i32,
    settings: &[(&str, &str)],
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .create()?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in settings {
        new = new.set(k, v);
    }
    for created in admin.create_topics(&[new], &AdminOptions::new()).await? {
        created.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
    }
    Ok(())
}

/// An idempotent, acks=all producer with `context` and a linger of `linger_ms`.
fn producer<C: ProducerContext + 'static>(
    servers: &str,
    linger_ms: &str,
    context: C,
) -> Result<ThreadedProducer<C>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms)
        .set("compression.type", "lz4")
        .create_with_context(context)?)
}

/// Sends `record`, waiting while the producer's queue is full.
fn send<C: ProducerContext<DeliveryOpaque = ()> + 'static>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, [u8], [u8]>,
) {
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, back)) => {
                record = back;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// A fresh input topic with `rows` records: 8-byte keys drawn uniformly from `keys` (seeded),
/// 16-byte values, partitioned by the key's murmur2 hash like the Java client.
async fn setup(servers: &str, flags: &Flags) -> Result<()> {
    let input = flags.get("input")?;
    let partitions: i32 = flags.number("partitions", None)?;
    let rows: u64 = flags.number("rows", None)?;
    let keys: u64 = flags.number("keys", Some(10_000))?;
    create_topic(servers, &input, partitions, &[]).await?;
    let producer = producer(servers, "5", DefaultProducerContext)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(543);
    let started = Instant::now();
    for _ in 0..rows {
        let key = rng.random_range(0..keys).to_be_bytes();
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
    producer.flush(Duration::from_secs(120))?;
    ensure!(producer.in_flight_count() == 0, "input not acknowledged");
    eprintln!(
        "e2e setup: {rows} records over {keys} keys into {input} ({partitions} partitions) in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

fn run_kstate(servers: &str, flags: &Flags) -> Result<()> {
    let rows: u64 = flags.number("rows", None)?;
    let coalesce = flags.0.contains_key("coalesce");
    let state_dir = tempfile::tempdir()?;
    let mut builder = App::builder(flags.get("application-id")?, servers);
    builder
        .input(flags.get("input")?)
        .state_dir(state_dir.path())
        .threads(flags.number("threads", Some(1))?);
    let (app, _) = count::build(&mut builder, &flags.get("output")?, coalesce)?;
    let started = Instant::now();
    let running = app.start()?;
    let deadline = started + Duration::from_secs(1800);
    loop {
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
        "kstate e2e processed {rows} records in {} ms from start (coalescing {})",
        elapsed.as_millis(),
        if coalesce { "on" } else { "off" }
    );
    Ok(())
}

/// Counts a producer's delivery reports.
#[derive(Default)]
struct Settled {
    count: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicBool,
}

impl rdkafka::ClientContext for Settled {}

impl rdkafka::producer::ProducerContext for Settled {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, _: ()) {
        use std::sync::atomic::Ordering;
        if result.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        self.count.fetch_add(1, Ordering::AcqRel);
    }
}

/// The bare pipe: consume one, produce two, commit every 100 ms once everything is acknowledged.
async fn pipe(servers: &str, flags: &Flags) -> Result<()> {
    let rows: u64 = flags.number("rows", None)?;
    let input = flags.get("input")?;
    let output = flags.get("output")?;
    let app = flags.get("application-id")?;
    let shadow = format!("{app}-shadow-changelog");
    let partitions = {
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", servers)
            .create()?;
        let metadata = probe.fetch_metadata(Some(&input), Duration::from_secs(30))?;
        metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len() as i32)
    };
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
    let producer = producer(servers, "1", Settled::default())?;
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
            let context = producer.context();
            let deadline = Instant::now() + Duration::from_secs(60);
            while context.count.load(std::sync::atomic::Ordering::Acquire) < sent {
                ensure!(
                    Instant::now() < deadline,
                    "pipe: records not acknowledged in 60 s"
                );
                std::thread::sleep(Duration::from_micros(100));
            }
            ensure!(
                !context.failed.load(std::sync::atomic::Ordering::Acquire),
                "pipe: a record was not delivered"
            );
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

/// Reads the output back; prints `e2e <records>/s` over first-to-last append time.
fn measure(servers: &str, flags: &Flags) -> Result<()> {
    let output = flags.get("output")?;
    let partitions: i32 = flags.number("partitions", None)?;
    let rows: u64 = flags.number("rows", None)?;
    let expect = flags.get("expect")?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "kstate-e2e-measure")
        .set("enable.auto.commit", "false")
        .create()?;
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
    let (mut first, mut last, mut records) = (i64::MAX, i64::MIN, 0u64);
    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
    while !ends.is_empty() {
        let Some(message) = consumer.poll(Duration::from_secs(10)) else {
            bail!("reading {output} stalled");
        };
        let m = message?;
        let Timestamp::LogAppendTime(t) = m.timestamp() else {
            bail!("{output} is not a LogAppendTime topic (create it with `e2e output`)");
        };
        first = first.min(t);
        last = last.max(t);
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
        if ends
            .get(&m.partition())
            .is_some_and(|end| m.offset() + 1 >= *end)
        {
            ends.remove(&m.partition());
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
    let seconds = ((last - first).max(1)) as f64 / 1e3;
    println!(
        "e2e output={output} outputs={records} first_to_last_ms={} records_per_sec={:.0}",
        last - first,
        rows as f64 / seconds
    );
    Ok(())
}
