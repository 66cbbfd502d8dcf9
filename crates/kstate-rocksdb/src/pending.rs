//! [`PendingMemory`]: the part of a [`MemoryBudget`](crate::MemoryBudget) that holds writes
//! above RocksDB.
//!
//! A logged store keeps each write in an overlay until the broker has acknowledged it and a
//! commit moves it into RocksDB, and a task's coalescing cache keeps the last value of each key
//! written in a commit interval. Each is bounded per store (64 MiB and 32 MiB by default), which
//! is no bound at all for a process of a thousand tasks of three stores: a budget that counts
//! only RocksDB's memtables and block cache says nothing of 100 GiB of overlays. So every
//! overlay and cache charges its bytes to one account per budget, and a holder that finds the
//! account full gives memory back before it takes more: an overlay commits (or, under a
//! transaction, asks for the commit), a cache writes its entries down and forgets its clean
//! ones (RocksDB's write-buffer manager does the same with memtables: past its limit, the next
//! write flushes).
//!
//! A holder charges through a [`PendingCharge`], which it sets to what it holds after each change
//! and which gives its bytes back when dropped, so the account cannot drift from what the
//! holders hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One account of memory held above RocksDB, shared by every holder charged to it. Cloning
/// shares the account.
#[derive(Clone)]
pub struct PendingMemory {
    used: Arc<AtomicUsize>,
    limit: usize,
}

impl std::fmt::Debug for PendingMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingMemory")
            .field("used", &self.usage())
            .field("limit", &self.limit)
            .finish()
    }
}

impl PendingMemory {
    /// An empty account of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        PendingMemory {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// The bytes charged now, by all holders.
    pub fn usage(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The account's limit, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the holders hold the limit or more: a holder should give memory back before it
    /// takes more.
    pub fn is_full(&self) -> bool {
        self.usage() >= self.limit
    }

    /// A new holder's charge, at zero bytes.
    pub fn charge(&self) -> PendingCharge {
        PendingCharge {
            account: self.clone(),
            bytes: 0,
        }
    }
}

/// What one holder has charged to a [`PendingMemory`]; given back when dropped.
#[derive(Debug)]
pub struct PendingCharge {
    account: PendingMemory,
    bytes: usize,
}

impl PendingCharge {
    /// Charges the holder at `bytes` from now on (more or less than before).
    pub fn set(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            self.account
                .used
                .fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else {
            self.account
                .used
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
    }

    /// The account charged.
    pub fn account(&self) -> &PendingMemory {
        &self.account
    }
}

impl Drop for PendingCharge {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_follow_what_each_holder_holds_and_are_given_back_when_dropped() {
        let account = PendingMemory::new(100);
        let mut a = account.charge();
        let mut b = account.charge();
        a.set(60);
        b.set(30);
        assert_eq!(account.usage(), 90);
        assert!(!account.is_full());
        b.set(45);
        assert_eq!(account.usage(), 105);
        assert!(account.is_full(), "at or past the limit");
        a.set(10);
        assert_eq!(account.usage(), 55);
        drop(b);
        assert_eq!(account.usage(), 10, "a dropped holder gives its bytes back");
        drop(a);
        assert_eq!(account.usage(), 0);
    }
}
