//! The application's error policy against a real broker: records that cannot be processed (the
//! processor's own error, a stored value that does not decode) are skipped or dead-lettered,
//! and every other record is processed exactly once around them.
//!
//! - Exactly-once with `ErrorPolicy::DeadLetter`: each failing record appears exactly once in
//!   the dead-letter topic (read_committed), with Kafka Streams' KIP-1034 headers naming the
//!   error, the input topic, partition and offset, and the task; nothing of its partial effects
//!   is visible (the processor sent an output before failing); every other record's count is
//!   exact; the application keeps running and stops cleanly.
//! - At-least-once with `ErrorPolicy::LogAndContinue`: the failing records are skipped and the
//!   others counted; the application keeps running.
//! - A record timestamped later than any window can hold (`i64::MAX`: any producer can write
//!   one) is bad input under either guarantee: the windowed count skips it before it sends or
//!   writes anything, so it closes no window early and makes no later record late.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::streams::{produce, read_topic, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{
    App, AppState, Context, ErrorPolicy, ProcessingGuarantee, Processor, Record, StoreHandle,
    StoreOptions,
};
use kstate_test_broker::unique_topic;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(120);

/// Counts per key. For key `bad` it first sends an output and then fails; for key `corrupt` it
/// writes bytes that are no `u64` under the key and then reads it back typed (a decode error).
struct Picky {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
}

impl Processor for Picky {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        match key.as_slice() {
            b"bad" => {
                ctx.send(&self.output, b"partial", Some(b"effect"))?;
                return Err("this record cannot be processed".into());
            }
            b"corrupt" => {
                let raw = ctx.store_bytes("counts").expect("the counts store");
                raw.put(&key, b"xx")?;
            }
            _ => {}
        }
        let counts = ctx.store(&self.counts);
        let n = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &n)?;
        ctx.send(&self.output, &key, Some(n.to_string().as_bytes()))?;
        Ok(())
    }
}

/// A record of the dead-letter topic: key and its headers.
struct DeadLetter {
    key: Vec<u8>,
    headers: BTreeMap<String, String>,
}

fn read_dead_letters(servers: &str, topic: &str) -> anyhow::Result<Vec<DeadLetter>> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "kstate-test-dead-letters")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let (low, high) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(20))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let position = consumer
            .position()?
            .find_partition(topic, 0)
            .and_then(|e| e.offset().to_raw());
        if high == low || position.is_some_and(|p| p >= high) {
            return Ok(out);
        }
        anyhow::ensure!(Instant::now() < deadline, "reading {topic} timed out");
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message?;
            let mut headers = BTreeMap::new();
            if let Some(h) = message.headers() {
                for header in h.iter() {
                    let value = header
                        .value
                        .map(String::from_utf8_lossy)
                        .unwrap_or_default();
                    headers.insert(header.key.to_string(), value.to_string());
                }
            }
            out.push(DeadLetter {
                key: message.key().unwrap_or_default().to_vec(),
                headers,
            });
        }
    }
}

struct Setup {
    servers: String,
    input: String,
    output: String,
    records: Vec<(i32, Vec<u8>, Vec<u8>)>,
}

async fn setup(name: &str) -> anyhow::Result<Setup> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let input = unique_topic(&format!("{name}-in"));
    let output = unique_topic(&format!("{name}-out"));
    common::create_topic(&servers, &input, 1, "delete").await?;
    common::create_topic(&servers, &output, 1, "delete").await?;
    let keys: [&[u8]; 7] = [b"k1", b"bad", b"k2", b"corrupt", b"k1", b"k3", b"k2"];
    let records = keys
        .iter()
        .map(|k| (0, k.to_vec(), b"v".to_vec()))
        .collect();
    Ok(Setup {
        servers,
        input,
        output,
        records,
    })
}

fn start(
    s: &Setup,
    dir: &std::path::Path,
    guarantee: ProcessingGuarantee,
    policy: ErrorPolicy,
) -> anyhow::Result<kstate::kstate_task::Running> {
    let mut builder = App::builder(unique_topic("policy-app"), s.servers.clone());
    builder
        .input(s.input.clone())
        .state_dir(dir)
        .processing_guarantee(guarantee)
        .error_policy(policy)
        .commit_interval(Duration::from_millis(50));
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let output = s.output.clone();
    let app = builder.build(move |_| {
        Box::new(Picky {
            counts: counts.clone(),
            output: output.clone(),
        })
    })?;
    Ok(app.start()?)
}

/// The counts the output shows, in order per key.
fn sequences(out: &[common::streams::ReadRecord]) -> BTreeMap<Vec<u8>, Vec<String>> {
    let mut seen: BTreeMap<Vec<u8>, Vec<String>> = BTreeMap::new();
    for (_, _, key, value) in out {
        let value = String::from_utf8_lossy(value.as_deref().unwrap_or_default()).to_string();
        seen.entry(key.clone()).or_default().push(value);
    }
    seen
}

