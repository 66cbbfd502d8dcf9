//! Failure detection by liveness beacons ([`AppBuilder::failure_detection`](crate::AppBuilder::failure_detection)):
//! a crashed process's tasks move when its peers notice it is gone, not when the broker's
//! session timeout expires.
//!
//! **Why.** A static member that dies never leaves the group; the coordinator removes it after
//! `session.timeout.ms`, 6 s at the least on the classic protocol (45 s on KIP-848), and that
//! wait was almost all of a failover with standbys (BENCHMARKS.md, "Failover and restart"). Heartbeating
//! the broker faster does not help: the session timeout is what the broker waits for.
//!
//! **How.** One thread per process writes a beacon (key: the process's name, `<app-id>-<instance-id>`)
//! to the one-partition topic `<app-id>-liveness` every quarter of the timeout, and reads every
//! process's beacons from that topic. When a process that was beaconing has been silent for the
//! timeout, this process reads the group's members (DescribeGroups: each worker's `client.id`
//! is its `group.instance.id`) and removes that process's members with `LeaveGroup`
//! ([`remove_group_members`]); the group rebalances at once, and the survivors (heartbeating
//! every half timeout) join it. Every live process does this; the second removal finds the
//! members gone and does nothing.
//!
//! **Safety.** Silence is read from the log, with this process's own beacons as the clock
//! (see `Beacons`): another process is silent when this process's own beacons, read back, span
//! more than the timeout (by this process's clock) with none of the other's between them. So
//! clocks need not agree, and a reader that was itself paused or starved, or is behind in
//! reading, cannot take the others' unread beacons for silence; one cut off from the broker
//! reads nothing back and judges nobody. A member is removed by its member id and instance id
//! together, so a process that restarted meanwhile (new member id) is left alone. A process
//! that was only paused past the timeout is removed like a dead one and fenced when it resumes:
//! its offset commits and transactions carry the old generation and are
//! refused, and it rejoins as a new member.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate_kafka::{MemberRemoved, MemberToRemove, create_topic_if_missing, remove_group_members};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseProducer;
use rdkafka::producer::BaseRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::placement::process_of;
use crate::shared::AppShared;

/// How long the beacons' topic keeps them: long enough for anyone reading late.
const RETENTION: &str = "600000";
/// How long a topic creation, a DescribeGroups or a removal may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The beacons' topic of application `application_id`.
pub(crate) fn topic(application_id: &str) -> String {
    format!("{application_id}-liveness")
}

/// What the beacons read so far say, with this process's own beacons as the clock.
///
/// Silence is measured in the log, not by when beacons reach this reader: the topic has one
/// partition, so when this process reads back its own beacon *s*, it has read every beacon
/// appended before it. Another process is silent for at least the time between the sending of
/// the first own beacon after its latest one and the sending of the latest own beacon read
/// back. A reader that was itself paused or slow cannot mistake that for silence: the others'
/// beacons of that time sit in the log between its own, and reset their silence.
#[derive(Debug)]
struct Beacons {
    me: String,
    next_seq: u64,
    /// Own beacons sent and not read back yet: sequence number, when sent.
    sent: VecDeque<(u64, Instant)>,
    /// When the latest own beacon read back was sent: how far the log has been read.
    clock: Option<Instant>,
    others: BTreeMap<String, Other>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Other {
    /// When the first own beacon after its latest one was sent; `None`: its latest beacon is
    /// after every own beacon read back.
    quiet_since: Option<Instant>,
    /// Its members were removed, and it has not beaconed since.
    removed: bool,
}

/// At most this many own beacons are remembered while none comes back.
const MAX_UNREAD: usize = 1024;

impl Beacons {
    fn new(me: String) -> Self {
        Beacons {
            me,
            next_seq: 0,
            sent: VecDeque::new(),
            clock: None,
            others: BTreeMap::new(),
        }
    }

    /// An own beacon is sent at `at`: its sequence number.
    fn sending(&mut self, at: Instant) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.sent.len() == MAX_UNREAD {
            self.sent.pop_front();
        }
        self.sent.push_back((seq, at));
        seq
    }

    /// A beacon of `process` (with sequence number `seq`) was read.
    fn received(&mut self, process: &str, seq: Option<u64>) {
        if process != self.me {
            *self.others.entry(process.to_string()).or_default() = Other::default();
            return;
        }
        let Some(seq) = seq else {
            return;
        };
        // Earlier own beacons that never came back are dropped with it.
        while let Some(&(s, at)) = self.sent.front() {
            if s > seq {
                break;
            }
            self.sent.pop_front();
            if s == seq {
                self.clock = Some(at);
                for other in self.others.values_mut() {
                    other.quiet_since.get_or_insert(at);
                }
            }
        }
    }

