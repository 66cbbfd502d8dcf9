//! Interactive queries: read a store of a task running in this process, from any thread, while
//! the task writes it. [`Running::query`] takes any store's handle and gives the query of its
//! kind; each read is routed to the task that owns the partition asked for.
//!
//! Reads see what the task has written into its logged store (a coalescing store's latest
//! writes show after the next commit). A window or session query opens a reader over the
//! logged store for each call: it reads the stored stream time, so windows and sessions that
//! have expired by then are invisible, as they are to the task.

use std::ops::RangeBounds;
use std::sync::Arc;

use kstate_core::codec::{Bincode, Codec, OrderedKey};
use kstate_core::{KeyValueStore, Session, SessionStore, Store, WindowEntry, WindowStore};
use kstate_kafka::LoggedStore;

use crate::app::Running;
use crate::stores::{SessionHandle, StoreHandle, WindowHandle};

/// Why a query has no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The task is not running in this process (another member owns it, or it is restoring).
    #[error("store {store} of task {partition} is not running here")]
    NotHere {
        /// The store.
        store: String,
        /// The task.
        partition: i32,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] kstate_core::Error),
}

impl Running {
    /// Read-only queries of a store, routed to the task that owns a partition: a
    /// [`StoreQuery`](crate::StoreQuery) for a key-value store's handle, a [`WindowQuery`](crate::WindowQuery)
    /// for a window store's, a [`SessionQuery`](crate::SessionQuery) for a session store's.
    pub fn query<H: Queryable>(&self, handle: &H) -> H::Query<'_> {
        handle.query(self)
    }

    /// Task `partition`'s logged store `name`, if the task is running here.
    pub(crate) fn running_store(
        &self,
        partition: i32,
        name: &str,
    ) -> Result<Arc<LoggedStore>, QueryError> {
        self.shared
            .registry
            .store(partition, name)
            .ok_or_else(|| QueryError::NotHere {
                store: name.to_string(),
                partition,
            })
    }
}

/// A store handle [`Running::query`] reads through: each kind of store has its query.
pub trait Queryable {
    /// The query of this kind of store.
    type Query<'a>;

    /// The query of this handle's store in `running`.
    fn query<'a>(&self, running: &'a Running) -> Self::Query<'a>;
}

/// Read-only access to one key-value store of the tasks running here.
pub struct StoreQuery<'a, K, V> {
    running: &'a Running,
    handle: StoreHandle<K, V>,
}

impl<K, V> Queryable for StoreHandle<K, V> {
    type Query<'a> = StoreQuery<'a, K, V>;

    fn query<'a>(&self, running: &'a Running) -> StoreQuery<'a, K, V> {
        StoreQuery {
            running,
            handle: self.clone(),
        }
    }
}

impl<K: OrderedKey, V> StoreQuery<'_, K, V>
where
    Bincode: Codec<V>,
{
    /// The value under `key` in task `partition`'s store.
    pub fn get(&self, partition: i32, key: &K) -> Result<Option<V>, QueryError> {
        let store = self.running.running_store(partition, self.handle.name())?;
        let typed: Store<K, V, &dyn KeyValueStore> = Store::new(&*store);
        Ok(typed.get(key)?)
    }
}

/// Read-only access to one window store of the tasks running here (keys and values as bytes,
/// as the task's [`TaskWindowStore`](crate::TaskWindowStore) holds them).
pub struct WindowQuery<'a> {
    running: &'a Running,
    handle: WindowHandle,
}

impl Queryable for WindowHandle {
    type Query<'a> = WindowQuery<'a>;

    fn query<'a>(&self, running: &'a Running) -> WindowQuery<'a> {
        WindowQuery {
            running,
            handle: self.clone(),
        }
    }
}

impl WindowQuery<'_> {
    /// `key`'s windows starting in `time`, earliest first, in task `partition`'s store.
    pub fn fetch(
        &self,
        partition: i32,
        key: &[u8],
        time: impl RangeBounds<i64>,
    ) -> Result<Vec<WindowEntry>, QueryError> {
        let store = self.running.running_store(partition, self.handle.name())?;
        let windows = WindowStore::reader(&*store, self.handle.options)?;
        Ok(windows.fetch(key, time)?.collect::<Result<_, _>>()?)
    }

    /// Every window starting in `time`, by key then start, in task `partition`'s store.
    pub fn fetch_all(
        &self,
        partition: i32,
        time: impl RangeBounds<i64>,
    ) -> Result<Vec<WindowEntry>, QueryError> {
        let store = self.running.running_store(partition, self.handle.name())?;
        let windows = WindowStore::reader(&*store, self.handle.options)?;
        Ok(windows.fetch_all(time)?.collect::<Result<_, _>>()?)
    }
}

/// Read-only access to one session store of the tasks running here.
pub struct SessionQuery<'a> {
    running: &'a Running,
    handle: SessionHandle,
}

impl Queryable for SessionHandle {
    type Query<'a> = SessionQuery<'a>;

    fn query<'a>(&self, running: &'a Running) -> SessionQuery<'a> {
        SessionQuery {
            running,
            handle: self.clone(),
        }
    }
}

impl SessionQuery<'_> {
    /// `key`'s sessions that end at or after `earliest_end` and start at or before
    /// `latest_start`, by end time, in task `partition`'s store.
    pub fn find_sessions(
        &self,
        partition: i32,
        key: &[u8],
        earliest_end: i64,
        latest_start: i64,
    ) -> Result<Vec<Session>, QueryError> {
        let store = self.running.running_store(partition, self.handle.name())?;
        let sessions = SessionStore::reader(&*store, self.handle.options)?;
        Ok(sessions
            .find_sessions(key, earliest_end, latest_start)?
            .collect::<Result<_, _>>()?)
    }
}
