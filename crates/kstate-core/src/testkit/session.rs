//! Session store conformance: scenarios and a model-based property test over every engine
//! (logged ones mapped by [`SessionChangelog`]). The model is a `BTreeMap` of
//! (key, end, start) → value and a stream time (the latest end put).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Harness;
use crate::session::{Session, SessionChangelog, SessionOptions, SessionPut, SessionStore};
use crate::store::KeyValueStore;

/// Sessions kept 50 ms behind stream time in segments of 20 ms.
pub fn small_sessions() -> SessionOptions {
    SessionOptions::new(Duration::from_millis(50)).segment_interval(Duration::from_millis(20))
}

fn open<H: Harness>(harness: &mut H) -> SessionStore<H::Store> {
    let options = small_sessions();
    let store = harness.open_mapped(Arc::new(SessionChangelog::new(&options)));
    SessionStore::open(store, options).unwrap()
}

fn reopen<H: Harness>(harness: &mut H, s: SessionStore<H::Store>) -> SessionStore<H::Store> {
    let options = *s.options();
    SessionStore::open(harness.reopen(s.into_inner()), options).unwrap()
}

fn find<S: KeyValueStore>(
    s: &SessionStore<S>,
    key: &[u8],
    earliest_end: i64,
    latest_start: i64,
) -> Vec<(i64, i64, Vec<u8>)> {
    s.find_sessions(key, earliest_end, latest_start)
        .unwrap()
        .map(|r| r.map(|s| (s.start, s.end, s.value)))
        .collect::<Result<_, _>>()
        .unwrap()
}

fn count(joined: &[Session]) -> Vec<u8> {
    let before: u64 = joined
        .iter()
        .map(|s| u64::from_be_bytes(s.value[..8].try_into().unwrap()))
        .sum();
    (before + 1).to_be_bytes().to_vec()
}

pub fn records_within_the_gap_join_one_session<H: Harness>(h: &mut H) {
    let s = open(h);
    let gap = Duration::from_millis(5);
    for t in [10, 14, 30, 18] {
        s.merge(b"k", t, gap, count).unwrap();
    }
    // 10, 14, 18 are one session; 30 is 12 ms later: another.
    assert_eq!(
        find(&s, b"k", 0, 100),
        [
            (10, 18, 3u64.to_be_bytes().to_vec()),
            (30, 30, 1u64.to_be_bytes().to_vec())
        ]
    );
    // 24 is 6 after 18 and 6 before 30: a session of its own.
    s.merge(b"k", 24, gap, count).unwrap();
    assert_eq!(find(&s, b"k", 0, 100).len(), 3);
    // 22 is within 5 of 18 and of 24 (not of 30): it joins the first two.
    let (_, merged) = s.merge(b"k", 22, gap, count).unwrap();
    let merged = merged.unwrap();
    assert_eq!((merged.start, merged.end), (10, 24));
    assert_eq!(merged.value, 5u64.to_be_bytes().to_vec());
    assert_eq!(find(&s, b"other", 0, 100), []);
    s.into_inner().close().unwrap();
}

pub fn find_sessions_honours_its_bounds_and_removes_remove<H: Harness>(h: &mut H) {
    let s = open(h);
    s.put(b"k", 0, 10, b"a").unwrap();
    s.put(b"k", 20, 30, b"b").unwrap();
    s.put(b"k\x00", 5, 25, b"other key").unwrap();
    assert_eq!(find(&s, b"k", 11, 100), [(20, 30, b"b".to_vec())]);
    assert_eq!(find(&s, b"k", 0, 19), [(0, 10, b"a".to_vec())]);
    assert_eq!(s.fetch_session(b"k", 20, 30).unwrap(), Some(b"b".to_vec()));
    s.remove(b"k", 20, 30).unwrap();
    assert_eq!(s.fetch_session(b"k", 20, 30).unwrap(), None);
    assert_eq!(find(&s, b"k", 0, 100), [(0, 10, b"a".to_vec())]);
    s.into_inner().close().unwrap();
}

pub fn expired_sessions_are_refused_and_survive_no_reopen<H: Harness>(h: &mut H) {
    let mut s = open(h);
    s.put(b"k", 0, 10, b"old").unwrap();
    s.put(b"k", 95, 100, b"new").unwrap();
    s.inner().flush().unwrap();
    s = reopen(h, s);
    assert_eq!(s.stream_time(), Some(100));
    // Ends at or before 100 - 50 are gone, after the reopen as before it.
    assert_eq!(
        s.put(b"k", 40, 50, b"late").unwrap(),
        SessionPut::Expired { stream_time: 100 }
    );
    assert_eq!(
        find(&s, b"k", i64::MIN, i64::MAX),
        [(95, 100, b"new".to_vec())]
    );
    s.into_inner().close().unwrap();
}