    /// The processes silent for longer than `timeout` and not yet removed, with how long.
    fn silent(&self, timeout: Duration) -> Vec<(String, Duration)> {
        let Some(clock) = self.clock else {
            return Vec::new();
        };
        self.others
            .iter()
            .filter(|(_, o)| !o.removed)
            .filter_map(|(p, o)| {
                let quiet = clock.saturating_duration_since(o.quiet_since?);
                (quiet > timeout).then(|| (p.clone(), quiet))
            })
            .collect()
    }

    fn mark_removed(&mut self, process: &str) {
        if let Some(o) = self.others.get_mut(process) {
            o.removed = true;
        }
    }
}

/// The liveness thread: beacons and judges until the application stops.
pub(crate) fn run(app: Arc<AppShared>, timeout: Duration) {
    let config = &app.config;
    let topic = topic(&config.application_id);
    let Some(first) = config.group_instance_id(0) else {
        return;
    };
    let me = process_of(&first).to_string();
    let created = create_topic_if_missing(
        &config.client,
        &topic,
        1,
        config.replication_factor,
        &[("cleanup.policy", "delete"), ("retention.ms", RETENTION)],
        REQUEST_TIMEOUT,
    );
    if let Err(e) = created {
        tracing::warn!(%topic, error = %e, "no failure detection: could not create the liveness topic");
        return;
    }
    let producer: Result<BaseProducer, _> = config
        .client
        .client_config()
        .set("linger.ms", "0")
        .set("acks", "1")
        .create();
    let consumer: Result<BaseConsumer, _> = config
        .client
        .client_config()
        .set(
            "group.id",
            format!("{}-liveness-reader", config.application_id),
        )
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create();
    let (producer, consumer) = match (producer, consumer) {
        (Ok(p), Ok(c)) => (p, c),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %config.client.redact_error(e), "no failure detection: could not create its clients");
            return;
        }
    };
    let mut partitions = TopicPartitionList::new();
    if let Err(e) = partitions
        .add_partition_offset(&topic, 0, Offset::End)
        .and_then(|()| consumer.assign(&partitions))
    {
        tracing::warn!(%topic, error = %e, "no failure detection: could not read the liveness topic");
        return;
    }
    let interval = (timeout / 4).max(Duration::from_millis(10));
    tracing::info!(%topic, process = %me, ?timeout, "failure detection on");
    let mut beacons = Beacons::new(me.clone());
    let mut next_beacon = Instant::now();
    while !app.stopping() {
        let now = Instant::now();
        if now >= next_beacon {
            let seq = beacons.sending(now).to_be_bytes();
            let beacon = BaseRecord::<str, [u8]>::to(&topic)
                .key(me.as_str())
                .payload(&seq);
            if let Err((e, _)) = producer.send(beacon) {
                tracing::debug!(error = %e, "a liveness beacon was not sent");
            }
            next_beacon = now + interval;
        }
        producer.poll(Duration::ZERO);
        let mut wait = next_beacon.saturating_duration_since(Instant::now());
        // Everything that arrived, before judging: a reader that was itself held up must not
        // take the backlog it has not read for silence.
        while let Some(received) = consumer.poll(wait) {
            wait = Duration::ZERO;
            match received {
                Ok(message) => {
                    if let Some(Ok(process)) = message.key_view::<str>() {
                        let seq = message
                            .payload()
                            .and_then(|p| p.try_into().ok())
                            .map(u64::from_be_bytes);
                        beacons.received(process, seq);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "reading liveness beacons"),
            }
        }
        for (process, silent_for) in beacons.silent(timeout) {
            if remove_process(&app, &consumer, &process, silent_for) {
                beacons.mark_removed(&process);
            }
        }
    }
}

