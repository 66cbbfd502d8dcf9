//! The one error type every [`KeyValueStore`](crate::KeyValueStore) returns.
//!
//! Every variant names the store it came from (its path for on-disk stores, its name otherwise), so
//! that a task running a hundred partition stores can tell which one failed. Engines wrap their own
//! error types as the `source` of [`Error::Backend`]; the core crate knows nothing of RocksDB or
//! Kafka and therefore cannot name their error types.

use std::fmt;
use std::time::Duration;

/// The result type of every store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed error from an engine or a codec, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine under the store (RocksDB, the changelog producer, ...) reported a failure.
    #[error("store {store}: {operation} failed: {source}")]
    Backend {
        /// The store's path or name.
        store: String,
        /// What the store was doing, e.g. `"put"`, `"flush"`, `"range scan"`.
        operation: &'static str,
        /// The engine's own error.
        #[source]
        source: BoxError,
    },

    /// The store was closed; no further operation is possible on this handle.
    #[error("store {store} is closed")]
    Closed {
        /// The store's path or name.
        store: String,
    },

    /// A previous write could not be made durable, or the store's durable source stopped
    /// matching what the store holds. Every later operation, reads included, is refused: the
    /// store may hold values that a reopen will not bring back, and it serves nothing it cannot
    /// stand behind. Reopen the store to recover (it restores from its durable source).
    #[error("store {store} is poisoned and serves nothing until it is reopened: {reason}")]
    Poisoned {
        /// The store's path or name.
        store: String,
        /// The failure that poisoned it.
        reason: PoisonReason,
    },

    /// A key or value could not be encoded by the typed layer's codec.
    #[error("store {store}: cannot encode {what}: {source}")]
    Encode {
        /// The store's path or name.
        store: String,
        /// `"key"` or `"value"`.
        what: &'static str,
        /// The codec's error.
        #[source]
        source: BoxError,
    },

    /// Stored bytes could not be decoded by the typed layer's codec.
    #[error("store {store}: cannot decode {what} at {location}: {source}")]
    Decode {
        /// The store's path or name.
        store: String,
        /// `"key"` or `"value"`.
        what: &'static str,
        /// Where the bytes came from: the key (hex) for a stored entry, or the changelog topic,
        /// partition and offset for a replayed record.
        location: String,
        /// The codec's error.
        #[source]
        source: BoxError,
    },

    /// An operation did not finish within the time its caller gave it. Unlike
    /// [`Error::Poisoned`], nothing was lost: the store is as the operation's documentation says
    /// a timeout leaves it, and can be used again or dropped.
    #[error(
        "store {store}: {operation} did not finish within {timeout:?} (waiting for {waiting_for})"
    )]
    Timeout {
        /// The store's path or name.
        store: String,
        /// What the store was doing, e.g. `"commit"`.
        operation: &'static str,
        /// What it was still waiting for.
        waiting_for: String,
        /// The time the caller gave it.
        timeout: Duration,
    },

    /// The caller passed something the store cannot accept.
    #[error("store {store}: invalid argument: {message}")]
    InvalidArgument {
        /// The store's path or name.
        store: String,
        /// What was wrong.
        message: String,
    },
}

/// Why a store was poisoned. Engines name their own offsets and messages; the kinds are common to
/// every store with a durable source it must stay in step with (a changelog, a replica).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoisonReason {
    /// A write was not acknowledged by the durable source within the time allowed.
    Timeout {
        /// What was waited for.
        waiting_for: String,
        /// How long.
        waited: Duration,
    },
    /// The durable source refused or lost a write (e.g. the broker rejected the record, or it
    /// ran out of retries).
    DeliveryFailed {
        /// The client's error.
        message: String,
    },
    /// The client of the durable source failed in a way it cannot recover from (a fatal
    /// producer error, a full queue that never drained).
    ClientFailed {
        /// The client's error.
        message: String,
    },
    /// Another writer appended to the durable source: this store's write did not land where
    /// the store's contents end, so the records in between were never applied here.
    ForeignWrite {
        /// Where the store's next record should have landed.
        expected_offset: i64,
        /// Where it landed.
        actual_offset: i64,
    },
    /// This store's write landed past where its contents end, after a point where only
    /// markers of the durable source may lie (a transaction's commit marker written twice), and
    /// the offsets in between could not be read to make sure: they may hold another writer's
    /// records, so the store is restored as after a [`ForeignWrite`](Self::ForeignWrite).
    UncheckedGap {
        /// Where the store's next record was expected.
        expected_offset: i64,
        /// Where it landed.
        actual_offset: i64,
        /// Why the offsets in between could not be read.
        message: String,
    },
    /// Acknowledgements arrived out of the order the writes were sent in.
    OutOfOrder {
        /// What arrived, and after what.
        message: String,
    },
    /// Acknowledged writes could not be applied to the local engine.
    LocalWriteFailed {
        /// The engine's error.
        message: String,
    },
}

