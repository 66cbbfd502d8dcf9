//! Failure detection by liveness beacons ([`AppBuilder::failure_detection`](crate::AppBuilder::failure_detection)):
//! a crashed process's tasks move when its peers notice it is gone, not when the broker's
//! session timeout expires.
//!
//! **Why.** A static member that dies never leaves the group; the coordinator removes it after
//! `session.timeout.ms`, 6 s at the least on the classic protocol (45 s on KIP-848), and that
//! wait was almost all of a failover with standbys (BENCHMARKS.md, "Failover and restart"). Heartbeating
//! the broker faster does not help: the session timeout is what the broker waits for.
//!
//! **How.** One thread per process writes a beacon (key: the process's name, `<app-id>-<instance-id>`;
//! value: the member ids its workers have in the group, as the group's description shows them)
//! to the one-partition topic `<app-id>-liveness` every quarter of the timeout, and reads every
//! process's beacons from that topic. When a process that was beaconing has been silent for the
//! timeout, this process removes the members that process last announced with `LeaveGroup`
//! ([`remove_group_members`]); the group rebalances at once, and the survivors (heartbeating
//! every half timeout) join it. Every live process does this; the second removal finds the
//! members gone and does nothing.
//!
//! **Safety.** Silence is read from the log, with the log's own clock: the topic keeps each
//! beacon's append time (`message.timestamp.type=LogAppendTime`), and another process is silent
//! when this process's own beacons, read back, span more than the timeout of append time with
//! none of the other's between them (see `Beacons`). So clocks need not agree; a reader that
//! was itself paused or starved, or is behind in reading, cannot take the others' unread
//! beacons for silence; one cut off from the broker reads nothing back and judges nobody; and a
//! stall of the partition (a leader moving) is no silence either: every process's queued
//! beacons are appended when the partition is back, with append times of that moment. A member
//! is removed by the member id *its own process announced* and its instance id together: a
//! process that restarted meanwhile has new member ids, which no beacon of the old one named,
//! and the coordinator refuses a removal by the old id once the instance id has a new one
//! ([`MemberRemoved::Fenced`]). A process that announced nothing yet (it died before it joined)
//! is left to the session timeout. A process that was only paused past the timeout is removed
//! like a dead one and fenced when it resumes: its offset commits and transactions carry the old
//! generation and are refused, and it rejoins as a new member.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate_core::sync::lock;
use kstate_kafka::{MemberRemoved, MemberToRemove, create_topic_if_missing, remove_group_members};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseProducer;
use rdkafka::producer::BaseRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::placement::process_of;
use crate::shared::AppShared;

/// After a stall of the beacons' partition, how much longer than the timeout another process
/// must stay silent: the time its producer may take beyond this one's to find the new leader.
const STALL_GRACE: Duration = Duration::from_secs(5);
/// How long the beacons' topic keeps them: long enough for anyone reading late.
const RETENTION: &str = "600000";
/// How long a topic creation, a DescribeGroups or a removal may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a process reads its own members' ids from the group's description.
const MEMBERS_REFRESH: Duration = Duration::from_secs(1);
/// The first byte of a beacon that announces member ids.
const ANNOUNCING: u8 = 1;

/// The beacons' topic of application `application_id`.
pub(crate) fn topic(application_id: &str) -> String {
    format!("{application_id}-liveness")
}