/// Removes the members of `process` from the group. True when there is nothing more to do
/// (removed, or none found); false to try again at the next look.
fn remove_process(
    app: &AppShared,
    client: &BaseConsumer,
    process: &str,
    silent_for: Duration,
) -> bool {
    let config = &app.config;
    let group = &config.application_id;
    let groups = match client.fetch_group_list(Some(group), REQUEST_TIMEOUT) {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(%process, error = %e, "a process is silent, but the group's members could not be read");
            return false;
        }
    };
    let members: Vec<MemberToRemove> = groups
        .groups()
        .iter()
        .filter(|g| g.name() == group.as_str())
        .flat_map(|g| g.members())
        .filter(|m| process_of(m.client_id()) == process)
        .map(|m| MemberToRemove {
            member_id: m.id().to_string(),
            group_instance_id: Some(m.client_id().to_string()),
        })
        .collect();
    if members.is_empty() {
        tracing::debug!(%process, "a silent process has no members in the group");
        return true;
    }
    match remove_group_members(&config.client, group, &members, REQUEST_TIMEOUT) {
        Ok(outcomes) => {
            let removed = outcomes
                .iter()
                .filter(|(_, o)| *o == MemberRemoved::Removed)
                .count();
            metrics::counter!("kstate_task_members_removed").increment(removed as u64);
            tracing::info!(
                %process,
                silent_ms = silent_for.as_millis() as u64,
                removed,
                ?outcomes,
                "process silent: removed its members from the group"
            );
            true
        }
        Err(e) => {
            tracing::warn!(%process, error = %e, "a process is silent, but its members could not be removed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(1);
    const STEP: Duration = Duration::from_millis(250);

    /// Sends and reads back an own beacon at `at`.
    fn tick(b: &mut Beacons, at: Instant) {
        let seq = b.sending(at);
        b.received("me", Some(seq));
    }

    #[test]
    fn a_process_is_silent_once_the_own_beacons_read_back_span_the_timeout_without_it() {
        let t0 = Instant::now();
        let mut b = Beacons::new("me".into());
        b.received("other", Some(0));
        for i in 0..=4 {
            tick(&mut b, t0 + STEP * i);
        }
        assert!(b.silent(TIMEOUT).is_empty(), "1 s exactly is not more");
        tick(&mut b, t0 + STEP * 5);
        assert_eq!(b.silent(TIMEOUT), vec![("other".to_string(), STEP * 5)]);
        b.mark_removed("other");
        assert!(b.silent(TIMEOUT).is_empty(), "removed once");
        // It beacons again (it was paused, or restarted): judged afresh.
        b.received("other", Some(7));
        assert!(b.silent(TIMEOUT).is_empty());
        for i in 6..=11 {
            tick(&mut b, t0 + STEP * i);
        }
        assert_eq!(b.silent(TIMEOUT).len(), 1);
    }

    #[test]
    fn a_paused_reader_does_not_take_the_beacons_it_has_not_read_for_silence() {
        let t0 = Instant::now();
        let mut b = Beacons::new("me".into());
        b.received("other", Some(0));
        tick(&mut b, t0);
        // Paused for 3 s: its next beacon is sent after the pause, and the other's beacons of
        // that time are in the log before it.
        let late = b.sending(t0 + Duration::from_secs(3));
        for seq in 1..12 {
            b.received("other", Some(seq));
        }
        b.received("me", Some(late));
        assert!(b.silent(TIMEOUT).is_empty());
        // Its own beacon read back before the backlog: still nothing is judged that the log
        // does not show.
        let mut b = Beacons::new("me".into());
        b.received("other", Some(0));
        tick(&mut b, t0);
        tick(&mut b, t0 + Duration::from_secs(3));
        assert_eq!(
            b.silent(TIMEOUT),
            vec![("other".to_string(), Duration::from_secs(3))],
            "the log shows 3 s of own beacons without the other's: it was silent"
        );
    }

    #[test]
    fn nothing_is_judged_before_an_own_beacon_comes_back_or_of_a_process_never_heard() {
        let t0 = Instant::now();
        let mut b = Beacons::new("me".into());
        b.received("other", Some(0));
        for i in 0..20 {
            b.sending(t0 + STEP * i);
        }
        assert!(b.silent(TIMEOUT).is_empty(), "no own beacon read back");
        let mut b = Beacons::new("me".into());
        for i in 0..20 {
            tick(&mut b, t0 + STEP * i);
        }
        assert!(b.silent(TIMEOUT).is_empty(), "nobody else heard");
    }

    #[test]
    fn own_beacons_that_never_come_back_are_forgotten() {
        let t0 = Instant::now();
        let mut b = Beacons::new("me".into());
        for i in 0..(MAX_UNREAD as u32 + 10) {
            b.sending(t0 + STEP * i);
        }
        assert_eq!(b.sent.len(), MAX_UNREAD);
        let last = b.sending(t0 + STEP * 2000);
        b.received("me", Some(last));
        assert!(b.sent.is_empty());
        assert_eq!(b.clock, Some(t0 + STEP * 2000));
    }
}
