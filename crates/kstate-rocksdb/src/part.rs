//! Where a store's keys are in a RocksDB, and what holds them open: a task's part of a shared
//! RocksDB (its key and metadata prefixes and the lease that keeps the task open), and the
//! prefixes a store handle reads and writes under. Below the stores and the databases that hand
//! them out, so that neither needs the other to say this.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use kstate_core::sync::lock;

/// Holds one task of a shared RocksDB open; dropping the last handle on the task releases it.
pub(crate) struct Lease {
    pub(crate) held: Arc<Mutex<BTreeSet<u32>>>,
    pub(crate) task: u32,
}

impl Drop for Lease {
    fn drop(&mut self) {
        lock(&self.held).remove(&self.task);
    }
}

/// A task's part of a shared RocksDB.
#[derive(Clone)]
pub(crate) struct Part {
    pub(crate) keys: Vec<u8>,
    pub(crate) metadata: Vec<u8>,
    pub(crate) lease: Arc<Lease>,
}

/// The key prefixes of a store handle, and the lease that keeps its task open.
#[derive(Default)]
pub(crate) struct Prefixes {
    pub(crate) keys: Vec<u8>,
    pub(crate) metadata: Vec<u8>,
    pub(crate) lease: Option<Arc<Lease>>,
}
