//! The count-by-key task: the count per key in a store named `counts`, and for every input
//! record `(key, count as decimal ASCII)` to the output, same partition (Kafka Streams'
//! `groupByKey().count()`).

use kstate_core::BoxError;
use kstate_task::{
    App, AppBuilder, Context, Processor, Record, StoreHandle, StoreOptions, TaskError,
};

/// Counts records per key.
pub struct CountByKey {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
    /// Coalesce the store's changelog and send only each key's latest count per commit
    /// (Kafka Streams with caching on); otherwise every record's count goes out.
    coalesce: bool,
}

impl Processor for CountByKey {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.counts);
        let count = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &count)?;
        let text = count.to_string();
        if self.coalesce {
            ctx.send_coalesced(&self.output, &key, Some(text.as_bytes()));
        } else {
            ctx.send(&self.output, &key, Some(text.as_bytes()))?;
        }
        Ok(())
    }
}

/// Declares the `counts` store on `builder` and builds the application with a [`CountByKey`]
/// per task sending to `output`; the handle reads the counts (`Running::query`).
pub fn build(
    builder: &mut AppBuilder,
    output: &str,
    coalesce: bool,
) -> Result<(App, StoreHandle<Vec<u8>, u64>), TaskError> {
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions { coalesce });
    let handle = counts.clone();
    let output = output.to_string();
    let app = builder.build(move |_task| {
        Box::new(CountByKey {
            counts: counts.clone(),
            output: output.clone(),
            coalesce,
        })
    })?;
    Ok((app, handle))
}
