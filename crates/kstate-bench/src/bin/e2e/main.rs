//! e2e: the end-to-end and failover benchmarks' kstate side, the bare-rdkafka baseline, and the
//! measures every system is judged by (`benches/kafka-streams/compare.sh`, `failover.sh`).
//!
//! ```text
//! e2e setup    --input T --partitions P --rows N [--keys K | --unique] [--key-bytes B]
//!              [--event-time-step-ms F [--event-time-start-ms T] [--event-time-bookends-ms J]]
//! e2e output   --topic T --partitions P                        output topic (LogAppendTime)
//! e2e kstate   --input T --output T --application-id A --rows N [--threads N] [--coalesce]
//!              [--guarantee at-least-once|exactly-once]
//!              [--topology count|windowed [--emit updates|final]]
//! e2e pipe     --input T --output T --application-id A --rows N
//! e2e measure  --output T --partitions P --rows N --expect records|counts|window-updates|windows
//!              [--input T] [--json PATH]
//! e2e wait     --output T --records N [--group G --input T] [--timeout-s S]
//! e2e failover --input T --output T --kill PID [--timeout-s S] [--json PATH]
//! e2e paced    --input T --output T --rows N --rate R [--warmup W] [--keys K] [--json PATH]
//!              [--fault CMD --fault-after S]
//! e2e leader   --topic T [--partition P]
//! e2e in-sync  [--timeout-s S]
//! e2e delete-topics --topics T1,T2,...
//! ```
//!
//! Built into `$CARGO_TARGET_DIR/release/e2e` by the workspace's build (`cargo build --release
//! --workspace --all-targets`; a build of `-p kstate-bench` alone resolves its dependencies'
//! features differently and compiles RocksDB again). `e2e --help` and `e2e <command> --help`
//! list the flags.
//! Counts may use `_` as a digit separator (`--rows 4_000_000`).
//!
//! Every command also takes `--client-properties FILE`: librdkafka properties, one `key=value`
//! a line (`kstate_kafka::ClientProperties::from_file`), for a secured broker, e.g. the
//! `sasl_ssl.properties` that `scripts/kafka start --secure` prints. Every Kafka client the
//! command creates starts from them: the application (`kstate`: its consumers, producers,
//! restore and admin clients), the pipe's clients, and the clients that write the input and
//! read the outputs back, so that everything goes through the same listener with the same
//! security. The broker is the file's `bootstrap.servers`; `--bootstrap-servers` replaces it,
//! and `KAFKA_BOOTSTRAP_SERVERS` is used only when neither gives one. The properties are printed
//! with their secrets redacted, never the password.
//!
//! - `setup` fills a fresh input topic: N records with 16-byte values, keys drawn uniformly from
//!   K (seeded; default 10,000) or, with `--unique`, the keys `0..N` once each; keys are B bytes
//!   wide (default 8: the index big-endian; wider keys add incompressible filler, which is how
//!   the failover benchmark gets about 1 GB of state). Partitioned by murmur2 like the Java client.
//!   With `--event-time-step-ms F` (a decimal: 1.2 puts 50,000 records in a minute) record i gets
//!   the timestamp T + ⌊i·F⌋, so that event time advances and the windowed runs' windows close;
//!   T (`--event-time-start-ms`) defaults to a whole minute about F·N ms plus a minute before
//!   now, so that the whole input lies in the recent past: the window stores' changelogs keep a
//!   window for a day past its end (`cleanup.policy=compact,delete`), and records older than that
//!   would be deleted by the broker under the run. Only the absolute times move from one setup
//!   to the next: windows start at whole minutes and T is one, so every (key, window) gets the
//!   same records. The input itself is created with `retention.ms=-1` then, whatever T is.
//!   `--event-time-bookends-ms J` (J at least a window's size plus its grace) moves each
//!   partition's first record J before T and its last one J past its own time: the second record
//!   of a partition then closes the first one's window, and the last closes every window before
//!   its own, so that a system sending final window counts sends its first output when it
//!   starts on a partition and its last when it ends one, and the first-to-last output clock
//!   (`measure`) covers its whole run, as it does for one output per input.
//! - `kstate` runs the count-by-key task (`kstate_bench::topology::count_by_key`, the
//!   `count_by_key` example's processor) in process until it has processed and committed N records,
//!   then stops gracefully. `--guarantee exactly-once` runs it exactly-once (one transaction per
//!   worker and commit interval); the tasks' `processed` counts only records whose commit (under
//!   exactly-once: whose transaction) succeeded, and an abort's rewind does not count its records
//!   twice, so the same stop condition holds under both guarantees. `--topology windowed` counts
//!   per key in tumbling 1-minute windows with a 10 s grace (the records' timestamps are the event
//!   time) in a window store named `counts`: `--emit updates` (the default) sends every window's
//!   new count for each record (`<key>@<window start ms>` → the count, as decimal ASCII: Kafka
//!   Streams' windowed `count()` with caching off, one output per input;
//!   `kstate_bench::topology::windowed_updates`), `--emit final` each window's final count once,
//!   when stream time passes its end plus the grace (`kstate_bench::topology::windowed_count`, the
//!   `windowed_count` example's task; Kafka Streams' `emitStrategy(onWindowClose())`).
//! - `pipe` is the physical limit: the same broker work with no state. Each input record is
//!   consumed and two records produced (the output, and a record to a compacted topic standing
//!   in for the changelog) by a producer with exactly kstate's settings
//!   (`ProducerConfig::client_config`: acks=all, idempotence, lz4, the same linger) from a
//!   consumer set up as kstate's. Every 100 ms it takes the input offsets and commits them once
//!   the broker has acknowledged everything sent before them (counting delivery reports, not
//!   librdkafka's flush, which costs far more), polling on meanwhile: kstate's commit stops its
//!   worker for that wait, the pipe never stops.
//! - `measure` reads the output topic back: output topics are created with
//!   `message.timestamp.type=LogAppendTime`, so the broker stamps every output when it appends it,
//!   whoever produced it. The rate is N input records over the time from the first output's
//!   append to the last one's: start-up (group join, topic creation) is outside the clock for
//!   every system alike. `--expect records`: one output per input (caching off, the pipe);
//!   `--expect counts`: the outputs' last counts sum to N (caching on emits fewer);
//!   `--expect window-updates --input T`: one output per input and, per window, the highest
//!   count sent is the number of its records in input T (`kstate --topology windowed`, emitting
//!   updates);
//!   `--expect windows --input T`: final window counts (`kstate --topology windowed --emit final`
//!   and Kafka Streams' emit-final), checked against input T read back: every output is a closed
//!   window with its exact count, and per input partition the windows sent are all those that
//!   closed up to the last one sent (`windows=<sent>/<closed>` in its line). A system may stop
//!   before it sent the windows that closed last: Kafka Streams sends closed windows at most once
//!   a second per task, and the windows that close within a second of a task's last record wait
//!   for a record that never comes. Windows that never close nobody sends. The rate is N over
//!   first-to-last append as above; so that the first and the last output come with the first
//!   and the last records, the input has bookends (`setup --event-time-bookends-ms`). It reads
//!   with `isolation.level=read_committed` (aborted outputs of an exactly-once run do not count)
//!   and is done with a partition when the consumer's position reaches the high watermark the
//!   partition had at the start: on a transactional topic the commit markers take offsets, so
//!   the last record's offset + 1 is below it. A second line gives each output partition's
//!   first and last append, in ms after the first output of all
//!   (`e2e partitions output=T append_ms=<p>:<first>-<last>,...`): a task that starts late
//!   stretches every system's window alike, and shows there.
//! - `wait` returns once the output topic holds N records (everything processed): the sum of
//!   its partitions' high - low watermarks, which on a transactional (exactly-once) output also
//!   counts the commit markers and so comes too early there. With `--group G --input T` it also
//!   waits until consumer group G's committed offsets reach T's end offsets on every partition:
//!   under exactly-once, until every input record was processed in a committed transaction
//!   (both systems commit their input offsets in the transaction, to the group named by the
//!   application id).
//! - `failover` SIGKILLs process PID (one copy of an application that has processed its input),
//!   then writes one marker record to every input partition and waits until each partition's
//!   marker has its output. It reads the output with `isolation.level=read_committed`, so an
//!   exactly-once marker output counts once its transaction committed (an aborted one never).
//!   It prints each partition's milliseconds from the kill to the marker output's append time
//!   (`ms`, the clock), and to when the reader got it (`visible_ms`: under exactly-once also the
//!   wait for the commit), and `failover seconds=<s>` for the slowest append: the time until the
//!   survivor (or the restarted copy) has processed a record of every partition that moved to
//!   it, group detection and restore included.
//! - `paced` measures latency, while the application runs (started before, on an empty input
//!   topic created with `e2e output`, so that the input records carry the broker's append time
//!   too, and with `--rows N`). It writes W warm-up records (default 10,000) at once and waits
//!   until their outputs are back (the application is up, has joined its group and caught up),
//!   then writes the remaining N - W records at R records/s (librdkafka, linger 5 ms; keys like
//!   `setup`'s). A read_committed consumer reads the output meanwhile. Each output (key, count
//!   n) belongs to the n-th input record with that key (count-by-key, caching off: one output
//!   per input, a key's records all in one partition). Per paced record it takes two latencies,
//!   both on the broker's clock (the broker runs on this machine): `append`, from the input
//!   record's append to its output's append; `visible`, from the input's append until the
//!   reader got the output (under exactly-once this includes the wait for the transaction's
//!   commit, which `append` does not). Prints `e2e latency ... append_p50_ms=.. visible_..`.
//!   With `--fault CMD --fault-after S` it runs CMD (`sh -c`; e.g. `scripts/kafka kill 2`) once S
//!   s of pacing have passed, pacing on meanwhile, and also prints `e2e fault ...
//!   next_output_ms=.. every_partition_ms=.. max_visible_ms=..`: from the fault until the reader
//!   had the output of an input appended after it, first on any partition, then on every one
//!   (an input partition without a leader until the next is elected included), and the slowest
//!   visible latency of an input appended from 10 s before it on.
//! - `leader` prints the node id of a partition's leader (the broker a fault run kills);
//!   `in-sync` waits until every partition of the cluster has a leader and all its replicas in
//!   its ISR (a killed node back and caught up).
//! - `delete-topics` deletes the named topics (missing ones are fine).
//!
//! The runtime's warnings go to stderr; `--log info` (or `debug`, `trace`) tells more.
mod common;
mod failover;
mod kstate;
mod measure;
mod nodes;
mod paced;
mod pipe;
mod setup;
mod wait;
mod window_check;

