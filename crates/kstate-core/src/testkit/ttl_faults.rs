//! TTL stores under aborts and crashes: the [`faults`](super::faults) kit's random sequences,
//! with a model of TTL's own.
//!
//! Why a model of its own: a TTL store holds one entry per key (a put replaces the key's entry,
//! live or not), never refuses a write, and its sweep deletes what expired with ordinary
//! deletes, in the same commit as the rest. The window and session model keys entries by their
//! time and refuses expired writes. What the kit checks here: a sweep never deletes a live key,
//! an aborted or crashed sweep brings back nothing visible, stream time (moved by `observe`
//! alone, a local key) survives a commit, and a crash keeps what the engine promises.
//!
//! The model: key → (value, expiry) and stream time, now and at the last commit; a key is
//! visible while its expiry is after stream time. A crash of an engine that keeps uncommitted
//! writes keeps the entries, and stream time is the committed one or the latest a write since
//! carried, as for windows.

use std::collections::BTreeMap;
use std::ops::Bound::Unbounded;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::faults::{FaultOp, Faults, KEYS, Timeline, Uncommitted, op};
use crate::range::Order;
use crate::store::KeyValueStore;
use crate::ttl::{TtlChangelog, TtlOptions, TtlStore};

/// The default time to live; a put's own is `TTL_MS + 5 × length`, so keys expire at varied
/// times within a few steps.
const TTL_MS: u64 = 30;

fn options() -> TtlOptions {
    TtlOptions::new(Duration::from_millis(TTL_MS))
}

/// Key → (value, expiry).
type Entries = BTreeMap<Vec<u8>, (Vec<u8>, i64)>;

#[derive(Debug, Default)]
struct Model {
    t: Timeline<Entries>,
}

impl Model {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>, time: i64, ttl: i64) {
        self.t
            .now
            .entries
            .insert(key, (value, time.saturating_add(ttl)));
        self.t.logged_write(time);
    }

    fn live(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let now = self.t.now.stream_time.unwrap_or(i64::MIN);
        self.t
            .now
            .entries
            .iter()
            .filter(|(_, (_, expires))| *expires > now)
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect()
    }
}

fn contents<S: KeyValueStore>(store: &TtlStore<S>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    store
        .scan(Unbounded, Unbounded, Order::Forward)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn run_ops<H: Faults>(harness: &mut H, ops: &[FaultOp]) -> Result<(), TestCaseError> {
    let keeps = harness.crash_keeps();
    let open = |store| TtlStore::open(store, options()).unwrap();
    let mut ttl = Some(open(harness.open_mapped(Arc::new(TtlChangelog))));
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        let s = ttl.as_ref().unwrap();
        match op {
            FaultOp::Put(k, t, len, byte) => {
                let key = KEYS[*k].to_vec();
                let life = TTL_MS + 5 * (*len as u64);
                s.put_with_ttl(&key, &[*byte], *t, Duration::from_millis(life))
                    .unwrap();
                model.put(key, vec![*byte], *t, life as i64);
            }
            FaultOp::Observe(t) => {
                s.observe(*t).unwrap();
                model.t.observe(*t);
            }
            FaultOp::Commit => {
                // As the task runtime does: sweep, then commit.
                s.sweep(usize::MAX).unwrap();
                harness.commit(s.inner());
                model.t.commit();
            }
            FaultOp::Abort => {
                if harness.abort(s.inner()) {
                    model.t.abort();
                    // What the store holds in memory (its stream time) may be ahead of the
                    // committed state; open it again, as the task runtime does.
                    let store = ttl.take().unwrap().into_inner();
                    ttl = Some(open(store));
                }
            }
            FaultOp::Crash => {
                if keeps == Uncommitted::Unknown {
                    harness.commit(s.inner());
                    model.t.commit();
                }
                let store = ttl.take().unwrap().into_inner();
                ttl = Some(open(harness.crash(store)));
                model.t.crash(keeps);
            }
            FaultOp::Read => {
                prop_assert_eq!(contents(s), model.live(), "step {} contents", step);
            }
        }
        let s = ttl.as_ref().unwrap();
        prop_assert_eq!(
            s.stream_time(),
            model.t.now.stream_time,
            "step {} stream time",
            step
        );
    }
    let s = ttl.take().unwrap();
    prop_assert_eq!(contents(&s), model.live(), "final contents");
    harness.commit(s.inner());
    s.into_inner().close().unwrap();
    Ok(())
}

/// Runs `cases` random sequences of up to 40 steps on TTL stores over `harness`'s stores.
/// Panics with the shrunk failing sequence when the engine disagrees with the model.
pub fn check_ttl<H: Faults>(harness: &mut H, cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let harness = std::cell::RefCell::new(harness);
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        run_ops(*harness.borrow_mut(), &ops)
    });
    if let Err(e) = result {
        panic!("a TTL store under aborts and crashes disagrees with the model: {e}");
    }
}

/// Runs the sequences that once broke an engine on TTL stores.
pub(super) fn check_known_sequences<H: Faults>(
    harness: &mut H,
    sequences: &[(&str, Vec<FaultOp>)],
) {
    for (what, ops) in sequences {
        if let Err(e) = run_ops(harness, ops) {
            panic!("a TTL store, {what} ({ops:?}): {e}");
        }
    }
}
