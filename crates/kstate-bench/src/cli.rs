//! Command-line pieces for clap's derive that the benchmark binaries and the examples share, so
//! that every program names a cluster, and writes a count, the same way:
//!
//! - [`ClusterArgs`]: `--client-properties FILE` and `--bootstrap-servers HOST:PORT`, resolved
//!   by [`crate::cluster`]'s rule (the environment's brokers only when neither names any).
//! - [`AppArgs`]: what every long-running example asks of its application (id, cluster, state
//!   directory, threads, commit interval, guarantee, instance id), turned into an
//!   [`AppBuilder`] by [`AppArgs::builder`].
//! - [`number`]: counts with `_` as a digit separator (`--rows 4_000_000`), as the scripts and
//!   BENCHMARKS.md write them.
//! - [`key_value`]: a librdkafka property, `KEY=VALUE`.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use kstate_kafka::ClientProperties;
use kstate_task::{App, AppBuilder, ProcessingGuarantee};

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

/// The application a long-running example runs, and how: flatten it into its command; the
/// inputs, stores and tasks are the example's own.
#[derive(Debug, Clone, clap::Args)]
pub struct AppArgs {
    /// The application id: the consumer group, and the prefix of the changelog topics.
    #[arg(long)]
    pub application_id: String,
    /// The cluster the application runs on.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Where the stores live, under `<PATH>/<application id>/` (default: the runtime's, `kstate`
    /// in the temporary directory).
    #[arg(long, value_name = "PATH")]
    pub state_dir: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub threads: usize,
    /// How often the workers commit, ms.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub commit_interval_ms: u64,
    /// at-least-once, or exactly-once: one Kafka transaction per worker and commit interval.
    #[arg(long, default_value_t = ProcessingGuarantee::default())]
    pub guarantee: ProcessingGuarantee,
    /// This copy's name in its transactional ids (`<app-id>-<NAME>-<worker>`): a copy restarted
    /// with the same name fences its previous incarnation at once. Never give two running copies
    /// the same name.
    #[arg(long, value_name = "NAME")]
    pub instance_id: Option<String>,
}

impl AppArgs {
    /// A builder of the application these flags name, on the cluster they name.
    pub fn builder(&self) -> Result<AppBuilder, BenchError> {
        let mut builder = App::builder(self.application_id.clone(), self.cluster.required()?);
        builder
            .threads(self.threads)
            .commit_interval(Duration::from_millis(self.commit_interval_ms))
            .processing_guarantee(self.guarantee);
        if let Some(dir) = &self.state_dir {
            builder.state_dir(dir);
        }
        if let Some(id) = &self.instance_id {
            builder.instance_id(id.clone());
        }
        Ok(builder)
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

    #[derive(Debug, Parser)]
    struct AppCli {
        #[command(flatten)]
        app: AppArgs,
    }

    #[test]
    fn an_application_needs_only_its_id() {
        let cli = AppCli::try_parse_from(["x", "--application-id", "counter"]);
        let app = cli.map(|c| c.app).ok();
        let defaults = app.map(|a| (a.threads, a.commit_interval_ms, a.guarantee, a.state_dir));
        let defaults = defaults.map(|(t, c, g, d)| (t, c, g, d.is_none()));
        assert_eq!(
            defaults,
            Some((1, 100, ProcessingGuarantee::AtLeastOnce, true))
        );
        assert!(AppCli::try_parse_from(["x"]).is_err());
        let cli =
            AppCli::try_parse_from(["x", "--application-id", "a", "--guarantee", "exactly-once"]);
        let guarantee = cli.map(|c| c.app.guarantee).ok();
        assert_eq!(guarantee, Some(ProcessingGuarantee::ExactlyOnce));
    }

    #[test]
    fn the_cluster_flags_are_optional() {
        let cli = Cli::try_parse_from(["x", "--bootstrap-servers", "h:1"]).ok();
        let servers = cli.and_then(|c| c.cluster.bootstrap_servers);
        assert_eq!(servers.as_deref(), Some("h:1"));
        assert!(Cli::try_parse_from(["x", "--client-properties"]).is_err());
    }
}
