//! The process's limit on open files against what its RocksDB may hold open.
//!
//! Every task of the process keeps its stores in one RocksDB
//! ([`SharedDb`](kstate_rocksdb::SharedDb)), which holds [`FILES_PER_ROCKSDB`] descriptors
//! besides its SST files: its `LOCK`, `MANIFEST`, write-ahead log (created and held open even
//! though no write uses it) and directory. SST files come on top, up to the RocksDB's cap
//! ([`RocksDbOptions::open_files_cap`], 64 by default). With a RocksDB per task, 1,000 tasks of
//! 3 stores held 10,110 descriptors, ten times the common soft limit of 1,024
//! (kstate-bench's `tasks_per_process`, BENCHMARKS.md); with the cap on one shared RocksDB the
//! count no longer grows with the tasks. At start the soft limit is still raised as far as the
//! hard limit allows, like servers that open many files do, and a limit below what the process
//! would need is warned about, with the number to give `ulimit -n`.
//!
//! [`RocksDbOptions::open_files_cap`]: kstate_rocksdb::RocksDbOptions::open_files_cap

/// Descriptors a RocksDB holds besides its SST files (see the module docs).
pub(crate) const FILES_PER_ROCKSDB: u64 = 4;

/// SST files counted per column family and task when RocksDB has no cap on open files (each
/// store's, and the metadata's): measured with a RocksDB per task, 1,000 tasks of 3 stores held
/// 10 descriptors each after a start and after a restart.
pub(crate) const SST_FILES_PER_FAMILY: u64 = 2;

/// Descriptors the rest of the process holds: librdkafka's sockets (one per broker per
/// client) and pipes, the workers', the restorers' and the standbys' clients, the application's
/// own files. Standby stores are tasks of the same RocksDB (counted above), and the standbys'
/// clients are a few follower lanes, one per store of a task, and two starters, however many
/// tasks are followed: 1,000 active and 1,000 standby tasks of 3 stores held 236 descriptors
/// (`tasks_per_process --standby`, BENCHMARKS.md).
pub(crate) const FILES_BESIDES_STORES: u64 = 256;

/// What the process would hold with `partitions` tasks of `stores` stores each in its RocksDB,
/// which keeps at most `cap` SST files open (`None`: no cap, so as many as the tasks' data
/// would need).
pub(crate) fn needed(partitions: i32, stores: usize, cap: Option<u32>) -> u64 {
    let tasks = u64::try_from(partitions.max(0)).unwrap_or(0);
    let uncapped = tasks * (stores as u64 + 1) * SST_FILES_PER_FAMILY;
    let ssts = cap.map_or(uncapped, |cap| uncapped.min(u64::from(cap)));
    FILES_BESIDES_STORES + FILES_PER_ROCKSDB + ssts
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
    fn the_cap_bounds_what_a_thousand_tasks_need_and_without_it_they_grow() {
        let fixed = FILES_BESIDES_STORES + FILES_PER_ROCKSDB;
        assert_eq!(needed(1_000, 3, Some(64)), fixed + 64);
        assert_eq!(needed(10, 30, Some(64)), fixed + 64);
        assert_eq!(
            needed(1, 1, Some(64)),
            fixed + 4,
            "fewer files than the cap"
        );
        assert_eq!(needed(1_000, 3, None), fixed + 8_000);
        assert!(needed(200, 1, None) > 1_024);
        assert_eq!(needed(-1, 3, None), fixed);
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
