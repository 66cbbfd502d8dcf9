//! Failure detection by liveness beacons ([`AppBuilder::failure_detection`](crate::AppBuilder::failure_detection)):
//! a crashed process's tasks move when its peers notice it is gone, not when the broker's
//! session timeout expires.
//!
//! **Why.** A static member that dies never leaves the group; the coordinator removes it after
//! `session.timeout.ms`, 6 s at the least on the classic protocol (45 s on KIP-848), and that
//! wait was almost all of a failover with standbys (BENCHMARKS.md, "Failover"). Heartbeating
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
//! **Safety.** Time is each reader's own clock of when it *received* beacons, so clocks need not
//! agree. A process judges others only while its own beacon came back to it within the
//! timeout: one that is starved or cut off itself removes nobody. A member is removed by its
//! member id and instance id together, so a process that restarted meanwhile (new member id) is
//! left alone. A process that was only paused past the timeout is removed like a dead one and
//! fenced when it resumes: its offset commits and transactions carry the old generation and are
//! refused, and it rejoins as a new member.

use std::collections::BTreeMap;
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

/// When each process's beacon was last received here, and whether it was removed since.
#[derive(Debug, Default)]
struct Beacons {
    seen: BTreeMap<String, Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    removed: bool,
}

impl Beacons {
    fn received(&mut self, process: &str, at: Instant) {
        self.seen
            .insert(process.to_string(), Seen { at, removed: false });
    }

    /// The processes silent for longer than `timeout` at `now` and not yet removed, if `me`
    /// itself was heard within `timeout` (otherwise nobody: the silence may be ours).
    fn silent(&self, me: &str, now: Instant, timeout: Duration) -> Vec<(String, Duration)> {
        let heard = |s: &Seen| now.saturating_duration_since(s.at);
        if self.seen.get(me).is_none_or(|s| heard(s) > timeout) {
            return Vec::new();
        }
        self.seen
            .iter()
            .filter(|(p, s)| p.as_str() != me && !s.removed && heard(s) > timeout)
            .map(|(p, s)| (p.clone(), heard(s)))
            .collect()
    }

    fn mark_removed(&mut self, process: &str) {
        if let Some(s) = self.seen.get_mut(process) {
            s.removed = true;
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
    let mut beacons = Beacons::default();
    let mut next_beacon = Instant::now();
    while !app.stopping() {
        let now = Instant::now();
        if now >= next_beacon {
            let beacon = BaseRecord::<str, [u8]>::to(&topic)
                .key(me.as_str())
                .payload(&[]);
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
                        beacons.received(process, Instant::now());
                    }
                }
                Err(e) => tracing::debug!(error = %e, "reading liveness beacons"),
            }
        }
        for (process, silent_for) in beacons.silent(&me, Instant::now(), timeout) {
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

    #[test]
    fn a_process_is_silent_after_the_timeout_and_only_while_this_one_is_heard() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(1);
        let mut b = Beacons::default();
        b.received("me", t0);
        b.received("other", t0);
        assert!(b.silent("me", t0 + timeout / 2, timeout).is_empty());
        // Both silent: the silence may be this process's own (starved, cut off).
        assert!(b.silent("me", t0 + timeout * 2, timeout).is_empty());
        b.received("me", t0 + timeout * 2);
        let silent = b.silent("me", t0 + timeout * 2, timeout);
        assert_eq!(silent, vec![("other".to_string(), timeout * 2)]);
        b.mark_removed("other");
        assert!(b.silent("me", t0 + timeout * 2, timeout).is_empty(), "once");
        // It beacons again (it was paused, or restarted): judged afresh.
        b.received("other", t0 + timeout * 3);
        b.received("me", t0 + timeout * 5);
        assert_eq!(b.silent("me", t0 + timeout * 5, timeout).len(), 1);
    }

    #[test]
    fn a_process_never_heard_is_never_judged() {
        let t0 = Instant::now();
        let mut b = Beacons::default();
        b.received("me", t0 + Duration::from_secs(10));
        assert!(
            b.silent("me", t0 + Duration::from_secs(10), Duration::from_secs(1))
                .is_empty()
        );
    }
}
