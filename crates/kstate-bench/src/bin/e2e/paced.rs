//! `e2e paced`: latency, while the application runs: a warm-up, then records at a fixed rate, each
//! output matched to its input record by the broker's append times (see the crate's module docs).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kstate_bench::cli::number;
use kstate_bench::kafka::{Settled, append_time, partition_count, producer, send};
use kstate_bench::latency::{Latency, LatencySummary};
use kstate_bench::report::{per_second, write_json};
use kstate_bench::workload::wide_key;
use kstate_kafka::ClientProperties;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::common::{now_ms, reader};

/// `e2e paced`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The input topic (created with `e2e output`, empty).
    #[arg(long)]
    input: String,
    /// The output topic.
    #[arg(long)]
    output: String,
    /// The records to write, warm-up included.
    #[arg(long, value_parser = number::<u64>)]
    rows: u64,
    /// The paced records' rate, records/s.
    #[arg(long, value_parser = number::<f64>)]
    rate: f64,
    /// Records written at once before the pacing, whose outputs must be back first.
    #[arg(long, value_parser = number::<u64>, default_value_t = 10_000)]
    warmup: u64,
    /// Keys are drawn uniformly (seeded) from this many.
    #[arg(long, value_parser = number::<u64>, default_value_t = 10_000)]
    keys: u64,
    /// Also write the result, with latency per second, as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// A fault to inflict while pacing: a shell command (`sh -c`), e.g. one that SIGKILLs a
    /// broker, run once `--fault-after` seconds of pacing have passed. The pacing goes on while
    /// it runs; the run fails if it fails.
    #[arg(long, requires = "fault_after")]
    fault: Option<String>,
    /// Seconds of pacing before `--fault` runs.
    #[arg(long, value_parser = number::<f64>, requires = "fault")]
    fault_after: Option<f64>,
    /// Give up after this many seconds without a new output (the application died or hangs).
    #[arg(long, value_parser = number::<u64>, default_value_t = 90)]
    stall_s: u64,
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
    /// With `--fault`: how the output came back after it.
    fault: Option<FaultRecovery>,
}

/// How the application's output came back after `--fault` (a broker SIGKILLed, say), on the
/// wall clock the broker's append times share (one machine).
#[derive(serde::Serialize)]
struct FaultRecovery {
    /// The command.
    command: String,
    /// When it started, ms since the epoch.
    at_ms: i64,
    /// From its start until the reader had the first output of an input appended after it, on
    /// any partition: the application's next committed output.
    next_output_ms: i64,
    /// The same for every input partition, the slowest: the time until the whole application
    /// flows again (an input partition whose leader died included).
    every_partition_ms: i64,
    /// The slowest visible latency of an input appended from 10 s before the fault on: what a
    /// record in flight waited.
    max_visible_ms: i64,
}

/// A `--fault` started by the paced writer: when, and how its command ended.
struct Fault {
    at_ms: i64,
    done: std::thread::JoinHandle<Result<()>>,
}

/// Starts `command` (`sh -c`) on a thread of its own.
fn inflict(command: &str) -> Result<Fault> {
    let at_ms = now_ms()?;
    eprintln!("e2e paced: fault at {at_ms} ms: {command}");
    let command = command.to_string();
    let done = std::thread::spawn(move || -> Result<()> {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .status()
            .with_context(|| format!("--fault {command:?} did not start"))?;
        ensure!(status.success(), "--fault {command:?} exited {status}");
        Ok(())
    });
    Ok(Fault { at_ms, done })
}

/// An output as the reader got it: the broker's append time and when the reader had it, ms.
#[derive(Clone, Copy)]
struct Seen {
    appended: i64,
    visible: i64,
}

