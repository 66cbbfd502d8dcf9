//! Window and session stores under aborts and crashes: random sequences of put / observe /
//! commit / abort / crash / read against a simple model, for engines that can commit, and
//! perhaps abort (a transaction) and crash (drop without close, open again).
//!
//! Why a kit of its own: a store of time changes RocksDB in two ways a plain store does not:
//! stream time moved by `observe` alone (a local key, no changelog record), and expired
//! segments dropped when stream time passes them. Both must reach the disk only with the commit
//! of the stream time that decided them, or an abort or crash replays against windows that are
//! gone. The plain model tests never abort, and reopen only cleanly.
//!
//! The model: the entries and stream time as they are now, and as they were at the last commit;
//! - a commit makes now the committed state;
//! - an abort goes back to the committed state;
//! - a crash goes back to the committed state too when the engine loses uncommitted writes (a
//!   transaction); when it keeps them (every write acknowledged on return), the entries stay
//!   and stream time is what the changelog carries: the committed one, or the latest a write
//!   since carried (a time moved by `observe` alone is a local key, and is lost);
//! - reads see the entries whose time (a window's start, a session's end) is within retention
//!   of stream time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Harness;
use crate::changelog_keys::ChangelogKeys;
use crate::session::{SessionChangelog, SessionOptions, SessionPut, SessionStore};
use crate::store::KeyValueStore;
use crate::window::{WindowChangelog, WindowOptions, WindowPut, WindowStore};

/// What a crash keeps of what was written since the last commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uncommitted {
    /// Everything: each write was acknowledged by the durable source before it returned.
    Kept,
    /// Nothing: the writes were in a transaction that the crash aborts.
    Lost,
    /// Some prefix, depending on timing (acknowledged in the background): the kit commits
    /// before every crash, so what a crash keeps is known.
    Unknown,
}

/// An engine whose stores commit, and may abort and crash.
pub trait Faults: Harness {
    /// Makes what was written to `store` since its last commit durable (a transaction's
    /// commit, a flush).
    fn commit(&mut self, store: &Self::Store);

    /// Undoes what was written to `store` since its last commit, if the engine can (a
    /// transaction's abort): `false` when it cannot, and the kit skips the step.
    fn abort(&mut self, store: &Self::Store) -> bool;

    /// `store` as a process that died finds it when it starts again: dropped without a
    /// close, and opened again.
    fn crash(&mut self, store: Self::Store) -> Self::Store;

    /// What a crash keeps of the writes since the last commit.
    fn crash_keeps(&self) -> Uncommitted;
}

/// A key's entry: its key, its first and last time (a window's start twice; a session's start
/// and end).
type Span = (Vec<u8>, i64, i64);

/// A store of time as the kit drives it.
trait TimedView<S: KeyValueStore>: Sized {
    fn keys() -> Arc<dyn ChangelogKeys>;
    fn retention() -> i64;
    fn open(store: S) -> Self;
    /// Puts `key`'s entry `first..=last`; `false`: refused as expired.
    fn put(&self, key: &[u8], first: i64, last: i64, value: &[u8]) -> bool;
    fn observe(&self, time: i64);
    fn stream_time(&self) -> Option<i64>;
    /// Every live entry, in order.
    fn contents(&self) -> BTreeMap<Span, Vec<u8>>;
    fn into_inner(self) -> S;
    /// The store under the view, for the harness's calls.
    fn inner_store(&self) -> &S;
    /// An entry's span from a record's time and a length (a window: its start).
    fn span(time: i64, length: i64) -> (i64, i64);
}

/// Windows of 10 ms kept 50 ms in segments of 20 ms: random times cross and drop segments
/// often.
fn windows() -> WindowOptions {
    super::window::small_windows()
}

/// Sessions kept 50 ms in segments of 20 ms.
fn sessions() -> SessionOptions {
    SessionOptions::new(Duration::from_millis(50)).segment_interval(Duration::from_millis(20))
}

/// Every key the kit writes.
pub(super) const KEYS: [&[u8]; 3] = [b"a", b"b\x00", b"c"];

impl<S: KeyValueStore> TimedView<S> for WindowStore<S> {
    fn keys() -> Arc<dyn ChangelogKeys> {
        Arc::new(WindowChangelog::new(&windows()))
    }
    fn retention() -> i64 {
        windows().retention_ms()
    }
    fn open(store: S) -> Self {
        WindowStore::open(store, windows()).unwrap()
    }
    fn put(&self, key: &[u8], first: i64, _: i64, value: &[u8]) -> bool {
        match WindowStore::put(self, key, first, Some(value)).unwrap() {
            WindowPut::Stored => true,
            WindowPut::Expired { .. } => false,
        }
    }
    fn observe(&self, time: i64) {
        WindowStore::observe(self, time).unwrap()
    }
    fn stream_time(&self) -> Option<i64> {
        WindowStore::stream_time(self)
    }
    fn contents(&self) -> BTreeMap<Span, Vec<u8>> {
        self.fetch_all(..)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                ((e.key().to_vec(), e.start(), e.start()), e.into_value())
            })
            .collect()
    }
    fn into_inner(self) -> S {
        WindowStore::into_inner(self)
    }
    fn inner_store(&self) -> &S {
        self.inner()
    }
    fn span(time: i64, _: i64) -> (i64, i64) {
        let start = time - time.rem_euclid(windows().size_ms());
        (start, start)
    }
}

