//! TTL store conformance: scenarios and a model-based property test over every engine (logged
//! ones mapped by [`TtlChangelog`]). The model is a `BTreeMap` of key → (expiry, value) and a
//! stream time; a key is visible while its expiry is after stream time.

use std::collections::BTreeMap;
use std::ops::Bound::{self, Excluded, Included, Unbounded};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Harness;
use crate::range::{KeyRange, Order};
use crate::store::KeyValueStore;
use crate::ttl::{TtlChangelog, TtlOptions, TtlStore};

fn open<H: Harness>(harness: &mut H) -> TtlStore<H::Store> {
    let store = harness.open_mapped(Arc::new(TtlChangelog));
    TtlStore::open(store, TtlOptions::new(Duration::from_millis(30))).unwrap()
}

fn reopen<H: Harness>(harness: &mut H, s: TtlStore<H::Store>) -> TtlStore<H::Store> {
    let options = *s.options();
    TtlStore::open(harness.reopen(s.into_inner()), options).unwrap()
}

type Entries = Vec<(Vec<u8>, Vec<u8>)>;

fn scan<S: KeyValueStore>(
    s: &TtlStore<S>,
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    order: Order,
) -> Entries {
    s.scan(from, to, order)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Keys the engine still holds entries for, expired or not.
fn stored_keys<S: KeyValueStore>(s: &TtlStore<S>) -> Vec<Vec<u8>> {
    s.inner()
        .scan(&KeyRange::prefix(&[0x01]), Order::Forward)
        .unwrap()
        .map(|e| e.unwrap().0[1..].to_vec())
        .collect()
}

pub fn expired_keys_are_invisible_at_once<H: Harness>(h: &mut H) {
    let s = open(h);
    s.put(b"a", b"1", 0).unwrap();
    s.put(b"b", b"2", 10).unwrap();
    assert_eq!(s.get(b"a").unwrap(), Some(b"1".to_vec()));
    s.put(b"c", b"3", 30).unwrap(); // a expires at 30
    assert_eq!(s.get(b"a").unwrap(), None);
    assert_eq!(
        scan(&s, Unbounded, Unbounded, Order::Forward),
        [
            (b"b".to_vec(), b"2".to_vec()),
            (b"c".to_vec(), b"3".to_vec())
        ]
    );
    // A write of its own time to live.
    s.put_with_ttl(b"d", b"4", 30, Duration::from_millis(1))
        .unwrap();
    s.put(b"c", b"3", 31).unwrap();
    assert_eq!(s.get(b"d").unwrap(), None);
    s.into_inner().close().unwrap();
}

pub fn a_swept_key_is_gone_from_the_store_and_after_a_reopen<H: Harness>(h: &mut H) {
    let mut s = open(h);
    s.put(b"old", b"v", 0).unwrap();
    s.put(b"kept", b"v", 25).unwrap();
    s.put(b"rewritten", b"v", 0).unwrap();
    s.put(b"rewritten", b"v2", 20).unwrap(); // its first index entry is stale now
    s.put(b"clock", b"v", 40).unwrap();
    assert_eq!(s.sweep(100).unwrap(), 1, "only `old` expired");
    assert_eq!(
        stored_keys(&s),
        [b"clock".to_vec(), b"kept".to_vec(), b"rewritten".to_vec()]
    );
    // Committed: a changelog-backed store sent the tombstone with the commit.
    s.inner().flush().unwrap();
    s = reopen(h, s);
    assert_eq!(s.stream_time(), Some(40));
    assert_eq!(s.get(b"old").unwrap(), None);
    assert!(!stored_keys(&s).contains(&b"old".to_vec()));
    assert_eq!(s.get(b"rewritten").unwrap(), Some(b"v2".to_vec()));
    // Nothing is due again until stream time moves.
    assert_eq!(s.sweep(100).unwrap(), 0);
    s.into_inner().close().unwrap();
}

pub fn a_sweep_deletes_at_most_its_limit<H: Harness>(h: &mut H) {
    let s = open(h);
    for i in 0..10u8 {
        s.put(&[i], b"v", i64::from(i)).unwrap();
    }
    s.put(b"now", b"v", 100).unwrap();
    assert_eq!(s.sweep(4).unwrap(), 4);
    assert_eq!(stored_keys(&s).len(), 7);
    assert_eq!(s.sweep(100).unwrap(), 6);
    assert_eq!(stored_keys(&s), [b"now".to_vec()]);
    s.into_inner().close().unwrap();
}

/// Generates one `#[test]` per TTL scenario, and the model test.
#[macro_export]
macro_rules! ttl_tests {
    ($harness:expr, cases = $cases:expr) => {
        mod ttl_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::ttl_tests!(@tests $harness;
                expired_keys_are_invisible_at_once,
                a_swept_key_is_gone_from_the_store_and_after_a_reopen,
                a_sweep_deletes_at_most_its_limit
            );

            #[test]
            fn random_ttl_operations_match_a_model() {
                let mut harness = $harness;
                $crate::testkit::ttl::check_against_model(&mut harness, $cases);
            }
        }
    };
    (@tests $harness:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let mut harness = $harness;
                $crate::testkit::ttl::$name(&mut harness);
            }
        )*
    };
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
pub enum TtlOp {
    /// Put at a time, with the default or its own time to live.
    Put(Vec<u8>, Vec<u8>, i64, Option<u8>),
    /// Delete.
    Delete(Vec<u8>),
    /// Compare a get.
    Get(Vec<u8>),
    /// Compare a scan.
    Scan(Bound<Vec<u8>>, Bound<Vec<u8>>, Order),
    /// Sweep up to this many.
    Sweep(usize),
    /// Commit the store underneath.
    Flush,
    /// Close and reopen.
    Reopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0xff]), 0..=2)
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        Just(Unbounded),
        key().prop_map(Included),
        key().prop_map(Excluded)
    ]
}

