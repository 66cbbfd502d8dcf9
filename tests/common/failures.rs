//! Helpers for the tests of failures: an application's state and `Running::wait` with a limit,
//! and whether an error's text names a partition or an offset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate::kstate_task::{AppState, Running};

/// Polls `running.state()` every 100 ms until it is `Failed`, at most `limit`; returns the last
/// state seen.
pub fn failed_within(running: &Running, limit: Duration) -> AppState {
    let deadline = Instant::now() + limit;
    loop {
        let state = running.state();
        if matches!(state, AppState::Failed(_)) || Instant::now() >= deadline {
            return state;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `running.wait()` on a thread of its own and returns its outcome (the error as text), or
/// `None` if it had not returned within `limit` (the thread is then left waiting).
pub fn wait_within(running: &Arc<Running>, limit: Duration) -> Option<Result<(), String>> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let waiting = running.clone();
    std::thread::spawn(move || {
        let _ = sender.send(waiting.wait().map_err(|e| e.to_string()));
    });
    receiver.recv_timeout(limit).ok()
}

/// Whether `text` has `prefix` followed by the number `n` (and not by more digits).
pub fn has_number_after(text: &str, prefix: &str, n: i64) -> bool {
    let wanted = format!("{prefix}{n}");
    text.match_indices(&wanted).any(|(at, _)| {
        !text[at + wanted.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// Whether `text` names partition `partition` of `topic`: `topic/partition`, or the topic and
/// `partition <n>`.
pub fn names_partition(text: &str, topic: &str, partition: i32) -> bool {
    text.contains(topic)
        && (has_number_after(text, &format!("{topic}/"), partition.into())
            || has_number_after(text, "partition ", partition.into()))
}

/// Whether `text` names offset `offset`: `@offset` (as in `topic/partition@offset`), or
/// `offset <n>`.
pub fn names_offset(text: &str, offset: i64) -> bool {
    has_number_after(text, "@", offset) || has_number_after(text, "offset ", offset)
}

/// Whether `topic`/`partition` has records of an open transaction: its last stable offset (what
/// a read_committed query answers) below its high watermark.
pub fn has_open_transaction(servers: &str, topic: &str, partition: i32) -> anyhow::Result<bool> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client = |isolation| -> anyhow::Result<BaseConsumer> {
        Ok(rdkafka::ClientConfig::new()
            .set("bootstrap.servers", servers)
            .set("isolation.level", isolation)
            .create()?)
    };
    let (uncommitted, committed) = (client("read_uncommitted")?, client("read_committed")?);
    let high = uncommitted
        .fetch_watermarks(topic, partition, Duration::from_secs(10))?
        .1;
    let stable = committed
        .fetch_watermarks(topic, partition, Duration::from_secs(10))?
        .1;
    Ok(stable < high)
}

/// The group's committed offset of `topic` partition 0, as the broker has it.
pub fn committed_offset(servers: &str, group: &str, topic: &str) -> anyhow::Result<Option<i64>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(
        match committed.find_partition(topic, 0).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        },
    )
}
