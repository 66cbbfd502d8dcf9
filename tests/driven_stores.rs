//! Stores driven from outside (what the task runtime builds on): many stores sending through one
//! shared producer, a restore as a cancellable step of its own, and a follower that keeps
//! applying a changelog until it is promoted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::streams::wait_for;
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_kafka::{
    CancelToken, ChangelogConfig, ChangelogError, LoggedStore, OpenHooks, RestoreClients,
    RestoredStore, SharedProducer, follow_changelog,
};
use kstate::kstate_rocksdb::RocksDbOptions;
use kstate_test_broker::unique_topic;

fn key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn stores_sharing_one_producer_restore_exactly_what_each_wrote() -> anyhow::Result<()> {
    let topic = unique_topic("shared-producer");
    let dir = tempfile::tempdir()?;
    let servers = kstate_test_broker::bootstrap_servers()?;
    let config = |p: i32| -> anyhow::Result<ChangelogConfig> {
        Ok(ChangelogConfig::new(servers.clone(), topic.clone(), p)
            .partitions(3)
            .delivery_timeout(Duration::from_secs(20)))
    };
    let producer = SharedProducer::new(&config(0)?)?;
    let mut stores = Vec::new();
    for p in 0..3 {
        let restored = RestoredStore::restore(
            dir.path().join(format!("p{p}")),
            &RocksDbOptions::default(),
            config(p)?,
            &OpenHooks::default(),
        )?;
        stores.push(LoggedStore::attach(restored, &producer)?);
    }
    // Interleaved writes: every partition's acknowledgements must reach its own store, in order
    // (a mix-up breaks the offset contiguity check and poisons).
    for i in 0..3_000u32 {
        let store = &stores[(i % 3) as usize];
        if i % 11 == 5 {
            store.delete(&key(i - 3))?;
        } else {
            store.put(&key(i), &i.to_le_bytes())?;
        }
    }
    let mut expected = Vec::new();
    for store in &stores {
        store.commit()?;
        expected.push(common::contents(store)?);
        store.close()?;
    }
    drop(stores);
    for p in 0..3 {
        let end = common::high_watermark(&topic, p)?;
        assert_eq!(
            common::fold_changelog(&topic, p, end)?,
            expected[p as usize],
            "partition {p}: changelog and store"
        );
        let reopened = LoggedStore::open(
            dir.path().join(format!("p{p}")),
            &RocksDbOptions::default(),
            config(p)?,
        )?;
        assert_eq!(
            reopened.restore_report().records,
            0,
            "committed: nothing to replay"
        );
        assert_eq!(common::contents(&reopened)?, expected[p as usize]);
        reopened.close()?;
    }
    Ok(())
}

