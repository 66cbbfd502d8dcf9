//! What a transactional producer and the stores it carries know of each other: the producer's
//! transaction state ([`Transaction`]) and a store's part in a commit or an abort
//! ([`TransactionMember`]). Apart from the `transaction` module (the commit protocol, on
//! [`SharedProducer`](crate::SharedProducer)) so that the producer, which holds both, does not
//! import the protocol that drives it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kstate_core::PoisonReason;

/// The transactional side of a [`SharedProducer`](crate::SharedProducer).
#[derive(Debug)]
pub(crate) struct Transaction {
    pub(crate) id: String,
    pub(crate) timeout: Duration,
    /// A store's overlay reached its bound: the owner should commit now.
    commit_requested: AtomicBool,
    /// A record (changelog or output) was sent since the transaction began.
    holds_records: AtomicBool,
    /// Where a commit's input offsets are added to the transaction.
    pub(crate) offsets: crate::offsets_call::OffsetsCaller,
}

impl Transaction {
    pub(crate) fn new(id: String, timeout: Duration) -> Self {
        Transaction {
            id,
            timeout,
            commit_requested: AtomicBool::new(false),
            holds_records: AtomicBool::new(false),
            offsets: crate::offsets_call::OffsetsCaller::default(),
        }
    }

    /// A record was sent in the open transaction.
    pub(crate) fn record_sent(&self) {
        self.holds_records.store(true, Ordering::Release);
    }

    /// Whether the open transaction holds any record.
    pub(crate) fn holds_records(&self) -> bool {
        self.holds_records.load(Ordering::Acquire)
    }

    /// A new transaction began: it holds nothing yet.
    pub(crate) fn began(&self) {
        self.holds_records.store(false, Ordering::Release);
    }

    /// Asks the producer's owner to commit soon (a full overlay must never be applied locally
    /// under a transaction).
    pub(crate) fn request_commit(&self) {
        self.commit_requested.store(true, Ordering::Release);
    }

    /// Whether a store asked for a commit since the last one started.
    pub(crate) fn commit_is_requested(&self) -> bool {
        self.commit_requested.load(Ordering::Acquire)
    }

    /// A commit starts: it answers every request made so far.
    pub(crate) fn commit_started(&self) {
        self.commit_requested.store(false, Ordering::Release);
    }
}

/// A store whose writes a transaction carries.
pub(crate) trait TransactionMember: Send + Sync {
    /// The store's name, for errors.
    fn member_name(&self) -> String;
    /// The store's send lock: held from the settle to the next transaction's begin, so that no
    /// write of the store falls between them (a [`Batch`](kstate_core::Batch) is in one
    /// transaction, whole). The calls below are made with it held.
    fn hold_sends(&self) -> std::sync::MutexGuard<'_, ()>;
    /// Waits until every record the store sent is acknowledged (its report served).
    fn settle(&self, deadline: Instant) -> Result<(), PoisonReason>;
    /// The transaction committed: write the overlay and its last offset to RocksDB.
    fn committed(&self) -> kstate_core::Result<()>;
    /// An abort starts: the purge's delivery failures must not poison.
    fn abort_starting(&self);
    /// The transaction aborted: drop the overlay.
    fn aborted(&self);
    /// The producer failed for good: the store serves nothing more.
    fn producer_failed(&self, reason: PoisonReason);
}
