//! One store's side of a shared producer: a route of its own in the router, so that its
//! records' acknowledgements reach its own tracker (and stop at it once the store is dropped),
//! and the sequence numbers that tracker checks them by.

use std::sync::Arc;
use std::time::Duration;

use kstate_core::PoisonReason;
use kstate_core::sync::write;

use super::acks::{AckTracker, SEQ_BITS, SEQ_MASK};
use super::routing::MAX_ROUTE;
use super::{Outgoing, SharedProducer};
use crate::config::ChangelogConfig;
use crate::error::ChangelogError;
use crate::transaction_member::{Transaction, TransactionMember};

/// One store's side of a [`SharedProducer`]: its partition and its acknowledgements.
pub(crate) struct ChangelogProducer {
    producer: SharedProducer,
    pub(crate) tracker: Arc<AckTracker>,
    /// This store's route id, shifted into place for the delivery opaque.
    route: usize,
    topic: String,
    partition: i32,
}

impl ChangelogProducer {
    pub(crate) fn new(
        producer: SharedProducer,
        config: &ChangelogConfig,
    ) -> Result<Self, ChangelogError> {
        let tracker = Arc::new(AckTracker::new(&config.topic, config.partition));
        let id = {
            let mut routes = write(&producer.routes);
            // The next id not in use; ids are reused only after MAX_ROUTE more stores.
            let mut id = None;
            for _ in 0..MAX_ROUTE {
                routes.last = routes.last % MAX_ROUTE + 1;
                if !routes.trackers.contains_key(&routes.last) {
                    id = Some(routes.last);
                    break;
                }
            }
            let id = id.ok_or_else(|| ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: format!("more than {MAX_ROUTE} stores on one producer"),
            })?;
            routes.trackers.insert(id, tracker.clone());
            id
        };
        Ok(ChangelogProducer {
            producer,
            tracker,
            route: (id as usize) << SEQ_BITS,
            topic: config.topic.clone(),
            partition: config.partition,
        })
    }

    /// Queues one record (a tombstone when `value` is `None`) with sequence number `seq`. Waits
    /// while librdkafka's queue is full, up to `queue_timeout`; any other failure poisons, and a
    /// poisoned changelog takes no more records.
    pub(crate) fn send(
        &self,
        seq: u64,
        key: &[u8],
        value: Option<&[u8]>,
        time: Option<i64>,
        queue_timeout: Duration,
    ) -> Result<(), PoisonReason> {
        if let Some(reason) = self.tracker.poisoned() {
            return Err(reason);
        }
        let opaque = self.route | (seq & SEQ_MASK) as usize;
        let sent = self.producer.send_routed(
            Outgoing {
                topic: &self.topic,
                partition: Some(self.partition),
                key,
                value,
                headers: None,
                time,
            },
            opaque,
            queue_timeout,
        );
        let Err((error, waited)) = sent else {
            return Ok(());
        };
        let reason = if waited > Duration::ZERO {
            PoisonReason::Timeout {
                waiting_for: format!(
                    "room in the producer queue of changelog {}/{}",
                    self.topic, self.partition
                ),
                waited,
            }
        } else {
            PoisonReason::ClientFailed {
                message: format!(
                    "changelog {}/{}: send failed: {error}",
                    self.topic, self.partition
                ),
            }
        };
        self.tracker.poison(reason.clone());
        Err(reason)
    }

    /// Records queued or in flight in the shared producer.
    pub(crate) fn in_flight(&self) -> i32 {
        self.producer.in_flight()
    }

    /// The shared producer's transaction, if it is transactional.
    pub(crate) fn transaction(&self) -> Option<&Arc<Transaction>> {
        self.producer.transaction.as_ref()
    }

    /// Makes `member` (this store) part of every transaction of the producer.
    pub(crate) fn join_transactions(&self, member: std::sync::Weak<dyn TransactionMember>) {
        let id = (self.route >> SEQ_BITS) as u32;
        write(&self.producer.routes).members.insert(id, member);
    }
}

impl Drop for ChangelogProducer {
    /// Leaves the router (and the transaction): reports for records still in flight are dropped.
    fn drop(&mut self) {
        let id = (self.route >> SEQ_BITS) as u32;
        let mut routes = write(&self.producer.routes);
        routes.trackers.remove(&id);
        routes.members.remove(&id);
    }
}
