//! [`ChangelogKeys`]: how a store's local keys map to its changelog's records, for stores whose
//! local layout is not the changelog's format.
//!
//! A key-value store logs its keys as they are. A window or session store does not:
//! - locally, its keys carry a time-segment prefix, so that an expired segment is one range
//!   delete ([`KeyValueStore::drop_range`](crate::KeyValueStore::drop_range));
//! - in the changelog, its keys are Kafka Streams' (`key ‖ window start ‖ seq`), so that state
//!   can move between the two;
//! - it keeps derived local keys (its stream time) that the changelog never carries, written in
//!   the same atomic batch as the data, and rebuilt from the records by a restore.
//!
//! The changelog layer asks [`ChangelogKeys::to_changelog`] for every write it sends (a local key
//! is not sent, but is committed with the others), and a restore turns each record back into
//! store mutations through a [`ChangelogReplay`]. The mapping lives here, next to the layouts it
//! describes, so that the changelog crate knows no layout and the window code knows no Kafka.

use std::borrow::Cow;
use std::fmt::Debug;

use crate::error::{BoxError, Result};
use crate::store::{KeyValueStore, Mutation};

/// Maps a store's local keys to its changelog's keys and back.
pub trait ChangelogKeys: Send + Sync + Debug {
    /// The changelog key of `store_key`; `None` for a local key, which is written and committed
    /// with the data but never sent.
    fn to_changelog<'k>(&self, store_key: &'k [u8]) -> Option<Cow<'k, [u8]>>;

    /// A replay of changelog records into `store` (the engine a restore writes to; the replay
    /// may read the derived state it holds, such as its stream time).
    fn replay(&self, store: &dyn KeyValueStore) -> Result<Box<dyn ChangelogReplay>>;
}

/// Where a replay writes the mutations a record stands for: the restore's chunk, which copies
/// them in (no allocation per record), or a `Vec` of mutations.
pub trait MutationSink {
    /// Writes `key` → `value` (`None`: a delete).
    fn write(&mut self, key: &[u8], value: Option<&[u8]>);
}

impl MutationSink for Vec<Mutation> {
    fn write(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.push((key.to_vec(), value.map(<[u8]>::to_vec)));
    }
}

/// Turns changelog records back into store mutations, in changelog order, during one restore.
pub trait ChangelogReplay: Send {
    /// Appends to `out` the mutations the record `key` → `value` (`None`: a tombstone) stands
    /// for; none skips it (a window already past retention). The record's own time (a window's
    /// start, a session's end, a TTL write's time) advances stream time, as Kafka Streams'
    /// stores advance it. An error fails the restore, naming the record's topic, partition and
    /// offset.
    fn record(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        out: &mut dyn MutationSink,
    ) -> Result<(), BoxError>;

    /// Appends the derived local keys to write with a chunk of replayed records, atomically with
    /// it and its position (the stream time the records so far advanced to).
    ///
    /// `sent_stream_time` is the store's stream time when the chunk's last record was written,
    /// if the writer sent it (kstate does, in the `kstate.time` header; a Kafka Streams
    /// changelog does not). A store's stream time only grows along its changelog, so the last
    /// record's is the chunk's latest: the restore reads one header per chunk, not one per
    /// record (parsing every record's headers cost a third of a window store's restore). Within
    /// a chunk, stream time is the records' own times, never later than the sent one: a record
    /// past retention may then be written and is dropped when the store opens, never kept.
    fn end_of_chunk(&mut self, sent_stream_time: Option<i64>, out: &mut dyn MutationSink);
}
