//! The conformance kit and the model test, run against `MemoryStore`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use kstate_core::MemoryStore;
use kstate_core::testkit::Harness;

struct MemoryHarness;

impl Harness for MemoryHarness {
    type Store = MemoryStore;

    fn open(&mut self) -> MemoryStore {
        MemoryStore::new("memory-conformance")
    }

    fn reopen(&mut self, store: MemoryStore) -> MemoryStore {
        store.close().unwrap();
        store.reopen()
    }
}

use kstate_core::KeyValueStore as _;

kstate_core::conformance_tests!(MemoryHarness);
kstate_core::model_tests!(MemoryHarness, cases = 256);
kstate_core::window_tests!(MemoryHarness, cases = 256);
kstate_core::session_tests!(MemoryHarness, cases = 256);
kstate_core::ttl_tests!(MemoryHarness, cases = 256);
