//! The windowed-count task: per key, the number of records in each time window (tumbling, or
//! hopping), and each window's **final** count sent once, when stream time passes the window's
//! end plus the grace (Kafka Streams' `suppress(untilWindowCloses)`, or emit-final, KIP-825).
//!
//! Output: key `<key>@<window start, ms>`, value the count as decimal ASCII. The counts live in a
//! window store named `counts`, as Kafka Streams' `windowedBy(...).count()` keeps them (values
//! are 8-byte big-endian counts, its `Long` serde), so its changelog is Kafka Streams'.
//!
//! How "sent once" holds: a record that moves stream time forward first sends every window that
//! closes up to its timestamp (they are still in the store: its retention is at least size +
//! grace past their start), then advances the store's stream time. The store keeps that time
//! with its data, and under exactly-once both commit with the outputs in one transaction: every
//! window closing at or before the stored stream time has been sent, and no other. A record for a
//! window that closed is late: not counted, through restarts too.

use kstate_core::{BoxError, WindowOptions};
use kstate_task::{App, AppBuilder, Context, Processor, Record, TaskError, WindowHandle};

use super::decode_count;

/// Counts records per key and window; sends final counts.
pub struct WindowedCount {
    counts: WindowHandle,
    windows: WindowOptions,
    output: String,
}

impl WindowedCount {
    /// The task's processor: counts in the store `counts` (declared with `windows`), final
    /// counts sent to `output`.
    pub fn new(counts: WindowHandle, windows: WindowOptions, output: &str) -> Self {
        WindowedCount {
            counts,
            windows,
            output: output.to_string(),
        }
    }

    /// Sends every window that closes after `from` and at or before `to`.
    fn send_closed(&self, ctx: &mut Context<'_>, from: i64, to: i64) -> Result<(), BoxError> {
        let w = &self.windows;
        let (after, until) = (
            from - w.size_ms() - w.grace_ms(),
            to - w.size_ms() - w.grace_ms(),
        );
        // Window starts are multiples of the advance: most records close none.
        if until.div_euclid(w.advance_ms()) == after.div_euclid(w.advance_ms()) {
            return Ok(());
        }
        let counts = ctx.window_store(&self.counts);
        let mut closed = Vec::new();
        for entry in counts.fetch_all(after + 1..=until)? {
            let entry = entry?;
            closed.push((
                entry.key().to_vec(),
                entry.start(),
                decode_count(entry.value())?,
            ));
        }
        for (key, start, count) in closed {
            let mut out = key;
            out.extend_from_slice(format!("@{start}").as_bytes());
            ctx.send(&self.output, &out, Some(count.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

impl Processor for WindowedCount {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let time = record
            .timestamp
            .ok_or("a record without a timestamp cannot be windowed")?;
        // A time no window can hold is bad input: refused before anything is sent or written.
        ctx.window_store(&self.counts).check_time(time)?;
        let key = record.key.unwrap_or_default();
        let before = ctx.window_store(&self.counts).stream_time();
        if let Some(before) = before
            && time > before
        {
            self.send_closed(ctx, before, time)?;
        }
        let counts = ctx.window_store(&self.counts);
        counts.observe(time)?;
        let now = counts.stream_time().unwrap_or(time);
        for start in self.windows.windows_containing(time) {
            if self.windows.closes_at(start) <= now {
                continue; // late: its window's final count was sent already
            }
            let count = match counts.get(key, start)? {
                Some(bytes) => decode_count(&bytes)? + 1,
                None => 1,
            };
            counts.put(key, start, Some(&count.to_be_bytes()))?;
        }
        Ok(())
    }
}

/// Declares the `counts` window store on `builder` and builds the application with a
/// [`WindowedCount`] per task sending to `output`; the handle reads the counts of the windows
/// not yet closed (`Running::query`).
pub fn build(
    builder: &mut AppBuilder,
    windows: WindowOptions,
    output: &str,
) -> Result<(App, WindowHandle), TaskError> {
    let counts = builder.window_store("counts", windows);
    let output = output.to_string();
    let handle = counts.clone();
    let app = builder
        .build(move |_task| Box::new(WindowedCount::new(counts.clone(), windows, &output)))?;
    Ok((app, handle))
}
