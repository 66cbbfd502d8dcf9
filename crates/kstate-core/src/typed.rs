//! [`Store`]: the typed layer over a byte [`KeyValueStore`].
//!
//! Keys go through [`OrderedKey`] so that ranges over typed keys mean what they say
//! (`range(10..20)` over `u64` keys is the numbers 10 to 19); values go through a [`Codec`],
//! serde + bincode by default. The byte store underneath may be a `MemoryStore`, a RocksDB store,
//! or a changelog-logged store: the typed layer adds encoding and nothing else.

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use crate::codec::{Bincode, Codec, OrderedKey};
use crate::error::{Error, HexBytes, Result};
use crate::range::{KeyRange, Order};
use crate::store::{Batch, EntryIter, KeyValueStore};

/// An iterator over typed entries.
pub type TypedIter<'a, K, V> = Box<dyn Iterator<Item = Result<(K, V)>> + 'a>;

/// A typed key-value store: keys `K` (order-preserving), values `V` (through codec `C`), over a
/// byte store `S`.
///
/// ```
/// use kstate_core::{MemoryStore, Store};
///
/// let counts: Store<u64, String, _> = Store::new(MemoryStore::new("counts"));
/// for i in 0..30u64 {
///     counts.put(&i, &format!("value {i}"))?;
/// }
/// let tens: Vec<u64> = counts.range(10..20)?.map(|e| e.map(|(k, _)| k)).collect::<Result<_, _>>()?;
/// assert_eq!(tens, (10..20).collect::<Vec<_>>());
/// # Ok::<(), kstate_core::Error>(())
/// ```
pub struct Store<K, V, S, C = Bincode> {
    inner: S,
    codec: C,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K, V, S, C> Store<K, V, S, C>
where
    K: OrderedKey,
    S: KeyValueStore,
    C: Codec<V>,
{
    /// A typed view of `inner` with the default codec.
    pub fn new(inner: S) -> Self
    where
        C: Default,
    {
        Self::with_codec(inner, C::default())
    }

    /// A typed view of `inner` that encodes values with `codec`.
    pub fn with_codec(inner: S, codec: C) -> Self {
        Store {
            inner,
            codec,
            types: PhantomData,
        }
    }

    /// The byte store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Gives back the byte store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn encode_key(key: &K) -> Vec<u8> {
        let mut out = Vec::with_capacity(K::FIXED_WIDTH.unwrap_or(16));
        key.encode_key(&mut out);
        out
    }

