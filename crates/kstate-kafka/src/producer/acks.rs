//! Why a store can trust the offset its commit stores: what the broker acknowledged of its
//! records, checked to arrive in send order and to be contiguous from the restore's end (one
//! writer per partition, DESIGN.md), with the exceptions transactions make (markers, aborts).
//!
//! Apart from librdkafka on purpose: a delivery report reaches the tracker as a sequence
//! number's low bits and an offset, so every guarantee here is tested without a broker, and the
//! router above it only has to hand reports over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kstate_core::PoisonReason;
use kstate_core::sync::{lock, wait_timeout};

/// A delivery report names its record by the low `SEQ_BITS` bits of its sequence number only
/// (the rest of the delivery opaque is the store's route, see `routing.rs`). Acknowledgements of
/// one store arrive in order, so its tracker knows which full sequence number the low bits
/// belong to. Defined here, where they are read back, so that the tracker needs nothing above it.
pub(super) const SEQ_BITS: u32 = 40;
pub(super) const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// What the broker has acknowledged so far.
#[derive(Debug, Default)]
struct Acks {
    /// Every record with a sequence number up to this one is acknowledged.
    acked_seq: u64,
    /// The offset of record `acked_seq`.
    last_offset: Option<i64>,
    /// A commit waiting for the offset of this sequence number.
    watch: Option<u64>,
    watched_offset: Option<i64>,
    /// The offset the next acknowledged record must have: the restore's end, then the last
    /// acknowledged offset + 1. `None` until the restore has ended (nothing is sent before).
    next_offset: Option<i64>,
    /// Why the changelog can no longer be trusted, once it cannot.
    poisoned: Option<PoisonReason>,
    /// Threads waiting on `changed`. Acknowledgements wake them only when there are any: most
    /// records have no waiter, and a wake is a system call per record.
    waiters: u32,
    /// Under a transaction: the records of an aborted transaction, whose delivery reports (the
    /// purge's failures, a late success) no longer count.
    aborted: Option<(u64, u64)>,
    /// Under a transaction: an abort is under way; every report is of an aborted record.
    aborting: bool,
    /// Under a transaction: a transaction committed and no record landed since, so the next
    /// one may land past `next_offset` if the coordinator wrote its marker more than once.
    after_marker: bool,
    /// Offsets `from..to` that the first record after a marker skipped: markers only, unless
    /// another writer's records are there; the commit checks before it applies
    /// ([`take_marker_gaps`](AckTracker::take_marker_gaps)).
    marker_gaps: Vec<MarkerGap>,
}

/// Offsets between a store's commit marker and its next record, `from..to`, which must hold
/// nothing but more markers (see [`crate::marker_gap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkerGap {
    /// Where the store's next record was expected.
    pub(crate) from: i64,
    /// Where it landed.
    pub(crate) to: i64,
}

/// Shared between the producer's delivery callback and the store.
#[derive(Debug)]
pub(crate) struct AckTracker {
    acks: Mutex<Acks>,
    changed: Condvar,
    /// Set once `poisoned` is, so that every send can check it without taking the lock the
    /// delivery callback takes for every record.
    is_poisoned: AtomicBool,
    /// `topic/partition`, for the log.
    changelog: String,
    /// `kstate_changelog_acked_offset` of this partition, registered once: setting it is an
    /// atomic store, cheap enough for every acknowledgement.
    acked_offset: metrics::Gauge,
}

