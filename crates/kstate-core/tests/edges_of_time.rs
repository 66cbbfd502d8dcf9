//! Times at the edges of `i64` in the stores of time: any producer can write a record
//! timestamped near `i64::MIN` or `i64::MAX`, and a store must never panic or wrap on it. A time
//! a store cannot place (a window or session whose end would not fit in an `i64`) is refused
//! with [`Error::InvalidArgument`], which the task runtime's error policy treats as bad input
//! (skip, dead-letter or fail), never as a crash.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::time::Duration;

use kstate_core::{
    Error, MemoryStore, SessionOptions, SessionStore, TtlClock, TtlOptions, TtlStore,
    WindowOptions, WindowPut, WindowStore,
};

/// Times near both edges, and ordinary ones between them.
const EDGES: [i64; 8] = [
    i64::MIN,
    i64::MIN + 1,
    -1,
    0,
    1_700_000_000_000,
    i64::MAX - 60_000,
    i64::MAX - 1,
    i64::MAX,
];

fn window_options() -> [WindowOptions; 2] {
    [
        WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10)),
        WindowOptions::hopping(Duration::from_secs(60), Duration::from_secs(20)),
    ]
}

/// Every store call of a window store at every edge time, in every order of two: no panic, and
/// a refusal is an invalid argument naming the time.
#[test]
fn window_stores_take_or_refuse_every_time_without_panicking() {
    for options in window_options() {
        for first in EDGES {
            for second in EDGES {
                let store = WindowStore::open(MemoryStore::new("edges"), options).unwrap();
                for t in [first, second] {
                    match store.observe(t) {
                        Ok(()) => assert!(t <= options.latest_time()),
                        Err(Error::InvalidArgument { message, .. }) => {
                            assert!(t > options.latest_time());
                            assert!(message.contains(&t.to_string()), "{message}");
                            assert_ne!(store.stream_time(), Some(t));
                        }
                        Err(e) => panic!("observe at {t}: {e}"),
                    }
                    for start in options.windows_containing(t) {
                        match store.put(b"k", start, Some(b"v")) {
                            Ok(WindowPut::Stored | WindowPut::Expired { .. }) => {}
                            Err(Error::InvalidArgument { message, .. }) => {
                                assert!(message.contains(&start.to_string()), "{message}")
                            }
                            Err(e) => panic!("put at {start}: {e}"),
                        }
                        store.get(b"k", start).unwrap();
                    }
                    store
                        .fetch(b"k", ..)
                        .unwrap()
                        .for_each(|e| drop(e.unwrap()));
                    store
                        .fetch_backward(b"k", t..)
                        .unwrap()
                        .for_each(|e| drop(e.unwrap()));
                    store
                        .fetch_all(..=t)
                        .unwrap()
                        .for_each(|e| drop(e.unwrap()));
                }
            }
        }
    }
}

/// A window whose end does not fit in an `i64` cannot be placed: its put and an observe of its
/// time are refused, store nothing and move no stream time.
#[test]
fn a_window_whose_end_overflows_is_refused_as_invalid() {
    let options = WindowOptions::tumbling(Duration::from_secs(60));
    let store = WindowStore::open(MemoryStore::new("edges"), options).unwrap();
    store.put(b"k", 0, Some(b"v")).unwrap();
    let start = i64::MAX - 30_000;
    let refused = store.put(b"k", start, Some(b"v"));
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "a window [{start}, {start} + 60 s) was {refused:?}"
    );
    let observed = store.observe(start);
    assert!(
        matches!(observed, Err(Error::InvalidArgument { .. })),
        "an observe at {start} was {observed:?}"
    );
    assert_eq!(store.stream_time(), Some(0));
    assert_eq!(store.get(b"k", start).unwrap(), None);
    assert_eq!(store.get(b"k", 0).unwrap().as_deref(), Some(&b"v"[..]));
}

/// Session puts, merges, removes and reads at every edge time: no panic.
#[test]
fn session_stores_take_or_refuse_every_time_without_panicking() {
    for first in EDGES {
        for second in EDGES {
            let store = SessionStore::open(
                MemoryStore::new("edges"),
                SessionOptions::new(Duration::from_secs(600)),
            )
            .unwrap();
            for t in [first, second] {
                store.observe(t).unwrap();
                match store.merge(b"k", t, Duration::from_secs(5), |_| b"v".to_vec()) {
                    Ok(_) | Err(Error::InvalidArgument { .. }) => {}
                    Err(e) => panic!("merge at {t}: {e}"),
                }
                match store.put(b"k", t, t.saturating_add(1_000), b"v") {
                    Ok(_) | Err(Error::InvalidArgument { .. }) => {}
                    Err(e) => panic!("put at {t}: {e}"),
                }
                store
                    .find_sessions(b"k", t, t)
                    .unwrap()
                    .for_each(|s| drop(s.unwrap()));
                store.fetch_session(b"k", t, t).unwrap();
                store.remove(b"k", t, t).unwrap();
            }
        }
    }
}

/// TTL puts at every edge time, with default and huge times to live, then reads: no panic.
#[test]
fn ttl_stores_take_every_time_without_panicking() {
    for first in EDGES {
        for second in EDGES {
            let store = TtlStore::open(
                MemoryStore::new("edges"),
                TtlOptions::new(Duration::from_secs(60)).clock(TtlClock::EventTime),
            )
            .unwrap();
            for t in [first, second] {
                store.put(b"k", b"v", t).unwrap();
                store
                    .put_with_ttl(b"long", b"v", t, Duration::from_secs(u64::MAX))
                    .unwrap();
                store.observe(t).unwrap();
                store.get(b"k").unwrap();
                store.get(b"long").unwrap();
            }
        }
    }
}
