//! [`OrderedKey`]: key encodings whose byte order is the key type's natural order.
//!
//! - Unsigned integers: fixed-width big-endian. `2 < 10` and `[0,..,2] < [0,..,10]`.
//! - Signed integers: big-endian with the sign bit flipped, so `-1` (`0x7f..ff`) sorts before `0`
//!   (`0x80..00`). Two's complement plus the flip is an order-preserving bijection onto unsigned.
//! - `String`, `Vec<u8>`: their bytes as they are. UTF-8 byte order is Unicode scalar order, which
//!   is also Rust's `str` order, so byte order equals `Ord`. These encodings are not
//!   self-delimiting, so they may only be the last component of a composite key.
//! - Pairs `(A, B)` where `A` is fixed-width: `A`'s encoding followed by `B`'s, ordered by `A`
//!   then `B` as a tuple. Composite keys like `(user_id, timestamp)` are the common case in
//!   stream processing.
//!
//! Every integer width has its own encoding; a store's key type must not change once data is
//! written.

use std::fmt;

/// Why bytes did not decode as a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDecodeError {
    /// The key type.
    pub expected: &'static str,
    /// What was wrong.
    pub problem: String,
}

impl fmt::Display for KeyDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a {} key: {}", self.expected, self.problem)
    }
}

impl std::error::Error for KeyDecodeError {}

/// A key type with an order-preserving byte encoding: for all `a`, `b`,
/// `a.cmp(&b) == encode(a).cmp(&encode(b))`.
pub trait OrderedKey: Sized + Ord {
    /// The encoding's length when it is the same for every value (integers), else `None`.
    const FIXED_WIDTH: Option<usize>;

    /// Appends the encoding to `out`.
    fn encode_key(&self, out: &mut Vec<u8>);

    /// Decodes a key from exactly `bytes`.
    fn decode_key(bytes: &[u8]) -> Result<Self, KeyDecodeError>;
}

fn fixed<const N: usize>(bytes: &[u8], expected: &'static str) -> Result<[u8; N], KeyDecodeError> {
    bytes.try_into().map_err(|_| KeyDecodeError {
        expected,
        problem: format!("{} bytes, expected {N}", bytes.len()),
    })
}

macro_rules! unsigned_keys {
    ($($t:ty),*) => {$(
        impl OrderedKey for $t {
            const FIXED_WIDTH: Option<usize> = Some(std::mem::size_of::<$t>());
            fn encode_key(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
            fn decode_key(bytes: &[u8]) -> Result<Self, KeyDecodeError> {
                Ok(<$t>::from_be_bytes(fixed(bytes, stringify!($t))?))
            }
        }
    )*};
}

macro_rules! signed_keys {
    ($($t:ty => $u:ty),*) => {$(
        impl OrderedKey for $t {
            const FIXED_WIDTH: Option<usize> = Some(std::mem::size_of::<$t>());
            fn encode_key(&self, out: &mut Vec<u8>) {
                let flipped = (*self as $u) ^ (1 << (<$u>::BITS - 1));
                out.extend_from_slice(&flipped.to_be_bytes());
            }
            fn decode_key(bytes: &[u8]) -> Result<Self, KeyDecodeError> {
                let raw = <$u>::from_be_bytes(fixed(bytes, stringify!($t))?);
                Ok((raw ^ (1 << (<$u>::BITS - 1))) as $t)
            }
        }
    )*};
}

unsigned_keys!(u8, u16, u32, u64, u128);
signed_keys!(i8 => u8, i16 => u16, i32 => u32, i64 => u64, i128 => u128);

impl OrderedKey for String {
    const FIXED_WIDTH: Option<usize> = None;
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode_key(bytes: &[u8]) -> Result<Self, KeyDecodeError> {
        String::from_utf8(bytes.to_vec()).map_err(|e| KeyDecodeError {
            expected: "String",
            problem: e.to_string(),
        })
    }
}

impl OrderedKey for Vec<u8> {
    const FIXED_WIDTH: Option<usize> = None;
    fn encode_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode_key(bytes: &[u8]) -> Result<Self, KeyDecodeError> {
        Ok(bytes.to_vec())
    }
}

impl<A: OrderedKey, B: OrderedKey> OrderedKey for (A, B) {
    const FIXED_WIDTH: Option<usize> = match (A::FIXED_WIDTH, B::FIXED_WIDTH) {
        (Some(a), Some(b)) => Some(a + b),
        _ => None,
    };
    fn encode_key(&self, out: &mut Vec<u8>) {
        const {
            assert!(
                A::FIXED_WIDTH.is_some(),
                "the first element of a pair key must be fixed-width (an integer)"
            )
        };
        self.0.encode_key(out);
        self.1.encode_key(out);
    }
    fn decode_key(bytes: &[u8]) -> Result<Self, KeyDecodeError> {
        let width = const {
            match A::FIXED_WIDTH {
                Some(w) => w,
                None => panic!("the first element of a pair key must be fixed-width (an integer)"),
            }
        };
        if bytes.len() < width {
            return Err(KeyDecodeError {
                expected: "pair",
                problem: format!(
                    "{} bytes, shorter than the first element's {width}",
                    bytes.len()
                ),
            });
        }
        let (a, b) = bytes.split_at(width);
        Ok((A::decode_key(a)?, B::decode_key(b)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc<K: OrderedKey>(k: &K) -> Vec<u8> {
        let mut out = Vec::new();
        k.encode_key(&mut out);
        out
    }

    fn order_and_round_trip<K: OrderedKey + Clone + fmt::Debug>(
        a: K,
        b: K,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(a.cmp(&b), enc(&a).cmp(&enc(&b)));
        prop_assert_eq!(K::decode_key(&enc(&a)).unwrap(), a);
        Ok(())
    }

    proptest! {
        #[test]
        fn u64_order(a: u64, b: u64) { order_and_round_trip(a, b)?; }
        #[test]
        fn i64_order(a: i64, b: i64) { order_and_round_trip(a, b)?; }
        #[test]
        fn i32_order(a: i32, b: i32) { order_and_round_trip(a, b)?; }
        #[test]
        fn i8_order(a: i8, b: i8) { order_and_round_trip(a, b)?; }
        #[test]
        fn u128_order(a: u128, b: u128) { order_and_round_trip(a, b)?; }
        #[test]
        fn i128_order(a: i128, b: i128) { order_and_round_trip(a, b)?; }
        #[test]
        fn string_order(a: String, b: String) { order_and_round_trip(a, b)?; }
        #[test]
        fn pair_order(a: (i64, String), b: (i64, String)) { order_and_round_trip(a, b)?; }
        #[test]
        fn int_pair_order(a: (u32, i16), b: (u32, i16)) { order_and_round_trip(a, b)?; }
    }

    #[test]
    fn negative_numbers_sort_before_positive_ones() {
        assert!(enc(&-1i64) < enc(&0i64));
        assert!(enc(&i64::MIN) < enc(&-1i64));
        assert!(enc(&2u64) < enc(&10u64));
    }

    #[test]
    fn wrong_widths_are_errors_not_panics() {
        let err = u64::decode_key(&[1, 2, 3]).unwrap_err();
        assert_eq!(err.to_string(), "not a u64 key: 3 bytes, expected 8");
        assert!(<(u32, String)>::decode_key(&[1]).is_err());
        assert!(String::decode_key(&[0xff]).is_err());
    }
}