impl PoisonReason {
    /// Whether this is the failure of some writes (not delivered, not acknowledged in time, a
    /// client error) rather than a disagreement between the store and its durable source
    /// (another writer, acknowledgements out of order, a local write that failed). Under a
    /// transaction, aborting it drops those writes and clears a transient failure.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            PoisonReason::Timeout { .. }
                | PoisonReason::DeliveryFailed { .. }
                | PoisonReason::ClientFailed { .. }
        )
    }
}

impl fmt::Display for PoisonReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoisonReason::Timeout {
                waiting_for,
                waited,
            } => write!(f, "timed out after {waited:?} waiting for {waiting_for}"),
            PoisonReason::DeliveryFailed { message } => write!(f, "delivery failed: {message}"),
            PoisonReason::ClientFailed { message } => write!(f, "client failed: {message}"),
            PoisonReason::ForeignWrite {
                expected_offset,
                actual_offset,
            } => write!(
                f,
                "this store's record landed at offset {actual_offset}, but offset \
                 {expected_offset} was expected: another writer appended to the changelog \
                 partition (a second store on it, or a zombie producer); reopen to restore its \
                 records, and make sure one store writes each partition"
            ),
            PoisonReason::UncheckedGap {
                expected_offset,
                actual_offset,
                message,
            } => write!(
                f,
                "this store's record landed at offset {actual_offset}, past a commit marker \
                 expected to end at {expected_offset}, and the offsets in between could not be \
                 read to make sure they hold only markers ({message}); reopen to restore"
            ),
            PoisonReason::OutOfOrder { message } => {
                write!(f, "acknowledgements out of order: {message}")
            }
            PoisonReason::LocalWriteFailed { message } => {
                write!(
                    f,
                    "acknowledged writes could not be applied locally: {message}"
                )
            }
        }
    }
}

impl Error {
    /// Wraps an engine error, naming the store and the operation.
    pub fn backend(
        store: impl Into<String>,
        operation: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            store: store.into(),
            operation,
            source: source.into(),
        }
    }
}

/// Formats bytes as lowercase hex, shortened in the middle when long; used to name keys in errors.
pub struct HexBytes<'a>(pub &'a [u8]);

impl fmt::Display for HexBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 32;
        let bytes = self.0;
        f.write_str("0x")?;
        if bytes.len() <= SHOWN {
            bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
        } else {
            bytes[..SHOWN / 2]
                .iter()
                .try_for_each(|b| write!(f, "{b:02x}"))?;
            write!(f, "..({} bytes)..", bytes.len())?;
            bytes[bytes.len() - SHOWN / 2..]
                .iter()
                .try_for_each(|b| write!(f, "{b:02x}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_bytes_shortens_long_keys() {
        assert_eq!(HexBytes(&[0x00, 0xab]).to_string(), "0x00ab");
        let long = vec![0x11u8; 100];
        let shown = HexBytes(&long).to_string();
        assert!(shown.contains("(100 bytes)"), "{shown}");
        assert!(shown.len() < 90, "{shown}");
    }

    #[test]
    fn errors_name_the_store() {
        let err = Error::backend("/data/p7", "put", "disk full");
        assert_eq!(err.to_string(), "store /data/p7: put failed: disk full");
    }
}
