//! [`ConnectionWatch`]: first contact with a cluster that ends at once when waiting cannot help.
//!
//! librdkafka retries a failed connection forever, whatever the cause: a wrong SASL password or
//! an untrusted certificate looks, to a caller waiting for metadata, like a broker that has not
//! started yet, and the wait ends at its timeout with "timed out". The errors that say why only
//! reach the client context. So the clients that make first contact (the restore's metadata
//! client, the task runtime's input check, the command line) use this context, ask for
//! metadata in slices of at most a second, and stop as soon as the context has seen a failure
//! of authentication or TLS: a retry cannot fix a password. Other errors (a refused or dropped
//! connection) keep the wait going until its timeout, and the last one is reported with it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;

/// The longest single metadata request while waiting for a cluster.
const SLICE: Duration = Duration::from_secs(1);

/// Why a client cannot log in to the cluster; retrying will not help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityFailure {
    /// SASL authentication failed (a wrong user name or password, an unknown mechanism).
    #[error(
        "SASL authentication failed: {0} (check the sasl.* client properties and security.protocol)"
    )]
    Authentication(String),
    /// The TLS handshake failed (an untrusted or mismatched certificate, a TLS client on a
    /// plaintext listener).
    #[error(
        "TLS handshake failed: {0} (check ssl.ca.location and the other ssl.* client properties)"
    )]
    Tls(String),
}

/// Why a [`fetch_metadata`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The cluster refused us; reported as soon as seen.
    #[error(transparent)]
    Security(SecurityFailure),
    /// No answer within the timeout.
    #[error(
        "{error}{}",
        last_error.as_deref().map(|e| format!("; the client's last error: {e}")).unwrap_or_default()
    )]
    Timeout {
        /// The request's last error.
        error: KafkaError,
        /// The last error the client reported about its connections (librdkafka's hints, e.g.
        /// "connecting to a SSL listener?").
        last_error: Option<String>,
    },
    /// The caller stopped waiting (a restore or follower cancelled while the cluster was silent).
    #[error("cancelled while waiting for the cluster's metadata")]
    Cancelled,
}

/// A client context that remembers the client's last error, and the last
/// [`SecurityFailure`]s.
#[derive(Debug, Default)]
pub struct ConnectionWatch {
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    last_error: Option<String>,
    /// The latest security failure, and when it and the one before it were reported.
    security: Option<(SecurityFailure, Instant, Option<Instant>)>,
}

impl ConnectionWatch {
    /// The authentication or TLS failure the client reported since `since` that no retry can
    /// fix, if any.
    ///
    /// Authentication failures and failed certificate verifications count at once: they fail
    /// every attempt. Other TLS failures count when seen twice: a broker that restarts in the
    /// middle of a handshake makes librdkafka report one, and the next attempt succeeds.
    /// (librdkafka reports an error identical to the one before at most every 30 s, so "twice"
    /// cannot be asked of the deterministic ones.)
    pub fn security_failure_since(&self, since: Instant) -> Option<SecurityFailure> {
        let seen = self.lock();
        let (failure, latest, before) = seen.security.as_ref()?;
        if *latest < since {
            return None;
        }
        let decisive = match failure {
            SecurityFailure::Authentication(_) => true,
            SecurityFailure::Tls(reason) => {
                reason.contains("verify")
                    || reason.contains("certificate")
                    || before.is_some_and(|before| before >= since)
            }
        };
        decisive.then(|| failure.clone())
    }

    /// The last error the client reported, if any, with a hint where librdkafka gives none.
    pub fn last_error(&self) -> Option<String> {
        let last = self.lock().last_error.clone()?;
        // A broker closes a plaintext connection to its TLS listener at the first request, and
        // a TLS client's handshake to a plaintext listener likewise; librdkafka 2.12 no longer
        // says what that usually means.
        if last.contains("Disconnected") && last.contains("APIVERSION_QUERY") {
            return Some(format!(
                "{last}: the broker closed the connection at the first request, which usually \
                 means that the listener expects another security.protocol (TLS or SASL)"
            ));
        }
        Some(last)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        kstate_core::sync::lock(&self.seen)
    }
}