/// Sets the flag when dropped: stops the paced writer whichever way `paced` returns.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Warm-up, then `rate` records/s into the input while reading the output (see the module docs).
pub fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let Args {
        input,
        output,
        rows,
        rate,
        warmup,
        keys,
        json,
        fault,
        fault_after,
        stall_s,
    } = args;
    let stall = Duration::from_secs(stall_s);
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
    let write = || -> Result<(f64, Option<Fault>)> {
        let mut fault_due = fault.as_deref().zip(fault_after);
        let mut inflicted = None;
        let mut rng = rand::rngs::StdRng::seed_from_u64(543);
        let mut write_one = |value: &[u8]| {
            let key = wide_key(rng.random_range(0..keys), 8);
            let partition = kstate_task::partition_for(&key, partitions);
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
            if let Some((command, after)) = fault_due
                && started.elapsed().as_secs_f64() >= after
            {
                inflicted = Some(inflict(command)?);
                fault_due = None;
            }
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
        Ok((seconds, inflicted))
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
                last_new.elapsed() < stall,
                "{output}: no new output for {stall:?}; {} of {rows} outputs read",
                outputs.len()
            );
            let Some(m) = poll_through_faults(&consumer)? else {
                continue;
            };
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
    let (paced_seconds, inflicted) = std::thread::scope(|scope| -> Result<(f64, Option<Fault>)> {
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
    let fault_at = inflicted.as_ref().map(|fault| fault.at_ms);
    // With a fault: per input partition, the first visible output of an input appended after
    // it; and the slowest visible latency of an input appended from 10 s before it on.
    let mut resumed: BTreeMap<i32, i64> = BTreeMap::new();
    let mut max_visible_near_fault = 0i64;
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
        if let Some(at) = fault_at {
            if input_appended >= at - 10_000 {
                max_visible_near_fault = max_visible_near_fault.max(seen.visible - input_appended);
            }
            if input_appended > at {
                let first = resumed
                    .entry(kstate_task::partition_for(key, partitions))
                    .or_insert(i64::MAX);
                *first = (*first).min(seen.visible);
            }
        }
    }
    let fault = match (inflicted, fault) {
        (Some(inflicted), Some(command)) => {
            inflicted
                .done
                .join()
                .map_err(|_| anyhow::anyhow!("the --fault thread panicked"))??;
            ensure!(
                resumed.len() == partitions as usize,
                "after --fault, {} of {partitions} input partitions had an output (pace longer \
                 after it)",
                resumed.len()
            );
            let at = inflicted.at_ms;
            Some(FaultRecovery {
                command,
                at_ms: at,
                next_output_ms: resumed.values().min().copied().unwrap_or_default() - at,
                every_partition_ms: resumed.values().max().copied().unwrap_or_default() - at,
                max_visible_ms: max_visible_near_fault,
            })
        }
        (None, Some(_)) => bail!("--fault never ran: the pacing ended before --fault-after"),
        _ => None,
    };
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
        fault,
    };
    let ms = |us: f64| us / 1e3;
    println!(
        "e2e latency output={} paced={paced_rows} rate={:.0} input_rate={:.0} written_s={:.1} \
         append_p50_ms={:.0} append_p95_ms={:.0} append_p99_ms={:.0} append_p999_ms={:.0} \
         append_max_ms={:.0} visible_p50_ms={:.0} visible_p95_ms={:.0} visible_p99_ms={:.0} \
         visible_p999_ms={:.0} visible_max_ms={:.0}",
        result.output,
        result.rate,
        result.input_rate,
        paced_seconds,
        ms(result.append.p50_us),
        ms(result.append.p95_us),
        ms(result.append.p99_us),
        ms(result.append.p999_us),
        ms(result.append.max_us),
        ms(result.visible.p50_us),
        ms(result.visible.p95_us),
        ms(result.visible.p99_us),
        ms(result.visible.p999_us),
        ms(result.visible.max_us),
    );
    if let Some(fault) = &result.fault {
        println!(
            "e2e fault output={} next_output_ms={} every_partition_ms={} max_visible_ms={}",
            result.output, fault.next_output_ms, fault.every_partition_ms, fault.max_visible_ms
        );
    }
    if let Some(path) = json {
        write_json(&path, &result)?;
    }
    Ok(())
}

/// The next record `consumer` has within 100 ms, if any. An error of a cluster in motion (a
/// broker `--fault` killed, still down) is none: the reader fetches from the new leaders.
fn poll_through_faults(
    consumer: &rdkafka::consumer::BaseConsumer,
) -> Result<Option<rdkafka::message::BorrowedMessage<'_>>> {
    match consumer.poll(Duration::from_millis(100)) {
        Some(Err(e)) if kstate_kafka::error_in_motion(&e) => Ok(None),
        polled => Ok(polled.transpose()?),
    }
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
        let (low, high) = kstate_kafka::retry_in_motion(Duration::from_secs(60), |left| {
            consumer.fetch_watermarks(topic, p, left.min(Duration::from_secs(10)))
        })?;
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
        let Some(m) = poll_through_faults(&consumer)? else {
            continue;
        };
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
