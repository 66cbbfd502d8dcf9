//! The standby placement model (`kstate_task::placement`) against librdkafka's own `range`
//! assignor, with real static consumers on the real broker.
//!
//! Two co-partitioned inputs of 10 partitions; groups of 3, 4 and 5 processes of two workers
//! each, every worker a consumer with `group.instance.id = <app>-<process>-<worker>` and the
//! eager `range` strategy, as kstate's workers under static membership. For each group:
//! - the settled assignment is the model's, member by member, and gives partition *p* of both
//!   inputs to one member;
//! - for every single process failure, a group of the survivors (a fresh group id, so that each
//!   failure is simulated in seconds instead of a session timeout) settles on the model's
//!   assignment without that process, and every task that changes process lands on a process
//!   whose predicted standbys hold it: 100 % hits.
//!
//! Then one real failure: the 3-process group loses a process without a LeaveGroup (static
//! members send none on close), and after the session timeout the survivors settle on the
//! assignment the model predicted.
//!
//! And the failure detector's way around that wait: with a session timeout of 120 s, a
//! vanished process's members are removed by another client (`remove_group_members`, the
//! `LeaveGroup` of Kafka's admin member removal), and the survivors settle on the predicted
//! assignment at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kstate::kstate_kafka::{MemberRemoved, MemberToRemove, remove_group_members};
use kstate::kstate_task::TaskId;
use kstate::kstate_task::placement::{RangePlacement, process_of};
use kstate_test_broker::unique_topic;
use rdkafka::consumer::{BaseConsumer, Consumer};

const PARTITIONS: i32 = 10;
const WORKERS: usize = 2;
const SESSION_TIMEOUT_MS: u64 = 6000;

/// One static member: its instance id and its consumer.
struct Member {
    id: String,
    consumer: BaseConsumer,
}

fn join(group: &str, id: &str, topics: &[&str], session_ms: u64) -> anyhow::Result<Member> {
    let consumer: BaseConsumer = common::client()?
        .client_config()
        .set("group.id", group)
        .set("group.instance.id", id)
        .set("client.id", id)
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", session_ms.to_string())
        .set("heartbeat.interval.ms", "500")
        .set("enable.auto.commit", "false")
        .create()
        .with_context(|| format!("consumer {id} of group {group}"))?;
    consumer.subscribe(topics)?;
    Ok(Member {
        id: id.to_string(),
        consumer,
    })
}

/// Each member's tasks per input topic, as librdkafka assigned them.
type Assignment = BTreeMap<String, BTreeMap<String, BTreeSet<i32>>>;

fn assignment(members: &[Member]) -> anyhow::Result<Assignment> {
    let mut all = Assignment::new();
    for m in members {
        let mine = all.entry(m.id.clone()).or_default();
        for e in m.consumer.assignment()?.elements() {
            mine.entry(e.topic().to_string())
                .or_default()
                .insert(e.partition());
        }
    }
    Ok(all)
}

/// Polls every member until their assignments cover each input's partitions exactly once, with
/// every member holding some, unchanged for a second: the group has settled.
fn settle(members: &[Member], topics: &[&str]) -> anyhow::Result<Assignment> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stable_since: Option<(Instant, Assignment)> = None;
    loop {
        for m in members {
            if let Some(Err(e)) = m.consumer.poll(Duration::from_millis(20)) {
                bail!("member {}: {e}", m.id);
            }
        }
        let now = assignment(members)?;
        let covered = topics.iter().all(|t| {
            let mut seen: Vec<i32> = now
                .values()
                .flat_map(|by_topic| by_topic.get(*t).into_iter().flatten().copied())
                .collect();
            seen.sort();
            seen == (0..PARTITIONS).collect::<Vec<_>>()
        }) && now.values().all(|by_topic| !by_topic.is_empty());
        if !covered {
            stable_since = None;
        } else {
            match &stable_since {
                Some((since, before)) if *before == now => {
                    if since.elapsed() >= Duration::from_secs(1) {
                        return Ok(now);
                    }
                }
                _ => stable_since = Some((Instant::now(), now)),
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the group did not settle in 60 s; last: {:?}",
                assignment(members)?
            );
        }
    }
}