impl ClientContext for ConnectionWatch {
    /// As rdkafka's default (to `tracing`, target `librdkafka`), and a connection failure logged
    /// below error level (a disconnect while talking to a TLS listener in plaintext is logged
    /// at info, and sent as no error) is remembered as the last error.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}")
            }
        }
        if fac == "FAIL" && !matches!(level, RDKafkaLogLevel::Debug) {
            self.lock().last_error = Some(message.to_string());
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let failure = match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
                Some(SecurityFailure::Authentication(reason.to_string()))
            }
            Some(RDKafkaErrorCode::SSL) => Some(SecurityFailure::Tls(reason.to_string())),
            _ => None,
        };
        tracing::warn!(error = %error, reason, "Kafka client error");
        let mut seen = self.lock();
        // "1/1 brokers are down" follows every connection failure: keep the failure, which
        // says why (e.g. librdkafka's "connecting to a SSL listener?").
        if seen.last_error.is_none()
            || error.rdkafka_error_code() != Some(RDKafkaErrorCode::AllBrokersDown)
        {
            seen.last_error = Some(reason.to_string());
        }
        if let Some(failure) = failure {
            let before = seen.security.as_ref().map(|(_, latest, _)| *latest);
            seen.security = Some((failure, Instant::now(), before));
        }
    }
}

impl ConsumerContext for ConnectionWatch {}

/// Metadata of `topic` (all topics if `None`) from `client`, waiting up to `timeout` for the
/// cluster, and not a moment longer once the client has seen a [`SecurityFailure`].
pub fn fetch_metadata(
    client: &BaseConsumer<ConnectionWatch>,
    topic: Option<&str>,
    timeout: Duration,
) -> Result<Metadata, MetadataError> {
    fetch_metadata_while(client, topic, timeout, &|| false)
}

/// [`fetch_metadata`] that gives up with [`MetadataError::Cancelled`] within one slice of the
/// wait (a second) once `cancelled` says so: a follower or restore revoked while the broker
/// does not answer must not hold its task, or a shutdown, for the whole timeout.
pub(crate) fn fetch_metadata_while(
    client: &BaseConsumer<ConnectionWatch>,
    topic: Option<&str>,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<Metadata, MetadataError> {
    // Errors queued before this call are old news: served (and so dated) now, they would look
    // like failures of this call.
    serve_events(client);
    let started = Instant::now();
    loop {
        if cancelled() {
            return Err(MetadataError::Cancelled);
        }
        let left = timeout.saturating_sub(started.elapsed());
        let result = client.fetch_metadata(topic, left.min(SLICE));
        if result.is_err() {
            serve_events(client);
        }
        let watch = client.context();
        if result.is_err()
            && let Some(failure) = watch.security_failure_since(started)
        {
            return Err(MetadataError::Security(failure));
        }
        match result {
            Ok(metadata) => return Ok(metadata),
            Err(error) if started.elapsed() >= timeout => {
                return Err(MetadataError::Timeout {
                    error,
                    last_error: watch.last_error(),
                });
            }
            Err(KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut)) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Serves the client's queued events: its errors reach [`ConnectionWatch`] only this way (and
/// its log lines reach `tracing`). The client is a metadata client with nothing assigned, so
/// there are no messages to lose. A poll serves one event, and says nothing of whether more are
/// waiting: so a bounded number of polls, each immediate.
fn serve_events(client: &BaseConsumer<ConnectionWatch>) {
    for _ in 0..EVENTS_PER_SERVE {
        let _ = client.poll(Duration::ZERO);
    }
}

/// How many events one [`serve_events`] serves at most: librdkafka logs a few dozen lines per
/// connection attempt at debug level, fewer otherwise, and an empty poll costs microseconds.
const EVENTS_PER_SERVE: usize = 2_000;
