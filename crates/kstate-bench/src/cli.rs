//! Command-line pieces for clap's derive that the benchmark binaries and the examples share, so
//! that every program names a cluster, and writes a count, the same way:
//!
//! - [`ClusterArgs`]: `--client-properties FILE` and `--bootstrap-servers HOST:PORT`, resolved
//!   by [`crate::cluster`]'s rule (the environment's brokers only when neither names any).
//! - [`number`]: counts with `_` as a digit separator (`--rows 4_000_000`), as the scripts and
//!   BENCHMARKS.md write them.
//! - [`key_value`]: a librdkafka property, `KEY=VALUE`.

use std::path::PathBuf;
use std::str::FromStr;

use kstate_kafka::ClientProperties;

use crate::BenchError;

/// The cluster a command line names. Flatten it into a command (`#[command(flatten)]`); in one
/// with subcommands the flags are accepted before or after the subcommand.
///
/// The environment is not a clap fallback of `--bootstrap-servers` on purpose: a file's
/// `bootstrap.servers` must win over a shell's local broker, so that the local broker never
/// receives the file's credentials ([`crate::cluster::named`]).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// librdkafka client properties, one `key=value` a line (`bootstrap.servers`,
    /// `security.protocol`, `sasl.*`, `ssl.*`), for every Kafka client the program makes: a TLS
    /// and SASL cluster. Secrets stay off the command line and out of the output.
    #[arg(long, value_name = "FILE", global = true, display_order = 900)]
    pub client_properties: Option<PathBuf>,
    /// The brokers; replaces the properties file's `bootstrap.servers`. When neither names any,
    /// $KAFKA_BOOTSTRAP_SERVERS does.
    #[arg(long, value_name = "HOST:PORT", global = true, display_order = 901)]
    pub bootstrap_servers: Option<String>,
}

impl ClusterArgs {
    /// The cluster the flags or the environment name; `None` when nothing does
    /// ([`crate::cluster::named`]).
    pub fn named(&self) -> Result<Option<ClientProperties>, BenchError> {
        crate::cluster::named(
            self.client_properties.as_deref(),
            self.bootstrap_servers.as_deref(),
        )
    }

    /// [`ClusterArgs::named`], for a program that cannot run without a cluster.
    pub fn required(&self) -> Result<ClientProperties, BenchError> {
        crate::cluster::required(
            self.client_properties.as_deref(),
            self.bootstrap_servers.as_deref(),
        )
    }
}

/// A flag value that is not a number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a number")]
pub struct NotANumber(pub String);

/// A number, with `_` allowed as a digit separator (`4_000_000`): the `value_parser` of the
/// benchmarks' counts, e.g. `#[arg(long, value_parser = number::<u64>)]`.
pub fn number<T: FromStr>(text: &str) -> Result<T, NotANumber> {
    text.replace('_', "")
        .parse()
        .map_err(|_| NotANumber(text.to_string()))
}

/// A flag value that is not `KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not KEY=VALUE")]
pub struct NotKeyValue(pub String);

/// `KEY=VALUE` split at the first `=` (a librdkafka property; the value may hold `=`).
pub fn key_value(text: &str) -> Result<(String, String), NotKeyValue> {
    text.split_once('=')
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .ok_or_else(|| NotKeyValue(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        cluster: ClusterArgs,
        #[arg(long, value_parser = number::<u64>, default_value_t = 1_000)]
        rows: u64,
        #[arg(long, value_parser = key_value)]
        property: Vec<(String, String)>,
    }

    #[test]
    fn numbers_take_digit_separators() {
        assert_eq!(number::<u64>("4_000_000"), Ok(4_000_000));
        assert_eq!(number::<f64>("1_000.5"), Ok(1000.5));
        assert_eq!(number::<u64>("many"), Err(NotANumber("many".into())));
        let cli = Cli::try_parse_from(["x", "--rows", "2_000"]).ok();
        assert_eq!(cli.map(|c| c.rows), Some(2000));
        let cli = Cli::try_parse_from(["x"]).ok();
        assert_eq!(cli.map(|c| c.rows), Some(1000));
        assert!(Cli::try_parse_from(["x", "--rows", "many"]).is_err());
    }

    #[test]
    fn key_values_split_at_the_first_equals_sign() {
        assert_eq!(
            key_value("sasl.jaas.config=a=b"),
            Ok(("sasl.jaas.config".into(), "a=b".into()))
        );
        assert!(key_value("no-equals").is_err());
        assert!(key_value("=value").is_err());
        let cli = Cli::try_parse_from(["x", "--property", "a=1", "--property", "b=2"]).ok();
        assert_eq!(cli.map(|c| c.property.len()), Some(2));
    }

    #[test]
    fn the_cluster_flags_are_optional() {
        let cli = Cli::try_parse_from(["x", "--bootstrap-servers", "h:1"]).ok();
        let servers = cli.and_then(|c| c.cluster.bootstrap_servers);
        assert_eq!(servers.as_deref(), Some("h:1"));
        assert!(Cli::try_parse_from(["x", "--client-properties"]).is_err());
    }
}
