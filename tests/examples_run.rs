//! Every example answers `--help` (`hello_count` takes no argument), and each runs its smallest form against the broker and does
//! what its doc comment says. Those that end on their own print their result; `windowed_count`
//! runs until SIGTERM, so its test stops it and checks the clean exit. (`count_by_key` and
//! `prometheus` also run until stopped: `tests/task_failover.rs` and `tests/prometheus.rs` run
//! them.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::ensure;
use kstate_test_broker::unique_topic;

/// Runs example `name` with `args`; its stdout, once it exited with success.
fn run(name: &str, args: &[&str]) -> anyhow::Result<String> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let output = Command::new(common::example_binary(name)?)
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", servers)
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr),
    );
    ensure!(
        output.status.success(),
        "{name} {args:?} exited with {}:\n{stdout}\n{stderr}",
        output.status
    );
    Ok(stdout)
}

#[test]
fn every_example_answers_help() -> anyhow::Result<()> {
    for name in [
        "count_by_key",
        "durability_modes",
        "exactly_once",
        "prometheus",
        "queries",
        "restore",
        "rows_per_second",
        "windowed_count",
    ] {
        let help = run(name, &["--help"])?;
        ensure!(help.contains("Usage:"), "{name} --help printed:\n{help}");
    }
    Ok(())
}

#[test]
fn hello_count_counts_every_word_of_its_lines() -> anyhow::Result<()> {
    let out = run("hello_count", &[])?;
    ensure!(
        out == "kafka: 3\nstreams: 2\nhello: 1\n",
        "hello_count printed:\n{out}"
    );
    Ok(())
}

#[test]
fn durability_modes_then_restore_replay_every_row() -> anyhow::Result<()> {
    let topic = unique_topic("example-durability");
    let out = run("durability_modes", &["--rows", "500", "--topic", &topic])?;
    for mode in ["sync", "group:10ms", "async"] {
        ensure!(out.contains(&format!("mode={mode} rows=500 ")), "{out}");
    }
    ensure!(out.contains("restored 1500 rows"), "{out}");
    // The restore example replays the same changelog into an empty directory.
    let out = run("restore", &["--topic", &topic])?;
    ensure!(out.contains("1500"), "{out}");
    Ok(())
}

#[test]
fn exactly_once_verifies_its_counts() -> anyhow::Result<()> {
    let out = run("exactly_once", &["--records", "300", "--keys", "10"])?;
    ensure!(out.contains("verified: 10 keys, 300 counts"), "{out}");
    Ok(())
}

#[test]
fn queries_read_every_count() -> anyhow::Result<()> {
    let out = run("queries", &["--records", "200", "--keys", "5"])?;
    ensure!(
        out.lines().filter(|l| l.starts_with("user-")).count() == 5,
        "{out}"
    );
    Ok(())
}

#[test]
fn rows_per_second_runs_its_smallest_form() -> anyhow::Result<()> {
    let out = run("rows_per_second", &["--rows", "2000"])?;
    ensure!(out.contains("restored 2000 records"), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windowed_count_sends_a_final_count_and_stops_on_sigterm() -> anyhow::Result<()> {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};

    let servers = kstate_test_broker::bootstrap_servers()?;
    let (input, output) = (
        unique_topic("example-wc-in"),
        unique_topic("example-wc-out"),
    );
    common::create_topic(servers.as_str(), &input, 1, "delete").await?;
    common::create_topic(servers.as_str(), &output, 1, "delete").await?;
    let state = tempfile::tempdir()?;
    let mut child = Command::new(common::example_binary("windowed_count")?)
        .args(["--application-id", &unique_topic("example-wc")])
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
