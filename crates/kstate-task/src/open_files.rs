//! The process's limit on open files against what its tasks' RocksDBs may hold open.
//!
//! Every task is one RocksDB ([`TaskDb`](kstate_rocksdb::TaskDb)), and each holds about
//! [`FILES_PER_TASK`] descriptors besides its SST files while open: its `LOCK`, `MANIFEST`,
//! write-ahead log (created and held open even though no write uses it) and directory. SST files
//! come on top, up to the RocksDB's cap ([`RocksDbOptions::open_files_cap`], 64 by default; a
//! flush writes one per store and one for the metadata). A process that runs many tasks runs out
//! of descriptors long before it runs out of memory: 1,000 tasks of 3 stores held 10,110
//! (`examples/tasks_per_process.rs`, BENCHMARKS.md), ten times the common soft limit of 1,024. So
//! at start the soft limit is raised as far as the hard limit allows, like servers that open
//! many files do, and a limit still below what every task of the application would need in this
//! one process is warned about, with the number to give `ulimit -n`. It is not an error: a
//! process usually holds only its share of the tasks.
//!
//! [`RocksDbOptions::open_files_cap`]: kstate_rocksdb::RocksDbOptions::open_files_cap

/// Descriptors one task's RocksDB holds besides its SST files (see the module docs).
pub(crate) const FILES_PER_TASK: u64 = 4;

/// SST files counted per column family (each store's, and the metadata's) while the data is
/// small: measured, 1,000 tasks of 3 stores held 10 descriptors each after a start and after
/// a restart.
pub(crate) const SST_FILES_PER_FAMILY: u64 = 2;

/// Descriptors the rest of the process holds: librdkafka's sockets (one per broker per
/// client) and pipes, the workers' and the restorers' clients, the application's own files.
pub(crate) const FILES_BESIDES_STORES: u64 = 256;

/// What every task in this process would hold: `partitions` tasks of `stores` stores each,
/// each RocksDB keeping at most `cap` SST files open (`None`: no cap).
pub(crate) fn needed(partitions: i32, stores: usize, cap: Option<u32>) -> u64 {
    let ssts = (stores as u64 + 1) * SST_FILES_PER_FAMILY;
    let ssts = cap.map_or(ssts, |cap| ssts.min(u64::from(cap)));
    FILES_BESIDES_STORES + u64::try_from(partitions.max(0)).unwrap_or(0) * (FILES_PER_TASK + ssts)
}

/// Raises the soft limit on open files towards `needed` (at most the hard limit) and returns
/// the limit now in force; warns when it stays below `needed`.
pub(crate) fn raise_for(needed: u64) -> Option<u64> {
    match rlimit::increase_nofile_limit(needed) {
        Ok(limit) => {
            if limit < needed {
                tracing::warn!(
                    limit,
                    needed,
                    "the open-files limit is below what every task of this application would hold in one process; \
                     a process given more tasks than fit fails to open their stores (raise `ulimit -n` to {needed})"
                );
            }
            Some(limit)
        }
        Err(e) => {
            tracing::warn!(error = %e, "the open-files limit could not be read or raised");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_tasks_of_three_stores_need_more_than_the_common_soft_limit() {
        assert_eq!(needed(1_000, 3, Some(64)), 256 + 12_000);
        assert_eq!(needed(1_000, 3, Some(20)), 256 + 12_000);
        assert_eq!(
            needed(1_000, 30, Some(20)),
            256 + 24_000,
            "the cap bounds the SST files"
        );
        assert!(needed(200, 1, None) > 1_024);
        assert_eq!(needed(-1, 3, None), FILES_BESIDES_STORES);
    }

    #[test]
    fn the_limit_is_raised_up_to_what_is_needed_never_lowered() {
        let (soft, _) = rlimit::Resource::NOFILE.get().unwrap_or((0, 0));
        let limit = raise_for(soft.saturating_sub(1)).unwrap_or(soft);
        assert!(limit >= soft.saturating_sub(1));
        let (after, _) = rlimit::Resource::NOFILE.get().unwrap_or((0, 0));
        assert!(after >= soft, "never lowered");
    }
}