impl AckTracker {
    /// The tracker of `topic`'s partition `partition`.
    pub(crate) fn new(topic: &str, partition: i32) -> Self {
        AckTracker {
            acks: Mutex::default(),
            changed: Condvar::new(),
            is_poisoned: AtomicBool::new(false),
            changelog: format!("{topic}/{partition}"),
            acked_offset: metrics::gauge!(
                "kstate_changelog_acked_offset",
                "topic" => topic.to_string(),
                "partition" => partition.to_string()
            ),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Acks> {
        lock(&self.acks)
    }

    /// Records why the changelog can no longer be trusted (the first reason wins). Also while
    /// an abort is under way: that the abort's purge must not poison is decided where its
    /// failures arrive ([`failed`](Self::failed)), and a failure of the abort itself
    /// (`TransactionMember::producer_failed`) must poison, or the stores would go on serving
    /// the transaction that was to be dropped.
    fn set_poisoned(&self, acks: &mut Acks, reason: PoisonReason) {
        if acks.poisoned.is_none() {
            tracing::error!(changelog = %self.changelog, %reason, "changelog poisoned");
            acks.poisoned = Some(reason);
            self.is_poisoned.store(true, Ordering::Release);
        }
        self.changed.notify_all();
    }

    pub(crate) fn poison(&self, reason: PoisonReason) {
        let mut acks = self.lock();
        self.set_poisoned(&mut acks, reason);
    }

    /// Record `...seq_low` was not delivered: poisons, unless it belongs to an aborted
    /// transaction or to the one an abort is dropping (the purge fails every queued record).
    pub(super) fn failed(&self, seq_low: u64, reason: PoisonReason) {
        let mut acks = self.lock();
        if !acks.aborting && !acks.is_aborted(seq_low) {
            self.set_poisoned(&mut acks, reason);
        }
    }

    /// The first record sent from now on must land at `offset` (the restore's end), each next one
    /// right after its predecessor. Under a transaction (`transactional`) the first may land
    /// further on past markers only, as after a commit: a transaction that an earlier instance
    /// of the task left open (it was killed) is aborted by the coordinator when it fences that
    /// instance or the transaction times out, which can be after the restore read the end, and
    /// its abort marker then lands in between. Such a gap is kept, and checked to hold markers
    /// only before the commit that would move past it ([`take_marker_gaps`](Self::take_marker_gaps)).
    pub(crate) fn expect_offsets_from(&self, offset: i64, transactional: bool) {
        let mut acks = self.lock();
        acks.next_offset = Some(offset);
        acks.after_marker = transactional;
    }

    pub(crate) fn poisoned(&self) -> Option<PoisonReason> {
        if !self.is_poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.lock().poisoned.clone()
    }

    /// Waits on `changed` for at most `left`, counted as a waiter meanwhile.
    fn wait<'a>(&self, mut acks: MutexGuard<'a, Acks>, left: Duration) -> MutexGuard<'a, Acks> {
        acks.waiters += 1;
        let mut acks = wait_timeout(&self.changed, acks, left);
        acks.waiters -= 1;
        acks
    }

    /// Every record up to this sequence number is acknowledged.
    pub(crate) fn acked_seq(&self) -> u64 {
        self.lock().acked_seq
    }

