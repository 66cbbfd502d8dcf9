//! `kstate`, the operator's command line for kstate's stores: a store that lives on a disk and
//! in a Kafka topic is a black box when something looks wrong (which offset is this directory
//! at, how far behind is it, does it agree with its changelog, what does it hold?). Each answer is
//! one command here.
//!
//! Every subcommand that only reads opens the store as RocksDB itself does, so a directory that
//! a running application holds is refused (RocksDB's lock), and nothing is written to the
//! store's contents. Only `restore` and `reseed` change anything, and only what they are asked
//! to.
//!
//! Exit codes: 0 done (and, for `verify` and `diff`, no difference); 1 `verify` or `diff` found a
//! difference; 2 bad arguments; 3 anything else failed (the message says what, naming the path,
//! topic, partition or offset).

mod changelog;
mod diff;
mod dump;
mod format;
mod inspect;
mod reseed;
mod restore;
mod store_dir;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

const EXIT_CODES: &str = "Exit codes: 0 done, no difference; 1 verify or diff found a difference; \
                          2 bad arguments; 3 failed (the message says why).";

/// Inspect, dump, verify, restore, diff and reseed kstate's stores.
#[derive(Debug, Parser)]
#[command(name = "kstate", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Inspect(inspect::Args),
    Dump(dump::Args),
    Verify(verify::Args),
    Restore(restore::Args),
    Diff(diff::Args),
    Reseed(reseed::Args),
}

/// How a subcommand ended, when it did not fail.
pub(crate) enum Outcome {
    /// Done; nothing differs.
    Done,
    /// `verify` or `diff` found a difference.
    Differs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Dump(args) => dump::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Restore(args) => restore::run(args),
        Command::Diff(args) => diff::run(args),
        Command::Reseed(args) => reseed::run(args),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Differs) => ExitCode::from(1),
        Err(e) => {
            eprintln!("kstate: error: {e:#}");
            ExitCode::from(3)
        }
    }
}
