//! The fault tests every engine instantiates ([`fault_tests!`](crate::fault_tests)): window and
//! session stores under random commits, aborts and crashes ([`faults`](super::faults)), TTL
//! stores under the same ([`ttl_faults`](super::ttl_faults)), and the sequences that once broke
//! an engine, on all three. Above both kits, so that neither names the other's checks.

use super::faults::{Faults, check_sequences_of_windows_and_sessions, known_sequences};

/// Runs the sequences that once broke an engine on window, session and TTL stores over
/// `harness`'s stores. Panics naming the sequence and the step where the engine disagrees with
/// the model.
pub fn check_known_sequences<H: Faults>(harness: &mut H) {
    let sequences = known_sequences();
    super::ttl_faults::check_known_sequences(harness, &sequences);
    check_sequences_of_windows_and_sessions(harness, sequences);
}

/// Generates the fault model tests (window, session and TTL stores under random commits,
/// aborts and crashes) for the engine whose [`Faults`] harness the expression builds.
#[macro_export]
macro_rules! fault_tests {
    ($harness:expr, cases = $cases:expr) => {
        mod faults {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn window_stores_under_aborts_and_crashes_match_a_model() {
                let mut harness = $harness;
                $crate::testkit::faults::check_windows(&mut harness, $cases);
            }

            #[test]
            fn session_stores_under_aborts_and_crashes_match_a_model() {
                let mut harness = $harness;
                $crate::testkit::faults::check_sessions(&mut harness, $cases);
            }

            #[test]
            fn ttl_stores_under_aborts_and_crashes_match_a_model() {
                let mut harness = $harness;
                $crate::testkit::ttl_faults::check_ttl(&mut harness, $cases);
            }

            #[test]
            fn sequences_that_once_broke_an_engine_match_the_model() {
                let mut harness = $harness;
                $crate::testkit::fault_suite::check_known_sequences(&mut harness);
            }
        }
    };
}
