//! `kstate reseed`: the recovery for a lost changelog topic (data-safety issue): the local store
//! is the best copy left, so its contents are written into the empty (or recreated) changelog,
//! and the store's position then points at them.

use std::path::PathBuf;

use anyhow::{Result, bail};
use kstate_core::KeyValueStore;
use kstate_kafka::{LoggedStore, LostChangelog};
use kstate_rocksdb::RocksDbOptions;
use serde::Serialize;

use crate::Outcome;
use crate::changelog::KafkaArgs;
use crate::store_dir;

/// Writes a store's contents into its empty changelog (creating the topic with --partitions if
/// it is missing) and stores the new offset. Refuses a changelog that holds records.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  kstate reseed /var/lib/counter/counter/3/counts --topic counter-counts-changelog --partitions 12 --bootstrap-servers broker:9092"
)]
pub(crate) struct Args {
    /// The store's directory.
    dir: PathBuf,
    /// The changelog topic to write.
    #[arg(long)]
    topic: String,
    /// The partition (default: the one the store's position names, else 0).
    #[arg(long)]
    partition: Option<i32>,
    /// Create the topic with this many partitions if it does not exist.
    #[arg(long)]
    partitions: Option<i32>,
    /// The replication factor of a topic created here (-1: the broker's
    /// default.replication.factor).
    #[arg(long, default_value_t = kstate_kafka::BROKER_DEFAULT_REPLICATION, allow_hyphen_values = true)]
    replication_factor: i32,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// Print the result as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Reseeded {
    path: String,
    topic: String,
    partition: i32,
    records: i64,
    offset: Option<i64>,
}

pub(crate) fn run(args: Args) -> Result<Outcome> {
    args.kafka.client()?;
    let partition = {
        let store = store_dir::open_existing(&args.dir)?;
        let stored = kstate_kafka::ChangelogPosition::read(&store)?;
        store.close()?;
        args.partition.or(stored.map(|p| p.partition)).unwrap_or(0)
    };
    let before = args.kafka.watermarks(&args.topic, partition).ok();
    if let Some((low, high)) = before
        && high > low
    {
        bail!(
            "{}/{partition} holds records (offsets {low}..{high}): reseed writes only into an \
             empty changelog; `kstate verify` or `kstate restore` may be what you want",
            args.topic
        );
    }
    let mut config = args
        .kafka
        .changelog(&args.topic, partition)?
        .replication_factor(args.replication_factor)
        .lost_changelog(LostChangelog::Reseed);
    if let Some(n) = args.partitions {
        config = config.partitions(n);
    }
    let location = store_dir::location(&args.dir)?;
    let store = LoggedStore::open(location, &RocksDbOptions::default(), config)?;
    let offset = store.committed_position()?.map(|p| p.offset);
    store.close()?;
    drop(store);
    let (low, high) = args.kafka.watermarks(&args.topic, partition)?;
    let reseeded = Reseeded {
        path: args.dir.display().to_string(),
        topic: args.topic.clone(),
        partition,
        records: high - low,
        offset,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reseeded)?);
    } else {
        println!(
            "reseeded {}/{} from {}: {} records; the store's position is now offset {}",
            reseeded.topic,
            reseeded.partition,
            reseeded.path,
            reseeded.records,
            offset.map_or("none (the store is empty)".into(), |o| o.to_string())
        );
    }
    Ok(Outcome::Done)
}
