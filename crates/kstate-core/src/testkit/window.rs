//! Window store conformance: scenarios and a model-based property test, run over every engine
//! (a [`WindowStore`] over the [`Harness`]'s stores, logged ones mapped by [`WindowChangelog`]).
//!
//! The model is a `BTreeMap` of (key, window start, sequence) → value and a stream time: a put
//! older than stream time − retention is refused, and reads see only windows at or after the
//! oldest live time. Segments, range deletes, escaping and the changelog mapping are the
//! engine's business; the model knows none of them.

use std::collections::BTreeMap;
use std::ops::Bound::{self, Excluded, Included, Unbounded};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Harness;
use crate::range::{KeyRange, Order};
use crate::store::KeyValueStore;
use crate::window::{WindowChangelog, WindowOptions, WindowPut, WindowStore};

/// Windows of 10 ms kept 50 ms in segments of 20 ms: small enough that random times cross
/// segments and expire them often.
pub fn small_windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_millis(10))
        .retention(Duration::from_millis(50))
        .segment_interval(Duration::from_millis(20))
}

/// A fresh window store over a store from `harness`.
pub fn open<H: Harness>(harness: &mut H, options: WindowOptions) -> WindowStore<H::Store> {
    let store = harness.open_mapped(Arc::new(WindowChangelog::new(&options)));
    WindowStore::open(store, options).unwrap()
}

/// Closes `window`'s store, reopens it through `harness` and opens the window store again.
pub fn reopen<H: Harness>(harness: &mut H, window: WindowStore<H::Store>) -> WindowStore<H::Store> {
    let options = *window.options();
    let store = harness.reopen(window.into_inner());
    WindowStore::open(store, options).unwrap()
}

type Windowed = Vec<(Vec<u8>, i64, Vec<u8>)>;

fn fetch<S: KeyValueStore>(
    w: &WindowStore<S>,
    key: &[u8],
    lo: i64,
    hi: i64,
    order: Order,
) -> Vec<(i64, Vec<u8>)> {
    let iter = match order {
        Order::Forward => w.fetch(key, lo..=hi),
        Order::Reverse => w.fetch_backward(key, lo..=hi),
    };
    iter.unwrap()
        .map(|e| e.map(|e| (e.start(), e.into_value())))
        .collect::<Result<_, _>>()
        .unwrap()
}

fn windowed<S: KeyValueStore>(iter: crate::window::WindowIter<'_, S>) -> Windowed {
    iter.map(|e| {
        e.map(|e| {
            let (k, t) = (e.key().to_vec(), e.start());
            (k, t, e.into_value())
        })
    })
    .collect::<Result<_, _>>()
    .unwrap()
}

pub fn fetch_returns_a_keys_windows_in_time_order<H: Harness>(h: &mut H) {
    let w = open(h, small_windows());
    for (t, v) in [(20, b"c"), (0, b"a"), (10, b"b"), (30, b"d")] {
        assert_eq!(w.put(b"k", t, Some(v)).unwrap(), WindowPut::Stored);
    }
    w.put(b"other", 10, Some(b"x")).unwrap();
    let forward = fetch(&w, b"k", 0, 30, Order::Forward);
    assert_eq!(
        forward,
        [
            (0, b"a".to_vec()),
            (10, b"b".to_vec()),
            (20, b"c".to_vec()),
            (30, b"d".to_vec())
        ]
    );
    let backward = fetch(&w, b"k", 5, 25, Order::Reverse);
    assert_eq!(backward, [(20, b"c".to_vec()), (10, b"b".to_vec())]);
    assert_eq!(w.get(b"k", 10).unwrap(), Some(b"b".to_vec()));
    assert_eq!(w.get(b"k", 11).unwrap(), None);
    w.put(b"k", 10, None).unwrap();
    assert_eq!(w.get(b"k", 10).unwrap(), None);
    assert_eq!(fetch(&w, b"k", 0, 30, Order::Forward).len(), 3);
    w.into_inner().close().unwrap();
}