    fn encode_value(&self, value: &V) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.codec
            .encode(value, &mut out)
            .map_err(|source| Error::Encode {
                store: self.inner.name().to_string(),
                what: "value",
                source,
            })?;
        Ok(out)
    }

    fn decode_value(&self, key: &[u8], bytes: &[u8]) -> Result<V> {
        self.codec.decode(bytes).map_err(|source| Error::Decode {
            store: self.inner.name().to_string(),
            what: "value",
            location: format!("key {}", HexBytes(key)),
            source,
        })
    }

    fn decode_entry(&self, key: &[u8], value: &[u8]) -> Result<(K, V)> {
        let k = K::decode_key(key).map_err(|e| Error::Decode {
            store: self.inner.name().to_string(),
            what: "key",
            location: format!("key {}", HexBytes(key)),
            source: Box::new(e),
        })?;
        Ok((k, self.decode_value(key, value)?))
    }

    /// The value under `key`.
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        let k = Self::encode_key(key);
        match self.inner.get(&k)? {
            Some(bytes) => Ok(Some(self.decode_value(&k, &bytes)?)),
            None => Ok(None),
        }
    }

    /// The values under `keys`, in the same order.
    pub fn multi_get(&self, keys: &[K]) -> Result<Vec<Option<V>>> {
        let encoded: Vec<Vec<u8>> = keys.iter().map(Self::encode_key).collect();
        let refs: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        let values = self.inner.multi_get(&refs)?;
        encoded
            .iter()
            .zip(values)
            .map(|(k, v)| v.map(|bytes| self.decode_value(k, &bytes)).transpose())
            .collect()
    }

    /// Stores `value` under `key`.
    pub fn put(&self, key: &K, value: &V) -> Result<()> {
        let v = self.encode_value(value)?;
        self.inner.put(&Self::encode_key(key), &v)
    }

    /// Removes `key`.
    pub fn delete(&self, key: &K) -> Result<()> {
        self.inner.delete(&Self::encode_key(key))
    }

    /// Stores all entries atomically. Nothing is written if any value fails to encode.
    pub fn put_all<'e>(&self, entries: impl IntoIterator<Item = (&'e K, &'e V)>) -> Result<()>
    where
        K: 'e,
        V: 'e,
    {
        let mut batch = Batch::new();
        for (k, v) in entries {
            batch.put(Self::encode_key(k), self.encode_value(v)?);
        }
        self.inner.write(batch)
    }

    /// Removes all `keys` atomically.
    pub fn delete_all<'e>(&self, keys: impl IntoIterator<Item = &'e K>) -> Result<()>
    where
        K: 'e,
    {
        let mut batch = Batch::new();
        for k in keys {
            batch.delete(Self::encode_key(k));
        }
        self.inner.write(batch)
    }

    fn key_range(range: &impl RangeBounds<K>) -> KeyRange {
        let encode = |b: Bound<&K>| b.map(Self::encode_key);
        let start = encode(range.start_bound());
        let end = encode(range.end_bound());
        KeyRange::new(
            start.as_ref().map(Vec::as_slice),
            end.as_ref().map(Vec::as_slice),
        )
    }

    fn typed<'a>(&'a self, entries: EntryIter<'a>) -> TypedIter<'a, K, V> {
        Box::new(entries.map(move |e| e.and_then(|(k, v)| self.decode_entry(&k, &v))))
    }

    /// Entries with keys in `range`, ascending.
    pub fn range(&self, range: impl RangeBounds<K>) -> Result<TypedIter<'_, K, V>> {
        let entries = self.inner.scan(&Self::key_range(&range), Order::Forward)?;
        Ok(self.typed(entries))
    }

    /// Entries with keys in `range`, descending.
    pub fn reverse_range(&self, range: impl RangeBounds<K>) -> Result<TypedIter<'_, K, V>> {
        let entries = self.inner.scan(&Self::key_range(&range), Order::Reverse)?;
        Ok(self.typed(entries))
    }

    /// Entries whose key encoding starts with `prefix`'s: for a pair key `(A, B)`, pass an `A`
    /// to get every entry with that first element.
    pub fn prefix_scan<P: OrderedKey>(&self, prefix: &P) -> Result<TypedIter<'_, K, V>> {
        let mut p = Vec::new();
        prefix.encode_key(&mut p);
        let entries = self.inner.prefix_scan(&p)?;
        Ok(self.typed(entries))
    }

    /// Every entry, ascending.
    pub fn all(&self) -> Result<TypedIter<'_, K, V>> {
        Ok(self.typed(self.inner.all()?))
    }

    /// See [`KeyValueStore::approximate_len`].
    pub fn approximate_len(&self) -> Result<u64> {
        self.inner.approximate_len()
    }

    /// See [`KeyValueStore::flush`].
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// See [`KeyValueStore::close`].
    pub fn close(&self) -> Result<()> {
        self.inner.close()
    }
}

/// A check that bytes decode as a `(K, V)` entry with `codec`: give it to a layer that receives
/// bytes from outside (a changelog restore) so that a record the typed layer could not read is
/// reported where it comes from, not on a later `get`.
pub fn entry_check<K, V, C>(
    codec: C,
) -> impl Fn(&[u8], &[u8]) -> Result<(), crate::BoxError> + Send + Sync + 'static
where
    K: OrderedKey + 'static,
    C: Codec<V> + 'static,
    V: 'static,
{
    move |key, value| {
        K::decode_key(key)?;
        codec.decode(value).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn signed_ranges_cross_zero_in_numeric_order() {
        let s: Store<i32, u8, _> = Store::new(MemoryStore::new("t"));
        for i in -5..5 {
            s.put(&i, &0).unwrap();
        }
        let keys: Vec<i32> = s.range(-2..=2).unwrap().map(|e| e.unwrap().0).collect();
        assert_eq!(keys, vec![-2, -1, 0, 1, 2]);
        let rev: Vec<i32> = s
            .reverse_range(..0)
            .unwrap()
            .map(|e| e.unwrap().0)
            .collect();
        assert_eq!(rev, vec![-1, -2, -3, -4, -5]);
    }

    #[test]
    fn pair_keys_scan_by_first_element() {
        let s: Store<(u32, String), u64, _> = Store::new(MemoryStore::new("t"));
        for user in [1u32, 2, 300] {
            for item in ["a", "b"] {
                s.put(&(user, item.to_string()), &u64::from(user)).unwrap();
            }
        }
        let two: Vec<_> = s
            .prefix_scan(&2u32)
            .unwrap()
            .map(|e| e.unwrap().0)
            .collect();
        assert_eq!(two, vec![(2, "a".to_string()), (2, "b".to_string())]);
    }

    #[test]
    fn undecodable_values_name_the_store_and_key() {
        let raw = MemoryStore::new("raw-store");
        raw.put(&7u64.to_be_bytes(), &[0xff, 0xff, 0xff]).unwrap();
        let s: Store<u64, String, _> = Store::new(raw);
        let err = s.get(&7).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Decode { .. }), "{text}");
        assert!(
            text.contains("raw-store") && text.contains("key 0x0000000000000007"),
            "{text}"
        );
    }
}
