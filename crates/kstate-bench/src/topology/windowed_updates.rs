//! The windowed count that sends every update: per key and window, each record's window's new
//! count, as Kafka Streams' `windowedBy(..).count()` with caching off sends it (one output per
//! input record and window). The counts live in a window store named `counts`, as
//! [`super::windowed_count`]'s do; output keys are `<key>@<window start ms>`, values the count as
//! decimal ASCII. A record for a window that closed (end plus grace at or before stream time) is
//! late: not counted, as Kafka Streams drops it.

use kstate_core::{BoxError, WindowOptions};
use kstate_task::{App, AppBuilder, Context, Processor, Record, TaskError, WindowHandle};

use super::decode_count;

/// Counts records per key and window; sends each new count.
pub struct WindowedUpdates {
    counts: WindowHandle,
    windows: WindowOptions,
    output: String,
}

impl Processor for WindowedUpdates {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let time = record
            .timestamp
            .ok_or("a record without a timestamp cannot be windowed")?;
        let key = record.key.unwrap_or_default();
        let counts = ctx.window_store(&self.counts);
        counts.observe(time)?;
        let now = counts.stream_time().unwrap_or(time);
        for start in self.windows.windows_containing(time) {
            if self.windows.closes_at(start) <= now {
                continue;
            }
            let count = match counts.get(key, start)? {
                Some(bytes) => decode_count(&bytes)? + 1,
                None => 1,
            };
            counts.put(key, start, Some(&count.to_be_bytes()))?;
            let mut out = key.to_vec();
            out.extend_from_slice(format!("@{start}").as_bytes());
            ctx.send(&self.output, &out, Some(count.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

/// Declares the `counts` window store on `builder` and builds the application with a
/// [`WindowedUpdates`] per task sending to `output`; the handle reads the counts
/// (`Running::query`).
pub fn build(
    builder: &mut AppBuilder,
    windows: WindowOptions,
    output: &str,
) -> Result<(App, WindowHandle), TaskError> {
    let counts = builder.window_store("counts", windows);
    let output = output.to_string();
    let handle = counts.clone();
    let app = builder.build(move |_task| {
        Box::new(WindowedUpdates {
            counts: counts.clone(),
            windows,
            output: output.clone(),
        })
    })?;
    Ok((app, handle))
}
