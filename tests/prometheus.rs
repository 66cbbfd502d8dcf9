//! `examples/prometheus.rs` as an operator meets it: started as its own process against the real
//! broker and scraped over HTTP with a real client.
//!
//! - `/health` answers 503 while a task restores: the test holds a transaction open on the
//!   application's changelog before starting it, and a restore waits for every open
//!   transaction below its end, so the task stays restoring until the test aborts it;
//!   `/metrics` then counts one restoring task. Once aborted, `/health` answers 200.
//! - After records went through, `/metrics` has the restore, commit, lag and throughput series
//!   with the values this run must give them: one restore, commits, a lag of 0 once caught up,
//!   and every input record processed.
//! - SIGTERM stops it cleanly (exit status 0).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use common::streams::{produce, read_topic, wait_for};
use kstate_test_broker::unique_topic;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const RECORDS: usize = 500;

/// A series' name with its labels, and what its value must satisfy.
type SaneValue = (&'static str, fn(f64) -> bool);

/// Kills the example if the test fails before stopping it.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An HTTP GET: status and body (503 is an answer, not an error).
fn get(url: &str) -> anyhow::Result<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent.get(url).call()?;
    let status = response.status().as_u16();
    Ok((status, response.body_mut().read_to_string()?))
}

/// The value of the series `name` (with its labels, as rendered) in a scrape, if present.
fn series(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The address the example printed it listens on.
fn listening(log: &Path) -> anyhow::Result<String> {
    let mut address = None;
    wait_for(
        "the example's listening line",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(log)?;
            address = text
                .lines()
                .find_map(|l| l.strip_prefix("prometheus: listening on "))
                .map(str::to_string);
            Ok(address.is_some())
        },
    )?;
    Ok(address.unwrap())
}

#[test]
fn the_scrape_has_the_documented_series_and_health_is_503_until_every_task_runs()
-> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let app_id = unique_topic("prometheus");
    let (input, output) = (format!("{app_id}-in"), format!("{app_id}-out"));
    let changelog = format!("{app_id}-counts-changelog");
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        common::create_topic(servers.as_str(), &input, 1, "delete").await?;
        common::create_topic(servers.as_str(), &output, 1, "delete").await?;
        common::create_topic(servers.as_str(), &changelog, 1, "compact").await
    })?;

    // A transaction left open on the changelog: the task's restore cannot end before it does.
    let held: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &servers)
        .set("transactional.id", format!("{app_id}-held"))
        .create()?;
    held.init_transactions(Duration::from_secs(30))?;
    held.begin_transaction()?;
    held.send(
        BaseRecord::to(&changelog)
            .partition(0)
            .key("held")
            .payload(&[0u8; 8][..]),
    )
    .map_err(|(e, _)| e)?;
    held.flush(Duration::from_secs(30))?;

    let records: Vec<_> = (0..RECORDS)
        .map(|i| (0, format!("key-{}", i % 50).into_bytes(), b"v".to_vec()))
        .collect();
    produce(&servers, &input, &records)?;

    let dir = tempfile::tempdir()?;
    let log = dir.path().join("prometheus.log");
    let mut example = Example(
        Command::new(common::example_binary("prometheus")?)
            .args(["--bootstrap-servers", &servers, "--application-id", &app_id])
            .args([
                "--input",
                &input,
                "--output",
                &output,
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
    );
    let base = listening(&log)?;
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    // Until the task restores, every answer is 503: first while joining, then while restoring.
    let mut answers = Vec::new();
    wait_for("/health to say restoring", Duration::from_secs(60), || {
        let (status, body) = get(&format!("{base}/health"))?;
        answers.push((status, body.trim().to_string()));
        Ok(body.starts_with("restoring"))
    })
    .with_context(logs)?;
    ensure!(
        answers.iter().all(|(status, _)| *status == 503),
        "/health answered other than 503 before the task restored: {answers:?}"
    );
    let scrape = get(&format!("{base}/metrics"))?.1;
    ensure!(
        series(&scrape, "kstate_task_tasks{role=\"restoring\"}") == Some(1.0),
        "one restoring task expected in the scrape:\n{scrape}"
    );

    held.abort_transaction(Duration::from_secs(30))?;
    wait_for("/health to answer 200", Duration::from_secs(60), || {
        Ok(get(&format!("{base}/health"))?.0 == 200)
    })
    .with_context(logs)?;

    // Every record's count out, and the statistics' lag (every 5 s) caught up.
    wait_for("every count in the output", Duration::from_secs(60), || {
        Ok(read_topic(&servers, &output, 1)?.len() == RECORDS)
    })
    .with_context(logs)?;
    let lag = format!("kstate_task_consumer_lag{{topic=\"{input}\",partition=\"0\"}}");
    let mut scrape = String::new();
    wait_for("the lag series at 0", Duration::from_secs(30), || {
        scrape = get(&format!("{base}/metrics"))?.1;
        Ok(series(&scrape, &lag) == Some(0.0)
            && series(&scrape, "kstate_task_records_processed") == Some(RECORDS as f64))
    })
    .with_context(|| format!("last scrape:\n{scrape}"))?;
    let expected: [SaneValue; 4] = [
        ("kstate_restore_seconds_count", |v| v == 1.0),
        ("kstate_task_commit_seconds_count", |v| v >= 1.0),
        ("kstate_task_tasks{role=\"running\"}", |v| v == 1.0),
        ("kstate_task_tasks{role=\"restoring\"}", |v| v == 0.0),
    ];
    for (name, sane) in expected {
        let value = series(&scrape, name);
        ensure!(
            value.is_some_and(sane),
            "{name} is {value:?} in the scrape:\n{scrape}"
        );
    }
    // Every count went through the changelog: its partition's acknowledged offset is past them.
    let acked = format!("kstate_changelog_acked_offset{{topic=\"{changelog}\",partition=\"0\"}}");
    ensure!(
        series(&scrape, &acked).is_some_and(|v| v >= (RECORDS - 1) as f64),
        "{acked} below {} in the scrape:\n{scrape}",
        RECORDS - 1
    );

    let pid = example.0.id().to_string();
    ensure!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()?
            .success()
    );
    let status = example.0.wait()?;
    ensure!(
        status.success(),
        "the example exited with {status}:\n{}",
        logs()
    );
    Ok(())
}
