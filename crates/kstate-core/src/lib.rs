//! kstate-core: the store contract, independent of any engine.
//!
//! This crate must not depend on RocksDB or Kafka (as TiKV's `engine_traits` does not depend on
//! RocksDB): engines depend on it, never the other way round, so the contract can be tested on
//! its own ([`MemoryStore`]) and a new engine is a new crate.
//!
//! - [`KeyValueStore`]: the byte-level contract (get, write batches, ordered scans, flush, close).
//! - [`Store`]: the typed layer, keys through [`OrderedKey`], values through a [`Codec`] (serde +
//!   bincode by default).
//! - [`MemoryStore`]: an ordered in-memory engine.
//! - [`window`]: window stores (values per key and time window, expired a segment at a time)
//!   and their Kafka Streams-compatible changelog keys ([`ChangelogKeys`]).
//! - [`session`]: session stores (a key's sessions of activity), laid out and logged the same
//!   way.
//! - [`ttl`]: key-value stores whose keys expire, swept with changelog tombstones.
//! - [`sync`]: the poison-tolerant lock helpers every crate uses.
//! - `testkit` (feature): the conformance suite and the model-based property test every engine
//!   runs.
//!
//! ```
//! use kstate_core::{KeyValueStore, MemoryStore};
//!
//! let store = MemoryStore::new("example");
//! store.put(b"apple", b"1")?;
//! store.put(b"apricot", b"2")?;
//! store.put(b"banana", b"3")?;
//! let ap: Vec<_> = store.prefix_scan(b"ap")?.collect::<Result<_, _>>()?;
//! assert_eq!(ap.len(), 2);
//! # Ok::<(), kstate_core::Error>(())
//! ```

#![deny(unsafe_code)]

mod changelog_keys;
pub mod codec;
mod error;
mod memory;
mod range;
mod segments;
pub mod session;
mod store;
mod stream_clock;
pub mod sync;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod ttl;
mod typed;
pub mod window;

pub use changelog_keys::{ChangelogKeys, ChangelogReplay, MutationSink};
pub use codec::{Bincode, Codec, OrderedKey};
pub use error::{BoxError, Error, HexBytes, PoisonReason, Result};
pub use memory::MemoryStore;
pub use range::{KeyRange, Order, prefix_end};
pub use session::{Session, SessionChangelog, SessionOptions, SessionPut, SessionStore};
pub use store::{Batch, Entry, EntryIter, KeyValueStore, Mutation};
pub use ttl::{TtlChangelog, TtlClock, TtlOptions, TtlStore};
pub use typed::{Store, TypedIter, entry_check};
pub use window::{WindowChangelog, WindowEntry, WindowOptions, WindowPut, WindowStore};
