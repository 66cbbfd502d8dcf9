//! The one error type every [`KeyValueStore`](crate::KeyValueStore) returns.
//!
//! Every variant names the store it came from (its path for on-disk stores, its name otherwise), so
//! that a task running a hundred partition stores can tell which one failed. Engines wrap their own
//! error types as the `source` of [`Error::Backend`]; the core crate knows nothing of RocksDB or
//! Kafka and therefore cannot name their error types.

use std::fmt;

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

    /// A previous write could not be made durable, so later writes are refused: accepting them
    /// would put the store's contents out of step with what was acknowledged. Reopen the store to
    /// recover (it restores from its durable source).
    #[error("store {store} is poisoned and refuses writes until it is reopened: {reason}")]
    Poisoned {
        /// The store's path or name.
        store: String,
        /// The failure that poisoned it.
        reason: String,
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

    /// The caller passed something the store cannot accept.
    #[error("store {store}: invalid argument: {message}")]
    InvalidArgument {
        /// The store's path or name.
        store: String,
        /// What was wrong.
        message: String,
    },
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
