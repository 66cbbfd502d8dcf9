//! [`WindowChangelog`]: a window store's changelog in Kafka Streams' format.
//!
//! Record key `key ‖ window start (i64 BE) ‖ seq (i32 BE)` (`WindowKeySchema.toStoreKeyBinary`;
//! seq is 0 unless duplicates are retained), value the raw value, null a delete. A Kafka Streams
//! application's window changelog restores into a kstate window store, and the other way round.
//! Each record carries the store's stream time when it was written (the `kstate.time` header);
//! a record without it (a Kafka Streams changelog) advances stream time to its window start, as
//! Kafka Streams' segmented store does (`observedStreamTime`), so both keep the same windows. The
//! stream time and the duplicates' sequence are local keys: never logged, rebuilt by a restore
//! from the records (the latest time or start, the highest sequence).

use std::borrow::Cow;

use crate::changelog_keys::{ChangelogKeys, ChangelogReplay, MutationSink};
use crate::error::{BoxError, Result};
use crate::segments::{self, DATA, STREAM_TIME_KEY, Segments};
use crate::store::KeyValueStore;
use crate::window::options::WindowOptions;
use crate::window::store::{SEQ_KEY, SUFFIX, decode_entry_key};

/// The [`ChangelogKeys`] of a [`WindowStore`](crate::WindowStore) with these options.
#[derive(Debug, Clone, Copy)]
pub struct WindowChangelog {
    segments: Segments,
}

impl WindowChangelog {
    /// The mapping for a window store opened with `options`.
    pub fn new(options: &WindowOptions) -> Self {
        WindowChangelog {
            segments: options.segments(),
        }
    }
}

impl ChangelogKeys for WindowChangelog {
    fn to_changelog<'k>(&self, store_key: &'k [u8]) -> Option<Cow<'k, [u8]>> {
        if store_key.first() != Some(&DATA) {
            return None;
        }
        let (mut key, start, seq) = decode_entry_key(store_key)?;
        key.reserve(SUFFIX);
        key.extend_from_slice(&start.to_be_bytes());
        key.extend_from_slice(&seq.to_be_bytes());
        Some(Cow::Owned(key))
    }

    fn replay(&self, store: &dyn KeyValueStore) -> Result<Box<dyn ChangelogReplay>> {
        let stream_time = segments::stored_time(store)?;
        let seq = store
            .get(SEQ_KEY)?
            .and_then(|v| v.try_into().ok().map(u32::from_be_bytes));
        Ok(Box::new(WindowReplay {
            segments: self.segments,
            stream_time,
            seq,
            written: (stream_time, seq),
            key: Vec::new(),
        }))
    }
}

struct WindowReplay {
    segments: Segments,
    stream_time: Option<i64>,
    seq: Option<u32>,
    /// What the store holds of both.
    written: (Option<i64>, Option<u32>),
    /// The local key being built.
    key: Vec<u8>,
}

impl ChangelogReplay for WindowReplay {
    fn record(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        out: &mut dyn MutationSink,
    ) -> Result<(), BoxError> {
        let Some(split) = key.len().checked_sub(SUFFIX) else {
            return Err(format!(
                "a window changelog key is the key, the window start (8 bytes) and a sequence \
                 number (4 bytes); this one has {} bytes",
                key.len()
            )
            .into());
        };
        let (user_key, suffix) = key.split_at(split);
        let start = i64::from_be_bytes(suffix[..8].try_into()?);
        let seq = u32::from_be_bytes(suffix[8..].try_into()?);
        // Skipped up front: a window already past retention at the stream time so far.
        if start < self.segments.min_live(self.stream_time) {
            return Ok(());
        }
        // The stream time when the record was written was at least the window start.
        self.stream_time = self.stream_time.max(Some(start));
        self.seq = Some(self.seq.map_or(seq, |s| s.max(seq)));
        // Built in a buffer kept across records: a restore maps millions of them.
        let store_key = &mut self.key;
        store_key.clear();
        store_key.extend_from_slice(&self.segments.prefix(self.segments.id(start)));
        segments::escape_into(user_key, store_key);
        store_key.extend_from_slice(&segments::flip(start));
        store_key.extend_from_slice(&seq.to_be_bytes());
        out.write(store_key, value);
        Ok(())
    }

    fn end_of_chunk(&mut self, sent_stream_time: Option<i64>, out: &mut dyn MutationSink) {
        self.stream_time = self.stream_time.max(sent_stream_time);
        if self.written == (self.stream_time, self.seq) {
            return;
        }
        if let Some(t) = self.stream_time {
            out.write(STREAM_TIME_KEY, Some(&t.to_be_bytes()));
        }
        if let Some(seq) = self.seq {
            out.write(SEQ_KEY, Some(&seq.to_be_bytes()));
        }
        self.written = (self.stream_time, self.seq);
    }
}
