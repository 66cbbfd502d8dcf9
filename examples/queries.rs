//! queries: read a running application's state from outside its tasks.
//!
//! Every task keeps its stores locally, so the process that runs a task can answer "what is
//! the count of key k" without a round trip to Kafka or a database: `Running::query` takes a
//! store's handle and routes each read to the task that owns the key's partition
//! (`Running::partition_for`, Kafka's default partitioner). A read of a task that runs
//! elsewhere, or is still restoring, is `QueryError::NotHere`: with several processes, the
//! caller asks the one that runs it.
//!
//! The example counts `--records` records over `--keys` keys, waits until every record is
//! committed, then reads each key's count from the running application.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example queries -- \
//!     [--records 1000] [--keys 10] [--partitions 3]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use clap::Parser;
use kstate::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use kstate::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use kstate::{App, BoxError, ClientProperties, Context, Processor, Record, StoreHandle};
use kstate::{StoreOptions, create_topic_if_missing, partition_for};

/// Counts keys, then reads the counts from the running application.
#[derive(Parser)]
struct Args {
    /// The Kafka cluster.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS")]
    bootstrap_servers: String,
    /// Input records to write and count.
    #[arg(long, default_value_t = 1_000)]
    records: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 10)]
    keys: u64,
    /// The input's partitions (one task each).
    #[arg(long, default_value_t = 3)]
    partitions: i32,
}

/// Counts records per key; sends nothing: the state is read where it is.
struct Count(StoreHandle<Vec<u8>, u64>);

impl Processor for Count {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.0);
        let count = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &count)?;
        Ok(())
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let servers = args.bootstrap_servers.as_str();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let app_id = format!("queries-{}", now.as_millis());
    let input = format!("{app_id}-input");
    let client = ClientProperties::new(servers);
    // -1: the broker's default replication.
    create_topic_if_missing(
        &client,
        &input,
        args.partitions,
        -1,
        &[],
        Duration::from_secs(30),
    )?;
    let writer: BaseProducer = client.client_config().create()?;
    for i in 0..args.records {
        // Kafka's default partitioner, as Java producers use it: the partition a query routes to.
        let key = format!("user-{}", i % args.keys);
        let partition = partition_for(key.as_bytes(), args.partitions);
        let mut record = BaseRecord::<[u8], [u8]>::to(&input)
            .partition(partition)
            .key(key.as_bytes())
            .payload(&b""[..]);
        // A full queue empties as deliveries are served.
        while let Err((e, back)) = writer.send(record) {
            if e != KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) {
                return Err(e.into());
            }
            writer.poll(Duration::from_millis(10));
            record = back;
        }
    }
    writer.flush(Duration::from_secs(60))?;

    let state = tempfile::tempdir()?;
    let mut builder = App::builder(app_id, servers);
    builder.input(input).state_dir(state.path());
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let handle = counts.clone();
    let running = builder
        .build(move |_task| Box::new(Count(counts.clone())))?
        .start()?;

    // Every record processed and committed (the tasks' counters move at each commit).
    let deadline = Instant::now() + Duration::from_secs(120);
    while running.tasks().iter().map(|t| t.processed).sum::<u64>() < args.records {
        ensure!(
            Instant::now() < deadline,
            "not every record processed after 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let query = running.query(&handle);
    let mut total = 0;
    for k in 0..args.keys {
        let key = format!("user-{k}").into_bytes();
        let partition = running.partition_for(&key);
        let count = query.get(partition, &key)?.unwrap_or(0);
        println!("user-{k}: {count} (task {partition})");
        total += count;
    }
    ensure!(
        total == args.records,
        "the counts add up to {total}, not {}",
        args.records
    );
    running.shutdown();
    running.wait()?;
    Ok(())
}
