//! The default value codec: serde through bincode 2, as the project's design card asks.
//!
//! bincode is marked unmaintained (RUSTSEC-2025-0141) and its 3.0.0 release is a tombstone that
//! does not build; the workspace pins `=2.0.1`, the last working release. Its wire format is
//! stable within that version. Because the codec is a type parameter of [`crate::Store`], moving
//! to another format (postcard, serde_json, a hand-written one) is a change of one type, not of
//! the store. Note that changing the codec of an existing store requires rewriting its changelog.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Codec;
use crate::error::BoxError;

/// The most a decode may allocate for one value. bincode trusts length prefixes, so without a
/// limit a few corrupt bytes claiming a huge length abort the process on allocation instead of
/// returning an error. Values this large do not fit a Kafka record anyway.
pub const DECODE_LIMIT: usize = 256 << 20;

/// serde values encoded with bincode's standard configuration (little-endian, variable-length
/// integers), decoded with a limit of 256 MiB (`DECODE_LIMIT`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

impl<T: Serialize + DeserializeOwned> Codec<T> for Bincode {
    fn encode(&self, value: &T, out: &mut Vec<u8>) -> Result<(), BoxError> {
        let encoded = bincode::serde::encode_to_vec(value, bincode::config::standard())?;
        out.extend_from_slice(&encoded);
        Ok(())
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        let config = bincode::config::standard().with_limit::<DECODE_LIMIT>();
        let (value, read) = bincode::serde::decode_from_slice(bytes, config)?;
        if read != bytes.len() {
            return Err(format!(
                "{} trailing bytes after a {}-byte value",
                bytes.len() - read,
                read
            )
            .into());
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Click {
        user: String,
        count: u64,
        tags: Vec<String>,
    }

    #[test]
    fn round_trips_structs() {
        let click = Click {
            user: "ada".into(),
            count: 42,
            tags: vec!["a".into()],
        };
        let mut bytes = Vec::new();
        Bincode.encode(&click, &mut bytes).unwrap();
        let back: Click = Bincode.decode(&bytes).unwrap();
        assert_eq!(back, click);
    }

    #[test]
    fn a_corrupt_length_prefix_is_an_error_not_an_abort() {
        // A Vec<u8> claiming u64::MAX / 2 elements: varint tag 253 then a u64.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(Codec::<Vec<u8>>::decode(&Bincode, &bytes).is_err());
    }

    #[test]
    fn rejects_truncated_and_trailing_bytes() {
        let mut bytes = Vec::new();
        Codec::<String>::encode(&Bincode, &"hello".to_string(), &mut bytes).unwrap();
        assert!(Codec::<String>::decode(&Bincode, &bytes[..3]).is_err());
        bytes.push(0);
        assert!(Codec::<String>::decode(&Bincode, &bytes).is_err());
    }
}
