//! The cluster a command line names. Every program of this crate (the services `count_by_key`
//! and `windowed_count`; the binaries `e2e`, `window_compat`, `window_ops`, `tasks_per_process`;
//! the harness of the `rows_per_second` example) finds its brokers by kstate-kafka's one rule
//! ([`ClientProperties::from_sources`]): a `--client-properties` file's `bootstrap.servers`,
//! replaced by `--bootstrap-servers`, and [`BOOTSTRAP_ENV`] only when neither names the brokers,
//! so that a shell's local broker address never receives a secured cluster's credentials. Here
//! once, so that the programs also agree on what happens when nothing names a cluster
//! ([`crate::cli::ClusterArgs`] holds the two flags).

use std::path::Path;

use kstate_kafka::ClientProperties;

use crate::BenchError;

/// The environment variable that names the brokers when neither a flag nor a file does (what
/// `scripts/kafka start` prints, and what the tests and scripts export).
pub const BOOTSTRAP_ENV: &str = "KAFKA_BOOTSTRAP_SERVERS";

/// The cluster `file` (`--client-properties`), `bootstrap_servers` (`--bootstrap-servers`) and
/// [`BOOTSTRAP_ENV`] name; `None` when none of them does. A file or flag that was given but
/// names no brokers is an error, not a run without a cluster.
pub fn named(
    file: Option<&Path>,
    bootstrap_servers: Option<&str>,
) -> Result<Option<ClientProperties>, BenchError> {
    let environment = std::env::var(BOOTSTRAP_ENV).ok();
    let cluster = ClientProperties::from_sources(file, bootstrap_servers, environment.as_deref())?;
    if !cluster.bootstrap_servers().trim().is_empty() {
        Ok(Some(cluster))
    } else if file.is_some() || bootstrap_servers.is_some() {
        Err(BenchError::NoCluster)
    } else {
        Ok(None)
    }
}

/// [`named`], for a program that cannot run without a cluster.
pub fn required(
    file: Option<&Path>,
    bootstrap_servers: Option<&str>,
) -> Result<ClientProperties, BenchError> {
    named(file, bootstrap_servers)?.ok_or(BenchError::NoCluster)
}
