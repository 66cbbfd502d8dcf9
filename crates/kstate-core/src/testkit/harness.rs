//! What an engine gives the kits ([`Harness`]: fresh stores and reopened ones) and the write
//! paths every scenario runs through ([`WritePath`]).

use std::sync::Arc;

use crate::changelog_keys::ChangelogKeys;
use crate::store::{Batch, KeyValueStore, Mutation};

/// How the kit gets stores from an engine.
pub trait Harness {
    /// The engine's store type.
    type Store: KeyValueStore;

    /// A fresh, empty store.
    fn open(&mut self) -> Self::Store;

    /// Closes `store` and opens it again, as a restarted task would: the contents must be what
    /// they were at close.
    fn reopen(&mut self, store: Self::Store) -> Self::Store;

    /// A fresh, empty store whose changelog, if the engine has one, maps keys with `keys` (a
    /// window store's). Engines without a changelog open a plain store.
    fn open_mapped(&mut self, keys: Arc<dyn ChangelogKeys>) -> Self::Store {
        let _ = keys;
        self.open()
    }
}

/// The ways a mutation can reach a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePath {
    /// `put` and `delete`, one call per mutation.
    Single,
    /// Runs of puts through `put_all`, runs of deletes through `delete_all`.
    Grouped,
    /// All mutations in one atomic `write(Batch)`.
    Batch,
}

impl WritePath {
    /// Every path, in the order the scenarios run them.
    pub const ALL: [WritePath; 3] = [WritePath::Single, WritePath::Grouped, WritePath::Batch];

    /// Applies `mutations` to `store` through this path.
    pub fn apply<S: KeyValueStore + ?Sized>(self, store: &S, mutations: &[Mutation]) {
        match self {
            WritePath::Single => {
                for (k, v) in mutations {
                    match v {
                        Some(v) => store.put(k, v).unwrap(),
                        None => store.delete(k).unwrap(),
                    }
                }
            }
            WritePath::Grouped => {
                for run in mutations.chunk_by(|a, b| a.1.is_some() == b.1.is_some()) {
                    if run[0].1.is_some() {
                        let entries: Vec<(&[u8], &[u8])> = run
                            .iter()
                            .map(|(k, v)| (k.as_slice(), v.as_deref().unwrap_or_default()))
                            .collect();
                        store.put_all(&entries).unwrap();
                    } else {
                        let keys: Vec<&[u8]> = run.iter().map(|(k, _)| k.as_slice()).collect();
                        store.delete_all(&keys).unwrap();
                    }
                }
            }
            WritePath::Batch => store
                .write(mutations.iter().cloned().collect::<Batch>())
                .unwrap(),
        }
    }
}