impl<S: KeyValueStore> TimedView<S> for SessionStore<S> {
    fn keys() -> Arc<dyn ChangelogKeys> {
        Arc::new(SessionChangelog::new(&sessions()))
    }
    fn retention() -> i64 {
        sessions().retention_ms()
    }
    fn open(store: S) -> Self {
        SessionStore::open(store, sessions()).unwrap()
    }
    fn put(&self, key: &[u8], first: i64, last: i64, value: &[u8]) -> bool {
        match SessionStore::put(self, key, first, last, value).unwrap() {
            SessionPut::Stored => true,
            SessionPut::Expired { .. } => false,
        }
    }
    fn observe(&self, time: i64) {
        SessionStore::observe(self, time).unwrap()
    }
    fn stream_time(&self) -> Option<i64> {
        SessionStore::stream_time(self)
    }
    fn contents(&self) -> BTreeMap<Span, Vec<u8>> {
        KEYS.iter()
            .flat_map(|key| {
                self.find_sessions(key, i64::MIN, i64::MAX)
                    .unwrap()
                    .map(|s| {
                        let s = s.unwrap();
                        ((s.key, s.start, s.end), s.value)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }
    fn into_inner(self) -> S {
        SessionStore::into_inner(self)
    }
    fn inner_store(&self) -> &S {
        self.inner()
    }
    fn span(time: i64, length: i64) -> (i64, i64) {
        (time - length, time)
    }
}

/// One step of a sequence.
#[derive(Debug, Clone)]
pub enum FaultOp {
    /// Put an entry of key `KEYS[k]` at a time, with a length (sessions) and a value byte.
    Put(usize, i64, i64, u8),
    /// Move stream time, without a write.
    Observe(i64),
    Commit,
    Abort,
    Crash,
    /// Compare every live entry.
    Read,
}

fn time() -> impl Strategy<Value = i64> {
    // Mostly within a few segments, now and then far ahead (every segment behind expires).
    prop_oneof![
        6 => 0i64..200,
        1 => 200i64..600,
    ]
}

pub(super) fn op() -> impl Strategy<Value = FaultOp> {
    prop_oneof![
        8 => (0..KEYS.len(), time(), 0i64..15, any::<u8>())
            .prop_map(|(k, t, len, v)| FaultOp::Put(k, t, len, v)),
        3 => time().prop_map(FaultOp::Observe),
        3 => Just(FaultOp::Commit),
        2 => Just(FaultOp::Abort),
        2 => Just(FaultOp::Crash),
        2 => Just(FaultOp::Read),
    ]
}

/// A store's entries and stream time.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Snapshot<E> {
    pub(super) entries: E,
    pub(super) stream_time: Option<i64>,
}

/// What a store of time holds now and at its last commit, and what commits, aborts and crashes
/// make of it; the window and session model and the TTL model differ only in their entries.
#[derive(Debug, Default)]
pub(super) struct Timeline<E> {
    pub(super) now: Snapshot<E>,
    committed: Snapshot<E>,
    /// The latest stream time a changelog record carried since the last commit.
    logged_time: Option<i64>,
}

impl<E: Clone> Timeline<E> {
    /// A write at `time` was logged: stream time moves to it, and its record carries the
    /// stream time.
    pub(super) fn logged_write(&mut self, time: i64) {
        let carried = self.now.stream_time.map_or(time, |t| t.max(time));
        self.now.stream_time = Some(carried);
        self.logged_time = Some(self.logged_time.map_or(carried, |t| t.max(carried)));
    }

    pub(super) fn observe(&mut self, time: i64) {
        self.now.stream_time = Some(self.now.stream_time.map_or(time, |t| t.max(time)));
    }

    pub(super) fn commit(&mut self) {
        self.committed = self.now.clone();
        self.logged_time = None;
    }

    pub(super) fn abort(&mut self) {
        self.now = self.committed.clone();
        self.logged_time = None;
    }

    pub(super) fn crash(&mut self, keeps: Uncommitted) {
        match keeps {
            Uncommitted::Kept => {
                self.now.stream_time = match (self.committed.stream_time, self.logged_time) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                self.commit();
            }
            Uncommitted::Lost | Uncommitted::Unknown => self.abort(),
        }
    }
}

/// Window and session entries by key and span, kept `retention` behind stream time.
#[derive(Debug, Default)]
struct Model {
    t: Timeline<BTreeMap<Span, Vec<u8>>>,
    retention: i64,
}

impl Model {
    fn min_live(&self) -> i64 {
        self.t
            .now
            .stream_time
            .map_or(i64::MIN, |t| t - self.retention + 1)
    }

    /// `false`: refused as expired.
    fn put(&mut self, span: Span, value: Vec<u8>) -> bool {
        let time = span.2;
        if time < self.min_live() {
            return false;
        }
        self.t.now.entries.insert(span, value);
        self.t.logged_write(time);
        true
    }

    fn live(&self) -> BTreeMap<Span, Vec<u8>> {
        let min = self.min_live();
        self.t
            .now
            .entries
            .iter()
            .filter(|((_, _, time), _)| *time >= min)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

fn run_ops<H: Faults, V: TimedView<H::Store>>(
    harness: &mut H,
    ops: &[FaultOp],
) -> Result<(), TestCaseError> {
    let keeps = harness.crash_keeps();
    let mut view = Some(V::open(harness.open_mapped(V::keys())));
    let mut model = Model {
        retention: V::retention(),
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        let v = view.as_ref().unwrap();
        match op {
            FaultOp::Put(k, t, len, byte) => {
                let (first, last) = V::span(*t, *len);
                let key = KEYS[*k].to_vec();
                let stored = v.put(&key, first, last, &[*byte]);
                let expected = model.put((key, first, last), vec![*byte]);
                prop_assert_eq!(stored, expected, "step {} stored", step);
            }
            FaultOp::Observe(t) => {
                v.observe(*t);
                model.t.observe(*t);
            }
            FaultOp::Commit => {
                harness.commit(v.inner_store());
                model.t.commit();
            }
            FaultOp::Abort => {
                if harness.abort(v.inner_store()) {
                    model.t.abort();
                    // As the task runtime does: what the view holds in memory (its stream
                    // time) may be ahead of the committed state; read it again.
                    let store = view.take().unwrap().into_inner();
                    view = Some(V::open(store));
                }
            }
            FaultOp::Crash => {
                if keeps == Uncommitted::Unknown {
                    harness.commit(v.inner_store());
                    model.t.commit();
                }
                let store = view.take().unwrap().into_inner();
                view = Some(V::open(harness.crash(store)));
                model.t.crash(keeps);
            }
            FaultOp::Read => {
                prop_assert_eq!(v.contents(), model.live(), "step {} contents", step);
            }
        }
        let v = view.as_ref().unwrap();
        prop_assert_eq!(
            v.stream_time(),
            model.t.now.stream_time,
            "step {} stream time",
            step
        );
    }
    let v = view.take().unwrap();
    prop_assert_eq!(v.contents(), model.live(), "final contents");
    harness.commit(v.inner_store());
    v.into_inner().close().unwrap();
    Ok(())
}

fn check<H: Faults, V: TimedView<H::Store>>(harness: &mut H, cases: u32, what: &str) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let harness = std::cell::RefCell::new(harness);
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        run_ops::<H, V>(*harness.borrow_mut(), &ops)
    });
    if let Err(e) = result {
        panic!("{what} under aborts and crashes disagrees with the model: {e}");
    }
}

/// Runs `cases` random sequences of up to 40 steps on window stores over `harness`'s stores.
/// Panics with the shrunk failing sequence when the engine disagrees with the model.
pub fn check_windows<H: Faults>(harness: &mut H, cases: u32) {
    check::<H, WindowStore<H::Store>>(harness, cases, "a window store");
}

/// [`check_windows`] for session stores.
pub fn check_sessions<H: Faults>(harness: &mut H, cases: u32) {
    check::<H, SessionStore<H::Store>>(harness, cases, "a session store");
}

/// Sequences that once broke an engine, run as they are on window and session stores.
pub(super) fn known_sequences() -> Vec<(&'static str, Vec<FaultOp>)> {
    use FaultOp::{Commit, Crash, Observe, Put, Read};
    vec![
        (
            // A fresh store's first commit writes its stream time alone (no record): the store
            // must open again after a crash and keep it.
            "a commit of stream time alone on a fresh store, then a crash",
            vec![Observe(227), Commit, Crash, Read, Put(0, 20, 3, 1), Read],
        ),
        (
            "a commit of stream time alone after a crash of a fresh store",
            vec![Crash, Observe(227), Commit, Crash, Read],
        ),
    ]
}

/// Runs `sequences` on window and session stores over `harness`'s stores. Panics naming the
/// sequence and the step where the engine disagrees with the model.
pub(super) fn check_sequences_of_windows_and_sessions<H: Faults>(
    harness: &mut H,
    sequences: Vec<(&'static str, Vec<FaultOp>)>,
) {
    for (what, ops) in sequences {
        if let Err(e) = run_ops::<H, WindowStore<H::Store>>(harness, &ops) {
            panic!("a window store, {what} ({ops:?}): {e}");
        }
        if let Err(e) = run_ops::<H, SessionStore<H::Store>>(harness, &ops) {
            panic!("a session store, {what} ({ops:?}): {e}");
        }
    }
}
