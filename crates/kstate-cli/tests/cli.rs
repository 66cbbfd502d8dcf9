//! The `kstate` binary against a real broker and real store directories: every subcommand's
//! output, `verify` failing on a tampered store and naming the key, `restore` then `verify`
//! passing, `diff`, `reseed` after the changelog topic was deleted, `restore --follow` stopped by
//! SIGTERM, a locked directory refused, bad arguments refused with a clear message, and the
//! same over SASL_SSL with a properties file, where a wrong password is named and no secret is
//! printed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kstate_core::KeyValueStore;
use kstate_kafka::{ChangelogConfig, ClientProperties, LoggedStore, StoreLocation};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore, StateDir};
use serde_json::Value;

fn kstate(args: &[&str]) -> Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_kstate"))
        .args(args)
        .env_remove("KAFKA_BOOTSTRAP_SERVERS")
        .output()?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `kstate` and checks its exit code; returns stdout.
fn expect(code: i32, args: &[&str]) -> Result<String> {
    let out = kstate(args)?;
    ensure!(
        out.status.code() == Some(code),
        "kstate {args:?} exited {:?}, expected {code}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

fn config(client: impl Into<ClientProperties>, topic: &str) -> ChangelogConfig {
    ChangelogConfig::new(client, topic, 0)
        .partitions(1)
        .open_timeout(Duration::from_secs(30))
}

/// A logged store at `dir` holding `key-0`..`key-99` = `value-i`, with `key-5` deleted,
/// committed and closed. Returns its last changelog offset.
fn make_store(dir: &Path, client: impl Into<ClientProperties>, topic: &str) -> Result<i64> {
    let store = LoggedStore::open(dir, &RocksDbOptions::default(), config(client, topic))?;
    for i in 0..100 {
        store.put(
            format!("key-{i}").as_bytes(),
            format!("value-{i}").as_bytes(),
        )?;
    }
    store.delete(b"key-5")?;
    store.flush()?;
    let offset = store.committed_position()?.context("no position")?.offset;
    store.close()?;
    Ok(offset)
}

/// Changes the store at `dir` behind its changelog's back.
fn tamper(dir: &Path, f: impl FnOnce(&RocksDbStore) -> kstate_core::Result<()>) -> Result<()> {
    let raw = RocksDbStore::open(dir, &RocksDbOptions::default())?;
    f(&raw)?;
    raw.close()?;
    Ok(())
}

#[test]
fn inspect_dump_and_verify_and_verify_names_a_tampered_key() -> Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let topic = kstate_test_broker::unique_topic("cli-verify");
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("store");
    let offset = make_store(&dir, &servers, &topic)?;
    let d = dir.to_str().context("path")?;

    let inspected: Value = serde_json::from_str(&expect(
        0,
        &["inspect", d, "--bootstrap-servers", &servers, "--json"],
    )?)?;
    ensure!(inspected["topic"] == topic.as_str(), "{inspected}");
    ensure!(
        inspected["partition"] == 0 && inspected["offset"] == offset,
        "{inspected}"
    );
    ensure!(inspected["format_version"] == 1, "{inspected}");
    ensure!(inspected["changelog"]["lag"] == 0, "{inspected}");
    ensure!(inspected["changelog"]["high"] == offset + 1, "{inspected}");
    let human = expect(0, &["inspect", d])?;
    ensure!(
        human.contains(&format!("stored offset   {offset}")),
        "{human}"
    );

    let dumped = expect(
        0,
        &[
            "dump",
            d,
            "--key-format",
            "utf8",
            "--value-format",
            "utf8",
            "--prefix",
            "key-1",
            "--json",
        ],
    )?;
    let entries: Vec<Value> = dumped
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    // key-1, key-10..key-19 in key order.
    ensure!(entries.len() == 11, "{dumped}");
    ensure!(
        entries[0]["key"] == "key-1" && entries[0]["value"] == "value-1",
        "{dumped}"
    );
    ensure!(entries[1]["key"] == "key-10", "{dumped}");
    let limited = expect(0, &["dump", d, "--key-format", "utf8", "--limit", "3"])?;
    ensure!(limited.lines().count() == 3, "{limited}");
    ensure!(limited.starts_with("key-0\t0x76616c75652d30"), "{limited}");

    let agreed = expect(0, &["verify", d, "--bootstrap-servers", &servers])?;
    ensure!(
        agreed.contains("agrees") && agreed.contains("99 keys"),
        "{agreed}"
    );

    tamper(&dir, |s| s.put(b"key-7", b"changed behind its back"))?;
    let differs = expect(
        1,
        &[
            "verify",
            d,
            "--bootstrap-servers",
            &servers,
            "--key-format",
            "utf8",
        ],
    )?;
    eprintln!("$ kstate verify {d} --key-format utf8\n{differs}");
    ensure!(differs.contains("different  key-7"), "{differs}");
    ensure!(
        differs.contains("0 missing") && differs.contains("1 different"),
        "{differs}"
    );

    tamper(&dir, |s| {
        s.delete(b"key-8")?;
        s.put(b"zzz", b"extra")
    })?;
    let counted: Value = serde_json::from_str(&expect(
        1,
        &[
            "verify",
            d,
            "--bootstrap-servers",
            &servers,
            "--key-format",
            "utf8",
            "--json",
        ],
    )?)?;
    ensure!(counted["agrees"] == false, "{counted}");
    ensure!(
        counted["missing"] == 1 && counted["extra"] == 1 && counted["different"] == 1,
        "{counted}"
    );
    ensure!(counted["first_missing"][0] == "key-8", "{counted}");
    ensure!(counted["first_extra"][0] == "zzz", "{counted}");
    Ok(())
}

#[test]
fn restore_then_verify_and_diff() -> Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let topic = kstate_test_broker::unique_topic("cli-restore");
    let tmp = tempfile::tempdir()?;
    let (a, b) = (tmp.path().join("a"), tmp.path().join("nested/b"));
    let offset = make_store(&a, &servers, &topic)?;
    let (a, b) = (a.to_str().context("path")?, b.to_str().context("path")?);

    let restored = expect(
        0,
        &[
            "restore",
            "--bootstrap-servers",
            &servers,
            "--topic",
            &topic,
            "--partition",
            "0",
            b,
        ],
    )?;
    ensure!(
        restored.contains(&format!("offsets 0..{}", offset + 1))
            && restored.contains(&format!("{} records", offset + 1)),
        "{restored}"
    );
    expect(0, &["verify", b, "--bootstrap-servers", &servers])?;
    let same = expect(0, &["diff", a, b])?;
    ensure!(same.contains("hold the same entries"), "{same}");

    // Again: resumes from the stored offset, nothing to replay.
    let again: Value = serde_json::from_str(&expect(
        0,
        &[
            "restore",
            "--bootstrap-servers",
            &servers,
            "--topic",
            &topic,
            "--partition",
            "0",
            b,
            "--json",
        ],
    )?)?;
    ensure!(
        again["records"] == 0 && again["start_offset"] == offset + 1,
        "{again}"
    );

    tamper(Path::new(b), |s| s.put(b"key-3", b"other"))?;
    let differ = expect(1, &["diff", a, b, "--key-format", "utf8"])?;
    ensure!(differ.contains("different  key-3"), "{differ}");

    // A topic that does not exist is an error, never created by restore.
    let missing = kstate(&[
        "restore",
        "--bootstrap-servers",
        &servers,
        "--topic",
        "no-such-topic-kstate-cli",
        "--partition",
        "0",
        &format!("{b}-other"),
    ])?;
    ensure!(missing.status.code() == Some(3), "{missing:?}");
    Ok(())
}

