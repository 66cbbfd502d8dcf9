//! Checking that the offsets a store's record skipped after its commit marker hold only
//! markers.
//!
//! A store under exactly-once knows where its next record must land: right after the marker
//! that committed its last transaction. A record landing anywhere else means another writer's
//! records sit in between, which the store never applied, so the store stops (a foreign write).
//! On a cluster whose leaders move there is one honest exception: the transaction coordinator
//! retries a marker write whose partition leader changed, and the new leader may append the
//! marker a second time. The next record then lands one offset further on, with nothing but a
//! marker in between. Such a gap is accepted only when a `read_uncommitted` read from its start
//! shows no record before the store's own (librdkafka never hands out control records), and it
//! is checked before the commit that would move the store's position past it.

use std::time::{Duration, Instant};

use kstate_core::PoisonReason;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::config::ChangelogConfig;
use crate::producer::MarkerGap;

/// How long one poll waits.
const POLL: Duration = Duration::from_millis(100);

/// Whether `gap` of `config`'s partition holds nothing but markers: the first record a
/// `read_uncommitted` reader sees from `gap.from` on is at `gap.to` (the store's own). A
/// record before it is another writer's ([`PoisonReason::ForeignWrite`]); a read that cannot
/// finish within the open timeout proves nothing ([`PoisonReason::UncheckedGap`]): either way
/// the store is restored again, from a position before the gap.
pub(crate) fn check_marker_gap(
    config: &ChangelogConfig,
    gap: MarkerGap,
) -> Result<(), PoisonReason> {
    let failed = |message: String| PoisonReason::UncheckedGap {
        expected_offset: gap.from,
        actual_offset: gap.to,
        message: format!("{}/{}: {message}", config.topic, config.partition),
    };
    let consumer: BaseConsumer = config
        .client
        .client_config()
        .set("isolation.level", "read_uncommitted")
        // librdkafka's consumer needs a group id even when it only assigns; none is joined.
        .set("group.id", "kstate-marker-gap")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| failed(config.client.redact_error(e).to_string()))?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&config.topic, config.partition, Offset::Offset(gap.from))
        .map_err(|e| failed(e.to_string()))?;
    consumer
        .assign(&assignment)
        .map_err(|e| failed(e.to_string()))?;
    let deadline = Instant::now() + config.open_timeout;
    let mut last_error = None;
    while Instant::now() < deadline {
        match consumer.poll(POLL) {
            Some(Ok(message)) if message.offset() < gap.to => {
                return Err(PoisonReason::ForeignWrite {
                    expected_offset: gap.from,
                    actual_offset: gap.to,
                });
            }
            Some(Ok(_)) => {
                tracing::info!(
                    changelog = %format!("{}/{}", config.topic, config.partition),
                    from = gap.from,
                    to = gap.to,
                    "a commit marker written more than once: the store's record landed after it"
                );
                return Ok(());
            }
            // A cluster in motion: the client retries by itself.
            Some(Err(e)) => last_error = Some(e.to_string()),
            None => {}
        }
    }
    Err(failed(format!(
        "no record within {:?}{}",
        config.open_timeout,
        last_error
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default()
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

    use rdkafka::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    use super::*;
    use crate::ClientProperties;

    #[test]
    fn a_gap_of_markers_passes_and_a_gap_holding_a_record_is_another_writers() {
        let servers = kstate_test_broker::bootstrap_servers().unwrap();
        let topic = kstate_test_broker::unique_topic("marker-gap");
        let client = ClientProperties::new(servers.clone());
        crate::create_topic_if_missing(&client, &topic, 1, 1, &[], Duration::from_secs(30))
            .unwrap();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &servers)
            .set(
                "transactional.id",
                kstate_test_broker::unique_topic("marker-gap"),
            )
            .create()
            .unwrap();
        let timeout = Duration::from_secs(30);
        producer.init_transactions(timeout).unwrap();
        // Offsets: 0 record, 1 commit marker; 2 record, 3 abort marker; 4 record, 5 marker.
        for commit in [true, false, true] {
            producer.begin_transaction().unwrap();
            producer
                .send(
                    BaseRecord::<[u8], [u8]>::to(&topic)
                        .partition(0)
                        .payload(b"v"),
                )
                .unwrap();
            producer.flush(timeout).unwrap();
            if commit {
                producer.commit_transaction(timeout).unwrap();
            } else {
                producer.abort_transaction(timeout).unwrap();
            }
        }
        let config = ChangelogConfig::new(client, &topic, 0);
        assert_eq!(
            check_marker_gap(&config, MarkerGap { from: 3, to: 4 }),
            Ok(())
        );
        assert_eq!(
            check_marker_gap(&config, MarkerGap { from: 1, to: 4 }),
            Err(PoisonReason::ForeignWrite {
                expected_offset: 1,
                actual_offset: 4
            })
        );
    }
}