    /// Waits until every record up to `seq` is acknowledged.
    pub(crate) fn wait_for(&self, seq: u64, timeout: Duration) -> Result<(), PoisonReason> {
        let deadline = Instant::now() + timeout;
        let mut acks = self.lock();
        loop {
            if let Some(reason) = &acks.poisoned {
                return Err(reason.clone());
            }
            if acks.acked_seq >= seq {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoisonReason::Timeout {
                    waiting_for: format!("the acknowledgement of record {seq}"),
                    waited: timeout,
                });
            }
            acks = self.wait(acks, left);
        }
    }

    /// The offset of record `seq`, waiting for its acknowledgement. Must be called before any
    /// record after `seq` is sent (the store calls it with its state lock held while
    /// registering), then waited on with [`AckTracker::wait_for_watched`].
    pub(crate) fn watch(&self, seq: u64) -> Result<Option<i64>, PoisonReason> {
        let mut acks = self.lock();
        if let Some(reason) = &acks.poisoned {
            return Err(reason.clone());
        }
        if acks.acked_seq == seq {
            // Nothing sent since the restore (a commit of local keys only, such as a TTL
            // store's expiry index): the position is the restore's end.
            let restored_end = acks.next_offset.map(|next| next - 1);
            if let Some(offset) = acks.last_offset.or(restored_end) {
                return Ok(Some(offset));
            }
        }
        acks.watch = Some(seq);
        acks.watched_offset = None;
        Ok(None)
    }

    /// The offset of record `seq`, the last one sent: [`watch`](Self::watch), then
    /// [`wait_for_watched`](Self::wait_for_watched) if it is not acknowledged yet. Only for a
    /// caller that may wait while holding off other sends.
    pub(crate) fn offset_of(&self, seq: u64, timeout: Duration) -> Result<i64, PoisonReason> {
        match self.watch(seq)? {
            Some(offset) => Ok(offset),
            None => self.wait_for_watched(timeout),
        }
    }

    pub(crate) fn wait_for_watched(&self, timeout: Duration) -> Result<i64, PoisonReason> {
        let deadline = Instant::now() + timeout;
        let mut acks = self.lock();
        loop {
            if let Some(reason) = &acks.poisoned {
                return Err(reason.clone());
            }
            if let Some(offset) = acks.watched_offset {
                acks.watch = None;
                return Ok(offset);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PoisonReason::Timeout {
                    waiting_for: "the acknowledgement of a commit's last record".into(),
                    waited: timeout,
                });
            }
            acks = self.wait(acks, left);
        }
    }

    /// The offset of the last acknowledged record, once every record up to `sent` is
    /// acknowledged (a transaction's records, after `commit_transaction` returned).
    pub(crate) fn all_acknowledged(&self, sent: u64) -> Result<Option<i64>, PoisonReason> {
        let acks = self.lock();
        if let Some(reason) = &acks.poisoned {
            return Err(reason.clone());
        }
        if acks.acked_seq != sent {
            return Err(PoisonReason::OutOfOrder {
                message: format!(
                    "the transaction committed with records {}..={sent} unacknowledged",
                    acks.acked_seq + 1
                ),
            });
        }
        Ok(acks.last_offset)
    }

    /// A transaction this store wrote records to committed: its partition holds a commit
    /// marker after them, so the next record lands one offset later, or further on if the
    /// transaction coordinator wrote the marker again (it retries a marker write whose leader
    /// moved): such a gap is recorded, to be checked for records before the next commit applies.
    pub(crate) fn transaction_committed(&self) {
        let mut acks = self.lock();
        if let Some(next) = &mut acks.next_offset {
            *next += 1;
            acks.after_marker = true;
        }
    }

    /// The gaps recorded since the last call: the commit that is about to apply the records
    /// after them must make sure they hold markers only.
    pub(crate) fn take_marker_gaps(&self) -> Vec<MarkerGap> {
        std::mem::take(&mut self.lock().marker_gaps)
    }

    /// An abort is starting: the purged records' failures must not poison.
    pub(crate) fn abort_starting(&self) {
        self.lock().aborting = true;
    }

    /// The transaction whose records were sequence numbers `first..=last` aborted: they count
    /// for nothing; a failure they caused is forgotten unless it means more than this
    /// transaction (another writer, acknowledgements out of order, a local write that failed).
    /// The next record's offset is unknown (the aborted records and the marker may or may not
    /// have landed); the one after it is checked again.
    pub(crate) fn transaction_aborted(&self, first: u64, last: u64) {
        let mut acks = self.lock();
        acks.aborting = false;
        if last >= first {
            acks.aborted = Some((first, last));
        }
        acks.acked_seq = acks.acked_seq.max(last);
        acks.watch = None;
        acks.watched_offset = None;
        acks.next_offset = None;
        acks.after_marker = false;
        acks.marker_gaps.clear();
        if acks
            .poisoned
            .as_ref()
            .is_some_and(PoisonReason::is_transient)
        {
            acks.poisoned = None;
            self.is_poisoned.store(false, Ordering::Release);
        }
        self.changed.notify_all();
    }

    /// Record `acked_seq + 1` (whose sequence number ends in the bits `seq_low`) landed at
    /// `offset`.
    pub(super) fn delivered(&self, seq_low: u64, offset: i64) {
        let mut acks = self.lock();
        if acks.poisoned.is_some() || acks.aborting || acks.is_aborted(seq_low) {
            // Past a failed record nothing counts as acknowledged: a commit must never cover it.
            // An aborted transaction's records count for nothing either.
            return;
        }
        let seq = acks.acked_seq + 1;
        if seq & SEQ_MASK != seq_low || offset < 0 {
            // The idempotent producer acknowledges in order with real offsets; anything else
            // breaks the offset bookkeeping, so refuse to go on rather than store a wrong position.
            let reason = PoisonReason::OutOfOrder {
                message: format!(
                    "acknowledgement for record ...{seq_low} (offset {offset}) arrived when record \
                     {seq} was due"
                ),
            };
            self.set_poisoned(&mut acks, reason);
            return;
        }
        if let Some(expected) = acks.next_offset
            && offset != expected
        {
            if acks.after_marker && offset > expected {
                acks.marker_gaps.push(MarkerGap {
                    from: expected,
                    to: offset,
                });
            } else {
                let reason = PoisonReason::ForeignWrite {
                    expected_offset: expected,
                    actual_offset: offset,
                };
                self.set_poisoned(&mut acks, reason);
                return;
            }
        }
        acks.after_marker = false;
        acks.next_offset = Some(offset + 1);
        acks.acked_seq = seq;
        acks.last_offset = Some(offset);
        if acks.watch == Some(seq) {
            acks.watched_offset = Some(offset);
        }
        self.acked_offset.set(offset as f64);
        if acks.waiters > 0 {
            self.changed.notify_all();
        }
    }
}