#[test]
fn restore_follow_applies_new_records_until_sigterm() -> Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let topic = kstate_test_broker::unique_topic("cli-follow");
    let tmp = tempfile::tempdir()?;
    let (a, standby) = (tmp.path().join("a"), tmp.path().join("standby"));
    make_store(&a, &servers, &topic)?;
    let mut follower = Command::new(env!("CARGO_BIN_EXE_kstate"))
        .args([
            "restore",
            "--bootstrap-servers",
            &servers,
            "--topic",
            &topic,
            "--partition",
            "0",
            "--follow",
        ])
        .arg(&standby)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // New records while it follows.
    let store = LoggedStore::open(&a, &RocksDbOptions::default(), config(&servers, &topic))?;
    store.put(b"late", b"arrival")?;
    store.close()?;
    drop(store);
    std::thread::sleep(Duration::from_secs(3));
    Command::new("kill")
        .args(["-TERM", &follower.id().to_string()])
        .status()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while follower.try_wait()?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "the follower did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = follower.wait_with_output()?;
    ensure!(out.status.success(), "follower: {out:?}");
    let s = standby.to_str().context("path")?;
    let dumped = expect(
        0,
        &[
            "dump",
            s,
            "--key-format",
            "utf8",
            "--value-format",
            "utf8",
            "--prefix",
            "late",
        ],
    )?;
    ensure!(dumped.trim() == "late\tarrival", "{dumped}");
    expect(0, &["diff", a.to_str().context("path")?, s])?;
    Ok(())
}

