//! Key-value stores whose keys expire: [`TtlStore`], [`TtlOptions`], [`TtlClock`], and the
//! changelog mapping [`TtlChangelog`].
//!
//! ```
//! use std::time::Duration;
//! use kstate_core::{MemoryStore, TtlOptions, TtlStore};
//!
//! let carts = TtlStore::open(MemoryStore::new("carts"), TtlOptions::new(Duration::from_secs(60)))?;
//! carts.put(b"user-1", b"3 items", 1_000)?;
//! carts.put(b"user-2", b"1 item", 30_000)?;
//! assert_eq!(carts.get(b"user-1")?, Some(b"3 items".to_vec()));
//! carts.put(b"user-2", b"2 items", 61_000)?; // stream time 61 s: user-1 expired at 61 s
//! assert_eq!(carts.get(b"user-1")?, None);
//! assert_eq!(carts.sweep(100)?, 1);
//! # Ok::<(), kstate_core::Error>(())
//! ```

mod changelog;
mod store;

pub use changelog::TtlChangelog;
pub use store::{TtlClock, TtlOptions, TtlStore};