impl Acks {
    /// Whether the record whose sequence number ends in `seq_low` belongs to the last aborted
    /// transaction.
    fn is_aborted(&self, seq_low: u64) -> bool {
        let Some((first, last)) = self.aborted else {
            return false;
        };
        // The full sequence number with these low bits at or below `last`.
        let mut seq = (last & !SEQ_MASK) | seq_low;
        if seq > last {
            seq = seq.wrapping_sub(SEQ_MASK + 1);
        }
        seq >= first && seq <= last
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_record_after_a_commit_may_land_past_a_repeated_marker_and_the_gap_is_kept_for_the_commit()
    {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.transaction_committed(); // marker at 11
        tracker.delivered(2, 13); // a second marker at 12
        assert!(tracker.poisoned().is_none());
        assert_eq!(
            tracker.take_marker_gaps(),
            vec![MarkerGap { from: 12, to: 13 }]
        );
        assert!(tracker.take_marker_gaps().is_empty());
        // Within a transaction, records follow each other: a gap there is another writer.
        tracker.delivered(3, 15);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 14,
                actual_offset: 15
            })
        ));
    }

    /// Seen on the three-node cluster: the restore ended at 12065 after a killed instance's
    /// last marker; the coordinator then aborted that instance's open transaction, whose abort
    /// marker landed at 12065, and the new instance's first record at 12066.
    #[test]
    fn a_first_record_under_a_transaction_may_land_past_an_abort_marker_after_the_restore() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 11); // an earlier instance's abort marker at 10
        assert!(tracker.poisoned().is_none(), "{:?}", tracker.poisoned());
        assert_eq!(
            tracker.take_marker_gaps(),
            vec![MarkerGap { from: 10, to: 11 }]
        );
        // Then records follow each other again.
        tracker.delivered(2, 13);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 12,
                actual_offset: 13
            })
        ));
    }

    #[test]
    fn a_first_record_without_a_transaction_must_land_at_the_restores_end() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, 11); // no markers without transactions: another writer's record
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 10,
                actual_offset: 11
            })
        ));
        assert!(tracker.take_marker_gaps().is_empty());
    }

    #[test]
    fn a_record_that_lands_before_its_expected_offset_after_a_commit_is_another_writers() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.transaction_committed();
        tracker.delivered(2, 11); // where the marker must be
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite { .. })
        ));
    }

    #[test]
    fn sequence_numbers_keep_counting_past_the_bits_the_opaque_carries() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.lock().acked_seq = SEQ_MASK - 1;
        tracker.expect_offsets_from(100, true);
        // Record SEQ_MASK, then SEQ_MASK + 1, whose low bits are 0.
        tracker.delivered(SEQ_MASK, 100);
        tracker.delivered(0, 101);
        assert_eq!(tracker.acked_seq(), SEQ_MASK + 1);
        assert!(tracker.poisoned().is_none());
        // Low bits that are not the next record's: out of order, poisoned.
        tracker.delivered(5, 102);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::OutOfOrder { .. })
        ));
    }

    // The invariants of the tracker, one a test: what "one writer per partition" and the commit
    // protocol may count on, asserted on what the tracker tells its store.

    fn delivery_failed(what: &str) -> PoisonReason {
        PoisonReason::DeliveryFailed {
            message: what.into(),
        }
    }

    #[test]
    fn an_offset_gap_without_a_transaction_poisons_the_store() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, 10);
        tracker.delivered(2, 12); // another writer's record at 11
        assert_eq!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 11,
                actual_offset: 12
            })
        );
        // The record past the gap is not acknowledged: no commit may cover it.
        assert_eq!(tracker.acked_seq(), 1);
        // Without transactions there are no markers: the gap is not one to check, it poisons.
        assert!(tracker.take_marker_gaps().is_empty());
    }

    #[test]
    fn acks_out_of_order_or_without_an_offset_poison_the_store_and_count_for_nothing() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, 10);
        tracker.delivered(3, 11); // record 2 was due
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::OutOfOrder { .. })
        ));
        assert_eq!(tracker.acked_seq(), 1);
        // Nothing counts any more, not even the report that was due.
        tracker.delivered(2, 11);
        assert_eq!(tracker.acked_seq(), 1);
        assert!(matches!(
            tracker.wait_for(2, Duration::ZERO),
            Err(PoisonReason::OutOfOrder { .. })
        ));

        // A report in order but without a real offset breaks the bookkeeping just as much.
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, -1);
        assert!(matches!(
            tracker.poisoned(),
            Some(PoisonReason::OutOfOrder { .. })
        ));
        assert_eq!(tracker.acked_seq(), 0);
    }

    #[test]
    fn past_a_failed_delivery_nothing_counts_as_acknowledged_and_the_first_reason_stays() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, 10);
        tracker.failed(2, delivery_failed("record 2 lost"));
        assert_eq!(tracker.poisoned(), Some(delivery_failed("record 2 lost")));
        // Not even a report that would be due counts.
        tracker.delivered(2, 11);
        assert_eq!(tracker.acked_seq(), 1);
        assert_eq!(
            tracker.wait_for(3, Duration::ZERO),
            Err(delivery_failed("record 2 lost"))
        );
        // A later failure does not replace the reason the store was poisoned for.
        tracker.poison(PoisonReason::ClientFailed {
            message: "later".into(),
        });
        assert_eq!(tracker.poisoned(), Some(delivery_failed("record 2 lost")));
    }

    #[test]
    fn an_aborted_transactions_records_count_for_nothing() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.transaction_committed(); // marker at 11
        // The next transaction: record 2 lands past a repeated marker, record 3 is in flight.
        tracker.delivered(2, 13);
        tracker.abort_starting();
        // The abort's purge fails record 3, and a late success of record 2 arrives: neither
        // poisons nor counts.
        tracker.failed(3, delivery_failed("purged"));
        tracker.delivered(3, 14);
        assert_eq!(tracker.poisoned(), None);
        assert_eq!(tracker.acked_seq(), 2);
        tracker.transaction_aborted(2, 3);
        assert_eq!(tracker.poisoned(), None);
        assert_eq!(tracker.acked_seq(), 3);
        // The gap record 2 skipped is no commit's concern any more.
        assert!(tracker.take_marker_gaps().is_empty());
        // Reports of the aborted records arriving after the abort count for nothing either.
        tracker.delivered(3, 14);
        tracker.failed(2, delivery_failed("late"));
        assert_eq!(tracker.poisoned(), None);
        assert_eq!(tracker.acked_seq(), 3);
    }

    #[test]
    fn after_an_abort_the_next_record_may_land_anywhere_and_the_one_after_it_is_checked_again() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.abort_starting();
        tracker.transaction_aborted(2, 3); // records 2 and 3 and the marker: where, unknown
        tracker.delivered(4, 20);
        assert_eq!(tracker.poisoned(), None);
        assert_eq!(tracker.all_acknowledged(4), Ok(Some(20)));
        assert!(tracker.take_marker_gaps().is_empty());
        tracker.delivered(5, 22);
        assert_eq!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 21,
                actual_offset: 22
            })
        );
    }

    #[test]
    fn an_abort_clears_a_failed_delivery_but_not_another_writer() {
        // A failure of some writes: aborting drops them, and the store goes on.
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.failed(2, delivery_failed("record 2 lost"));
        assert!(tracker.poisoned().is_some());
        tracker.abort_starting();
        tracker.transaction_aborted(2, 2);
        assert_eq!(tracker.poisoned(), None);
        tracker.delivered(3, 15);
        assert_eq!(tracker.acked_seq(), 3);

        // Another writer: the store no longer matches its changelog, abort or not.
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        tracker.delivered(2, 12);
        tracker.abort_starting();
        tracker.transaction_aborted(2, 2);
        assert_eq!(
            tracker.poisoned(),
            Some(PoisonReason::ForeignWrite {
                expected_offset: 11,
                actual_offset: 12
            })
        );
    }

    #[test]
    fn the_watched_offset_is_the_watched_records_even_when_later_ones_are_acknowledged() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        tracker.delivered(1, 10);
        assert_eq!(tracker.watch(2), Ok(None)); // the commit's last record, in flight
        assert!(matches!(
            tracker.wait_for_watched(Duration::ZERO),
            Err(PoisonReason::Timeout { .. })
        ));
        // Records sent after the snapshot are acknowledged before the commit looks.
        tracker.delivered(2, 11);
        tracker.delivered(3, 12);
        assert_eq!(tracker.wait_for_watched(Duration::ZERO), Ok(11));
        // The last acknowledged record's offset is known at once.
        assert_eq!(tracker.watch(3), Ok(Some(12)));
    }

    #[test]
    fn a_commit_with_nothing_sent_since_the_restore_is_at_the_restores_end() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, false);
        assert_eq!(tracker.watch(0), Ok(Some(9)));
        assert_eq!(tracker.offset_of(0, Duration::ZERO), Ok(9));
    }

    #[test]
    fn a_transaction_that_committed_with_records_unacknowledged_is_refused() {
        let tracker = AckTracker::new("changelog", 0);
        tracker.expect_offsets_from(10, true);
        tracker.delivered(1, 10);
        assert!(matches!(
            tracker.all_acknowledged(2),
            Err(PoisonReason::OutOfOrder { .. })
        ));
        assert_eq!(tracker.all_acknowledged(1), Ok(Some(10)));
    }

    #[test]
    fn a_waiter_wakes_at_the_acknowledgement_it_waits_for_or_at_a_poison() {
        let patience = Duration::from_secs(60);
        let tracker = Arc::new(AckTracker::new("changelog", 0));
        tracker.expect_offsets_from(10, false);
        let wait_until_waiting = |tracker: &AckTracker| {
            while tracker.lock().waiters == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        };

        let waiter = {
            let tracker = tracker.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                (tracker.wait_for(2, patience), started.elapsed())
            })
        };
        wait_until_waiting(&tracker);
        tracker.delivered(1, 10);
        tracker.delivered(2, 11);
        let (result, waited) = waiter.join().unwrap();
        assert_eq!(result, Ok(()));
        assert!(waited < patience / 2, "woken late: {waited:?}");

        assert_eq!(tracker.watch(3), Ok(None));
        let waiter = {
            let tracker = tracker.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                (tracker.wait_for_watched(patience), started.elapsed())
            })
        };
        wait_until_waiting(&tracker);
        tracker.failed(3, delivery_failed("record 3 lost"));
        let (result, waited) = waiter.join().unwrap();
        assert_eq!(result, Err(delivery_failed("record 3 lost")));
        assert!(waited < patience / 2, "woken late: {waited:?}");
    }
}