use anyhow::Result;
use clap::{Parser, Subcommand};
use kstate_bench::cli::{ClusterArgs, number};
use kstate_bench::kafka::{LOG_APPEND_TIME, create_topic, delete_topics};

/// The end-to-end and failover benchmarks' kstate side, the bare-rdkafka baseline, and the
/// measures every system is judged by (benches/kafka-streams/compare.sh, failover.sh).
#[derive(Debug, Parser)]
#[command(name = "e2e")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The runtime's log level on stderr: error, warn, info, debug or trace.
    #[arg(
        long,
        global = true,
        value_name = "LEVEL",
        default_value = "warn",
        display_order = 902
    )]
    log: tracing::Level,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fills a fresh input topic with N seeded records (16-byte values).
    Setup(setup::Args),
    /// Creates an output topic whose records the broker stamps with its append time.
    Output {
        /// The topic to create.
        #[arg(long)]
        topic: String,
        /// Its partitions.
        #[arg(long, value_parser = number::<i32>)]
        partitions: i32,
    },
    /// Runs kstate's count-by-key (or windowed) task until it committed N records.
    Kstate(kstate::Args),
    /// The physical limit: consume one, produce two, commit every 100 ms, no state.
    Pipe(pipe::Args),
    /// Reads an output topic back and prints its rate over first-to-last append time.
    Measure(measure::Args),
    /// Waits until an output topic holds N records (and a group committed an input's end).
    Wait(wait::Args),
    /// SIGKILLs a copy, writes a marker to every input partition, times their outputs.
    Failover(failover::Args),
    /// Measures latency: a warm-up, then records at a fixed rate while reading the output.
    Paced(paced::Args),
    /// Prints the node id of a partition's leader.
    Leader(nodes::LeaderArgs),
    /// Waits until every partition of the cluster has a leader and all its replicas in sync.
    InSync(nodes::InSyncArgs),
    /// Deletes topics (missing ones are fine).
    DeleteTopics {
        /// The topics, comma-separated.
        #[arg(long, value_name = "T1,T2,...")]
        topics: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The runtime's warnings (and, with `--log info`, its story) go to stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(cli.log)
        .init();
    // The cluster and its security (see the module docs): `--client-properties FILE`, whose
    // `bootstrap.servers` `--bootstrap-servers` replaces; `KAFKA_BOOTSTRAP_SERVERS` when neither
    // names the brokers.
    let client = cli.cluster.required()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Setup(args) => runtime.block_on(setup::run(&client, args)),
        Command::Output { topic, partitions } => {
            Ok(runtime.block_on(create_topic(client, &topic, partitions, LOG_APPEND_TIME))?)
        }
        Command::Kstate(args) => kstate::run(&client, args),
        Command::Pipe(args) => runtime.block_on(pipe::run(&client, args)),
        Command::Measure(args) => measure::run(&client, args),
        Command::Wait(args) => wait::run(&client, args),
        Command::Failover(args) => failover::run(&client, args),
        Command::Paced(args) => paced::run(&client, args),
        Command::Leader(args) => nodes::leader(&client, args),
        Command::InSync(args) => nodes::in_sync(&client, args),
        Command::DeleteTopics { topics } => {
            let topics: Vec<&str> = topics.split(',').filter(|t| !t.is_empty()).collect();
            Ok(runtime.block_on(delete_topics(client, &topics))?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The command lines the scripts in benches/ write, with the client properties last.
    #[test]
    fn the_scripts_command_lines_parse() {
        let lines: [&[&str]; 7] = [
            &[
                "setup",
                "--input",
                "i",
                "--partitions",
                "4",
                "--rows",
                "1_000_000",
                "--event-time-step-ms",
                "1.2",
                "--event-time-bookends-ms",
                "120000",
            ],
            &[
                "setup",
                "--input",
                "i",
                "--partitions",
                "8",
                "--rows",
                "4000000",
                "--unique",
                "--key-bytes",
                "512",
                "--client-properties",
                "c.properties",
            ],
            &[
                "kstate",
                "--input",
                "i",
                "--rows",
                "10",
                "--application-id",
                "a",
                "--topology",
                "windowed",
                "--emit",
                "final",
                "--output",
                "o",
                "--log",
                "info",
            ],
            &[
                "measure",
                "--output",
                "o",
                "--partitions",
                "4",
                "--rows",
                "10",
                "--expect",
                "window-updates",
                "--input",
                "i",
            ],
            &[
                "wait",
                "--output",
                "o",
                "--records",
                "10",
                "--group",
                "g",
                "--input",
                "i",
                "--timeout-s",
                "3600",
            ],
            &[
                "paced", "--input", "i", "--output", "o", "--rows", "250000", "--rate", "10000",
                "--warmup", "50000", "--json", "x.json",
            ],
            &["delete-topics", "--topics", "a,b"],
        ];
        for line in lines {
            let parsed = Cli::try_parse_from(std::iter::once("e2e").chain(line.iter().copied()));
            assert!(parsed.is_ok(), "{line:?}: {parsed:?}");
        }
        let windows_without_input = [
            "e2e",
            "measure",
            "--output",
            "o",
            "--partitions",
            "4",
            "--rows",
            "1",
            "--expect",
            "windows",
        ];
        assert!(Cli::try_parse_from(windows_without_input).is_err());
    }
}
