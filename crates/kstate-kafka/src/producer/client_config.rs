//! The librdkafka settings of a changelog producer, on their own because the commit protocol
//! rests on some of them (`acks=all`, idempotence, gapless delivery or a transaction), which a
//! user's client properties must never override, and because a bare producer that must send
//! exactly as kstate's changelogs do (a benchmark's baseline) takes the same settings.

use rdkafka::ClientConfig;

use crate::config::ProducerConfig;
use crate::transaction_member::Transaction;

impl ProducerConfig {
    /// The librdkafka settings of the producer
    /// [`SharedProducer::with_config`](crate::SharedProducer::with_config) builds from this
    /// configuration: the cluster's properties, `compression.type=lz4` unless they set one, and
    /// what the commit protocol depends on (`acks=all`, idempotence, at most 5 requests in
    /// flight, `enable.gapless.guarantee`), with this configuration's delivery timeout, linger
    /// and record limit. For a client that must send exactly as kstate's changelogs do (the
    /// bare-producer baseline of `rows_per_second`).
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_for(None)
    }

    /// The settings of the producer, transactional when `transaction` is given.
    pub(super) fn client_config_for(&self, transaction: Option<&Transaction>) -> ClientConfig {
        let mut client = self.client.client_config();
        // Defaults a user may override through `client_property`.
        if self.client.get("compression.type").is_none() {
            client.set("compression.type", "lz4");
        }
        // What the commit protocol depends on: never overridden.
        let mut delivery_timeout = self.delivery_timeout;
        client
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("max.in.flight.requests.per.connection", "5");
        match transaction {
            // A record that fails after retries fails the producer: later records are never
            // delivered over a gap (librdkafka would otherwise go on past it).
            None => {
                client.set("enable.gapless.guarantee", "true");
            }
            // A record that fails fails its transaction, which aborts: nothing after it is
            // committed either. A record must time out before its transaction does (librdkafka
            // refuses a longer `message.timeout.ms`), so that the failure is ours to see and
            // abort on, not the broker's timeout abort: at most 90% of the transaction timeout.
            Some(transaction) => {
                delivery_timeout = delivery_timeout.min(transaction.timeout * 9 / 10);
                client.set("transactional.id", &transaction.id).set(
                    "transaction.timeout.ms",
                    transaction.timeout.as_millis().to_string(),
                );
            }
        }
        client
            .set(
                "message.timeout.ms",
                delivery_timeout.as_millis().to_string(),
            )
            .set(
                "linger.ms",
                format!("{}", self.linger.as_micros() as f64 / 1e3),
            )
            .set(
                "message.max.bytes",
                (self.max_record_bytes + crate::config::RECORD_OVERHEAD)
                    .max(1_000_000)
                    .to_string(),
            );
        client
    }
}
