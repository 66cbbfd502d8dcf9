//! [`TtlChangelog`]: a TTL store's changelog. Record key = the key; value = write time (i64 BE)
//! ‖ expiry (i64 BE) ‖ value, so a restore from the changelog alone knows every key's expiry;
//! null = deleted (by the user or by the sweep). The expiry index and stream time are local,
//! rebuilt by the restore.

use std::borrow::Cow;

use crate::changelog_keys::{ChangelogKeys, ChangelogReplay, MutationSink};
use crate::error::{BoxError, Result};
use crate::segments::{self, STREAM_TIME_KEY};
use crate::store::KeyValueStore;
use crate::ttl::store::{DATA, HEADER, data_key, header, index_key};

/// The [`ChangelogKeys`] of a [`TtlStore`](crate::TtlStore).
#[derive(Debug, Clone, Copy, Default)]
pub struct TtlChangelog;

impl ChangelogKeys for TtlChangelog {
    fn to_changelog<'k>(&self, store_key: &'k [u8]) -> Option<Cow<'k, [u8]>> {
        match store_key.split_first() {
            Some((&DATA, key)) => Some(Cow::Borrowed(key)),
            _ => None,
        }
    }

    fn replay(&self, store: &dyn KeyValueStore) -> Result<Box<dyn ChangelogReplay>> {
        let stream_time = segments::stored_time(store)?;
        Ok(Box::new(TtlReplay {
            stream_time,
            written: stream_time,
        }))
    }
}

struct TtlReplay {
    stream_time: Option<i64>,
    written: Option<i64>,
}

impl ChangelogReplay for TtlReplay {
    fn record(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        out: &mut dyn MutationSink,
    ) -> Result<(), BoxError> {
        let Some(value) = value else {
            out.write(&data_key(key), None);
            return Ok(());
        };
        let Some((written, expires)) = header(value) else {
            return Err(format!(
                "a TTL changelog value starts with its write time and expiry ({HEADER} bytes); \
                 this one has {} bytes",
                value.len()
            )
            .into());
        };
        self.stream_time = self.stream_time.max(Some(written));
        out.write(&data_key(key), Some(value));
        out.write(&index_key(key, expires), Some(&[]));
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