/// A beacon's value: the members its process announces (member id, instance id).
fn encode_members(members: &[MemberToRemove]) -> Vec<u8> {
    let mut out = vec![ANNOUNCING];
    let fits = |s: &str| u16::try_from(s.len()).is_ok();
    let members: Vec<_> = members
        .iter()
        .filter(|m| fits(&m.member_id) && m.group_instance_id.as_deref().is_some_and(fits))
        .take(usize::from(u16::MAX))
        .collect();
    out.extend_from_slice(&(members.len() as u16).to_be_bytes());
    for m in members {
        for s in [
            m.member_id.as_str(),
            m.group_instance_id.as_deref().unwrap_or_default(),
        ] {
            out.extend_from_slice(&(s.len() as u16).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
    out
}

/// The members a beacon's value announces; none for a value that announces nothing (a beacon of
/// an older kstate: a sequence number) or does not parse.
fn decode_members(value: &[u8]) -> Vec<MemberToRemove> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if rest.len() < n {
            return None;
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Some(head)
    }
    fn string(rest: &mut &[u8]) -> Option<String> {
        let len = take(rest, 2)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        String::from_utf8(take(rest, len)?.to_vec()).ok()
    }
    let parse = || -> Option<Vec<MemberToRemove>> {
        let mut rest = value;
        if take(&mut rest, 1)? != [ANNOUNCING] {
            return None;
        }
        let count = take(&mut rest, 2)?;
        let count = usize::from(u16::from_be_bytes([count[0], count[1]]));
        // Each member takes at least 4 bytes: no count from the wire sizes an allocation.
        let mut members = Vec::with_capacity(count.min(rest.len() / 4));
        for _ in 0..count {
            let member_id = string(&mut rest)?;
            let instance = string(&mut rest)?;
            members.push(MemberToRemove {
                member_id,
                group_instance_id: Some(instance),
            });
        }
        Some(members)
    };
    parse().unwrap_or_default()
}

/// What the beacons read so far say, with the append times of this process's own beacons as
/// the clock.
///
/// Silence is measured in the log, not by when beacons reach this reader: the topic has one
/// partition, so when this process reads back its own beacon, it has read every beacon
/// appended before it. Another process is silent for the append time its own beacons read back
/// since its latest one span, each step between two own beacons counting at most `max_step`
/// (two beacon intervals). A reader that was itself paused or slow cannot mistake its pause for
/// silence: the others' beacons of that time sit in the log between its own, and reset their
/// silence. A stall of the partition (its leader moving) is no silence either: nobody's beacons
/// are appended meanwhile, and the step across it counts `max_step` only. Nor are the moments
/// after it: each process's producer finds the new leader in its own time (its metadata
/// refreshes back off up to a second apart), so the others' queued beacons may land seconds
/// after this one's. After a step longer than `max_step` every other process is given
/// [`STALL_GRACE`] on top of the timeout (on the three-node cluster, with a 1 s timeout, a
/// reader whose producer found the new leader first removed both other, live, processes 1.27 s
/// later).
#[derive(Debug)]
struct Beacons {
    me: String,
    /// The most one step between two own beacons counts.
    max_step: i64,
    /// The append time (ms) of the latest own beacon read back: how far the log has been read.
    clock: Option<i64>,
    others: BTreeMap<String, Other>,
}

#[derive(Debug, Clone, Default)]
struct Other {
    /// How long it has been silent (ms), counted from the first own beacon after its latest
    /// one; `None`: its latest beacon is after every own beacon read back.
    quiet: Option<i64>,
    /// Its members were removed, and it has not beaconed since.
    removed: bool,
    /// The members its latest beacon announced.
    announced: Vec<MemberToRemove>,
}

impl Beacons {
    fn new(me: String, max_step: Duration) -> Self {
        Beacons {
            me,
            max_step: i64::try_from(max_step.as_millis()).unwrap_or(i64::MAX),
            clock: None,
            others: BTreeMap::new(),
        }
    }

    /// A beacon of `process`, appended at `appended` (ms), announcing `members`, was read.
    fn received(&mut self, process: &str, appended: i64, members: Vec<MemberToRemove>) {
        if process != self.me {
            *self.others.entry(process.to_string()).or_default() = Other {
                announced: members,
                ..Other::default()
            };
            return;
        }
        let gap = self.clock.map_or(0, |c| appended.saturating_sub(c));
        let step = gap.clamp(0, self.max_step);
        self.clock = Some(self.clock.map_or(appended, |c| c.max(appended)));
        let grace = i64::try_from(STALL_GRACE.as_millis()).unwrap_or(i64::MAX);
        for other in self.others.values_mut() {
            let quiet = other.quiet.map_or(0, |q| q.saturating_add(step));
            // A stall: the others' beacons may land this much later than this one's.
            other.quiet = Some(if gap > self.max_step { -grace } else { quiet });
        }
    }

    /// The processes silent for longer than `timeout` and not yet removed, with how long and
    /// the members they last announced.
    fn silent(&self, timeout: Duration) -> Vec<(String, Duration, Vec<MemberToRemove>)> {
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        self.others
            .iter()
            .filter(|(_, o)| !o.removed)
            .filter_map(|(p, o)| {
                let quiet = o.quiet?;
                (quiet > timeout_ms).then(|| {
                    let quiet = Duration::from_millis(u64::try_from(quiet).unwrap_or_default());
                    (p.clone(), quiet, o.announced.clone())
                })
            })
            .collect()
    }

    fn mark_removed(&mut self, process: &str) {
        if let Some(o) = self.others.get_mut(process) {
            o.removed = true;
        }
    }
}

/// This process's members as the group's description shows them (member id, instance id),
/// every [`MEMBERS_REFRESH`] until the application stops; what the beacons announce.
fn watch_own_members(app: &AppShared, client: &BaseConsumer, own: &Mutex<Vec<MemberToRemove>>) {
    let config = &app.config;
    let group = config.application_id.as_str();
    let instances: Vec<String> = (0..config.threads)
        .filter_map(|w| config.group_instance_id(w))
        .collect();
    while !app.stopping() {
        match client.fetch_group_list(Some(group), REQUEST_TIMEOUT) {
            Ok(groups) => {
                let members: Vec<MemberToRemove> = groups
                    .groups()
                    .iter()
                    .filter(|g| g.name() == group)
                    .flat_map(|g| g.members())
                    .filter(|m| instances.iter().any(|i| i == m.client_id()))
                    .map(|m| MemberToRemove {
                        member_id: m.id().to_string(),
                        group_instance_id: Some(m.client_id().to_string()),
                    })
                    .collect();
                *lock(own) = members;
            }
            Err(e) => tracing::debug!(error = %e, "reading this process's members"),
        }
        let until = Instant::now() + MEMBERS_REFRESH;
        while !app.stopping() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
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
        &[
            ("cleanup.policy", "delete"),
            ("retention.ms", RETENTION),
            ("message.timestamp.type", "LogAppendTime"),
        ],
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
    let describer: Result<BaseConsumer, _> = config.client.client_config().create();
    let (producer, consumer, describer) = match (producer, consumer, describer) {
        (Ok(p), Ok(c), Ok(d)) => (p, c, d),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
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
    let own = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let watcher = std::thread::Builder::new()
            .name("kstate-members".into())
            .spawn_scoped(scope, || watch_own_members(&app, &describer, &own));
        if let Err(e) = watcher {
            tracing::warn!(error = %e, "no failure detection: could not start its member watcher");
            return;
        }
        beacon_and_judge(&app, timeout, &topic, &me, &producer, &consumer, &own);
    });
}

/// The liveness loop: a beacon every quarter of `timeout`, every beacon read, every silent
/// process judged.
fn beacon_and_judge(
    app: &AppShared,
    timeout: Duration,
    topic: &str,
    me: &str,
    producer: &BaseProducer,
    consumer: &BaseConsumer,
    own: &Mutex<Vec<MemberToRemove>>,
) {
    let interval = (timeout / 4).max(Duration::from_millis(10));
    tracing::info!(%topic, process = %me, ?timeout, "failure detection on");
    let mut beacons = Beacons::new(me.to_string(), interval * 2);
    let mut warned_create_time = false;
    let mut next_beacon = Instant::now();
    while !app.stopping() {
        let now = Instant::now();
        if now >= next_beacon {
            let value = encode_members(&lock(own));
            let beacon = BaseRecord::<str, [u8]>::to(topic).key(me).payload(&value);
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
                    let stamp = message.timestamp();
                    if let rdkafka::Timestamp::CreateTime(_) = stamp
                        && !warned_create_time
                    {
                        warned_create_time = true;
                        tracing::warn!(%topic, "the liveness topic keeps its producers' create times, not append times: a stall of its partition may be taken for silence; delete it (the application creates it again with message.timestamp.type=LogAppendTime)");
                    }
                    if let (Some(Ok(process)), Some(appended)) =
                        (message.key_view::<str>(), stamp.to_millis())
                    {
                        let members = decode_members(message.payload().unwrap_or_default());
                        beacons.received(process, appended, members);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "reading liveness beacons"),
            }
        }
        for (process, silent_for, announced) in beacons.silent(timeout) {
            if remove_process(app, &process, silent_for, &announced) {
                beacons.mark_removed(&process);
            }
        }
    }
}

/// Removes the members `process` announced from the group. True when there is nothing more to
/// do (removed, fenced, gone, or none announced); false to try again at the next look.
fn remove_process(
    app: &AppShared,
    process: &str,
    silent_for: Duration,
    announced: &[MemberToRemove],
) -> bool {
    let config = &app.config;
    let group = &config.application_id;
    if announced.is_empty() {
        tracing::info!(%process, "a silent process announced no members: its session timeout removes them");
        return true;
    }
    match remove_group_members(&config.client, group, announced, REQUEST_TIMEOUT) {
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
    const STEP: i64 = 250;

    fn beacons() -> Beacons {
        Beacons::new("me".into(), Duration::from_millis(2 * STEP as u64))
    }

    fn member(id: &str, instance: &str) -> MemberToRemove {
        MemberToRemove {
            member_id: id.into(),
            group_instance_id: Some(instance.into()),
        }
    }

    fn names(silent: &[(String, Duration, Vec<MemberToRemove>)]) -> Vec<(&str, Duration)> {
        silent.iter().map(|(p, d, _)| (p.as_str(), *d)).collect()
    }

    #[test]
    fn a_process_is_silent_once_the_own_beacons_read_back_span_the_timeout_without_it() {
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        for i in 0..=4 {
            b.received("me", STEP * i, Vec::new());
        }
        assert!(b.silent(TIMEOUT).is_empty(), "1 s exactly is not more");
        b.received("me", STEP * 5, Vec::new());
        assert_eq!(
            names(&b.silent(TIMEOUT)),
            vec![("other", Duration::from_millis(1250))]
        );
        b.mark_removed("other");
        assert!(b.silent(TIMEOUT).is_empty(), "removed once");
        // It beacons again (it was paused, or restarted): judged afresh.
        b.received("other", STEP * 6, Vec::new());
        assert!(b.silent(TIMEOUT).is_empty());
        for i in 6..=11 {
            b.received("me", STEP * i, Vec::new());
        }
        assert_eq!(b.silent(TIMEOUT).len(), 1);
    }

    #[test]
    fn a_paused_reader_does_not_take_the_beacons_it_has_not_read_for_silence() {
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        b.received("me", 0, Vec::new());
        // Paused for 3 s: the other's beacons of that time are in the log before its next one.
        for i in 1..12 {
            b.received("other", STEP * i, Vec::new());
        }
        b.received("me", 3000, Vec::new());
        assert!(b.silent(TIMEOUT).is_empty());
        // 3 s of own beacons in the log without the other's: it was silent.
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        for i in 0..=12 {
            b.received("me", STEP * i, Vec::new());
        }
        assert_eq!(
            names(&b.silent(TIMEOUT)),
            vec![("other", Duration::from_secs(3))]
        );
    }

    #[test]
    fn a_stall_of_the_liveness_partition_is_not_silence() {
        // The partition's leader moves for 3 s: every process queues its beacons, and each
        // producer writes its backlog when it finds the new leader, this one first.
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        b.received("me", 0, Vec::new());
        for _ in 0..12 {
            b.received("me", 3000, Vec::new());
        }
        assert!(
            b.silent(TIMEOUT).is_empty(),
            "the step across the stall counts two intervals, not three seconds"
        );
        b.received("other", 3010, Vec::new());
        b.received("me", 3250, Vec::new());
        assert!(b.silent(TIMEOUT).is_empty());
    }

    /// On the three-node cluster the other producers found the new leader more than a second
    /// after this one: its own beacons after the stall spanned more than the timeout before the
    /// others' queued ones landed, and it removed two live processes.
    #[test]
    fn after_a_stall_the_others_beacons_may_land_seconds_later() {
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        b.received("me", 0, Vec::new());
        // The stall, then four seconds of own beacons alone.
        for i in 0..=16 {
            b.received("me", 9000 + STEP * i, Vec::new());
        }
        assert!(
            b.silent(TIMEOUT).is_empty(),
            "within the grace after a stall, nobody is silent"
        );
        b.received("other", 13_000, Vec::new());
        b.received("me", 13_250, Vec::new());
        assert!(b.silent(TIMEOUT).is_empty());
        // A process that died in the stall is still found, the grace later.
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        b.received("me", 0, Vec::new());
        for i in 0..=28 {
            b.received("me", 9000 + STEP * i, Vec::new());
        }
        assert_eq!(
            names(&b.silent(TIMEOUT)).len(),
            1,
            "silent past the grace and the timeout"
        );
    }

    #[test]
    fn only_the_members_a_silent_process_announced_are_removed() {
        let mut b = beacons();
        b.received("other", 0, vec![member("old-id", "app-other-0")]);
        for i in 0..=5 {
            b.received("me", STEP * i, Vec::new());
        }
        let silent = b.silent(TIMEOUT);
        assert_eq!(silent.len(), 1);
        assert_eq!(silent[0].2, vec![member("old-id", "app-other-0")]);
        // Restarted: its first beacon announces nothing yet (its workers have not joined).
        b.received("other", 1300, Vec::new());
        for i in 6..=12 {
            b.received("me", STEP * i, Vec::new());
        }
        let silent = b.silent(TIMEOUT);
        assert_eq!(silent.len(), 1);
        assert!(silent[0].2.is_empty(), "nothing announced, nothing removed");
    }

    #[test]
    fn nothing_is_judged_before_an_own_beacon_comes_back_or_of_a_process_never_heard() {
        let mut b = beacons();
        b.received("other", 0, Vec::new());
        assert!(b.silent(TIMEOUT).is_empty(), "no own beacon read back");
        let mut b = beacons();
        for i in 0..20 {
            b.received("me", STEP * i, Vec::new());
        }
        assert!(b.silent(TIMEOUT).is_empty(), "nobody else heard");
    }

    #[test]
    fn announced_members_round_trip_and_other_values_announce_nothing() {
        let members = vec![member("m-1", "app-a-0"), member("", "app-a-1")];
        assert_eq!(decode_members(&encode_members(&members)), members);
        assert!(
            decode_members(&7u64.to_be_bytes()).is_empty(),
            "an older beacon"
        );
        assert!(decode_members(&[ANNOUNCING, 0xff, 0xff, 0, 3]).is_empty());
        assert!(decode_members(&[]).is_empty());
    }

    proptest::proptest! {
        #[test]
        fn no_beacon_value_makes_the_decoder_panic(
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let _ = decode_members(&value);
        }
    }
}
