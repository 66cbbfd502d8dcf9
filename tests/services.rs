//! The services the runtime's tests and the benchmarks run as processes of their own, run as
//! an operator runs them: kstate-bench's `windowed_count` sends a window's final count once and
//! stops cleanly on SIGTERM. (`count_by_key` is run by `tests/task_failover.rs`, several copies
//! at once, through SIGKILLs.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::ensure;
use kstate_test_broker::unique_topic;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_count_sends_a_final_count_and_stops_on_sigterm() -> anyhow::Result<()> {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};

    let servers = kstate_test_broker::bootstrap_servers()?;
    let (input, output) = (
        unique_topic("service-wc-in"),
        unique_topic("service-wc-out"),
    );
    common::create_topic(servers.as_str(), &input, 1, "delete").await?;
    common::create_topic(servers.as_str(), &output, 1, "delete").await?;
    let state = tempfile::tempdir()?;
    let mut child = Command::new(common::service_binary("windowed_count")?)
        .args(["--application-id", &unique_topic("service-wc")])
        .args(["--input", &input, "--output", &output])
        .args(["--window-secs", "1", "--grace-secs", "0"])
        .arg("--state-dir")
        .arg(state.path())
        .env("KAFKA_BOOTSTRAP_SERVERS", &servers)
        .stdout(Stdio::null())
        .spawn()?;
    // Two records of key `a` in the window [t0, t0 + 1 s); one of `b` at t0 + 4 s moves stream
    // time past that window's end, which closes it: `a@<t0>` → 2, once. (`t0`: a recent minute,
    // so the broker's retention keeps the records.)
    let t0 = common::recent_minute();
    let client = kstate::kstate_kafka::ClientProperties::new(servers.as_str());
    let producer = kstate_bench::kafka::producer(client, 5, DefaultProducerContext)?;
    for (key, time) in [("a", t0), ("a", t0 + 500), ("b", t0 + 4_000)] {
        let record = BaseRecord::to(&input)
            .key(key.as_bytes())
            .payload(&b""[..])
            .timestamp(time);
        kstate_bench::kafka::send(&producer, record);
    }
    producer.flush(Duration::from_secs(30))?;
    let sent = common::streams::wait_for("a's final count", Duration::from_secs(90), || {
        let records = common::streams::read_topic(&servers, &output, 1)?;
        Ok(!records.is_empty())
    });
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM: {status}");
    let exit = child.wait()?;
    sent?;
    let records = common::streams::read_topic(&servers, &output, 1)?;
    let sent: Vec<(&[u8], Option<&[u8]>)> = records
        .iter()
        .map(|(_, _, key, value)| (key.as_slice(), value.as_deref()))
        .collect();
    let window = format!("a@{t0}");
    ensure!(sent == [(window.as_bytes(), Some(&b"2"[..]))], "{sent:?}");
    ensure!(
        exit.success(),
        "windowed_count exited with {exit} after SIGTERM"
    );
    Ok(())
}