pub fn keys_that_prefix_each_other_never_mix<H: Harness>(h: &mut H) {
    let w = open(h, small_windows());
    let keys: [&[u8]; 5] = [b"", b"a", b"a\x00", b"a\x00\xff", b"a\x80"];
    for (i, k) in keys.iter().enumerate() {
        w.put(k, 10, Some(&[i as u8])).unwrap();
        w.put(k, 20, Some(&[i as u8 + 10])).unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            fetch(&w, k, 0, 30, Order::Forward),
            [(10, vec![i as u8]), (20, vec![i as u8 + 10])],
            "key {k:?}"
        );
    }
    let between = windowed(
        w.fetch_keys(Included(b"a"), Included(b"a\x00\xff"), 0..=30)
            .unwrap(),
    );
    let seen: Vec<(Vec<u8>, i64)> = between.into_iter().map(|(k, t, _)| (k, t)).collect();
    assert_eq!(
        seen,
        [
            (b"a".to_vec(), 10),
            (b"a\x00".to_vec(), 10),
            (b"a\x00\xff".to_vec(), 10),
            (b"a".to_vec(), 20),
            (b"a\x00".to_vec(), 20),
            (b"a\x00\xff".to_vec(), 20),
        ]
    );
    let excluded = windowed(
        w.fetch_keys(Excluded(b"a"), Excluded(b"a\x80"), 20..=20)
            .unwrap(),
    );
    let keys_seen: Vec<Vec<u8>> = excluded.into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(keys_seen, [b"a\x00".to_vec(), b"a\x00\xff".to_vec()]);
    w.into_inner().close().unwrap();
}

pub fn expired_windows_are_refused_and_invisible<H: Harness>(h: &mut H) {
    let w = open(h, small_windows());
    w.put(b"k", 0, Some(b"old")).unwrap();
    w.put(b"k", 45, Some(b"new")).unwrap();
    // Stream time 45, retention 50: times from -4 on are live; 0 still is.
    assert_eq!(w.get(b"k", 0).unwrap(), Some(b"old".to_vec()));
    w.put(b"k", 50, Some(b"newer")).unwrap();
    // Stream time 50: times from 1 on are live. Window 0 is gone from reads at once, though
    // its segment (0..20) still has live times and is not dropped yet.
    assert_eq!(w.get(b"k", 0).unwrap(), None);
    assert_eq!(
        w.put(b"k", 0, Some(b"late")).unwrap(),
        WindowPut::Expired { stream_time: 50 }
    );
    assert_eq!(w.expired_writes(), 1);
    assert_eq!(windowed(w.fetch_all(..).unwrap()).len(), 2);
    w.into_inner().close().unwrap();
}

pub fn expired_segments_are_dropped_from_the_store<H: Harness>(h: &mut H) {
    let w = open(h, small_windows());
    for t in (0..60).step_by(10) {
        w.put(b"k", t, Some(b"v")).unwrap();
    }
    // Committed, so that a changelog-backed store's drop finds everything in its engine.
    w.inner().flush().unwrap();
    w.put(b"k", 70, Some(b"v")).unwrap();
    // Stream time 70: times from 21 on live, segment 0 (0..20) wholly expired and dropped;
    // segment 1 (20..40) keeps window 20 stored, though it is invisible.
    let data: Vec<Vec<u8>> = w
        .inner()
        .scan(&KeyRange::prefix(&[0x01]), Order::Forward)
        .unwrap()
        .map(|e| e.unwrap().0)
        .collect();
    assert_eq!(
        data.len(),
        5,
        "windows 20..=70 stored, 0 and 10 dropped: {data:?}"
    );
    assert_eq!(
        fetch(&w, b"k", 0, 100, Order::Forward)
            .into_iter()
            .map(|(t, _)| t)
            .collect::<Vec<_>>(),
        [30, 40, 50, 70]
    );
    w.into_inner().close().unwrap();
}

pub fn stream_time_survives_a_reopen<H: Harness>(h: &mut H) {
    let mut w = open(h, small_windows());
    w.put(b"k", 100, Some(b"v")).unwrap();
    w.inner().flush().unwrap();
    w = reopen(h, w);
    assert_eq!(w.stream_time(), Some(100));
    // Late before the reopen, late after it.
    assert!(matches!(
        w.put(b"k", 40, Some(b"late")).unwrap(),
        WindowPut::Expired { stream_time: 100 }
    ));
    assert_eq!(
        fetch(&w, b"k", 0, 200, Order::Forward),
        [(100, b"v".to_vec())]
    );
    w.into_inner().close().unwrap();
}

/// Stream time observed past every window start (a record's time) is what the store has after
/// a reopen; restored from the changelog alone, it comes from the time sent with the last record.
pub fn an_observed_stream_time_survives_a_reopen<H: Harness>(h: &mut H) {
    let mut w = open(h, small_windows());
    w.put(b"k", 10, Some(b"a")).unwrap();
    w.observe(100).unwrap();
    w.put(b"k", 60, Some(b"b")).unwrap();
    w.inner().flush().unwrap();
    w = reopen(h, w);
    assert_eq!(w.stream_time(), Some(100));
    // Live by the last window start (60), expired by the observed time (100).
    assert!(matches!(
        w.put(b"k", 45, Some(b"late")).unwrap(),
        WindowPut::Expired { stream_time: 100 }
    ));
    assert_eq!(
        fetch(&w, b"k", 0, 200, Order::Forward),
        [(60, b"b".to_vec())]
    );
    w.into_inner().close().unwrap();
}

