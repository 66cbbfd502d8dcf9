//! Session stores: a key's sessions of activity, each closed after an inactivity gap, kept for
//! a retention behind stream time.
//!
//! - [`SessionOptions`]: retention and segments.
//! - [`SessionStore`]: the store, over any [`KeyValueStore`](crate::KeyValueStore), with
//!   [`merge`](SessionStore::merge) for the usual "a record extends or joins sessions" step.
//! - [`SessionChangelog`]: its changelog in Kafka Streams' format.
//!
//! ```
//! use std::time::Duration;
//! use kstate_core::{MemoryStore, SessionOptions, SessionStore};
//!
//! let sessions = SessionStore::open(
//!     MemoryStore::new("visits"),
//!     SessionOptions::new(Duration::from_secs(3600)),
//! )?;
//! let gap = Duration::from_secs(300);
//! let count = |joined: &[kstate_core::Session]| {
//!     let before: u64 = joined.iter().map(|s| u64::from_be_bytes(s.value[..].try_into().unwrap())).sum();
//!     (before + 1).to_be_bytes().to_vec()
//! };
//! sessions.merge(b"user-1", 1_000, gap, count)?;
//! sessions.merge(b"user-1", 200_000, gap, count)?; // within 5 minutes: the same session
//! let (_, merged) = sessions.merge(b"user-1", 100_000, gap, count)?;
//! let merged = merged.unwrap();
//! assert_eq!((merged.start, merged.end, merged.value), (1_000, 200_000, 3u64.to_be_bytes().to_vec()));
//! # Ok::<(), kstate_core::Error>(())
//! ```

mod changelog;
mod store;

pub use changelog::SessionChangelog;
pub use store::{Session, SessionIter, SessionOptions, SessionPut, SessionStore};
