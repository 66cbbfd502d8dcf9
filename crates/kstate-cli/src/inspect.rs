//! `kstate inspect`: where a store directory is, in one screen.

use std::path::PathBuf;
use std::time::UNIX_EPOCH;

use anyhow::Result;
use kstate_core::KeyValueStore;
use serde::Serialize;

use crate::Outcome;
use crate::changelog::KafkaArgs;
use crate::store_dir;

/// Format version, changelog topic/partition, stored offset and its age, approximate keys, disk
/// size, SST files per level; with --bootstrap-servers also the changelog's watermarks and lag.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  kstate inspect /var/lib/counter/counter/3/counts --bootstrap-servers broker:9092"
)]
pub(crate) struct Args {
    /// The store's directory.
    dir: PathBuf,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Inspection {
    path: String,
    format_version: Option<u32>,
    topic: Option<String>,
    partition: Option<i32>,
    /// The offset of the last changelog record the store holds.
    offset: Option<i64>,
    written_at_ms: Option<u64>,
    age_seconds: Option<f64>,
    approximate_keys: u64,
    disk_bytes: u64,
    sst_files_per_level: Vec<u64>,
    changelog: Option<Watermarks>,
}

#[derive(Debug, Serialize)]
struct Watermarks {
    low: i64,
    high: i64,
    /// Records after the store's position.
    lag: i64,
}

pub(crate) fn run(args: Args) -> Result<Outcome> {
    let store = store_dir::open_existing(&args.dir)?;
    let position = kstate_kafka::ChangelogPosition::read(&store)?;
    let format_version = store
        .metadata(b"kstate.format.version")?
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(u32::from_be_bytes);
    let mut levels = Vec::new();
    for level in 0..7 {
        let files = store
            .property(&format!("rocksdb.num-files-at-level{level}"))?
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        levels.push(files);
    }
    while levels.len() > 1 && levels.last() == Some(&0) {
        levels.pop();
    }
    let changelog = match (&position, args.kafka.given()) {
        (Some(p), true) => {
            let (low, high) = args.kafka.watermarks(&p.topic, p.partition)?;
            Some(Watermarks {
                low,
                high,
                lag: (high - 1 - p.offset).max(0),
            })
        }
        _ => None,
    };
    let inspection = Inspection {
        path: args.dir.display().to_string(),
        format_version,
        topic: position.as_ref().map(|p| p.topic.clone()),
        partition: position.as_ref().map(|p| p.partition),
        offset: position.as_ref().map(|p| p.offset),
        written_at_ms: position
            .as_ref()
            .and_then(|p| p.written_at)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64),
        age_seconds: position
            .as_ref()
            .and_then(|p| p.age())
            .map(|a| a.as_secs_f64()),
        approximate_keys: store.approximate_len()?,
        disk_bytes: store_dir::disk_bytes(&store, &args.dir)?,
        sst_files_per_level: levels,
        changelog,
    };
    store.close()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        print_text(&inspection);
    }
    Ok(Outcome::Done)
}

fn print_text(i: &Inspection) {
    println!("store           {}", i.path);
    match i.format_version {
        Some(v) => println!("format version  {v}"),
        None => println!("format version  none (no changelog position written yet)"),
    }
    match (&i.topic, i.partition, i.offset) {
        (Some(topic), Some(partition), Some(offset)) => {
            println!("changelog       {topic}/{partition}");
            let age = i
                .age_seconds
                .map_or("age unknown".to_string(), |a| format!("{} ago", seconds(a)));
            println!("stored offset   {offset} (written {age})");
        }
        _ => println!("changelog       none: not a kstate logged store, or never committed"),
    }
    println!("keys            about {}", i.approximate_keys);
    println!("disk            {} bytes", i.disk_bytes);
    let levels: Vec<String> = i
        .sst_files_per_level
        .iter()
        .enumerate()
        .map(|(level, n)| format!("L{level}={n}"))
        .collect();
    println!("sst files       {}", levels.join(" "));
    if let Some(w) = &i.changelog {
        println!(
            "watermarks      low {} high {}: {} records after the stored offset",
            w.low, w.high, w.lag
        );
    }
}

/// `3.2 s`, `4 min 10 s`, `2 h 5 min`.
fn seconds(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{} h {} min",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}
