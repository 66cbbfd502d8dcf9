//! At-least-once: after a periodic offset commit that failed, a graceful hand-over still
//! processes no record twice ("without a crash nothing is processed twice").
//!
//! Member A processes every record of a one-partition input, and one of its periodic
//! asynchronous offset commits fails with no later record to commit again; then A shuts down
//! gracefully (`shutdown` + `wait`) and member B, already in the group, takes the partition
//! over. Guaranteed: B starts from where A got to, so every input record is processed exactly
//! once over both members (a counter that the processors of both share), and B's task reports no
//! record processed.
//!
//! How a commit is made to fail (KIP-848 consumer protocol, `GroupProtocol::Consumer`): B joins,
//! which bumps the group epoch, and the broker is paused (SIGSTOP) before A's next heartbeat.
//! A's processor is slow and goes on with records fetched before the pause; its commits carry
//! its member epoch and queue behind the heartbeat on the coordinator connection. Once resumed,
//! the broker answers the heartbeat with A's new epoch, then refuses the commits sent after it
//! with STALE_MEMBER_EPOCH, which librdkafka does not retry for a commit the application asked
//! for; A keeps its partition. Or librdkafka fails the commits queued during the pause itself,
//! with "Local: Operation in progress", once the broker answers again. The test checks
//! librdkafka's `debug=cgrp` lines "OffsetCommit ... returned: <error>" (anything but
//! `Success`) before the hand-over, and repeats the pause (with another member joining or
//! leaving for a new epoch) when no commit of A failed.
//!
//! A paused broker alone does not make a commit fail: librdkafka 2.12.1 defers a commit while the
//! coordinator is unreachable and retries one that timed out, and the broker applies the requests
//! it had received before the pause once it runs again. Under the classic protocol a commit
//! waits behind the member's own JoinGroup and SyncGroup on the same connection, so it is not
//! refused during a rebalance either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::streams::{produce, wait_for};
use kstate::kstate_core::BoxError;
use kstate::kstate_task::{App, Context, GroupProtocol, Processor, Record, Running, TaskState};
use kstate_test_broker::{PrivateBroker, unique_topic};

const WAIT: Duration = Duration::from_secs(60);
/// Records per attempt: the processor takes about 6 s for them, inside the pause.
const BATCH: usize = 3_000;
const PAUSE: Duration = Duration::from_secs(10);
const ATTEMPTS: usize = 5;

/// Every log line of this test binary: kstate's, and librdkafka's through rdkafka's `tracing`.
fn captured_logs() -> &'static Mutex<Vec<u8>> {
    common::captured_logs(tracing::Level::DEBUG)
}

fn log_len() -> usize {
    captured_logs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len()
}

/// The captured log lines from byte `from` on that contain every one of `parts`.
fn log_lines(from: usize, parts: &[&str]) -> Vec<String> {
    let logs = captured_logs().lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&logs[from.min(logs.len())..])
        .lines()
        .filter(|line| parts.iter().all(|part| line.contains(part)))
        .map(str::to_string)
        .collect()
}

/// Counts every record it processes in `processed` (shared by the processors of all members),
/// about 2 ms per record; no store and no output, so that its commits need nothing from the
/// broker but the offset commit.
struct SlowCount {
    processed: Arc<AtomicU64>,
}