fn expected() -> BTreeMap<Vec<u8>, Vec<String>> {
    BTreeMap::from([
        (b"k1".to_vec(), vec!["1".to_string(), "2".to_string()]),
        (b"k2".to_vec(), vec!["1".to_string(), "2".to_string()]),
        (b"k3".to_vec(), vec!["1".to_string()]),
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_dead_letters_each_failing_record_once_and_nothing_of_its_effects()
-> anyhow::Result<()> {
    let s = setup("dlq").await?;
    let dead_letters = unique_topic("dlq-dead");
    common::create_topic(&s.servers, &dead_letters, 1, "delete").await?;
    let dir = tempfile::tempdir()?;
    let running = start(
        &s,
        dir.path(),
        ProcessingGuarantee::ExactlyOnce,
        ErrorPolicy::DeadLetter(dead_letters.clone()),
    )?;
    produce(&s.servers, &s.input, &s.records)?;
    wait_for("every good record's count", WAIT, || {
        Ok(sequences(&read_topic(&s.servers, &s.output, 1)?) == expected())
    })?;
    assert_eq!(running.state(), AppState::Running);
    // A few more commit intervals: nothing late may appear.
    std::thread::sleep(Duration::from_millis(500));
    let out = read_topic(&s.servers, &s.output, 1)?;
    assert_eq!(
        sequences(&out),
        expected(),
        "each good record counted once, and the failing record's partial output never visible"
    );
    let letters = read_dead_letters(&s.servers, &dead_letters)?;
    let keys: Vec<&[u8]> = letters.iter().map(|l| l.key.as_slice()).collect();
    assert_eq!(
        keys,
        vec![&b"bad"[..], &b"corrupt"[..]],
        "each failing record once"
    );
    for (letter, offset) in letters.iter().zip(["1", "3"]) {
        let h = &letter.headers;
        assert_eq!(h.get("__streams.errors.topic"), Some(&s.input));
        assert_eq!(
            h.get("__streams.errors.partition").map(String::as_str),
            Some("0")
        );
        assert_eq!(
            h.get("__streams.errors.offset").map(String::as_str),
            Some(offset)
        );
        assert_eq!(
            h.get("__kstate.errors.task").map(String::as_str),
            Some("task 0")
        );
        assert!(
            h.get("__streams.errors.message")
                .is_some_and(|m| !m.is_empty()),
            "{h:?}"
        );
        assert!(h.contains_key("__streams.errors.exception"), "{h:?}");
    }
    assert!(
        letters[1].headers["__streams.errors.message"].contains("decode"),
        "a value that does not decode is named: {:?}",
        letters[1].headers
    );
    running.shutdown();
    running.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_log_and_continue_skips_failing_records() -> anyhow::Result<()> {
    let s = setup("skip").await?;
    let dir = tempfile::tempdir()?;
    let running = start(
        &s,
        dir.path(),
        ProcessingGuarantee::AtLeastOnce,
        ErrorPolicy::LogAndContinue,
    )?;
    produce(&s.servers, &s.input, &s.records)?;
    wait_for("every good record's count", WAIT, || {
        let seen = sequences(&read_topic(&s.servers, &s.output, 1)?);
        Ok(expected().iter().all(|(k, v)| seen.get(k) == Some(v)))
    })?;
    assert_eq!(running.state(), AppState::Running);
    running.shutdown();
    running.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_timestamped_past_what_a_window_can_hold_is_skipped_and_moves_no_time()
-> anyhow::Result<()> {
    use kstate::kstate_core::WindowOptions;
    use kstate_bench::topology::windowed_count as windowed;
    let servers = kstate_test_broker::bootstrap_servers()?;
    for guarantee in [
        ProcessingGuarantee::AtLeastOnce,
        ProcessingGuarantee::ExactlyOnce,
    ] {
        let input = unique_topic("end-of-time-in");
        let output = unique_topic("end-of-time-out");
        // The broker takes any timestamp on this topic (Kafka 4's default refuses those more
        // than an hour ahead; a producer can still set a topic up like this).
        let max = i64::MAX.to_string();
        let settings = [
            ("cleanup.policy", "delete"),
            ("message.timestamp.after.max.ms", max.as_str()),
        ];
        kstate_bench::kafka::create_topic(servers.as_str(), &input, 1, &settings).await?;
        common::create_topic(&servers, &output, 1, "delete").await?;
        let dir = tempfile::tempdir()?;
        let mut builder = App::builder(unique_topic("end-of-time-app"), servers.clone());
        builder
            .input(input.clone())
            .state_dir(dir.path())
            .processing_guarantee(guarantee)
            .error_policy(ErrorPolicy::LogAndContinue)
            .commit_interval(Duration::from_millis(50));
        let windows =
            WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10));
        let (app, _) = windowed::build(&mut builder, windows, &output)?;
        let running = app.start()?;
        let t0 = common::recent_minute();
        let records: [(&[u8], i64); 5] = [
            (b"k", t0),
            (b"k", t0 + 1_000),
            (b"k", i64::MAX),
            (b"k", t0 + 2_000),
            // Closes window t0 (at t0 + 70 s), and nothing after it.
            (b"z", t0 + 100_000),
        ];
        let records = records.map(|(key, time)| (0, key, &b"x"[..], time));
        common::streams::produce_timed(&servers, &input, records)?;
        wait_for("window t0's final count", WAIT, || {
            Ok(!read_topic(&servers, &output, 1)?.is_empty())
        })?;
        // A few more commit intervals: nothing else may appear.
        std::thread::sleep(Duration::from_millis(500));
        let sent = sequences(&read_topic(&servers, &output, 1)?);
        let window = format!("k@{t0}").into_bytes();
        assert_eq!(
            sent,
            BTreeMap::from([(window, vec!["3".to_string()])]),
            "{guarantee:?}: the record at i64::MAX skipped, the one after it counted, window \
             t0 sent once when t0 + 100 s passed its close"
        );
        assert_eq!(running.state(), AppState::Running, "{guarantee:?}");
        running.shutdown();
        running.wait().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}
