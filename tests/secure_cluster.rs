//! kstate against a secured broker (`scripts/kafka start --secure`: a TLS listener and a SASL_SSL
//! listener with a SCRAM-SHA-512 user, certificates from a throwaway CA): a store writes, closes
//! and restores over SASL_SSL; the task runtime counts exactly once over it; a wrong password is
//! an authentication error long before the open timeout; a client without TLS cannot use the
//! TLS listener; a certificate from another CA is refused; and no secret reaches a `{:?}`, an
//! error or a log line (every log line of this binary, librdkafka's included at debug level, is
//! captured and searched for the password).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

mod common;
use kstate_bench::topology::count_by_key as count;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::streams::{last_counts, produce_with, read_topic_with, wait_for};
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{
    ChangelogConfig, ChangelogError, ClientProperties, LoggedStore, MetadataError, RestoreClients,
    SecurityFailure,
};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate::kstate_task::{App, ProcessingGuarantee, TaskError};
use kstate_test_broker::{SecureBroker, unique_topic};

/// Every log line of this test binary: kstate's, and librdkafka's through rdkafka's `tracing`.
fn captured_logs() -> &'static Mutex<Vec<u8>> {
    common::captured_logs(tracing::Level::TRACE)
}

/// The secured broker and its SASL_SSL client properties, with librdkafka's debug logging of
/// security, broker and configuration events on, so that the log search below has something to
/// search.
fn secure() -> anyhow::Result<(&'static SecureBroker, ClientProperties)> {
    captured_logs();
    let broker = kstate_test_broker::secure_broker()?;
    let client = ClientProperties::from_file(broker.sasl_ssl_properties())?
        .set("debug", "security,broker,conf");
    Ok((broker, client))
}

fn password(client: &ClientProperties) -> anyhow::Result<String> {
    let password = client.get("sasl.password").context("no sasl.password")?;
    ensure!(
        password.len() >= 12,
        "a throwaway password this short would match by chance"
    );
    Ok(password.to_string())
}

/// Fails if `secret` appears in any log line captured so far, and checks that logs were
/// captured at all (a search of nothing finds nothing).
fn assert_not_logged(secret: &str) -> anyhow::Result<()> {
    let logs = String::from_utf8_lossy(&captured_logs().lock().unwrap_or_else(|p| p.into_inner()))
        .into_owned();
    ensure!(
        logs.contains("librdkafka") || logs.contains("rdkafka"),
        "librdkafka's log lines were not captured: {} bytes of logs",
        logs.len()
    );
    ensure!(!logs.contains(secret), "the secret was logged");
    Ok(())
}

fn config(client: &ClientProperties, topic: &str) -> ChangelogConfig {
    common::changelog_on(client.clone(), topic)
}