pub fn duplicates_are_all_kept_when_asked<H: Harness>(h: &mut H) {
    let mut w = open(h, small_windows().retain_duplicates());
    w.put(b"k", 10, Some(b"1")).unwrap();
    w.put(b"k", 10, Some(b"2")).unwrap();
    w.put(b"k", 10, None).unwrap(); // ignored, as in Kafka Streams
    w.inner().flush().unwrap();
    w = reopen(h, w);
    // The sequence continues after a reopen: nothing written before is overwritten.
    w.put(b"k", 10, Some(b"3")).unwrap();
    let values: Vec<Vec<u8>> = fetch(&w, b"k", 10, 10, Order::Forward)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values, [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    w.into_inner().close().unwrap();
}

/// Generates one `#[test]` per window scenario, and the model test, for the engine whose
/// [`Harness`] the expression builds.
#[macro_export]
macro_rules! window_tests {
    ($harness:expr) => {
        $crate::window_tests!($harness, cases = 64);
    };
    ($harness:expr, cases = $cases:expr) => {
        mod window_conformance {
            #[allow(unused_imports)]
            use super::*;
            $crate::window_tests!(@tests $harness;
                fetch_returns_a_keys_windows_in_time_order,
                keys_that_prefix_each_other_never_mix,
                expired_windows_are_refused_and_invisible,
                expired_segments_are_dropped_from_the_store,
                stream_time_survives_a_reopen,
                an_observed_stream_time_survives_a_reopen,
                duplicates_are_all_kept_when_asked
            );

            #[test]
            fn random_window_operations_match_a_model() {
                let mut harness = $harness;
                $crate::testkit::window::check_against_model(&mut harness, $cases);
            }
        }
    };
    (@tests $harness:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let mut harness = $harness;
                $crate::testkit::window::$name(&mut harness);
            }
        )*
    };
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
pub enum WindowOp {
    /// Put (or delete, `None`) a key's window.
    Put(Vec<u8>, i64, Option<Vec<u8>>),
    /// Compare a key's windows in a time range.
    Fetch(Vec<u8>, i64, i64, Order),
    /// Compare the windows of a key range in a time range.
    FetchKeys(Bound<Vec<u8>>, Bound<Vec<u8>>, i64, i64),
    /// Compare every window in a time range.
    FetchAll(i64, i64),
    /// Commit (flush) the store underneath.
    Flush,
    /// Close and reopen.
    Reopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0xff]), 0..=2)
}

fn time() -> impl Strategy<Value = i64> {
    // Mostly forward, by up to a segment, with late ones behind.
    (0i64..300).prop_map(|t| t - 20)
}

fn key_bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        Just(Unbounded),
        key().prop_map(Included),
        key().prop_map(Excluded),
    ]
}

/// The strategy for one operation.
pub fn op() -> impl Strategy<Value = WindowOp> {
    prop_oneof![
        8 => (key(), time(), prop::option::weighted(0.85, prop::collection::vec(any::<u8>(), 0..4)))
            .prop_map(|(k, t, v)| WindowOp::Put(k, t, v)),
        3 => (key(), time(), time(), prop::sample::select(vec![Order::Forward, Order::Reverse]))
            .prop_map(|(k, a, b, o)| WindowOp::Fetch(k, a.min(b), a.max(b), o)),
        2 => (key_bound(), key_bound(), time(), time())
            .prop_map(|(f, t, a, b)| WindowOp::FetchKeys(f, t, a.min(b), a.max(b))),
        1 => (time(), time()).prop_map(|(a, b)| WindowOp::FetchAll(a.min(b), a.max(b))),
        1 => Just(WindowOp::Flush),
        1 => Just(WindowOp::Reopen),
    ]
}

/// The simple model: every stored window, and the stream time.
#[derive(Debug, Default)]
struct Model {
    windows: BTreeMap<(Vec<u8>, i64, u32), Vec<u8>>,
    stream_time: Option<i64>,
    retention: i64,
    duplicates: bool,
    seq: u32,
}

impl Model {
    fn min_live(&self) -> i64 {
        self.stream_time
            .map_or(i64::MIN, |t| t - self.retention + 1)
    }

    fn put(&mut self, key: &[u8], start: i64, value: Option<&Vec<u8>>) -> WindowPut {
        if start < self.min_live() {
            return WindowPut::Expired {
                stream_time: self.stream_time.unwrap_or(i64::MIN),
            };
        }
        if self.duplicates && value.is_none() {
            return WindowPut::Stored;
        }
        let seq = if self.duplicates {
            self.seq += 1;
            self.seq
        } else {
            0
        };
        match value {
            Some(v) => self.windows.insert((key.to_vec(), start, seq), v.clone()),
            None => self.windows.remove(&(key.to_vec(), start, seq)),
        };
        self.stream_time = Some(self.stream_time.map_or(start, |t| t.max(start)));
        WindowPut::Stored
    }

