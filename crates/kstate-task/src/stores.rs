//! A task's stores: each a logged store (RocksDB + changelog), optionally behind the coalescing
//! cache, or a window, session or TTL store over one; and the handles a processor and the query
//! API name them by.

use std::marker::PhantomData;
use std::sync::Arc;

use kstate_core::{
    KeyValueStore, SessionOptions, SessionStore, TtlOptions, TtlStore, WindowOptions, WindowStore,
};
use kstate_kafka::LoggedStore;

use crate::cache::CoalescingStore;
use crate::config::StoreKind;

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

/// Declares a handle to a store of time ([`AppBuilder::window_store`](crate::AppBuilder::window_store)
/// and its siblings), passed to the [`Context`](crate::Context) method of the same name and to
/// [`Running::query`](crate::Running::query). It carries the store's options: a query opens a
/// reader with them.
macro_rules! time_handle {
    ($(#[$doc:meta])* $name:ident, $options:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            pub(crate) index: usize,
            pub(crate) name: Arc<str>,
            pub(crate) options: $options,
        }

        impl $name {
            pub(crate) fn new(index: usize, name: &str, options: $options) -> Self {
                $name {
                    index,
                    name: name.into(),
                    options,
                }
            }

            /// The store's name.
            pub fn name(&self) -> &str {
                &self.name
            }

            /// The store's options.
            pub fn options(&self) -> &$options {
                &self.options
            }
        }
    };
}

time_handle!(
    /// A handle to a window store of every task.
    WindowHandle,
    WindowOptions
);
time_handle!(
    /// A handle to a session store of every task.
    SessionHandle,
    SessionOptions
);
time_handle!(
    /// A handle to a TTL store of every task.
    TtlHandle,
    TtlOptions
);

/// A task's window store: over its logged store, keys as bytes (Kafka Streams' format).
pub type TaskWindowStore = WindowStore<Arc<LoggedStore>>;
/// A task's session store.
pub type TaskSessionStore = SessionStore<Arc<LoggedStore>>;
/// A task's TTL store.
pub type TaskTtlStore = TtlStore<Arc<LoggedStore>>;

/// The store of time a task store is, if it is one: opened over the logged store, holding the
/// stream time it read from it.
pub(crate) enum Timed {
    KeyValue,
    Window(TaskWindowStore),
    Session(TaskSessionStore),
    Ttl(TaskTtlStore),
}

/// How many expired keys a TTL store's sweep deletes per commit: bounded, so a commit after a
/// long pause does not stall the task; the rest go at the next commits.
pub(crate) const SWEEP_PER_COMMIT: usize = 10_000;

impl Timed {
    /// Opens the store of `kind` over `logged`, reading what it keeps there.
    pub(crate) fn open(kind: &StoreKind, logged: &Arc<LoggedStore>) -> kstate_core::Result<Timed> {
        Ok(match kind {
            StoreKind::KeyValue => Timed::KeyValue,
            StoreKind::Window(options) => {
                Timed::Window(WindowStore::open(logged.clone(), *options)?)
            }
            StoreKind::Session(options) => {
                Timed::Session(SessionStore::open(logged.clone(), *options)?)
            }
            StoreKind::Ttl(options) => Timed::Ttl(TtlStore::open(logged.clone(), *options)?),
        })
    }
}

/// One store of a task.
pub(crate) struct TaskStore {
    pub(crate) name: String,
    pub(crate) kind: StoreKind,
    pub(crate) logged: Arc<LoggedStore>,
    pub(crate) cache: Option<CoalescingStore>,
    pub(crate) timed: Timed,
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