/// The task runtime's restorer keeps one set of clients for every restore it runs. Each restore
/// through it must read its own topic partition and nothing of the one before (the consumer is
/// reassigned each time), including a topic that the restore itself has just created (its leader
/// still being elected: a warm client is told "not leader" at once, and must ask again).
#[tokio::test(flavor = "multi_thread")]
async fn one_set_of_restore_clients_restores_store_after_store_each_exactly_its_own()
-> anyhow::Result<()> {
    let (first, second, fresh) = (
        unique_topic("clients-a"),
        unique_topic("clients-b"),
        unique_topic("clients-new"),
    );
    let dir = tempfile::tempdir()?;
    let config = |topic: &str, p: i32, partitions: i32| -> anyhow::Result<ChangelogConfig> {
        Ok(
            ChangelogConfig::new(kstate_test_broker::bootstrap_servers()?, topic, p)
                .partitions(partitions)
                .open_timeout(Duration::from_secs(30))
                .delivery_timeout(Duration::from_secs(20)),
        )
    };
    let mut expected = Vec::new();
    for (topic, p, partitions, rows) in [
        (&first, 0, 2, 3_000u32),
        (&first, 1, 2, 2_000),
        (&second, 0, 1, 1_000),
    ] {
        let store = LoggedStore::open(
            dir.path().join(format!("writer-{topic}-{p}")),
            &RocksDbOptions::default(),
            config(topic, p, partitions)?,
        )?;
        for i in 0..rows {
            store.put(&key(i), format!("{topic}/{p}/{i}").as_bytes())?;
        }
        expected.push((config(topic, p, partitions)?, common::contents(&store)?));
        store.close()?;
    }
    // A topic nobody wrote: the restore creates it, then reads its (empty) end at once.
    expected.push((config(&fresh, 0, 1)?, Default::default()));
    // The first store once more, into another directory: nothing of the others may leak in.
    expected.push(expected[0].clone());

    let clients = RestoreClients::new(&expected[0].0)?;
    for (n, (config, contents)) in expected.iter().enumerate() {
        let path = dir.path().join(format!("restored-{n}"));
        let restored = RestoredStore::restore_with(
            &path,
            &RocksDbOptions::default(),
            config.clone(),
            &OpenHooks::default(),
            &clients,
        )?;
        assert_eq!(
            restored.report().records,
            contents.len() as u64,
            "restore {n}"
        );
        drop(restored);
        let reopened = LoggedStore::open(&path, &RocksDbOptions::default(), config.clone())?;
        assert_eq!(
            reopened.restore_report().records,
            0,
            "restore {n} was complete"
        );
        assert_eq!(
            &common::contents(&reopened)?,
            contents,
            "restore {n}: {}",
            config.topic()
        );
        reopened.close()?;
    }

    // Clients made for other client properties are refused, without printing their values.
    let other = expected[0]
        .0
        .clone()
        .client_property("sasl.password", "hunter2");
    let err = RestoredStore::restore_with(
        dir.path().join("refused"),
        &RocksDbOptions::default(),
        other,
        &OpenHooks::default(),
        &clients,
    )
    .expect_err("clients for another configuration");
    assert!(matches!(err, ChangelogError::InvalidConfig { .. }), "{err}");
    let clients_with_secret = RestoreClients::new(
        &expected[0]
            .0
            .clone()
            .client_property("sasl.password", "hunter2"),
    );
    if let Ok(c) = &clients_with_secret {
        assert!(!format!("{c:?}").contains("hunter2"));
    }
    assert!(!err.to_string().contains("hunter2"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_restore_stops_with_a_typed_error_and_leaves_a_usable_directory()
-> anyhow::Result<()> {
    let topic = unique_topic("cancel");
    let dir = tempfile::tempdir()?;
    {
        let store = LoggedStore::open(
            dir.path().join("writer"),
            &RocksDbOptions::default(),
            common::changelog(&topic)?,
        )?;
        for i in 0..5_000u32 {
            store.put(&key(i), b"v")?;
        }
        store.close()?;
    }
    let cancel = CancelToken::new();
    cancel.cancel();
    let hooks = OpenHooks {
        cancel: Some(cancel),
        ..OpenHooks::default()
    };
    let path = dir.path().join("fresh");
    let err = RestoredStore::restore(
        &path,
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
        &hooks,
    )
    .expect_err("cancelled before it started");
    assert!(
        matches!(&err, ChangelogError::Cancelled { topic: t, partition: 0 } if *t == topic),
        "{err}"
    );
    // The next restore of the same directory completes.
    let store = LoggedStore::open(
        &path,
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )?;
    assert_eq!(store.approximate_len()?, 5_000);
    assert_eq!(store.get(&key(4_999))?.as_deref(), Some(&b"v"[..]));
    store.close()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_keeps_up_and_its_promotion_replays_nothing() -> anyhow::Result<()> {
    let topic = unique_topic("follow");
    let dir = tempfile::tempdir()?;
    let writer = LoggedStore::open(
        dir.path().join("active"),
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )?;
    for i in 0..1_000u32 {
        writer.put(&key(i), b"first")?;
    }
    writer.commit()?;

    let stop = CancelToken::new();
    let recorder = Arc::new(common::Recorder::default());
    let follower = {
        let (path, config, stop, recorder) = (
            dir.path().join("standby"),
            common::changelog(&topic)?,
            stop.clone(),
            recorder.clone(),
        );
        std::thread::spawn(move || {
            follow_changelog(
                path,
                &RocksDbOptions::default(),
                &config,
                Some(recorder),
                &stop,
            )
            .map_err(anyhow::Error::from)
        })
    };
    // Written after the follower started: it applies them as they come.
    for i in 0..1_000u32 {
        if i % 4 == 0 {
            writer.delete(&key(i))?;
        } else {
            writer.put(&key(i), b"second")?;
        }
    }
    writer.commit()?;
    let end = common::high_watermark(&topic, 0)?;
    wait_for(
        "the follower to apply the last record",
        Duration::from_secs(60),
        || {
            Ok(recorder
                .batches
                .lock()
                .unwrap()
                .last()
                .is_some_and(|b| b.last_offset == end - 1))
        },
    )?;
    stop.cancel();
    let report = follower.join().expect("follower thread")?;
    assert_eq!(report.records, 2_000, "every record, once");

    let expected = common::contents(&writer)?;
    writer.close()?;
    let promoted = LoggedStore::open(
        dir.path().join("standby"),
        &RocksDbOptions::default(),
        common::changelog(&topic)?,
    )?;
    assert_eq!(
        promoted.restore_report().records,
        0,
        "the follower was up to date"
    );
    assert_eq!(common::contents(&promoted)?, expected);
    promoted.close()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_for_outputs_never_reorders_a_stores_acknowledgements() -> anyhow::Result<()> {
    // The task runtime waits for its outputs on every commit while its stores keep sending. An
    // earlier version did that with librdkafka's flush, which serves delivery reports on the
    // caller's thread as well as the producer's: in the end-to-end benchmark a partition's
    // acknowledgements then arrived out of order and the store poisoned itself (once in 1,000,000
    // records). This volume run did not reproduce that race with the old flush (3 runs), so it
    // only guards the path: 200,000 records and outputs, a commit every 500, no poison, every
    // output counted. (The old flush also took 13x as long here: 41 s against 3 s.)
    let topic = unique_topic("outputs-and-changelog");
    let output = unique_topic("outputs");
    let servers = kstate_test_broker::bootstrap_servers()?;
    common::create_topic(&servers, &output, 1, "delete").await?;
    let dir = tempfile::tempdir()?;
    let config = common::changelog(&topic)?;
    let producer = SharedProducer::new(&config)?;
    let restored = RestoredStore::restore(
        dir.path().join("store"),
        &RocksDbOptions::default(),
        config,
        &OpenHooks::default(),
    )?;
    let store = LoggedStore::attach(restored, &producer)?;
    for i in 0..200_000u32 {
        store.put(&key(i % 5_000), &i.to_le_bytes())?;
        producer.send_output(&output, 0, &key(i), Some(b"out"), Duration::from_secs(20))?;
        if i % 500 == 499 {
            producer.flush(Duration::from_secs(30))?;
            store.commit()?;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    store.commit()?;
    assert_eq!(producer.outputs(), (200_000, 200_000));
    assert_eq!(common::high_watermark(&output, 0)?, 200_000);
    store.close()?;
    Ok(())
}

/// Partition `p` of a two-partition changelog `topic` on the tests' cluster.
fn two_partitions(topic: &str, p: i32) -> anyhow::Result<ChangelogConfig> {
    Ok(ChangelogConfig::new(common::client()?, topic, p)
        .partitions(2)
        .open_timeout(Duration::from_secs(30))
        .delivery_timeout(Duration::from_secs(20)))
}

/// The ends a task runtime prefetches for an assignment serve the restores that resume, with no
/// round trip of their own; an end older than what the store holds (written after the prefetch)
/// is never taken for the partition's end: the store is decided on an end captured for it, not
/// refused as a store of a recreated topic.
#[tokio::test(flavor = "multi_thread")]
async fn prefetched_ends_serve_restores_and_one_older_than_the_store_is_asked_again()
-> anyhow::Result<()> {
    let topic = unique_topic("prefetch");
    let dir = tempfile::tempdir()?;
    let config = |p: i32| two_partitions(&topic, p);
    for p in 0..2 {
        let store = LoggedStore::open(
            dir.path().join(format!("p{p}")),
            &RocksDbOptions::default(),
            config(p)?,
        )?;
        common::write_keys(&store, 0..100)?;
        store.close()?;
    }
    let clients = RestoreClients::new(&config(0)?)?;
    assert_eq!(clients.prefetch_ends(&[config(0)?, config(1)?], None)?, 2);

    // Partition 0 moves on after the prefetch: 50 records more than its prefetched end says.
    let store = LoggedStore::open(
        dir.path().join("p0"),
        &RocksDbOptions::default(),
        config(0)?,
    )?;
    common::write_keys(&store, 100..150)?;
    let expected0 = common::contents(&store)?;
    store.close()?;
    drop(store);

    let restore = |path: &str, p: i32| -> anyhow::Result<RestoredStore> {
        Ok(RestoredStore::restore_with(
            dir.path().join(path),
            &RocksDbOptions::default(),
            config(p)?,
            &OpenHooks::default(),
            &clients,
        )?)
    };
    let restored = restore("p0", 0)?;
    assert_eq!(
        restored.report().start.end_offset,
        150,
        "the end asked again"
    );
    assert_eq!(restored.report().records, 0);
    restored.close()?;
    let reopened = LoggedStore::open(
        dir.path().join("p0"),
        &RocksDbOptions::default(),
        config(0)?,
    )?;
    assert_eq!(common::contents(&reopened)?, expected0);
    reopened.close()?;

    // Partition 1's prefetched end is right and serves its restore ...
    let restored = restore("p1", 1)?;
    assert_eq!(restored.report().start.end_offset, 100);
    assert_eq!(restored.report().records, 0);
    restored.close()?;
    // ... once: a second restore of the partition asks for its end itself, and replays it all.
    let restored = restore("p1-again", 1)?;
    assert_eq!(restored.report().start.end_offset, 100);
    assert_eq!(restored.report().records, 100);
    restored.close()?;
    Ok(())
}

/// Writes 100 records to `config`'s partition, has `clients` prefetch its end (100), then writes
/// 50 more: a writer that went on past a prefetched end.
fn write_past_a_prefetch(
    dir: &std::path::Path,
    config: &ChangelogConfig,
    clients: &RestoreClients,
) -> anyhow::Result<()> {
    let writer = LoggedStore::open(
        dir.join("writer"),
        &RocksDbOptions::default(),
        config.clone(),
    )?;
    common::write_keys(&writer, 0..100)?;
    writer.commit()?;
    assert_eq!(
        clients.prefetch_ends(std::slice::from_ref(config), None)?,
        1
    );
    common::write_keys(&writer, 100..150)?;
    writer.close()?;
    Ok(())
}

/// Sets of restore clients made sharing one cluster's clients (a task runtime's restorer
/// threads) share what those learned: an end prefetched through one set serves a restore through
/// another, which asks the broker for nothing of its own. The end is told apart from one the
/// restore would ask for itself by records written after the prefetch, which it leaves out.
#[tokio::test(flavor = "multi_thread")]
async fn an_end_prefetched_through_one_set_serves_a_restore_through_another_of_its_cluster()
-> anyhow::Result<()> {
    let topic = unique_topic("prefetch-shared");
    let dir = tempfile::tempdir()?;
    let config = two_partitions(&topic, 0)?;
    let prefetching = RestoreClients::new(&config)?;
    let restoring = RestoreClients::sharing(prefetching.cluster().clone(), &config)?;
    write_past_a_prefetch(dir.path(), &config, &prefetching)?;

    let restored = RestoredStore::restore_with(
        dir.path().join("fresh"),
        &RocksDbOptions::default(),
        config.clone(),
        &OpenHooks::default(),
        &restoring,
    )?;
    assert_eq!(
        restored.report().start.end_offset,
        100,
        "the end prefetched through the other set"
    );
    restored.close()?;

    // A set of another cluster's clients shares nothing, and is refused.
    let elsewhere = ChangelogConfig::new(
        kstate::kstate_kafka::ClientProperties::new("127.0.0.1:1"),
        &topic,
        0,
    );
    let refused = RestoreClients::sharing(prefetching.cluster().clone(), &elsewhere);
    assert!(
        matches!(refused, Err(ChangelogError::InvalidConfig { .. })),
        "clients of another cluster are refused: {refused:?}"
    );
    Ok(())
}

/// A prefetched end also fills an empty store (a new task's): its restore replays up to that end
/// with no round trip of its own. When another writer has gone past that end since, nothing of
/// its records is lost to the store: its first write lands past where the restore ended, and the
/// store is poisoned (a foreign write) instead of storing a position that skips them.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefetched_end_fills_an_empty_store_and_a_writer_past_it_poisons_the_store()
-> anyhow::Result<()> {
    let topic = unique_topic("prefetch-fresh");
    let dir = tempfile::tempdir()?;
    let config = two_partitions(&topic, 0)?;
    let clients = RestoreClients::new(&config)?;
    // Another writer goes on after the prefetch.
    write_past_a_prefetch(dir.path(), &config, &clients)?;

    let restored = RestoredStore::restore_with(
        dir.path().join("fresh"),
        &RocksDbOptions::default(),
        config,
        &OpenHooks::default(),
        &clients,
    )?;
    assert_eq!(
        (
            restored.report().start.end_offset,
            restored.report().records
        ),
        (100, 100),
        "the empty store was filled up to the prefetched end"
    );
    let producer = SharedProducer::new(&two_partitions(&topic, 0)?)?;
    let store = LoggedStore::attach(restored, &producer)?;
    store.put(b"after", b"1")?;
    let committed = store.commit();
    assert!(
        matches!(
            committed,
            Err(kstate::kstate_core::Error::Poisoned {
                reason: kstate::kstate_core::PoisonReason::ForeignWrite {
                    expected_offset: 100,
                    actual_offset: 150
                },
                ..
            })
        ),
        "the write past the other writer's records poisons the store: {committed:?}"
    );
    Ok(())
}

/// The changelog topics of an assignment's new tasks that do not exist are created together,
/// before the restores (one request, where each restore created its own in turn); topics that
/// exist are left as they are; the restores then find every topic as they require it (two
/// partitions, compacted) and the prefetch finds every end. A missing topic whose partition count
/// is not configured cannot be created: the error names it.
#[tokio::test(flavor = "multi_thread")]
async fn missing_changelog_topics_are_created_together_and_their_restores_find_them_as_required()
-> anyhow::Result<()> {
    let (a, b, existing) = (
        unique_topic("create-a"),
        unique_topic("create-b"),
        unique_topic("create-existing"),
    );
    common::create_topic(common::client()?, &existing, 2, "compact").await?;
    let dir = tempfile::tempdir()?;
    let mut changelogs = Vec::new();
    for topic in [&a, &b, &existing] {
        for p in 0..2 {
            changelogs.push(two_partitions(topic, p)?);
        }
    }
    let clients = RestoreClients::new(&changelogs[0])?;
    let mut created = clients.create_missing_topics(&changelogs, None)?;
    created.sort();
    assert_eq!(created, [a.clone(), b.clone()], "a and b");
    assert!(
        clients.create_missing_topics(&changelogs, None)?.is_empty(),
        "all exist now"
    );
    // A new topic's partitions have no leader for a moment: the runtime asks for their ends
    // again until they have.
    wait_for(
        "the ends of every partition",
        Duration::from_secs(30),
        || Ok(matches!(clients.prefetch_ends(&changelogs, None), Ok(6))),
    )?;
    // Restores through clients of their own check each topic afresh: partitions, compaction.
    let fresh = RestoreClients::new(&changelogs[0])?;
    for (i, config) in changelogs.iter().enumerate() {
        let restored = RestoredStore::restore_with(
            dir.path().join(i.to_string()),
            &RocksDbOptions::default(),
            config.clone(),
            &OpenHooks::default(),
            &fresh,
        )?;
        assert_eq!(restored.report().records, 0);
        restored.close()?;
    }

    let unsized_topic = unique_topic("create-unsized");
    let unsized_config = ChangelogConfig::new(common::client()?, &unsized_topic, 0);
    match clients.create_missing_topics(&[unsized_config], None) {
        Err(ChangelogError::InvalidConfig { topic, message }) => {
            assert_eq!(topic, unsized_topic);
            assert!(message.contains("partitions"), "{message}");
        }
        other => anyhow::bail!("a topic of unknown partition count was not refused: {other:?}"),
    }
    Ok(())
}

/// A prefetch that finds the changelog topic missing (a fresh start) leaves it alone: the
/// restores that follow, through the same clients, find the topic once it exists, whoever
/// created it.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefetch_that_finds_no_topic_leaves_the_restores_to_find_it_once_created()
-> anyhow::Result<()> {
    let topic = unique_topic("prefetch-missing");
    let dir = tempfile::tempdir()?;
    let config = |p: i32| two_partitions(&topic, p);
    let clients = RestoreClients::new(&config(0)?)?;
    assert_eq!(clients.prefetch_ends(&[config(0)?, config(1)?], None)?, 0);
    // Created by another client, as another restorer thread of the task runtime does.
    common::create_topic(common::client()?, &topic, 2, "compact").await?;
    for p in 0..2 {
        let restored = RestoredStore::restore_with(
            dir.path().join(format!("p{p}")),
            &RocksDbOptions::default(),
            config(p)?,
            &OpenHooks::default(),
            &clients,
        )?;
        assert_eq!(restored.report().records, 0, "partition {p}");
        restored.close()?;
    }
    Ok(())
}