#[test]
fn a_store_writes_closes_and_restores_over_sasl_ssl() -> anyhow::Result<()> {
    let (_, client) = secure()?;
    let secret = password(&client)?;
    let topic = unique_topic("secure-store");
    let dir = tempfile::tempdir()?;
    let options = RocksDbOptions::default();

    let store = LoggedStore::open(dir.path().join("a"), &options, config(&client, &topic))?;
    let mut expected = BTreeMap::new();
    for i in 0..2_000u32 {
        let (key, value) = (format!("key-{}", i % 700), format!("value-{i}"));
        store.put(key.as_bytes(), value.as_bytes())?;
        expected.insert(key.into_bytes(), value.into_bytes());
    }
    for i in (0..700).step_by(7) {
        let key = format!("key-{i}");
        store.delete(key.as_bytes())?;
        expected.remove(key.as_bytes());
    }
    store.flush()?;
    ensure!(common::contents(&store)? == expected);
    let shown = format!("{store:?}");
    ensure!(
        !shown.contains(&secret),
        "the store's Debug shows the password"
    );
    store.close()?;
    drop(store);

    // A fresh directory: everything comes back from the changelog, over SASL_SSL.
    let restored = LoggedStore::open(dir.path().join("b"), &options, config(&client, &topic))?;
    ensure!(
        restored.restore_report().records > 0,
        "{:?}",
        restored.restore_report()
    );
    ensure!(
        common::contents(&restored)? == expected,
        "restored over SASL_SSL differs"
    );
    restored.close()?;
    // The first directory again: nothing to replay.
    let reopened = LoggedStore::open(dir.path().join("a"), &options, config(&client, &topic))?;
    ensure!(
        reopened.restore_report().records == 0,
        "{:?}",
        reopened.restore_report()
    );
    ensure!(common::contents(&reopened)? == expected);
    reopened.close()?;
    assert_not_logged(&secret)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_task_runtime_counts_exactly_once_over_sasl_ssl() -> anyhow::Result<()> {
    let (_, client) = secure()?;
    let secret = password(&client)?;
    let (app_id, input, output) = (
        unique_topic("secure-app"),
        unique_topic("secure-in"),
        unique_topic("secure-out"),
    );
    common::create_topic(client.clone(), &input, 2, "delete").await?;
    common::create_topic(client.clone(), &output, 2, "delete").await?;
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..1_000)
        .map(|i| {
            let k = i % 40;
            (
                k % 2,
                format!("key-{k}").into_bytes(),
                i.to_string().into_bytes(),
            )
        })
        .collect();
    produce_with(&client, &input, &records).context("writing the input over SASL_SSL")?;

    let dir = tempfile::tempdir()?;
    let mut builder = App::builder(app_id, client.clone());
    builder
        .input(input)
        .state_dir(dir.path())
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .commit_interval(Duration::from_millis(100));
    let (app, _counts) = count::build(&mut builder, &output, false)?;
    let running = app.start()?;
    let result = wait_for(
        "every count, read_committed",
        Duration::from_secs(120),
        || Ok(read_topic_with(&client, &output, 2)?.len() >= records.len()),
    );
    running.shutdown();
    running.wait()?;
    result?;
    let out = read_topic_with(&client, &output, 2)?;
    ensure!(
        out.len() == records.len(),
        "{} outputs for {} inputs",
        out.len(),
        records.len()
    );
    ensure!(
        last_counts(&out).values().all(|n| *n == 25),
        "every key counted 25 times"
    );
    assert_not_logged(&secret)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_is_an_authentication_error_long_before_the_open_timeout()
-> anyhow::Result<()> {
    let (_, client) = secure()?;
    let secret = password(&client)?;
    let wrong = client
        .clone()
        .set("sasl.password", "not-the-password-at-all");
    let open_timeout = Duration::from_secs(30);
    let dir = tempfile::tempdir()?;

    let started = Instant::now();
    let error = LoggedStore::open(
        dir.path().join("s"),
        &RocksDbOptions::default(),
        config(&wrong, &unique_topic("secure-wrong")).open_timeout(open_timeout),
    )
    .expect_err("a wrong password opened a store");
    let took = started.elapsed();
    eprintln!("a wrong password: the open failed after {took:?}");
    ensure!(
        matches!(
            &error,
            ChangelogError::Security {
                failure: SecurityFailure::Authentication(_),
                ..
            }
        ),
        "not an authentication error: {error:?}"
    );
    ensure!(
        took < open_timeout / 2,
        "the open took {took:?}: it waited for the timeout"
    );
    let message = error.to_string();
    ensure!(message.contains("SASL authentication failed"), "{message}");
    ensure!(
        !message.contains("not-the-password") && !message.contains(&secret),
        "{message}"
    );

    // The task runtime's start says the same, as early.
    let started = Instant::now();
    let mut builder = App::builder(unique_topic("secure-wrong-app"), wrong.clone());
    builder
        .input(unique_topic("secure-wrong-in"))
        .state_dir(dir.path());
    let (app, _) = count::build(&mut builder, "unused", false)?;
    let error = match app.start() {
        Ok(_) => anyhow::bail!("an application started with a wrong password"),
        Err(error) => error,
    };
    ensure!(
        matches!(
            &error,
            TaskError::Cluster { source, .. }
                if matches!(**source, MetadataError::Security(SecurityFailure::Authentication(_)))
        ),
        "not an authentication error: {error:?}"
    );
    let took = started.elapsed();
    eprintln!("a wrong password: the application's start failed after {took:?}");
    ensure!(took < Duration::from_secs(15), "start took {took:?}");
    assert_not_logged("not-the-password-at-all")?;
    assert_not_logged(&secret)
}

#[test]
fn a_client_without_tls_cannot_use_the_tls_listener() -> anyhow::Result<()> {
    let (broker, _) = secure()?;
    let tls = ClientProperties::from_file(broker.ssl_properties())?;
    let dir = tempfile::tempdir()?;
    let options = RocksDbOptions::default();
    let topic = unique_topic("secure-tls");

    // With TLS and the broker's CA: works (so the failures below are the client's settings).
    let store = LoggedStore::open(dir.path().join("ok"), &options, config(&tls, &topic))?;
    store.put(b"k", b"v")?;
    store.flush()?;
    store.close()?;

    let plaintext = tls.clone().set("security.protocol", "plaintext");
    let open_timeout = Duration::from_secs(8);
    let error = LoggedStore::open(
        dir.path().join("plain"),
        &options,
        config(&plaintext, &topic).open_timeout(open_timeout),
    )
    .expect_err("a plaintext client used the TLS listener");
    ensure!(
        matches!(
            error,
            ChangelogError::BrokerUnreachable { .. } | ChangelogError::Security { .. }
        ),
        "{error:?}"
    );
    // librdkafka's hint reaches the error: the user learns what to fix.
    let message = error.to_string();
    ensure!(message.contains("security.protocol"), "{message}");
    Ok(())
}

#[test]
fn a_certificate_from_another_ca_is_refused() -> anyhow::Result<()> {
    let (broker, _) = secure()?;
    let dir = tempfile::tempdir()?;
    let other_ca = dir.path().join("other-ca.pem");
    make_ca(&dir.path().join("other-ca.key"), &other_ca)?;
    for file in [broker.ssl_properties(), broker.sasl_ssl_properties()] {
        let client = ClientProperties::from_file(&file)?
            .set("ssl.ca.location", other_ca.to_str().context("path")?);
        let started = Instant::now();
        let error = LoggedStore::open(
            dir.path().join("s"),
            &RocksDbOptions::default(),
            config(&client, &unique_topic("secure-ca")).open_timeout(Duration::from_secs(30)),
        )
        .expect_err("a broker certificate from an untrusted CA was accepted");
        ensure!(
            matches!(
                &error,
                ChangelogError::Security {
                    failure: SecurityFailure::Tls(_),
                    ..
                }
            ),
            "{} : not a TLS error: {error:?}",
            file.display()
        );
        ensure!(
            error.to_string().contains("verify"),
            "the message does not say the certificate failed verification: {error}"
        );
        let took = started.elapsed();
        eprintln!(
            "{}, another CA: the open failed after {took:?}",
            file.display()
        );
        ensure!(took < Duration::from_secs(15), "took {took:?}");
    }
    Ok(())
}

/// A self-signed CA certificate at `cert` (key at `key`), made with the `openssl` command.
fn make_ca(key: &Path, cert: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=kstate-test-other-ca", "-keyout"])
        .arg(key)
        .arg("-out")
        .arg(cert)
        .stderr(std::process::Stdio::null())
        .status()
        .context("running openssl (apt-get install openssl)")?;
    ensure!(status.success(), "openssl req failed: {status}");
    Ok(())
}

#[test]
fn secrets_stay_out_of_debug_and_errors() -> anyhow::Result<()> {
    let (_, client) = secure()?;
    let secret = password(&client)?;
    let config = config(&client, &unique_topic("secure-debug"));
    for shown in [
        format!("{client:?}"),
        client.to_string(),
        format!("{config:?}"),
        format!("{:?}", RestoreClients::new(&config)?),
    ] {
        ensure!(!shown.contains(&secret), "shown: {shown}");
        ensure!(
            shown.contains("sasl.password"),
            "the property is not even named: {shown}"
        );
    }
    // A Java-style property holding the password: librdkafka refuses it, quoting the value.
    let java = client.clone().set(
        "sasl.jaas.config",
        format!("ScramLoginModule required username=\"kstate\" password=\"{secret}\";"),
    );
    let dir = tempfile::tempdir()?;
    let error = LoggedStore::open(
        dir.path().join("s"),
        &RocksDbOptions::default(),
        ChangelogConfig::new(java, unique_topic("secure-java"), 0).partitions(1),
    )
    .expect_err("librdkafka has no sasl.jaas.config");
    let shown = format!("{error} {error:?}");
    ensure!(shown.contains("sasl.jaas.config"), "{shown}");
    ensure!(
        !shown.contains(&secret),
        "the error quotes the password: {shown}"
    );
    assert_not_logged(&secret)
}
