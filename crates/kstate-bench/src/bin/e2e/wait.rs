//! `e2e wait`: until an output topic holds N records, and a consumer group committed the end of
//! its input (see the crate's module docs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kstate_bench::cli::number;
use kstate_bench::kafka::{create_client, partition_count};
use kstate_kafka::ClientProperties;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::common::reader;

/// `e2e wait`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The output topic.
    #[arg(long)]
    output: String,
    /// Wait until it holds this many records (its partitions' high - low watermarks).
    #[arg(long, value_parser = number::<i64>)]
    records: i64,
    /// Also wait until this consumer group's committed offsets reach --input's end offsets.
    #[arg(long, requires = "input")]
    group: Option<String>,
    /// The group's input topic (with --group).
    #[arg(long)]
    input: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, value_parser = number::<u64>, default_value_t = 1800)]
    timeout_s: u64,
}

/// Waits until the output topic holds `--records` records and, with `--group`, until that
/// group's committed offsets reach `--input`'s end offsets.
pub fn run(client: &ClientProperties, args: Args) -> Result<()> {
    let Args {
        output,
        records,
        group,
        input,
        timeout_s,
    } = args;
    let timeout = Duration::from_secs(timeout_s);
    let partitions = partition_count(client.clone(), &output)?;
    ensure!(partitions > 0, "{output} does not exist");
    let consumer = reader(client)?;
    // The group's committed offsets, read by a consumer that names the group but never joins it
    // (no subscribe): OffsetFetch only.
    let group = match (group, input) {
        (Some(group), Some(input)) => {
            let input_partitions = partition_count(client.clone(), &input)?;
            ensure!(input_partitions > 0, "{input} does not exist");
            let offsets: BaseConsumer = create_client(
                client,
                &[
                    ("group.id", group.as_str()),
                    ("enable.auto.commit", "false"),
                ],
                "offsets client",
            )?;
            Some((group, input, input_partitions, offsets))
        }
        _ => None,
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
