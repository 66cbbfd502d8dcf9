//! A task's stores: each a logged store (RocksDB + changelog), optionally behind the coalescing
//! cache, and the typed handles a processor and the query API name them by.

use std::marker::PhantomData;
use std::sync::Arc;

use kstate_core::KeyValueStore;
use kstate_kafka::LoggedStore;

use crate::cache::CoalescingStore;

/// A typed handle to a store, returned by [`AppBuilder::store`](crate::AppBuilder::store) and
/// passed to [`Context::store`](crate::Context::store) and the query API. Cheap to clone.
pub struct StoreHandle<K, V> {
    pub(crate) index: usize,
    pub(crate) name: Arc<str>,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> StoreHandle<K, V> {
    pub(crate) fn new(index: usize, name: &str) -> Self {
        StoreHandle {
            index,
            name: name.into(),
            types: PhantomData,
        }
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<K, V> Clone for StoreHandle<K, V> {
    fn clone(&self) -> Self {
        StoreHandle {
            index: self.index,
            name: self.name.clone(),
            types: PhantomData,
        }
    }
}

impl<K, V> std::fmt::Debug for StoreHandle<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreHandle")
            .field("name", &self.name)
            .finish()
    }
}

/// One store of a task.
pub(crate) struct TaskStore {
    pub(crate) name: String,
    pub(crate) logged: Arc<LoggedStore>,
    pub(crate) cache: Option<CoalescingStore>,
}

impl TaskStore {
    /// What the processor reads and writes.
    pub(crate) fn view(&self) -> &dyn KeyValueStore {
        match &self.cache {
            Some(cache) => cache,
            None => &*self.logged,
        }
    }
}
