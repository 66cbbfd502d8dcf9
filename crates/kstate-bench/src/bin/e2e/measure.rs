//! `e2e measure`: an output topic read back, its rate over the time from the first output's
//! broker append to the last one's, and its outputs checked against the input (see the crate's
//! module docs).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use clap::ValueEnum;
use kstate_bench::cli::number;
use kstate_bench::kafka::append_time;
use kstate_bench::report::{per_second, write_json};
use kstate_kafka::ClientProperties;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::common::reader;
use crate::window_check::WindowedInput;

/// `e2e measure`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The output topic (created with `e2e output`: LogAppendTime).
    #[arg(long)]
    output: String,
    /// Its partitions.
    #[arg(long, value_parser = number::<i32>)]
    partitions: i32,
    /// The input records the run processed.
    #[arg(long, value_parser = number::<u64>)]
    rows: u64,
    /// What the outputs must be.
    #[arg(long, value_enum)]
    expect: Expect,
    /// The input topic, which windowed outputs are checked against.
    #[arg(long, required_if_eq_any = [("expect", "windows"), ("expect", "window-updates")])]
    input: Option<String>,
    /// Also write the result, with progress points, as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// What `--expect` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Expect {
    /// One output per input (caching off, the pipe).
    Records,
    /// The outputs' last counts sum to the inputs (caching on emits fewer).
    Counts,
    /// One output per input, and per window the highest count is its records in --input.
    WindowUpdates,
    /// Final window counts, each checked against --input.
    Windows,
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
pub fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let Args {
        output,
        partitions,
        rows,
        expect,
        input,
        json,
    } = args;
    let final_windows = expect == Expect::Windows;
    // The input, against which windowed outputs are checked.
    let windowed_input = match expect {
        Expect::Windows | Expect::WindowUpdates => {
            let input = input.context("--expect windows and window-updates need --input")?;
            Some(WindowedInput::read(client, &input)?)
        }
        Expect::Records | Expect::Counts => None,
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
    match (expect, &windowed_input) {
        (Expect::Records, _) => ensure!(
            records == rows,
            "{output}: {records} outputs for {rows} inputs"
        ),
        (Expect::Counts, _) => {
            let total: u64 = counts.values().sum();
            ensure!(
                total == rows,
                "{output}: the last counts sum to {total}, not {rows}"
            );
        }
        (Expect::WindowUpdates, Some(input)) => {
            ensure!(
                records == rows,
                "{output}: {records} outputs for {rows} inputs"
            );
            let windows = input.check_updates(&output, &counts)?;
            windows_line = format!(" windows={windows}");
        }
        (Expect::Windows, Some(input)) => {
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
        (Expect::WindowUpdates | Expect::Windows, None) => {
            unreachable!("windowed outputs are read with their input")
        }
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
    if let Some(path) = json {
        write_json(&path, &result)?;
    }
    Ok(())
}
