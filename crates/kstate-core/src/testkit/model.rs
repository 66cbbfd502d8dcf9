//! Model-based property test: random operation sequences applied to an engine and to a
//! `BTreeMap`, compared after every read and at the end.
//!
//! Keys come from a five-symbol alphabet (`00 01 7f 80 ff`) and are at most three bytes long, so
//! sequences overwrite, delete and range over the same keys often, and bounds fall on the
//! byte-order corners (empty key, sign bit, `0xff` prefixes). `Reopen` closes the store and opens
//! it again through the harness, which must keep every write (engines' close flushes).

use std::collections::BTreeMap;
use std::ops::Bound;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::{Harness, WritePath};
use crate::range::{KeyRange, Order};
use crate::store::{Entry, KeyValueStore, Mutation};

/// One step of a random sequence.
#[derive(Debug, Clone)]
pub enum Op {
    /// Apply these mutations through this write path.
    Write(WritePath, Vec<Mutation>),
    /// Compare one key.
    Get(Vec<u8>),
    /// Compare a scan.
    Scan(Bound<Vec<u8>>, Bound<Vec<u8>>, Order),
    /// Compare a prefix scan.
    Prefix(Vec<u8>),
    /// Close and reopen.
    Reopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop::sample::select(vec![0x00u8, 0x01, 0x7f, 0x80, 0xff]),
        0..=3,
    )
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        Just(Bound::Unbounded),
        key().prop_map(Bound::Included),
        key().prop_map(Bound::Excluded),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        key(),
        prop::option::weighted(0.75, prop::collection::vec(any::<u8>(), 0..8)),
    )
}

/// The strategy for one operation.
pub fn op() -> impl Strategy<Value = Op> {
    let path = prop::sample::select(WritePath::ALL.to_vec());
    prop_oneof![
        8 => (path, prop::collection::vec(mutation(), 1..6)).prop_map(|(p, m)| Op::Write(p, m)),
        3 => key().prop_map(Op::Get),
        3 => (bound(), bound(), prop::sample::select(vec![Order::Forward, Order::Reverse]))
            .prop_map(|(a, b, o)| Op::Scan(a, b, o)),
        1 => key().prop_map(Op::Prefix),
        1 => Just(Op::Reopen),
    ]
}

fn model_scan(model: &BTreeMap<Vec<u8>, Vec<u8>>, range: &KeyRange, order: Order) -> Vec<Entry> {
    if range.is_empty() {
        return Vec::new();
    }
    let it = model
        .range::<[u8], _>(range.as_bounds())
        .map(|(k, v)| (k.clone(), v.clone()));
    match order {
        Order::Forward => it.collect(),
        Order::Reverse => it.rev().collect(),
    }
}

fn run_ops<H: Harness>(harness: &mut H, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut store = harness.open();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let scan = |s: &H::Store, range: &KeyRange, order| -> Vec<Entry> {
        s.scan(range, order)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Write(path, mutations) => {
                path.apply(&store, mutations);
                for (k, v) in mutations {
                    match v {
                        Some(v) => model.insert(k.clone(), v.clone()),
                        None => model.remove(k),
                    };
                }
            }
            Op::Get(k) => prop_assert_eq!(
                store.get(k).unwrap(),
                model.get(k).cloned(),
                "step {}",
                step
            ),
            Op::Scan(a, b, order) => {
                let range =
                    KeyRange::new(a.as_ref().map(Vec::as_slice), b.as_ref().map(Vec::as_slice));
                prop_assert_eq!(
                    scan(&store, &range, *order),
                    model_scan(&model, &range, *order),
                    "step {}",
                    step
                );
            }
            Op::Prefix(p) => {
                let got: Vec<Entry> = store
                    .prefix_scan(p)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                prop_assert_eq!(
                    got,
                    model_scan(&model, &KeyRange::prefix(p), Order::Forward),
                    "step {}",
                    step
                );
            }
            Op::Reopen => store = harness.reopen(store),
        }
    }
    let everything = scan(&store, &KeyRange::all(), Order::Forward);
    prop_assert_eq!(
        everything,
        model_scan(&model, &KeyRange::all(), Order::Forward),
        "final contents"
    );
    store.close().unwrap();
    Ok(())
}

/// Runs `cases` random sequences of up to 40 operations against fresh stores from `harness`.
/// Panics with the shrunk failing sequence when an engine disagrees with the model.
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
        panic!("engine disagrees with the BTreeMap model: {e}");
    }
}
