//! Window stores: values per key and time window, kept for a retention behind stream time.
//!
//! - [`WindowOptions`]: tumbling or hopping windows, grace, retention, duplicates, segments.
//! - [`WindowStore`]: the store, over any [`KeyValueStore`](crate::KeyValueStore).
//! - [`WindowChangelog`]: its changelog in Kafka Streams' format.
//!
//! ```
//! use std::time::Duration;
//! use kstate_core::{MemoryStore, WindowOptions, WindowStore};
//!
//! let minute = WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10));
//! let counts = WindowStore::open(MemoryStore::new("counts"), minute)?;
//! counts.put(b"page-1", 60_000, Some(b"3"))?;
//! counts.put(b"page-1", 120_000, Some(b"5"))?;
//! let starts: Vec<i64> = counts
//!     .fetch(b"page-1", 0..=120_000)?
//!     .map(|e| e.map(|e| e.start()))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(starts, [60_000, 120_000]);
//! # Ok::<(), kstate_core::Error>(())
//! ```

mod changelog;
mod options;
mod store;

pub use changelog::WindowChangelog;
pub use options::{CHANGELOG_EXTRA_RETENTION, WindowOptions};
pub use store::{WindowEntry, WindowIter, WindowPut, WindowStore};
