//! At-least-once: a clean shutdown commits every processed record's offset, and sees that the
//! group holds them, without waiting out the revocation timeout.
//!
//! count_by_key reads two co-partitioned inputs of three partitions, with no periodic commit
//! (the interval is an hour), so that only the shutdown's last commit carries offsets. After
//! every record has its output the application is shut down. Guaranteed: `wait()` returns Ok,
//! the group holds the high watermark of every partition of both inputs, and the runtime did not
//! report the last commit unconfirmed. The last check failed before the commit was confirmed
//! from the group's offsets: rust-rdkafka 0.39 never calls the commit callback for an
//! asynchronous commit (fede1024/rust-rdkafka#856), so every shutdown waited for an answer that
//! could not come, for the whole revocation timeout, and warned that the next owner may replay.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use kstate_bench::topology::count_by_key as count;

use std::time::Duration;

use common::streams::{produce_with, read_topic_with, wait_for};
use kstate::kstate_task::App;
use kstate_test_broker::unique_topic;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
const PER_PARTITION: usize = 20;
const WAIT: Duration = Duration::from_secs(60);

/// The group's committed offset of every partition of `topics` (absent: none).
fn committed(
    client: &kstate::kstate_kafka::ClientProperties,
    group: &str,
    topics: &[&str],
) -> anyhow::Result<Vec<(String, i32, Option<i64>)>> {
    let mut config = client.client_config();
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = config.create()?;
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        for p in 0..PARTITIONS {
            tpl.add_partition(topic, p);
        }
    }
    let held = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(held
        .elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.topic().to_string(), e.partition(), offset)
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_shutdown_commits_every_offset_and_confirms_it_without_waiting_out_the_timeout()
-> anyhow::Result<()> {
    let logs = common::captured_logs(tracing::Level::WARN);
    let client = common::client()?;
    let (app_id, left, right, output) = (
        unique_topic("shutdown"),
        unique_topic("shutdown-left"),
        unique_topic("shutdown-right"),
        unique_topic("shutdown-out"),
    );
    for topic in [&left, &right, &output] {
        common::create_topic(client.clone(), topic, PARTITIONS, "delete").await?;
    }
    let dir = tempfile::tempdir()?;
    let mut builder = App::builder(app_id.clone(), client.clone());
    builder
        .input(left.clone())
        .input(right.clone())
        .state_dir(dir.path())
        .threads(2)
        .commit_interval(Duration::from_secs(3600));
    let (app, _) = count::build(&mut builder, &output, false)?;
    let running = app.start()?;
    for topic in [&left, &right] {
        let records: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..PARTITIONS)
            .flat_map(|p| {
                (0..PER_PARTITION)
                    .map(move |i| (p, format!("k{p}-{}", i % 4).into_bytes(), b"v".to_vec()))
            })
            .collect();
        produce_with(&client, topic, &records)?;
    }
    let total = 2 * PARTITIONS as usize * PER_PARTITION;
    wait_for("every record's output", WAIT, || {
        Ok(read_topic_with(&client, &output, PARTITIONS)?.len() >= total)
    })?;
    let before = logs.lock().unwrap_or_else(|p| p.into_inner()).len();
    running.shutdown();
    running.wait().map_err(|e| anyhow::anyhow!("wait: {e}"))?;

    let held = committed(&client, &app_id, &[&left, &right])?;
    assert_eq!(held.len(), 2 * PARTITIONS as usize);
    for (topic, partition, offset) in &held {
        assert_eq!(
            *offset,
            Some(PER_PARTITION as i64),
            "{topic}/{partition}: the group holds {offset:?}, not the end of the input"
        );
    }
    let logs = logs.lock().unwrap_or_else(|p| p.into_inner());
    let after = String::from_utf8_lossy(&logs[before..]);
    let unconfirmed: Vec<&str> = after
        .lines()
        .filter(|l| l.contains("the last offset commit was not"))
        .collect();
    assert!(
        unconfirmed.is_empty(),
        "the shutdown reported its last commit unconfirmed: {unconfirmed:?}"
    );
    Ok(())
}