fn op() -> impl Strategy<Value = TtlOp> {
    prop_oneof![
        6 => (key(), prop::collection::vec(any::<u8>(), 0..3), 0i64..200, prop::option::of(1u8..60))
            .prop_map(|(k, v, t, ttl)| TtlOp::Put(k, v, t, ttl)),
        1 => key().prop_map(TtlOp::Delete),
        3 => key().prop_map(TtlOp::Get),
        2 => (bound(), bound(), prop::sample::select(vec![Order::Forward, Order::Reverse]))
            .prop_map(|(a, b, o)| TtlOp::Scan(a, b, o)),
        2 => (0usize..5).prop_map(TtlOp::Sweep),
        1 => Just(TtlOp::Flush),
        1 => Just(TtlOp::Reopen),
    ]
}

#[derive(Default)]
struct Model {
    entries: BTreeMap<Vec<u8>, (i64, Vec<u8>)>,
    stream_time: Option<i64>,
}

impl Model {
    fn now(&self) -> i64 {
        self.stream_time.unwrap_or(i64::MIN)
    }

    fn live(&self) -> impl Iterator<Item = (&Vec<u8>, &Vec<u8>)> {
        let now = self.now();
        self.entries
            .iter()
            .filter(move |(_, (expires, _))| *expires > now)
            .map(|(k, (_, v))| (k, v))
    }
}

fn run_ops<H: Harness>(harness: &mut H, ops: &[TtlOp]) -> Result<(), TestCaseError> {
    let mut s = open(harness);
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        match op {
            TtlOp::Put(k, v, t, ttl) => {
                let ttl_ms = ttl.map_or(30, i64::from);
                match ttl {
                    Some(ttl) => s
                        .put_with_ttl(k, v, *t, Duration::from_millis(u64::from(*ttl)))
                        .unwrap(),
                    None => s.put(k, v, *t).unwrap(),
                }
                model.entries.insert(k.clone(), (t + ttl_ms, v.clone()));
                model.stream_time = Some(model.stream_time.map_or(*t, |n| n.max(*t)));
            }
            TtlOp::Delete(k) => {
                s.delete(k).unwrap();
                model.entries.remove(k);
            }
            TtlOp::Get(k) => {
                let expected = model
                    .live()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.clone());
                prop_assert_eq!(s.get(k).unwrap(), expected, "step {}", step);
            }
            TtlOp::Scan(a, b, order) => {
                let range =
                    KeyRange::new(a.as_ref().map(Vec::as_slice), b.as_ref().map(Vec::as_slice));
                let mut expected: Entries = model
                    .live()
                    .filter(|(k, _)| range.contains(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if *order == Order::Reverse {
                    expected.reverse();
                }
                let got = scan(
                    &s,
                    a.as_ref().map(Vec::as_slice),
                    b.as_ref().map(Vec::as_slice),
                    *order,
                );
                prop_assert_eq!(got, expected, "step {}", step);
            }
            TtlOp::Sweep(limit) => {
                // A sweep changes nothing a reader sees; what it deleted is gone from the
                // engine, and never a live key.
                s.sweep(*limit).unwrap();
                let now = model.now();
                let stored = stored_keys(&s);
                for (k, (expires, _)) in &model.entries {
                    if *expires > now {
                        prop_assert!(stored.contains(k), "step {}: live key {:?} swept", step, k);
                    }
                }
                model.entries.retain(|k, _| stored.contains(k));
            }
            TtlOp::Flush => s.inner().flush().unwrap(),
            TtlOp::Reopen => {
                s = reopen(harness, s);
                prop_assert_eq!(s.stream_time(), model.stream_time, "step {} reopened", step);
            }
        }
    }
    let everything = scan(&s, Unbounded, Unbounded, Order::Forward);
    let expected: Entries = model.live().map(|(k, v)| (k.clone(), v.clone())).collect();
    prop_assert_eq!(everything, expected, "final contents");
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
        panic!("TTL store disagrees with the model: {e}");
    }
}
