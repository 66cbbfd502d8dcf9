//! Every example answers `--help` (`hello_count` takes no argument), and each runs its smallest
//! form against the broker and does what its doc comment says, printing its result.
//! (`prometheus` runs until stopped: `tests/prometheus.rs` runs it. The services the tests and
//! benchmarks run, kstate-bench's `count_by_key` and `windowed_count`, are run by
//! `tests/services.rs` and `tests/task_failover.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

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
        "durability_modes",
        "exactly_once",
        "prometheus",
        "queries",
        "restore",
        "rows_per_second",
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
