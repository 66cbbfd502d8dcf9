//! The windowed runs' outputs checked against their input: `e2e measure --expect windows` (final
//! counts: every window sent is closed and exact, and none that closed before one sent is
//! missing) and `--expect window-updates` (every window's highest count is its records).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kstate_bench::kafka::partition_count;
use kstate_kafka::ClientProperties;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::common::{e2e_windows, reader};

/// The windowed runs' input read back: what each window's final count must be, and when it
/// closes.
pub struct WindowedInput {
    /// The input's records.
    pub records: u64,
    /// Every (key, window start)'s count, closed or not.
    counts: HashMap<(Vec<u8>, i64), u64>,
    /// Each key's input partition: windows close by their partition's stream time.
    partition_of: HashMap<Vec<u8>, i32>,
    /// Per input partition, its stream time at the end: its latest record's timestamp.
    stream_time: BTreeMap<i32, i64>,
}

/// What `WindowedInput::check` found.
pub struct WindowCheck {
    /// Distinct windows sent.
    pub sent: usize,
    /// Windows that closed (all input partitions).
    pub closed: usize,
    /// Windows sent more than once (with the same count; at-least-once allows it).
    pub duplicates: usize,
}

impl WindowedInput {
    /// Reads `topic` to its end, counting every (key, window) by the partitions' stream time.
    pub fn read(client: &ClientProperties, topic: &str) -> Result<Self> {
        let windows = e2e_windows();
        let partitions = partition_count(client.clone(), topic)?;
        ensure!(partitions > 0, "{topic} does not exist");
        let consumer = reader(client)?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for p in 0..partitions {
            let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(30))?;
            if high > low {
                ends.insert(p, high);
                tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
            }
        }
        consumer.assign(&tpl)?;
        let mut input = WindowedInput {
            records: 0,
            counts: HashMap::new(),
            partition_of: HashMap::new(),
            stream_time: BTreeMap::new(),
        };
        let started = Instant::now();
        while !ends.is_empty() {
            ensure!(
                started.elapsed() < Duration::from_secs(300),
                "reading {topic} back took more than 5 minutes"
            );
            let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let m = message?;
            let time = m
                .timestamp()
                .to_millis()
                .with_context(|| format!("{topic}: a record without a timestamp"))?;
            let key = m.key().unwrap_or_default().to_vec();
            let now = input.stream_time.entry(m.partition()).or_insert(time);
            *now = (*now).max(time);
            let now = *now;
            for start in windows.windows_containing(time) {
                // A late record counts nowhere, in either system.
                if windows.closes_at(start) > now {
                    *input.counts.entry((key.clone(), start)).or_default() += 1;
                }
            }
            input.partition_of.insert(key, m.partition());
            input.records += 1;
            if ends
                .get(&m.partition())
                .is_some_and(|end| m.offset() + 1 >= *end)
            {
                ends.remove(&m.partition());
            }
        }
        Ok(input)
    }

    /// Checks the highest count `topic` sent for each window (`<key>@<start>`) against the
    /// input: one per input record (closed or not, late records aside), every window's the
    /// count of its records. Returns the number of windows.
    pub fn check_updates(&self, topic: &str, highest: &HashMap<Vec<u8>, u64>) -> Result<usize> {
        for (output, count) in highest {
            let (key, start) = window_of(topic, output)?;
            let expected = self.counts.get(&(key.clone(), start)).copied();
            ensure!(
                expected == Some(*count),
                "{topic}: window {start} of key {key:?} counted up to {count}; the input has \
                 {expected:?}"
            );
        }
        ensure!(
            highest.len() == self.counts.len(),
            "{topic}: {} windows have counts, the input has {}",
            highest.len(),
            self.counts.len()
        );
        Ok(highest.len())
    }

    /// Checks `outputs` (`<key>@<start>`, count) of `topic` as final window counts (see the
    /// module docs).
    pub fn check(&self, topic: &str, outputs: &[(Vec<u8>, u64)]) -> Result<WindowCheck> {
        let windows = e2e_windows();
        let closed = |key: &[u8], start: i64| {
            self.partition_of
                .get(key)
                .and_then(|p| self.stream_time.get(p))
                .is_some_and(|now| windows.closes_at(start) <= *now)
        };
        let mut sent: HashMap<(Vec<u8>, i64), u64> = HashMap::new();
        let mut duplicates = 0;
        // Per input partition, the latest window close among the windows sent.
        let mut sent_until: BTreeMap<i32, i64> = BTreeMap::new();
        for (output, count) in outputs {
            let (key, start) = window_of(topic, output)?;
            let expected = self.counts.get(&(key.clone(), start)).copied();
            ensure!(
                expected == Some(*count) && closed(&key, start),
                "{topic}: window {start} of key {key:?} sent with count {count}; the input has \
                 {expected:?}{}",
                if closed(&key, start) {
                    ""
                } else {
                    ", and it never closed"
                }
            );
            let p = self.partition_of[&key];
            let until = sent_until.entry(p).or_insert(i64::MIN);
            *until = (*until).max(windows.closes_at(start));
            if sent.insert((key, start), *count).is_some() {
                duplicates += 1;
            }
        }
        ensure!(
            !sent.is_empty(),
            "{topic}: no window was sent, so there is no clock (a run that ends within a second \
             of its start may send none: Kafka Streams sends closed windows once a second)"
        );
        // Per (input partition, window start): windows sent, windows closed; and how many
        // closed before a window of their partition that was sent, but were never sent.
        let mut per_start: BTreeMap<(i32, i64), (usize, usize)> = BTreeMap::new();
        let (mut closed_windows, mut skipped) = (0, 0);
        for (key, start) in self.counts.keys() {
            if !closed(key, *start) {
                continue;
            }
            closed_windows += 1;
            let p = self.partition_of[key];
            let was_sent = sent.contains_key(&(key.clone(), *start));
            let tally = per_start.entry((p, *start)).or_default();
            tally.0 += usize::from(was_sent);
            tally.1 += 1;
            let sent_up_to = sent_until.get(&p).copied().unwrap_or(i64::MIN);
            if !was_sent && windows.closes_at(*start) <= sent_up_to {
                skipped += 1;
            }
        }
        if skipped > 0 {
            let tallies: Vec<String> = per_start
                .iter()
                .map(|((p, start), (sent, closed))| format!("{p}:{start}={sent}/{closed}"))
                .collect();
            bail!(
                "{topic}: {skipped} windows closed before windows of their partition that were \
                 sent, but were never sent; sent/closed per partition:window start: {}",
                tallies.join(" ")
            );
        }
        Ok(WindowCheck {
            sent: sent.len(),
            closed: closed_windows,
            duplicates,
        })
    }
}

/// An output key `<key>@<window start>` split.
fn window_of(topic: &str, output: &[u8]) -> Result<(Vec<u8>, i64)> {
    let at = output
        .iter()
        .rposition(|b| *b == b'@')
        .with_context(|| format!("{topic}: an output key without @<window start>"))?;
    let start = std::str::from_utf8(&output[at + 1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{topic}: an output key without @<window start>"))?;
    Ok((output[..at].to_vec(), start))
}