/// The model's assignment in the same shape.
fn predicted(placement: &RangePlacement, topics: &[&str]) -> Assignment {
    placement
        .members()
        .iter()
        .map(|m| {
            let tasks: BTreeSet<i32> = placement.tasks_of(m).collect();
            let by_topic = topics
                .iter()
                .map(|t| (t.to_string(), tasks.clone()))
                .collect();
            (m.clone(), by_topic)
        })
        .collect()
}

fn member_ids(app: &str, processes: &[String]) -> Vec<String> {
    processes
        .iter()
        .flat_map(|p| (0..WORKERS).map(move |w| format!("{app}-{p}-{w}")))
        .collect()
}

fn start_group(
    group: &str,
    ids: &[String],
    topics: &[&str],
    session_ms: u64,
) -> anyhow::Result<Vec<Member>> {
    ids.iter()
        .map(|id| join(group, id, topics, session_ms))
        .collect()
}

fn new_group(app: &str) -> String {
    unique_topic(&format!("{app}-group"))
}

fn process_owner(placement: &RangePlacement, task: i32) -> &str {
    process_of(placement.owner(TaskId { partition: task }).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn librdkafkas_range_assignment_is_the_predicted_one_after_every_single_failure()
-> anyhow::Result<()> {
    let a = unique_topic("placement-a");
    let b = unique_topic("placement-b");
    for t in [&a, &b] {
        common::create_topic(common::client()?, t, PARTITIONS, "delete").await?;
    }
    let topics = [a.as_str(), b.as_str()];
    let mut checked_moves = 0;
    for count in 3..=5 {
        // Names that sort differently bytewise and numerically.
        let processes: Vec<String> = (0..count).map(|i| format!("host{}", i * 5)).collect();
        let app = format!("place{count}");
        let ids = member_ids(&app, &processes);
        let placement = RangePlacement::new(ids.clone(), PARTITIONS);
        let members = start_group(&new_group(&app), &ids, &topics, SESSION_TIMEOUT_MS)?;
        let actual = settle(&members, &topics)?;
        assert_eq!(
            actual,
            predicted(&placement, &topics),
            "{count} processes: librdkafka's assignment is not the model's"
        );
        drop(members);

        for failed in &processes {
            let failed_process = format!("{app}-{failed}");
            let after = placement.without(|m| process_of(m) == failed_process);
            let survivors: Vec<String> = after.members().to_vec();
            let members = start_group(&new_group(&app), &survivors, &topics, SESSION_TIMEOUT_MS)?;
            let actual = settle(&members, &topics)?;
            assert_eq!(
                actual,
                predicted(&after, &topics),
                "{count} processes without {failed}: librdkafka's assignment is not the model's"
            );
            for task in 0..PARTITIONS {
                let to = process_owner(&after, task);
                if process_owner(&placement, task) != to {
                    checked_moves += 1;
                    assert!(
                        placement
                            .standbys_of(to, 1)
                            .contains(&TaskId { partition: task }),
                        "{count} processes without {failed}: task {task} went to {to}, which \
                         keeps no standby of it"
                    );
                }
            }
            drop(members);
        }
    }
    assert!(checked_moves > 0, "no failure moved a task");

    // One real failure: a process's members vanish without leaving the group.
    let processes: Vec<String> = ["p1", "p2", "p3"].map(String::from).to_vec();
    let app = "placereal";
    let ids = member_ids(app, &processes);
    let placement = RangePlacement::new(ids.clone(), PARTITIONS);
    let mut members = start_group(&new_group(app), &ids, &topics, SESSION_TIMEOUT_MS)?;
    assert_eq!(settle(&members, &topics)?, predicted(&placement, &topics));
    let failed = format!("{app}-p2");
    let started = Instant::now();
    // Static members send no LeaveGroup on close: the group learns of it at the session timeout.
    members.retain(|m| process_of(&m.id) != failed);
    let after = placement.without(|m| process_of(m) == failed);
    let actual = settle(&members, &topics)?;
    assert_eq!(
        actual,
        predicted(&after, &topics),
        "after a real failure, the survivors' assignment is not the predicted one"
    );
    eprintln!(
        "real failure: settled on the predicted assignment {:.1} s after the process vanished",
        started.elapsed().as_secs_f64()
    );
    for t in [&a, &b] {
        common::delete_topic(t).await?;
    }
    Ok(())
}

/// `kstate_kafka::remove_group_members` (the failure detector's removal of a silent process's
/// members) on a real group: with a session timeout of 120 s, a process's static members vanish
/// without leaving; removing them by member id and instance id makes the survivors settle on
/// the predicted assignment long before the session timeout could have. A member named with a
/// member id that is not its own is left alone (fenced), and a second removal finds nothing.
#[tokio::test(flavor = "multi_thread")]
async fn removing_a_vanished_processs_members_moves_its_tasks_without_waiting_for_the_session()
-> anyhow::Result<()> {
    const LONG_SESSION_MS: u64 = 120_000;
    let a = unique_topic("removal-a");
    let b = unique_topic("removal-b");
    for t in [&a, &b] {
        common::create_topic(common::client()?, t, PARTITIONS, "delete").await?;
    }
    let topics = [a.as_str(), b.as_str()];
    let processes: Vec<String> = ["p1", "p2", "p3"].map(String::from).to_vec();
    let app = "removal";
    let group = new_group(app);
    let ids = member_ids(app, &processes);
    let placement = RangePlacement::new(ids.clone(), PARTITIONS);
    let mut members = start_group(&group, &ids, &topics, LONG_SESSION_MS)?;
    assert_eq!(settle(&members, &topics)?, predicted(&placement, &topics));
    let failed = format!("{app}-p2");
    let described = members[0]
        .consumer
        .fetch_group_list(Some(&group), Duration::from_secs(10))?;
    let vanished: Vec<MemberToRemove> = described
        .groups()
        .iter()
        .flat_map(|g| g.members())
        .filter(|m| process_of(m.client_id()) == failed)
        .map(|m| MemberToRemove {
            member_id: m.id().to_string(),
            group_instance_id: Some(m.client_id().to_string()),
        })
        .collect();
    assert_eq!(vanished.len(), WORKERS, "{vanished:?}");
    // Static members send no LeaveGroup on close.
    members.retain(|m| process_of(&m.id) != failed);
    let client = common::client()?;
    let timeout = Duration::from_secs(10);

    let impostor = MemberToRemove {
        member_id: "not-its-member-id".into(),
        group_instance_id: vanished[0].group_instance_id.clone(),
    };
    let outcomes = remove_group_members(&client, &group, &[impostor], timeout)?;
    assert_eq!(
        outcomes.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
        vec![MemberRemoved::Fenced],
        "a member named with another member id is left alone"
    );

    let removed_at = Instant::now();
    let outcomes = remove_group_members(&client, &group, &vanished, timeout)?;
    assert!(
        outcomes.iter().all(|(_, o)| *o == MemberRemoved::Removed),
        "{outcomes:?}"
    );
    let after = placement.without(|m| process_of(m) == failed);
    // `settle` gives up after 60 s, half the session timeout: the move is the removal's.
    assert_eq!(settle(&members, &topics)?, predicted(&after, &topics));
    eprintln!(
        "removed: the survivors settled on the predicted assignment {:.1} s after the removal \
         (session timeout {} s)",
        removed_at.elapsed().as_secs_f64(),
        LONG_SESSION_MS / 1000
    );
    let again = remove_group_members(&client, &group, &vanished, timeout)?;
    assert!(
        again.iter().all(|(_, o)| *o == MemberRemoved::Unknown),
        "{again:?}"
    );
    for t in [&a, &b] {
        common::delete_topic(t).await?;
    }
    Ok(())
}