impl Processor for SlowCount {
    fn process(&mut self, _: &mut Context<'_>, _: &Record<'_>) -> Result<(), BoxError> {
        self.processed.fetch_add(1, Ordering::AcqRel);
        std::thread::sleep(Duration::from_millis(2));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "fails 3 runs in 7 (2026-12-02): after the broker's pause A's consumer loses its \
            broker handle (_DESTROY_BROKER) and finds no broker until the revocation timeout, so \
            its last commit never leaves and B repeats about 2,000 records; RELIABILITY.md; run \
            with --ignored"]
async fn a_graceful_handover_after_a_failed_offset_commit_repeats_no_record() -> anyhow::Result<()>
{
    captured_logs();
    let broker = PrivateBroker::start()?;
    let servers = broker.bootstrap_servers().to_string();
    let app_id = unique_topic("handover");
    let input = unique_topic("handover-in");
    common::create_topic(servers.as_str(), &input, 1, "delete").await?;
    let dir = tempfile::tempdir()?;
    let processed = Arc::new(AtomicU64::new(0));
    let start = |name: &str| -> anyhow::Result<Running> {
        let mut builder = App::builder(app_id.clone(), servers.clone());
        builder
            .input(input.clone())
            .state_dir(dir.path().join(name))
            .group_protocol(GroupProtocol::Consumer)
            .commit_interval(Duration::from_millis(100))
            // librdkafka's group events, for the check of the failed commit.
            .consumer_property("debug", "cgrp");
        let processed = processed.clone();
        let app = builder.build(move |_| {
            Box::new(SlowCount {
                processed: processed.clone(),
            })
        })?;
        Ok(app.start()?)
    };
    let a = start("a")?;
    wait_for("A runs the task", WAIT, || {
        Ok(a.tasks().iter().any(|t| t.state == TaskState::Running))
    })?;

    let mut produced = 0usize;
    let mut others: Vec<Running> = Vec::new();
    let mut failed = false;
    for attempt in 0..ATTEMPTS {
        // A fetches the batch at once and works through it for about 6 s.
        let batch: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..BATCH)
            .map(|i| (0, format!("key-{}", i % 10).into_bytes(), b"v".to_vec()))
            .collect();
        produce(&servers, &input, &batch)?;
        produced += batch.len();
        let before = processed.load(Ordering::Acquire) as usize;
        wait_for("A starts on the batch", WAIT, || {
            Ok(processed.load(Ordering::Acquire) as usize > before)
        })?;
        // A new group epoch: another member joins (or, every other attempt, leaves).
        if attempt % 2 == 0 {
            others.push(start(&format!("member-{attempt}"))?);
        } else if let Some(other) = others.pop() {
            other.shutdown();
            other.wait()?;
        }
        std::thread::sleep(Duration::from_millis(1_500));
        let from = log_len();
        broker.pause()?;
        std::thread::sleep(PAUSE);
        broker.resume()?;
        wait_for("A processes the batch", WAIT, || {
            Ok(processed.load(Ordering::Acquire) as usize >= produced)
        })?;
        // The commits queued during the pause are answered.
        std::thread::sleep(Duration::from_secs(3));
        // Refused by the broker (a stale member epoch), or failed in librdkafka (commits
        // queued during the pause that it fails with "Operation in progress" once the broker
        // answers again): either way an asynchronous commit whose offsets the next one must
        // carry.
        let refused: Vec<String> = log_lines(from, &["OffsetCommit for", "returned:"])
            .into_iter()
            .filter(|line| !line.ends_with("returned: Success"))
            .collect();
        eprintln!(
            "attempt {attempt}: {} commits failed ({} as stale); the group's offset {:?} of {produced}",
            refused.len(),
            refused
                .iter()
                .filter(|l| l.contains("The member epoch is stale"))
                .count(),
            common::failures::committed_offset(&servers, &app_id, &input)?
        );
        if !refused.is_empty() {
            failed = true;
            break;
        }
    }
    anyhow::ensure!(
        failed,
        "no offset commit of A failed in {ATTEMPTS} pauses; librdkafka's commit results:\n{}",
        log_lines(0, &["OffsetCommit for", "returned"]).join("\n")
    );

    // No more input. B, in the group already, takes the partition over from A.
    let b = match others.pop() {
        Some(b) => b,
        None => start("b")?,
    };
    a.shutdown();
    a.wait()?;
    wait_for("B runs the task", WAIT, || {
        Ok(b.tasks().iter().any(|t| t.state == TaskState::Running))
    })?;
    wait_for("the group's offset at the end of the input", WAIT, || {
        Ok(common::failures::committed_offset(&servers, &app_id, &input)? == Some(produced as i64))
    })?;
    let again: u64 = b.tasks().iter().map(|t| t.processed).sum();
    let total = processed.load(Ordering::Acquire);
    // What the workers said about their offset commits, for a failure to be read from.
    let commit_story = log_lines(0, &["kstate_task", "commit"])
        .into_iter()
        .filter(|line| {
            ["WARN", "committing and closing", "could not be fetched"]
                .iter()
                .any(|part| line.contains(part))
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        total, produced as u64,
        "{produced} records were processed {total} times over a graceful hand-over ({again} by B); \
         the workers' commit warnings:\n{commit_story}"
    );
    assert_eq!(again, 0, "B processed records A had processed");
    b.shutdown();
    b.wait()?;
    for other in others {
        other.shutdown();
        other.wait()?;
    }
    Ok(())
}
