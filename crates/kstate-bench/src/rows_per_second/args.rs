//! The command line of `examples/rows_per_second.rs` (clap derive), with the checks clap cannot
//! make alone.

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use kstate_kafka::ClientProperties;
use kstate_rocksdb::{Compression, MemoryBudget, RocksDbOptions};

use super::configs::{CONFIGS, config, names};
use crate::BenchError;
use crate::cli::{ClusterArgs, key_value, number};

/// rows_per_second: how many rows per second each store configuration takes, in the form of
/// the SAMZA-543 listing, followed by a summary line per configuration.
#[derive(Debug, Clone, Parser)]
#[command(name = "rows_per_second")]
pub struct Args {
    /// Rows per configuration (`_` may separate digits).
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 1_000_000)]
    pub rows: u64,
    /// Bytes per value.
    #[arg(long, value_name = "BYTES", value_parser = number::<usize>, default_value_t = 100)]
    pub value_size: usize,
    /// Rows per write call (1: `put`; more: a batch).
    #[arg(long, value_name = "N", value_parser = number::<usize>, default_value_t = 1)]
    pub batch: usize,
    /// The configurations to run, comma-separated (default: all; the list is below).
    #[arg(long, value_name = "A,B,...", value_delimiter = ',', value_parser = known_config)]
    pub configs: Vec<String>,
    /// Where the stores go (a temporary directory inside it; default: the system's).
    #[arg(long, value_name = "PATH")]
    pub dir: Option<PathBuf>,
    /// The seed of the rows' order and values.
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 543)]
    pub seed: u64,
    /// At most this many rows for `logged-sync`, which waits for every put's acknowledgement.
    #[arg(long, value_name = "N", value_parser = number::<u64>, default_value_t = 50_000)]
    pub sync_rows: u64,
    /// The `logged-group` changelog's topic (it must not exist yet; default: a new one per run).
    #[arg(long, value_name = "NAME")]
    pub restore_topic: Option<String>,
    /// The stores' write buffer, MB (default: the store's).
    #[arg(long, value_name = "N", value_parser = number::<usize>)]
    pub write_buffer_mb: Option<usize>,
    /// The stores' compression (default: the store's).
    #[arg(long, value_enum)]
    pub compression: Option<CompressionArg>,
    /// Thread counts, comma-separated: every configuration runs once per count, one store per
    /// thread.
    #[arg(
        long,
        value_name = "N[,N...]",
        value_delimiter = ',',
        value_parser = thread_count,
        default_values_t = [1]
    )]
    pub threads: Vec<usize>,
    /// The cluster (`--client-properties`, `--bootstrap-servers`).
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// A librdkafka property on top of the cluster's (repeatable), e.g. compression.type=none.
    #[arg(long = "client-property", value_name = "KEY=VALUE", value_parser = key_value)]
    pub client_properties: Vec<(String, String)>,
    /// The logged configurations' producer linger, ms (`ChangelogConfig::linger`).
    #[arg(long, value_name = "N", value_parser = number::<u64>)]
    pub linger_ms: Option<u64>,
    /// Also write every result, with the progress points, as JSON (for benches/chart.py).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
}

/// `--compression`'s values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompressionArg {
    /// No compression.
    None,
    /// lz4 on every level.
    Lz4,
    /// lz4, and zstd for the bottommost level.
    Lz4Zstd,
}

impl From<CompressionArg> for Compression {
    fn from(arg: CompressionArg) -> Self {
        match arg {
            CompressionArg::None => Compression::None,
            CompressionArg::Lz4 => Compression::Lz4,
            CompressionArg::Lz4Zstd => Compression::Lz4ThenZstd,
        }
    }
}

/// A thread count: a number of at least 1.
fn thread_count(text: &str) -> Result<usize, String> {
    match number::<usize>(text) {
        Ok(0) => Err("0 threads cannot write anything".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A configuration's name, if it names one.
fn known_config(name: &str) -> Result<String, String> {
    match config(name) {
        Some(config) => Ok(config.name.to_string()),
        None => Err(format!(
            "unknown configuration '{name}'; known: {}",
            names()
        )),
    }
}

impl Args {
    /// The process's command line, with the configurations listed under `--help`; exits with
    /// clap's message on a flag it rejects.
    pub fn from_command_line() -> Result<Args, BenchError> {
        let command =
            <Args as CommandFactory>::command().after_help(format!("Configurations: {}", names()));
        let matches = command.get_matches();
        let args = Args::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
        args.checked()
    }

    /// The defaults clap cannot express, and the checks it cannot make.
    fn checked(mut self) -> Result<Args, BenchError> {
        self.batch = self.batch.max(1);
        if self.configs.is_empty() {
            self.configs = CONFIGS.iter().map(|c| c.name.to_string()).collect();
        }
        let mut seen = self.threads.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != self.threads.len() {
            return Err(BenchError::Flag {
                flag: "--threads",
                reason: "each count at most once (a repeat would reuse its topic)".to_string(),
            });
        }
        Ok(self)
    }

    /// The store options of every configuration: the defaults, or the ones the flags sweep, with
    /// a fresh budget each, so no configuration inherits another's warm cache.
    pub fn store_options(&self) -> RocksDbOptions {
        let mut options =
            RocksDbOptions::default().memory_budget(MemoryBudget::new(256 << 20, 128 << 20));
        if let Some(mb) = self.write_buffer_mb {
            options = options.write_buffer_size(mb << 20);
        }
        if let Some(compression) = self.compression {
            options = options.compression(compression.into());
        }
        options
    }

    /// The cluster the flags and the environment name (`crate::cluster`), with
    /// `--client-property` on top; `None` when nothing names one.
    pub fn cluster(&self) -> Result<Option<ClientProperties>, BenchError> {
        let Some(mut cluster) = self.cluster.named()? else {
            return Ok(None);
        };
        for (key, value) in &self.client_properties {
            cluster.insert(key, value);
        }
        Ok(Some(cluster))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<Args, BenchError> {
        let mut line = vec!["rows_per_second"];
        line.extend_from_slice(flags);
        Args::try_parse_from(line)
            .map_err(|e| BenchError::Flag {
                flag: "clap",
                reason: e.to_string(),
            })?
            .checked()
    }

    #[test]
    fn every_configuration_runs_by_default() -> Result<(), BenchError> {
        let args = parse(&["--rows", "1_000"])?;
        assert_eq!(args.rows, 1000);
        assert_eq!(args.configs.len(), CONFIGS.len());
        Ok(())
    }

    #[test]
    fn unknown_configurations_and_bad_thread_counts_are_refused() {
        assert!(parse(&["--configs", "rocksdb-wal,nosuch"]).is_err());
        assert!(parse(&["--threads", "0"]).is_err());
        assert!(parse(&["--threads", "1,2,1"]).is_err());
        assert!(parse(&["--threads", "1,2"]).is_ok());
    }
}
