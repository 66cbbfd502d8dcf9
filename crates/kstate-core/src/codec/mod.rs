//! Codecs: how the typed layer turns keys and values into bytes.
//!
//! Keys and values need different things. A value codec only has to round-trip; a key codec must
//! also preserve order, because the byte store sorts keys as bytes and `range(10..20)` over `u64`
//! keys has to mean numbers 10 to 19, not whatever sorts between two serialised blobs. So values
//! go through a [`Codec`] (serde + bincode by default) and keys through [`OrderedKey`], a small
//! hand-written order-preserving encoding.

mod bincode_codec;
mod ordered_key;

pub use bincode_codec::Bincode;
pub use ordered_key::{KeyDecodeError, OrderedKey};

use crate::error::BoxError;

/// Encodes and decodes values of type `T`.
///
/// A codec is a value (not just a type) so that it can carry configuration, and it is `Clone +
/// Send + Sync` so one typed store can be shared between threads.
pub trait Codec<T>: Clone + Send + Sync {
    /// Appends the encoding of `value` to `out`.
    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), BoxError>;

    /// Decodes a value from exactly `bytes`.
    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError>;
}