    fn live(&self, lo: i64, hi: i64) -> impl Iterator<Item = (&(Vec<u8>, i64, u32), &Vec<u8>)> {
        let lo = lo.max(self.min_live());
        self.windows
            .iter()
            .filter(move |((_, t, _), _)| *t >= lo && *t <= hi)
    }
}

fn in_bounds(key: &[u8], from: &Bound<Vec<u8>>, to: &Bound<Vec<u8>>) -> bool {
    let above = match from {
        Included(f) => key >= f.as_slice(),
        Excluded(f) => key > f.as_slice(),
        Unbounded => true,
    };
    let below = match to {
        Included(t) => key <= t.as_slice(),
        Excluded(t) => key < t.as_slice(),
        Unbounded => true,
    };
    above && below
}

fn run_ops<H: Harness>(
    harness: &mut H,
    options: WindowOptions,
    ops: &[WindowOp],
) -> Result<(), TestCaseError> {
    let mut w = open(harness, options);
    let mut model = Model {
        retention: options.retention_ms(),
        duplicates: options.retains_duplicates(),
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        match op {
            WindowOp::Put(k, t, v) => {
                let got = w.put(k, *t, v.as_deref()).unwrap();
                prop_assert_eq!(got, model.put(k, *t, v.as_ref()), "step {}", step);
            }
            WindowOp::Fetch(k, lo, hi, order) => {
                let mut expected: Vec<(i64, Vec<u8>)> = model
                    .live(*lo, *hi)
                    .filter(|((key, _, _), _)| key == k)
                    .map(|((_, t, _), v)| (*t, v.clone()))
                    .collect();
                if *order == Order::Reverse {
                    // Latest window first; duplicates of one window stay in sequence order
                    // reversed too (the store scans the key's run backwards).
                    expected.reverse();
                }
                prop_assert_eq!(fetch(&w, k, *lo, *hi, *order), expected, "step {}", step);
            }
            WindowOp::FetchKeys(from, to, lo, hi) => {
                let mut expected: Windowed = model
                    .live(*lo, *hi)
                    .filter(|((key, _, _), _)| in_bounds(key, from, to))
                    .map(|((k, t, _), v)| (k.clone(), *t, v.clone()))
                    .collect();
                let mut got = windowed(
                    w.fetch_keys(
                        from.as_ref().map(Vec::as_slice),
                        to.as_ref().map(Vec::as_slice),
                        *lo..=*hi,
                    )
                    .unwrap(),
                );
                // Segment-by-segment order is the store's; the model compares contents.
                expected.sort();
                got.sort();
                prop_assert_eq!(got, expected, "step {}", step);
            }
            WindowOp::FetchAll(lo, hi) => {
                let mut expected: Windowed = model
                    .live(*lo, *hi)
                    .map(|((k, t, _), v)| (k.clone(), *t, v.clone()))
                    .collect();
                let mut got = windowed(w.fetch_all(*lo..=*hi).unwrap());
                expected.sort();
                got.sort();
                prop_assert_eq!(got, expected, "step {}", step);
            }
            WindowOp::Flush => w.inner().flush().unwrap(),
            WindowOp::Reopen => {
                w = reopen(harness, w);
                prop_assert_eq!(w.stream_time(), model.stream_time, "step {} reopened", step);
            }
        }
    }
    let mut everything = windowed(w.fetch_all(..).unwrap());
    let mut expected: Windowed = model
        .live(i64::MIN, i64::MAX)
        .map(|((k, t, _), v)| (k.clone(), *t, v.clone()))
        .collect();
    everything.sort();
    expected.sort();
    prop_assert_eq!(everything, expected, "final contents");
    w.into_inner().close().unwrap();
    Ok(())
}

/// Runs `cases` random sequences of up to 40 operations on window stores over fresh stores from
/// `harness`, half of them retaining duplicates. Panics with the shrunk failing sequence when
/// the engine disagrees with the model.
pub fn check_against_model<H: Harness>(harness: &mut H, cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let harness = std::cell::RefCell::new(harness);
    let strategy = (any::<bool>(), prop::collection::vec(op(), 1..40));
    let result = runner.run(&strategy, |(duplicates, ops)| {
        let options = if duplicates {
            small_windows().retain_duplicates()
        } else {
            small_windows()
        };
        run_ops(*harness.borrow_mut(), options, &ops)
    });
    if let Err(e) = result {
        panic!("window store disagrees with the model: {e}");
    }
}