#[tokio::test]
async fn reseed_writes_a_deleted_changelog_back() -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let servers = kstate_test_broker::bootstrap_servers()?;
    let topic = kstate_test_broker::unique_topic("cli-reseed");
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("store");
    make_store(&dir, &servers, &topic)?;
    let d = dir.to_str().context("path")?.to_string();

    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &servers)
        .create()?;
    admin.delete_topics(&[&topic], &AdminOptions::new()).await?;
    // Until the broker has forgotten the topic, a reseed would find it still there.
    let servers_ = servers.clone();
    let topic_ = topic.clone();
    let gone = tokio::task::spawn_blocking(move || -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &servers_)
                .create()?;
            let md = rdkafka::consumer::Consumer::fetch_metadata(
                &consumer,
                Some(&topic_),
                Duration::from_secs(10),
            )?;
            if md.topics().iter().all(|t| t.partitions().is_empty()) {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "topic {topic_} not deleted");
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    gone.await??;

    // The store refuses to open without its changelog; reseed puts it back.
    let reseeded = tokio::task::spawn_blocking({
        let (d, servers, topic) = (d.clone(), servers.clone(), topic.clone());
        move || {
            expect(
                0,
                &[
                    "reseed",
                    &d,
                    "--topic",
                    &topic,
                    "--partitions",
                    "1",
                    "--bootstrap-servers",
                    &servers,
                ],
            )
        }
    })
    .await??;
    ensure!(reseeded.contains("99 records"), "{reseeded}");
    let verified = tokio::task::spawn_blocking(move || {
        expect(0, &["verify", &d, "--bootstrap-servers", &servers])
    })
    .await??;
    ensure!(verified.contains("agrees"), "{verified}");
    Ok(())
}

/// A store of a task's RocksDB of the older layout (the bytes an older kstate wrote: a
/// fixture) is named `<task directory>/<store>`, where the oldest layout kept its directory; the
/// task directory itself is refused with the names of its stores. In the fixtures a store's
/// offset is its generation * 100 + 41.
#[test]
fn a_store_of_a_tasks_rocksdb_is_inspected_by_its_old_path() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = layout_fixture("v2_task_dir", tmp.path())?;
    let task = root.join("0");
    ensure!(inspected_offset(&task.join("counts"))? == 2041);
    ensure!(inspected_offset(&root.join("1").join("events"))? == 2141);
    let out = kstate(&["inspect", task.to_str().context("path")?])?;
    let err = text(&out.stderr);
    ensure!(
        out.status.code() == Some(3) && err.contains("counts, events") && err.contains("<store>"),
        "{err}"
    );
    let missing = kstate(&["inspect", task.join("nope").to_str().context("path")?])?;
    ensure!(
        missing.status.code() == Some(3)
            && text(&missing.stderr).contains("holds no store \"nope\""),
        "{}",
        text(&missing.stderr)
    );
    ensure!(
        !root.join("rocksdb").exists(),
        "reading created a shared RocksDB"
    );
    Ok(())
}