/// Generates one `#[test]` per session scenario, and the model test.
#[macro_export]
macro_rules! session_tests {
    ($harness:expr, cases = $cases:expr) => {
        mod session_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::session_tests!(@tests $harness;
                records_within_the_gap_join_one_session,
                find_sessions_honours_its_bounds_and_removes_remove,
                expired_sessions_are_refused_and_survive_no_reopen
            );

            #[test]
            fn random_session_operations_match_a_model() {
                let mut harness = $harness;
                $crate::testkit::session::check_against_model(&mut harness, $cases);
            }
        }
    };
    (@tests $harness:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let mut harness = $harness;
                $crate::testkit::session::$name(&mut harness);
            }
        )*
    };
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
pub enum SessionOp {
    /// Merge a record at a time with a gap.
    Merge(Vec<u8>, i64, u8),
    /// Remove a session of the model's, by index (modulo its size).
    Remove(usize),
    /// Compare `find_sessions`.
    Find(Vec<u8>, i64, i64),
    /// Commit the store underneath.
    Flush,
    /// Close and reopen.
    Reopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0xff]), 0..=2)
}

fn op() -> impl Strategy<Value = SessionOp> {
    prop_oneof![
        8 => (key(), 0i64..300, 0u8..15).prop_map(|(k, t, g)| SessionOp::Merge(k, t - 20, g)),
        1 => any::<usize>().prop_map(SessionOp::Remove),
        3 => (key(), 0i64..300, 0i64..300).prop_map(|(k, a, b)| SessionOp::Find(k, a - 20, b - 20)),
        1 => Just(SessionOp::Flush),
        1 => Just(SessionOp::Reopen),
    ]
}

#[derive(Default)]
struct Model {
    /// (key, end, start) → value.
    sessions: BTreeMap<(Vec<u8>, i64, i64), Vec<u8>>,
    stream_time: Option<i64>,
    retention: i64,
}

impl Model {
    fn min_live(&self) -> i64 {
        self.stream_time
            .map_or(i64::MIN, |t| t - self.retention + 1)
    }

    fn find(&self, key: &[u8], earliest_end: i64, latest_start: i64) -> Vec<(i64, i64, Vec<u8>)> {
        let lo = earliest_end.max(self.min_live());
        self.sessions
            .iter()
            .filter(|((k, end, start), _)| k == key && *end >= lo && *start <= latest_start)
            .map(|((_, end, start), v)| (*start, *end, v.clone()))
            .collect()
    }
}

fn run_ops<H: Harness>(harness: &mut H, ops: &[SessionOp]) -> Result<(), TestCaseError> {
    let mut s = open(harness);
    let mut model = Model {
        retention: small_sessions().retention_ms(),
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        match op {
            SessionOp::Merge(k, t, gap) => {
                let gap_ms = i64::from(*gap);
                let joined = model.find(k, t - gap_ms, t + gap_ms);
                let start = joined.iter().map(|j| j.0).fold(*t, i64::min);
                let end = joined.iter().map(|j| j.1).fold(*t, i64::max);
                let (put, _) = s
                    .merge(k, *t, Duration::from_millis(u64::from(*gap)), count)
                    .unwrap();
                if end < model.min_live() {
                    prop_assert!(matches!(put, SessionPut::Expired { .. }), "step {}", step);
                    continue;
                }
                prop_assert_eq!(put, SessionPut::Stored, "step {}", step);
                let before: u64 = joined
                    .iter()
                    .map(|j| u64::from_be_bytes(j.2[..8].try_into().unwrap()))
                    .sum();
                for (js, je, _) in &joined {
                    model.sessions.remove(&(k.clone(), *je, *js));
                }
                model
                    .sessions
                    .insert((k.clone(), end, start), (before + 1).to_be_bytes().to_vec());
                model.stream_time = Some(model.stream_time.map_or(end, |n| n.max(end)));
            }
            SessionOp::Remove(i) => {
                if model.sessions.is_empty() {
                    continue;
                }
                let (k, end, start) = model
                    .sessions
                    .keys()
                    .nth(i % model.sessions.len())
                    .unwrap()
                    .clone();
                s.remove(&k, start, end).unwrap();
                model.sessions.remove(&(k, end, start));
            }
            SessionOp::Find(k, a, b) => {
                prop_assert_eq!(find(&s, k, *a, *b), model.find(k, *a, *b), "step {}", step);
            }
            SessionOp::Flush => s.inner().flush().unwrap(),
            SessionOp::Reopen => {
                s = reopen(harness, s);
                prop_assert_eq!(s.stream_time(), model.stream_time, "step {} reopened", step);
            }
        }
    }
    for key in [
        &b""[..],
        b"\x00",
        b"\x01",
        b"\xff",
        b"\x00\x00",
        b"\x01\xff",
    ] {
        prop_assert_eq!(
            find(&s, key, i64::MIN, i64::MAX),
            model.find(key, i64::MIN, i64::MAX)
        );
    }
    s.into_inner().close().unwrap();
    Ok(())
}

/// Runs `cases` random sequences of up to 40 operations. Panics with the shrunk failing
/// sequence when the engine disagrees with the model.
pub fn check_against_model<H: Harness>(harness: &mut H, cases: u32) {
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
        panic!("session store disagrees with the model: {e}");
    }
}
