//! A topology with a session store and a TTL store side by side in the task runtime (the
//! windowed count, with its window store, is `tests/windowed_count.rs`):
//!
//! - sessions merged by the processor through `Context::session_store` are read back by
//!   `Running::query` from another thread;
//! - a TTL key that expires by event time is swept at a commit: its tombstone is in the TTL
//!   store's changelog, so a restore from the changelog alone (a new state directory) does not
//!   bring it back, while a key that has not expired stays.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::streams::wait_for;
use kstate::kstate_core::{BoxError, SessionOptions, TtlOptions};
use kstate::kstate_task::{App, Context, Processor, QueryError, Record, SessionHandle, TtlHandle};
use kstate_test_broker::unique_topic;

const GAP: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(120);
const SECOND: i64 = 1_000;

/// Per record: its key's session (count of records, 8-byte big-endian) and its last value in a
/// TTL store, both by the record's time.
struct Activity {
    sessions: SessionHandle,
    last_seen: TtlHandle,
}

impl Processor for Activity {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let time = record.timestamp.ok_or("no timestamp")?;
        let key = record.key.ok_or("no key")?;
        let sessions = ctx.session_store(&self.sessions);
        sessions.merge(key, time, GAP, |joined| {
            let count: i64 = joined
                .iter()
                .map(|s| i64::from_be_bytes(s.value.as_slice().try_into().unwrap_or([0; 8])))
                .sum();
            (count + 1).to_be_bytes().to_vec()
        })?;
        let last_seen = ctx.ttl_store(&self.last_seen);
        last_seen.observe(time)?;
        last_seen.put(key, record.value.unwrap_or_default(), time)?;
        Ok(())
    }
}

fn send(servers: &str, topic: &str, records: &[(&[u8], i64)]) -> anyhow::Result<()> {
    let records = records
        .iter()
        .map(|(key, time)| (0, *key, &b"seen"[..], *time));
    common::streams::produce_timed(servers, topic, records)
}

fn start(
    app_id: &str,
    servers: &str,
    input: &str,
    state: &std::path::Path,
) -> anyhow::Result<(kstate::kstate_task::Running, SessionHandle)> {
    let mut builder = App::builder(app_id.to_string(), servers.to_string());
    builder
        .input(input.to_string())
        .state_dir(state)
        .commit_interval(Duration::from_millis(100));
    let sessions = builder.session_store("sessions", SessionOptions::new(Duration::from_secs(600)));
    let last_seen = builder.ttl_store("last-seen", TtlOptions::new(TTL));
    let handle = sessions.clone();
    let app = builder.build(move |_| {
        Box::new(Activity {
            sessions: sessions.clone(),
            last_seen: last_seen.clone(),
        })
    })?;
    Ok((app.start()?, handle))
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_queryable_and_expired_ttl_keys_stay_gone_after_a_restore()
-> anyhow::Result<()> {
    let servers = kstate_test_broker::bootstrap_servers()?;
    let input = unique_topic("time-stores-in");
    common::create_topic(&servers, &input, 1, "delete").await?;
    let app_id = unique_topic("time-stores");
    let first_dir = tempfile::tempdir()?;
    let (running, sessions) = start(&app_id, &servers, &input, first_dir.path())?;
    // `a`: two sessions (10–12 s, 30 s); `old` is seen at 1 s only; `new` at 40 s; every time
    // from a recent minute `t0` (`common::recent_minute`).
    let t0 = common::recent_minute();
    send(
        &servers,
        &input,
        &[
            (b"a", t0 + 10 * SECOND),
            (b"old", t0 + SECOND),
            (b"a", t0 + 12 * SECOND),
            (b"a", t0 + 30 * SECOND),
            (b"new", t0 + 40 * SECOND),
        ],
    )?;
    let query = running.query(&sessions);
    wait_for("a's two sessions", WAIT, || {
        let found = match query.find_sessions(0, b"a", 0, i64::MAX) {
            Ok(found) => found,
            Err(QueryError::NotHere { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let got: Vec<(i64, i64, i64)> = found
            .iter()
            .map(|s| {
                let count = i64::from_be_bytes(s.value.as_slice().try_into().unwrap());
                (s.start - t0, s.end - t0, count)
            })
            .collect();
        Ok(got == [(10 * SECOND, 12 * SECOND, 2), (30 * SECOND, 30 * SECOND, 1)])
    })?;
    // Sessions that end before `earliest_end` are left out.
    assert_eq!(
        query
            .find_sessions(0, b"a", t0 + 13 * SECOND, i64::MAX)?
            .len(),
        1
    );
    // Stream time 40 s: `old` (seen at 1 s, time to live 30 s) expired at 31 s; the next commit
    // swept it and sent its tombstone. Wait for the TTL changelog to hold it.
    let changelog = format!("{app_id}-last-seen-changelog");
    wait_for("old's tombstone in the TTL changelog", WAIT, || {
        let end = common::high_watermark(&changelog, 0)?;
        let folded = common::fold_changelog(&changelog, 0, end)?;
        Ok(folded.keys().any(|k| k.ends_with(b"new"))
            && !folded.keys().any(|k| k.ends_with(b"old")))
    })?;
    drop(query);
    drop(running);

    // A new state directory: the stores come back from their changelogs alone.
    let second_dir = tempfile::tempdir()?;
    let (running, sessions) = start(&app_id, &servers, &input, second_dir.path())?;
    let query = running.query(&sessions);
    wait_for("the restored sessions", WAIT, || {
        match query.find_sessions(0, b"a", 0, i64::MAX) {
            Ok(found) => Ok(found.len() == 2),
            Err(QueryError::NotHere { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    })?;
    let end = common::high_watermark(&changelog, 0)?;
    let folded = common::fold_changelog(&changelog, 0, end)?;
    assert!(
        !folded.keys().any(|k| k.ends_with(b"old")),
        "the expired key is back in the TTL changelog"
    );
    drop(query);
    drop(running);
    Ok(())
}