/// A store of a task in the RocksDB its application's tasks share
/// (`<app>/rocksdb`) is named `<app>/<p>/<store>` too, and that RocksDB itself is refused with
/// the form to use.
#[test]
fn a_store_of_a_task_in_the_shared_rocksdb_is_inspected_and_verified_by_its_task_path() -> Result<()>
{
    let servers = kstate_test_broker::bootstrap_servers()?;
    let topic = kstate_test_broker::unique_topic("cli-shared");
    let tmp = tempfile::tempdir()?;
    let app = tmp.path().join("app");
    {
        let state = StateDir::open(&app, &["counts"], &RocksDbOptions::default())?;
        let other = kstate_test_broker::unique_topic("cli-shared-4");
        for (task, n, topic) in [(3u32, 7, &topic), (4, 2, &other)] {
            let location = StoreLocation::InTask {
                db: state.open_task(task, &["counts"])?,
                name: "counts".into(),
            };
            let store = LoggedStore::open(
                location,
                &RocksDbOptions::default(),
                config(&servers, topic),
            )?;
            for i in 0..n {
                store.put(format!("key-{i}").as_bytes(), b"v")?;
            }
            store.close()?;
        }
    }
    let counts = app.join("3").join("counts");
    let c = counts.to_str().context("path")?;
    let inspected: Value = serde_json::from_str(&expect(
        0,
        &["inspect", c, "--bootstrap-servers", &servers, "--json"],
    )?)?;
    ensure!(
        inspected["topic"] == topic.as_str()
            && inspected["offset"] == 6
            && inspected["approximate_keys"] == 7,
        "{inspected}"
    );
    expect(0, &["verify", c, "--bootstrap-servers", &servers])?;
    let out = kstate(&["inspect", app.join("rocksdb").to_str().context("path")?])?;
    let err = text(&out.stderr);
    ensure!(
        out.status.code() == Some(3) && err.contains("<partition>/<store>"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_directory_open_elsewhere_is_refused() -> Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let topic = kstate_test_broker::unique_topic("cli-locked");
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("store");
    make_store(&dir, &servers, &topic)?;
    let held = RocksDbStore::open(&dir, &RocksDbOptions::default())?;
    let d = dir.to_str().context("path")?;
    for args in [
        vec!["inspect", d],
        vec!["dump", d],
        vec!["verify", d, "--bootstrap-servers", &servers],
    ] {
        let out = kstate(&args)?;
        let stderr = text(&out.stderr);
        ensure!(out.status.code() == Some(3), "{args:?}: {out:?}");
        ensure!(
            stderr.contains("already open") && stderr.contains(d),
            "{args:?}: {stderr}"
        );
    }
    drop(held);
    Ok(())
}

#[test]
fn bad_arguments_get_a_clear_message_and_a_nonzero_exit() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let d = tmp.path().to_str().context("path")?;
    for (args, code, says) in [
        (vec!["dump"], 2, "Usage"),
        (vec!["frobnicate"], 2, "unrecognized subcommand"),
        (vec!["dump", d, "--key-format", "nope"], 2, "invalid value"),
        (
            vec!["dump", d, "--prefix", "a", "--from", "b"],
            2,
            "cannot be used with",
        ),
        (
            vec!["dump", d, "--key-format", "u64", "--prefix", "x"],
            3,
            "is not a u64",
        ),
        (vec!["inspect", d], 3, "not a store directory"),
        (vec!["verify", d], 3, "KAFKA_BOOTSTRAP_SERVERS"),
        (
            vec![
                "restore",
                d,
                "--topic",
                "t",
                "--partition",
                "0",
                "--client-property",
                "novalue",
            ],
            2,
            "KEY=VALUE",
        ),
    ] {
        let out = kstate(&args)?;
        let stderr = text(&out.stderr);
        ensure!(
            out.status.code() == Some(code) && stderr.contains(says),
            "{args:?}: exit {:?}, stderr {stderr}",
            out.status.code()
        );
    }
    // Every subcommand has help with an example.
    for sub in ["inspect", "dump", "verify", "restore", "diff", "reseed"] {
        let help = expect(0, &[sub, "--help"])?;
        ensure!(
            help.contains("Example"),
            "{sub} --help has no example:\n{help}"
        );
    }
    Ok(())
}

#[test]
fn restore_and_verify_over_sasl_ssl_and_a_wrong_password_is_named_never_printed() -> Result<()> {
    let broker = kstate_test_broker::secure_broker()?;
    let file = broker.sasl_ssl_properties();
    let client = ClientProperties::from_file(&file)?;
    let secret = client
        .get("sasl.password")
        .context("no password")?
        .to_string();
    let topic = kstate_test_broker::unique_topic("cli-secure");
    let tmp = tempfile::tempdir()?;
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let offset = make_store(&a, client.clone(), &topic)?;
    let (b, file_arg) = (b.to_str().context("path")?, file.to_str().context("path")?);

    let mut printed = String::new();
    let restore = [
        "restore",
        "--client-properties-file",
        file_arg,
        "--topic",
        &topic,
        "--partition",
        "0",
        b,
    ];
    let out = kstate(&restore)?;
    printed.push_str(&text(&out.stdout));
    printed.push_str(&text(&out.stderr));
    ensure!(out.status.success(), "{out:?}");
    ensure!(
        printed.contains(&format!("{} records", offset + 1)),
        "{printed}"
    );
    let out = kstate(&["verify", b, "--client-properties-file", file_arg])?;
    printed.push_str(&text(&out.stdout));
    printed.push_str(&text(&out.stderr));
    ensure!(out.status.success(), "{out:?}");
    // The file names the brokers, so an ambient KAFKA_BOOTSTRAP_SERVERS (here a port nothing
    // listens on) does not replace them: a shell's local broker address never receives the
    // file's credentials.
    let out = Command::new(env!("CARGO_BIN_EXE_kstate"))
        .args(["verify", b, "--client-properties-file", file_arg])
        .env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
        .output()?;
    printed.push_str(&text(&out.stdout));
    printed.push_str(&text(&out.stderr));
    ensure!(
        out.status.success(),
        "KAFKA_BOOTSTRAP_SERVERS replaced the file's brokers: {out:?}"
    );

    // A wrong password: named as an authentication failure, at once, and never printed.
    let wrong_file = tmp.path().join("wrong.properties");
    let wrong = std::fs::read_to_string(&file)?
        .lines()
        .map(|line| {
            if line.starts_with("sasl.password=") {
                "sasl.password=wrong-password-for-the-test".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&wrong_file, wrong)?;
    let started = Instant::now();
    let out = kstate(&[
        "verify",
        b,
        "--client-properties-file",
        wrong_file.to_str().context("path")?,
    ])?;
    let stderr = text(&out.stderr);
    printed.push_str(&text(&out.stdout));
    printed.push_str(&stderr);
    ensure!(out.status.code() == Some(3), "{out:?}");
    ensure!(stderr.contains("SASL authentication failed"), "{stderr}");
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    // On the command line instead of the file: still never echoed.
    let out = kstate(&[
        "verify",
        b,
        "--client-properties-file",
        file_arg,
        "--client-property",
        "sasl.password=wrong-password-for-the-test",
    ])?;
    printed.push_str(&text(&out.stdout));
    printed.push_str(&text(&out.stderr));
    ensure!(out.status.code() == Some(3), "{out:?}");
    ensure!(
        !printed.contains(&secret),
        "the password was printed:\n{printed}"
    );
    ensure!(
        !printed.contains("wrong-password-for-the-test"),
        "the wrong password was printed:\n{printed}"
    );
    Ok(())
}

/// A copy of storage layout fixture `name` (`crates/kstate-rocksdb/tests/fixtures/layouts`,
/// bytes older kstate versions wrote) in `into`.
fn layout_fixture(name: &str, into: &Path) -> Result<std::path::PathBuf> {
    fn copy(from: &Path, to: &Path) -> Result<()> {
        std::fs::create_dir_all(to)?;
        for entry in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                copy(&entry.path(), &to.join(entry.file_name()))?;
            } else {
                std::fs::copy(entry.path(), to.join(entry.file_name()))?;
            }
        }
        Ok(())
    }
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kstate-rocksdb/tests/fixtures/layouts")
        .join(name);
    let root = into.join(name);
    copy(&from, &root)?;
    Ok(root)
}

fn inspected_offset(store: &Path) -> Result<Value> {
    let path = store.to_str().context("path")?;
    let inspected: Value = serde_json::from_str(&expect(0, &["inspect", path, "--json"])?)?;
    Ok(inspected["offset"].clone())
}

/// Where older copies of a store are left beside the one the application keeps (a move cut
/// short by a kill, or a task directory kept for a store no longer declared), the tool reads
/// the application's: the shared RocksDB's, whether the older
/// copy is a task's RocksDB (layout 2) or a directory of the store's own (layout 1), and it
/// moves nothing. In the fixtures a store's offset is its generation * 100 + 41.
#[test]
fn a_store_with_older_copies_left_beside_it_is_read_from_the_shared_rocksdb() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    // Layout 2's `0/` (generation 50) beside the shared RocksDB (51).
    let root = layout_fixture("v3_mid_move", tmp.path())?;
    ensure!(inspected_offset(&root.join("0/counts"))? == 5141);
    ensure!(
        root.join("0/CURRENT").is_file(),
        "the older copy was left alone"
    );
    // Layout 1's `0/counts/` (generation 10) beside the shared RocksDB (60).
    let root = layout_fixture("v3_shared", tmp.path())?;
    let v1 = layout_fixture("v1_store_dirs", &tmp.path().join("v1"))?;
    std::fs::create_dir(root.join("0"))?;
    std::fs::rename(v1.join("0/counts"), root.join("0/counts"))?;
    ensure!(inspected_offset(&root.join("0/counts"))? == 6041);
    ensure!(inspected_offset(&root.join("1/counts"))? == 6041);
    // Layout 1 alone: the directory itself.
    ensure!(inspected_offset(&v1.join("1/counts"))? == 1141);
    // Layout 2's `0/` kept beside the shared RocksDB (60) for a store the application no longer
    // declares (`retired`, generation 40): the declared store is read from the shared RocksDB,
    // the undeclared one from the only copy there is.
    let root = layout_fixture("v3_shared", &tmp.path().join("kept"))?;
    let v2 = layout_fixture("v2_undeclared_store", &tmp.path().join("v2"))?;
    std::fs::rename(v2.join("0"), root.join("0"))?;
    ensure!(inspected_offset(&root.join("0/counts"))? == 6041);
    ensure!(inspected_offset(&root.join("0/retired"))? == 4041);
    Ok(())
}

/// The tool writes a store of a task only where the application reads it: into the shared
/// RocksDB, never into an older layout's RocksDB.
#[test]
fn writing_a_store_of_a_task_without_a_shared_rocksdb_is_refused() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = layout_fixture("v2_task_dir", tmp.path())?;
    let path = root.join("0/counts");
    let out = kstate(&[
        "restore",
        path.to_str().context("path")?,
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--partition",
        "0",
    ])?;
    let err = text(&out.stderr);
    ensure!(
        out.status.code() == Some(3)
            && err.contains("older layout")
            && err.contains("start the application"),
        "exit {:?}: {err}",
        out.status.code()
    );
    ensure!(
        !root.join("rocksdb").exists(),
        "a shared RocksDB was created"
    );
    Ok(())
}
