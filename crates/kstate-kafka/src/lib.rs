//! kstate-kafka: the changelog. Every mutation of a store is mirrored to a Kafka topic partition,
//! and a store that opens replays what it lacks, so a task that crashed comes back with exactly
//! the state it acknowledged.
//!
//! - [`LoggedStore`]: a RocksDB store plus its changelog; the commit protocol keeps RocksDB a
//!   prefix of the changelog and stores the matching offset inside RocksDB.
//! - [`Durability`]: `async`, `group:<dur>`, `sync`, switchable at runtime.
//! - restore on open, with a [`RestoreListener`], `tracing` spans and `metrics`; or as a step of
//!   its own ([`RestoredStore`], cancellable through a [`CancelToken`]), then
//!   [`LoggedStore::attach`]ed to a [`SharedProducer`] that many stores share (the task runtime);
//!   or kept following the changelog ([`follow_changelog`], a standby).
//! - exactly-once: a [`SharedProducer::transactional`] producer carries its stores' changelog
//!   records, outputs and input offsets in one Kafka transaction; overlays reach RocksDB only
//!   after the commit, and an abort drops them.
//! - topic management: the changelog topic is created compacted, and checked on every open.
//! - secured clusters: every client starts from one [`ClientProperties`] (TLS and SASL settings
//!   reach them all; secrets are redacted wherever a config or a client error is shown), and
//!   first contact goes through a [`ConnectionWatch`], so that a wrong password or an untrusted
//!   certificate fails an open at once instead of at its timeout.
//!
//! ```no_run
//! use kstate_core::KeyValueStore;
//! use kstate_kafka::{ChangelogConfig, Durability, LoggedStore};
//! use kstate_rocksdb::RocksDbOptions;
//!
//! // Partition 3 of a task's input; its changelog is partition 3 of "counts-changelog".
//! let changelog = ChangelogConfig::new("127.0.0.1:9092", "counts-changelog", 3)
//!     .partitions(12) // created compacted if missing, checked if not
//!     .durability(Durability::Sync);
//! // Opening replays what the directory lacks of the changelog.
//! let store = LoggedStore::open(std::path::Path::new("/var/lib/my-task/counts-3"), &RocksDbOptions::default(), changelog)?;
//! println!("restored {} records", store.restore_report().records);
//! store.put(b"user-42", b"7")?; // acknowledged by the broker before it returns (Sync)
//! store.set_durability(Durability::Async); // switched at runtime
//! store.commit()?; // RocksDB flushed with the changelog offset it reached
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]
// `ChangelogError` carries the topic, partition and client error of every failure, which makes it
// larger than clippy likes. It is only returned from open, restore and topic management (the
// write path returns `kstate_core::Error`), so the size costs nothing where it matters.
#![allow(clippy::result_large_err)]

mod client_properties;
mod config;
mod connection;
mod durability;
mod error;
mod in_motion;
mod key_prefix;
mod logged_store;
mod marker_gap;
mod member_removal;
mod offsets_call;
mod overlay;
mod position;
mod producer;
mod restore;
mod topic;
mod transaction;
mod transaction_member;

pub use client_properties::{ClientProperties, REDACTED, is_sensitive};
pub use config::{
    BROKER_DEFAULT_REPLICATION, ChangelogConfig, DEFAULT_LINGER, DEFAULT_MAX_RECORD_BYTES,
    LostChangelog, ProducerConfig,
};
pub use connection::{ConnectionWatch, MetadataError, SecurityFailure, fetch_metadata};
pub use durability::{DEFAULT_GROUP_INTERVAL, Durability, ParseDurabilityError};
pub use error::{ChangelogError, ClientPropertiesError, MemberRemovalError, TransactionError};
pub use in_motion::{error_in_motion, is_in_motion, retry_in_motion};
pub use logged_store::LoggedStore;
pub use member_removal::{MemberRemoved, MemberToRemove, remove_group_members};
pub use position::{ChangelogPosition, FORMAT_VERSION};
pub use producer::{SharedProducer, TIME_HEADER};
pub use restore::{
    BatchRestored, CancelToken, FollowerGroup, Following, OpenHooks, PREFETCHED_END_TTL,
    RESTORE_FETCH_SETTINGS, RecordCheck, RestoreClients, RestoreCluster, RestoreListener,
    RestoreReport, RestoreStart, RestoredStore, StoreLocation, follow_changelog,
    follow_changelog_sharing,
};
pub use topic::create_topic_if_missing;
