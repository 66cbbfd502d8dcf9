//! Many stores and their task's outputs share one producer, whose delivery callback gets
//! nothing but an integer per record: this part says what that integer means, and hands each
//! report to the one store's tracker, or to the outputs' counts, it belongs to.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use kstate_core::PoisonReason;
use kstate_core::sync::{lock, read};
use rdkafka::ClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext};

use super::acks::{AckTracker, SEQ_BITS, SEQ_MASK};
use crate::transaction_member::TransactionMember;

/// Delivery opaques are plain integers, so that a record costs no allocation and no reference
/// count on the hot path: 0 is an output; anything else is a store's route id (a slot in the
/// router's table, never reused while the store exists) above `SEQ_BITS`, and the low `SEQ_BITS`
/// bits of the record's sequence number. Acknowledgements of one store arrive in order, so its
/// tracker knows which full sequence number the low bits belong to (`SEQ_BITS` and `SEQ_MASK`
/// are the tracker's, in `acks.rs`).
pub(super) const OUTPUT_OPAQUE: usize = 0;
/// Route ids use the bits above `SEQ_BITS` (one spare).
pub(super) const MAX_ROUTE: u32 = (1 << (usize::BITS - SEQ_BITS - 1)) - 1;
const _: () = assert!(usize::BITS == 64, "delivery opaques need 64-bit usize");

/// The stores sending through one producer, by route id.
#[derive(Default)]
pub(crate) struct Routes {
    pub(super) last: u32,
    pub(super) trackers: std::collections::HashMap<u32, Arc<AckTracker>>,
    /// Under a transaction: the stores whose overlays its commit applies and its abort drops.
    pub(crate) members: std::collections::HashMap<u32, std::sync::Weak<dyn TransactionMember>>,
}

/// Outputs sent through a [`SharedProducer`](crate::SharedProducer) and what became of them.
#[derive(Debug, Default)]
pub(crate) struct OutputAcks {
    counts: Mutex<OutputCounts>,
    pub(super) changed: Condvar,
}

#[derive(Debug, Default)]
pub(super) struct OutputCounts {
    pub(super) sent: u64,
    /// Delivered or failed: no longer in flight.
    pub(super) settled: u64,
    /// The first output that could not be delivered: why, and the client's error code.
    pub(super) failed: Option<(String, Option<RDKafkaErrorCode>)>,
    pub(super) waiters: u32,
}

impl OutputAcks {
    pub(super) fn lock(&self) -> MutexGuard<'_, OutputCounts> {
        lock(&self.counts)
    }

    fn settled(&self, failure: Option<(String, Option<RDKafkaErrorCode>)>) {
        let mut counts = self.lock();
        counts.settled += 1;
        if counts.failed.is_none() {
            counts.failed = failure;
        }
        if counts.waiters > 0 {
            self.changed.notify_all();
        }
    }

    /// A transaction aborted: its outputs are gone, and so is their failure.
    pub(crate) fn forget(&self) {
        let mut counts = self.lock();
        counts.failed = None;
        counts.settled = counts.settled.max(counts.sent);
    }
}

/// The producer's context: routes delivery reports.
pub(crate) struct Router {
    pub(super) outputs: Arc<OutputAcks>,
    pub(super) routes: Arc<std::sync::RwLock<Routes>>,
}

impl ClientContext for Router {}

impl ProducerContext for Router {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        if opaque == OUTPUT_OPAQUE {
            let failure = result.as_ref().err().map(|(error, message)| {
                let text = format!(
                    "output to {}/{} was not delivered: {error}",
                    message.topic(),
                    message.partition()
                );
                (text, error.rdkafka_error_code())
            });
            self.outputs.settled(failure);
            return;
        }
        let route = (opaque >> SEQ_BITS) as u32;
        let seq_low = opaque as u64 & SEQ_MASK;
        let routes = read(&self.routes);
        // A store dropped with records in flight: nobody is waiting for them.
        let Some(tracker) = routes.trackers.get(&route) else {
            return;
        };
        match result {
            Ok(message) => tracker.delivered(seq_low, message.offset()),
            Err((error, message)) => tracker.failed(
                seq_low,
                PoisonReason::DeliveryFailed {
                    message: format!(
                        "changelog {}/{}: record ...{seq_low} was not delivered: {error}",
                        message.topic(),
                        message.partition()
                    ),
                },
            ),
        }
    }
}
