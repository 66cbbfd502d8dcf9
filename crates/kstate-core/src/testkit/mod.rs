//! The conformance kit: one suite every engine must pass (feature `testkit`).
//!
//! In the spirit of TiKV's `engine_traits_tests`: the scenarios are written once against the
//! [`KeyValueStore`](crate::KeyValueStore) trait, and each engine's test crate instantiates them with
//! [`conformance_tests!`](crate::conformance_tests) and [`model_tests!`](crate::model_tests).
//! Every scenario runs through every write path ([`WritePath`]): single puts and deletes,
//! `put_all`/`delete_all`, and one atomic [`Batch`](crate::Batch), because engines often
//! implement those separately and a bug in one path hides behind the others.
//!
//! The kit panics on failure (it is test code); engines provide a [`Harness`] that opens fresh
//! stores and reopens existing ones.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod fault_suite;
pub mod faults;
mod harness;
pub mod model;
pub mod scenarios;
pub mod session;
pub mod ttl;
pub mod ttl_faults;
pub mod window;

pub use harness::{Harness, WritePath};

/// Generates one `#[test]` per conformance scenario for the engine whose [`Harness`] the
/// expression builds.
///
/// ```
/// use kstate_core::testkit::Harness;
/// use kstate_core::{KeyValueStore, MemoryStore};
///
/// struct Memory;
///
/// impl Harness for Memory {
///     type Store = MemoryStore;
///     fn open(&mut self) -> MemoryStore {
///         MemoryStore::new("doc")
///     }
///     fn reopen(&mut self, store: MemoryStore) -> MemoryStore {
///         store.close().unwrap();
///         store.reopen()
///     }
/// }
///
/// kstate_core::conformance_tests!(Memory);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@tests $harness;
            get_of_a_missing_key_is_none,
            put_then_get_returns_the_value,
            later_writes_win,
            delete_removes_and_deleting_a_missing_key_is_fine,
            empty_values_are_not_absent_values,
            multi_get_answers_in_request_order,
            keys_order_as_unsigned_bytes,
            ranges_honour_every_kind_of_bound,
            reverse_ranges_mirror_forward_ranges,
            prefix_scans_cover_exactly_the_prefix,
            inverted_ranges_are_empty,
            long_scans_see_every_key_once,
            large_values_round_trip,
            approximate_len_tracks_the_entry_count,
            closed_stores_refuse_every_operation,
            reopen_keeps_every_flushed_write,
            drop_range_removes_exactly_the_range
        );
    };
    (@tests $harness:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let mut harness = $harness;
                $crate::testkit::scenarios::$name(&mut harness);
            }
        )*
    };
}

/// Generates the model-based property test (random operation sequences checked against a
/// `BTreeMap`) for the engine whose [`Harness`] the expression builds.
#[macro_export]
macro_rules! model_tests {
    ($harness:expr) => {
        #[test]
        fn random_operations_match_a_btreemap_model() {
            let mut harness = $harness;
            $crate::testkit::model::check_against_model(&mut harness, 64);
        }
    };
    ($harness:expr, cases = $cases:expr) => {
        #[test]
        fn random_operations_match_a_btreemap_model() {
            let mut harness = $harness;
            $crate::testkit::model::check_against_model(&mut harness, $cases);
        }
    };
}
