//! `e2e setup`: a fresh input topic of seeded records, optionally with event times that advance
//! record by record (see the crate's module docs).

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kstate_bench::cli::number;
use kstate_bench::kafka::{create_topic, producer, send};
use kstate_bench::workload::wide_key;
use kstate_kafka::ClientProperties;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};

use crate::common::now_ms;

/// `e2e setup`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The input topic to create.
    #[arg(long)]
    input: String,
    /// Its partitions (records go to them by murmur2, as the Java client sends them).
    #[arg(long, value_parser = number::<i32>)]
    partitions: i32,
    /// The records to write.
    #[arg(long, value_parser = number::<u64>)]
    rows: u64,
    /// Keys are drawn uniformly (seeded) from this many.
    #[arg(long, value_parser = number::<u64>, default_value_t = 10_000)]
    keys: u64,
    /// Keys 0..N once each instead of drawn ones.
    #[arg(long, conflicts_with = "keys")]
    unique: bool,
    /// Key width: 8 bytes hold the index big-endian; wider keys add incompressible filler.
    #[arg(long, value_parser = number::<usize>, default_value_t = 8)]
    key_bytes: usize,
    /// Record i's timestamp is T + ⌊i·F⌋ (a decimal, ≥ 0): event time advances.
    #[arg(long, value_name = "F")]
    event_time_step_ms: Option<f64>,
    /// Record 0's timestamp T (default: a whole minute about F·N ms plus a minute before now).
    #[arg(
        long,
        value_name = "T",
        requires = "event_time_step_ms",
        allow_negative_numbers = true
    )]
    event_time_start_ms: Option<i64>,
    /// Each partition's first record this much before T, its last this much past its own time
    /// (at least a window's size plus its grace).
    #[arg(
        long,
        value_name = "J",
        requires = "event_time_step_ms",
        value_parser = clap::value_parser!(i64).range(1..)
    )]
    event_time_bookends_ms: Option<i64>,
}

/// A fresh input topic with `rows` records (see the module docs).
pub async fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let event_time = EventTime::from_args(&args, args.rows)?;
    let Args {
        input,
        partitions,
        rows,
        keys,
        unique,
        key_bytes,
        ..
    } = args;
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
            let partition = kstate_task::partition_for(&key, partitions);
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
    fn from_args(args: &Args, rows: u64) -> Result<Option<Self>> {
        let Some(step_ms) = args.event_time_step_ms else {
            return Ok(None);
        };
        ensure!(
            step_ms.is_finite() && step_ms >= 0.0,
            "--event-time-step-ms must be ≥ 0"
        );
        let bookends_ms = args.event_time_bookends_ms;
        let minute = 60_000;
        let start_ms = match args.event_time_start_ms {
            Some(start) => start,
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
