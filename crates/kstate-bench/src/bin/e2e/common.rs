//! What the subcommands share: the windowed runs' windows, a reader of outputs outside any
//! application's group, and the wall clock the latencies are measured on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use kstate_bench::kafka::create_client;
use kstate_core::WindowOptions;
use kstate_kafka::ClientProperties;
use rdkafka::consumer::BaseConsumer;

/// The windowed runs' windows, as Kafka Streams' side has them (`KafkaStreamsBench.E2E_WINDOWS`):
/// tumbling, one minute, a grace of 10 s.
pub fn e2e_windows() -> WindowOptions {
    WindowOptions::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10))
}

/// A consumer outside any application's group, for reading outputs back: committed records
/// only (librdkafka's default, stated here because `measure` depends on it).
pub fn reader(client: &ClientProperties) -> Result<BaseConsumer> {
    Ok(create_client(
        client,
        &[
            ("group.id", "kstate-e2e-measure"),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
        ],
        "reader",
    )?)
}

/// A timestamp on the machine's wall clock (the broker's clock too: it runs here), ms.
pub fn now_ms() -> Result<i64> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64)
}
