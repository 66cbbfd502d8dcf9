//! [`SessionChangelog`]: a session store's changelog in Kafka Streams' format.
//!
//! Record key `key ‖ end (i64 BE) ‖ start (i64 BE)` (`SessionKeySchema.toBinary`), value the
//! aggregate, null a removed session; each record carries the store's stream time when it was
//! written (the `kstate.time` header). The stream time is local, and rebuilt by a restore from the records.

use std::borrow::Cow;

use crate::changelog_keys::{ChangelogKeys, ChangelogReplay, MutationSink};
use crate::error::{BoxError, Result};
use crate::segments::{self, DATA, STREAM_TIME_KEY, Segments};
use crate::session::store::{SUFFIX, SessionOptions, decode_session_key, session_key};
use crate::store::KeyValueStore;

/// The [`ChangelogKeys`] of a [`SessionStore`](crate::SessionStore) with these options.
#[derive(Debug, Clone, Copy)]
pub struct SessionChangelog {
    segments: Segments,
}

impl SessionChangelog {
    /// The mapping for a session store opened with `options`.
    pub fn new(options: &SessionOptions) -> Self {
        SessionChangelog {
            segments: options.segments(),
        }
    }
}

impl ChangelogKeys for SessionChangelog {
    fn to_changelog<'k>(&self, store_key: &'k [u8]) -> Option<Cow<'k, [u8]>> {
        if store_key.first() != Some(&DATA) {
            return None;
        }
        let (mut key, start, end) = decode_session_key(store_key)?;
        key.reserve(SUFFIX);
        key.extend_from_slice(&end.to_be_bytes());
        key.extend_from_slice(&start.to_be_bytes());
        Some(Cow::Owned(key))
    }

    fn replay(&self, store: &dyn KeyValueStore) -> Result<Box<dyn ChangelogReplay>> {
        let stream_time = segments::stored_time(store)?;
        Ok(Box::new(SessionReplay {
            segments: self.segments,
            stream_time,
            written: stream_time,
        }))
    }
}

struct SessionReplay {
    segments: Segments,
    stream_time: Option<i64>,
    written: Option<i64>,
}

impl ChangelogReplay for SessionReplay {
    fn record(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        out: &mut dyn MutationSink,
    ) -> Result<(), BoxError> {
        let Some(split) = key.len().checked_sub(SUFFIX) else {
            return Err(format!(
                "a session changelog key is the key, the session end and start (8 bytes each); \
                 this one has {} bytes",
                key.len()
            )
            .into());
        };
        let (user_key, suffix) = key.split_at(split);
        let end = i64::from_be_bytes(suffix[..8].try_into()?);
        let start = i64::from_be_bytes(suffix[8..].try_into()?);
        if end < self.segments.min_live(self.stream_time) {
            return Ok(());
        }
        // A removal's end does not advance stream time (the store's remove does not either).
        if value.is_some() {
            self.stream_time = self.stream_time.max(Some(end));
        }
        out.write(&session_key(&self.segments, user_key, start, end), value);
        Ok(())
    }

    fn end_of_chunk(&mut self, sent_stream_time: Option<i64>, out: &mut dyn MutationSink) {
        self.stream_time = self.stream_time.max(sent_stream_time);
        if self.written == self.stream_time {
            return;
        }
        if let Some(t) = self.stream_time {
            out.write(STREAM_TIME_KEY, Some(&t.to_be_bytes()));
        }
        self.written = self.stream_time;
    }
}
