//! What each RocksDB instance costs a process, apart from the data it holds: `--tasks`
//! RocksDBs, one per task as kstate's older layout had them (each the shared RocksDB of a state
//! directory of its own, `StateDir`, with `--stores` stores, a few keys per store, flushed), are
//! created in a temporary directory, closed, and opened again one after another on one thread,
//! as a restart of a process with that many tasks opened them. Prints the time per open, and with all of them
//! open the process's resident memory, threads and file descriptors, per instance:
//!
//! ```text
//! cargo bench --workspace --bench rocksdb_open -- [--tasks 1000] [--stores 3]
//! rocksdb-open tasks=<N> stores=<S> create_s=<s> open_s=<s> open_ms_each=<ms> close_s=<s>
//! rocksdb-held tasks=<N> rss_mb=<MB> rss_kb_each=<KB> fds=<n> fds_each=<x> threads=<n>
//! ```
//!
//! Linux only (it reads `/proc/self`). The memory budget is the process default; what it
//! holds (a few KB of memtables per store) is a small part of what is measured.

use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Parser;
use kstate::kstate_core::KeyValueStore;
use kstate::kstate_rocksdb::{RocksDbOptions, StateDir};
use kstate_bench::cli::number;

/// What each RocksDB instance costs a process: task RocksDBs created, closed, and opened again
/// one after another, timed, with the process's memory, threads and file descriptors.
#[derive(Debug, Parser)]
#[command(name = "rocksdb_open")]
struct Args {
    /// Task RocksDBs to create and open.
    #[arg(long, value_parser = number::<usize>, default_value_t = 1000)]
    tasks: usize,
    /// Stores (column families) per task RocksDB.
    #[arg(long, value_parser = number::<usize>, default_value_t = 3)]
    stores: usize,
    /// Passed by `cargo bench` to every bench binary; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `VmRSS` (KB) and `Threads` from `/proc/self/status`.
fn rss_kb_and_threads() -> Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .context(format!("no {name} in /proc/self/status"))?
            .parse()
            .context(name.to_string())
    };
    Ok((field("VmRSS:")?, field("Threads:")?))
}

fn main() -> Result<()> {
    let Args { tasks, stores, .. } = Args::parse();
    let names: Vec<String> = (0..stores).map(|s| format!("s{s}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = RocksDbOptions::new();
    let dir = tempfile::tempdir()?;
    let path = |task: usize| dir.path().join(task.to_string());

    let started = Instant::now();
    for task in 0..tasks {
        let db = StateDir::open(path(task), &names, &options)?.open_task(0, &names)?;
        for name in &names {
            let store = db.store(name)?;
            for key in 0..10u64 {
                store.put(&key.to_be_bytes(), b"value")?;
            }
            store.flush()?;
        }
    }
    let create = started.elapsed();

    let (rss_before, _) = rss_kb_and_threads()?;
    let fds_before = std::fs::read_dir("/proc/self/fd")?.count();
    let started = Instant::now();
    let held = (0..tasks)
        .map(|task| StateDir::open(path(task), &names, &options))
        .collect::<Result<Vec<_>, _>>()?;
    let open = started.elapsed();
    let (rss, threads) = rss_kb_and_threads()?;
    let fds = std::fs::read_dir("/proc/self/fd")?.count();
    let started = Instant::now();
    drop(held);
    let close = started.elapsed();

    println!(
        "rocksdb-open tasks={tasks} stores={stores} create_s={:.2} open_s={:.2} \
         open_ms_each={:.2} close_s={:.2}",
        create.as_secs_f64(),
        open.as_secs_f64(),
        open.as_secs_f64() * 1e3 / tasks as f64,
        close.as_secs_f64()
    );
    let rss_added = rss.saturating_sub(rss_before);
    println!(
        "rocksdb-held tasks={tasks} rss_mb={} rss_kb_each={} fds={fds} fds_each={:.1} \
         threads={threads}",
        rss / 1024,
        rss_added / tasks as u64,
        fds.saturating_sub(fds_before) as f64 / tasks as f64
    );
    Ok(())
}
