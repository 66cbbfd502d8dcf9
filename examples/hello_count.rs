//! hello_count: Kafka Streams' WordCount on kstate. Three lines go to `<app>-lines`; the app
//! counts each word in a store (restored from its changelog after a crash), sends `(word,
//! count)` to `<app>-counts`, then the example reads counts from the store, and stops.
//!
//! ```text
//! scripts/with-broker cargo run --release --example hello_count
//! ```

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kstate::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use kstate::{App, BoxError, ClientProperties, Context, Processor, Record, StoreHandle};
use kstate::{StoreOptions, create_topic_if_missing};

const LINES: [&str; 3] = [
    "all streams lead to kafka",
    "hello kafka streams",
    "join kafka summit",
];

/// The counts, and the topic each new count goes to.
struct WordCount(StoreHandle<String, u64>, String);

impl Processor for WordCount {
    fn process(&mut self, ctx: &mut Context<'_>, line: &Record<'_>) -> Result<(), BoxError> {
        let text = std::str::from_utf8(line.value.unwrap_or_default())?;
        for word in text.split_whitespace().map(str::to_lowercase) {
            let counts = ctx.store(&self.0);
            let count = counts.get(&word)?.unwrap_or(0) + 1;
            counts.put(&word, &count)?;
            ctx.send(&self.1, word.as_bytes(), Some(count.to_string().as_bytes()))?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let servers = std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or("127.0.0.1:9092".into());
    let app_id = format!("hello-count-{}", std::process::id());
    let (input, output) = (format!("{app_id}-lines"), format!("{app_id}-counts"));
    let client = ClientProperties::new(&servers);
    for topic in [&input, &output] {
        // One partition, so one task counts every word; -1: the broker's replication.
        create_topic_if_missing(&client, topic, 1, -1, &[], Duration::from_secs(30))?;
    }
    let producer: BaseProducer = client.client_config().create()?;
    for line in LINES {
        producer
            .send(BaseRecord::<(), str>::to(&input).payload(line))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;

    let state = std::env::temp_dir().join(&app_id);
    let mut builder = App::builder(&app_id, &servers);
    builder.input(&input).state_dir(&state);
    builder.commit_interval(Duration::from_secs(1));
    let counts = builder.store::<String, u64>("counts", StoreOptions::default());
    let handle = counts.clone();
    let app = builder.build(move |_| Box::new(WordCount(counts.clone(), output.clone())))?;
    let running = app.start()?;

    // Each task's count of processed lines moves at its commits.
    let deadline = Instant::now() + Duration::from_secs(60);
    while running.tasks().iter().map(|t| t.processed).sum::<u64>() < LINES.len() as u64 {
        ensure!(
            Instant::now() < deadline,
            "the lines were not counted within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for word in ["kafka", "streams", "hello"] {
        let count = running.query(&handle).get(0, &word.to_string())?;
        println!("{word}: {}", count.unwrap_or(0));
    }
    running.shutdown();
    running.wait()?;
    std::fs::remove_dir_all(state)?;
    Ok(())
}
