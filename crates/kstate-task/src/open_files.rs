//! The process's limit on open files against what its stores may hold open.
//!
//! Every store is a RocksDB, and each holds up to about [`FILES_PER_STORE`] descriptors while open:
//! its `LOCK`, `MANIFEST`, write-ahead log (created and held open even though no write uses it)
//! and directory, and its SST files. A process that runs many tasks runs out of descriptors
//! long before it runs out of memory: at the common soft limit of 1,024 about 150 stores fit,
//! and one process holding 1,000 tasks of 3 stores ran out at a limit of 20,000 on its restart
//! (`examples/tasks_per_process.rs`, BENCHMARKS.md). So at start the soft limit is raised as
//! far as the hard limit allows, like servers that open many files do, and a limit still
//! below what every task of the application would need in this one process is warned about,
//! with the number to give `ulimit -n`. It is not an error: a process usually holds only its
//! share of the tasks.

/// Descriptors one open store holds (see the module docs), its SST files counted as four:
/// measured, 6 per store right after a fresh start and 7 after a restart on the state the
/// start left (`examples/tasks_per_process.rs`); more SST files with more data.
pub(crate) const FILES_PER_STORE: u64 = 8;

/// Descriptors the rest of the process holds: librdkafka's sockets (one per broker per
/// client) and pipes, the workers' and the restorers' clients, the application's own files.
pub(crate) const FILES_BESIDES_STORES: u64 = 256;

/// What every task in this process would hold: `partitions` tasks of `stores` stores each.
pub(crate) fn needed(partitions: i32, stores: usize) -> u64 {
    FILES_BESIDES_STORES
        + u64::try_from(partitions.max(0)).unwrap_or(0) * stores as u64 * FILES_PER_STORE
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
        assert_eq!(needed(1_000, 3), 256 + 24_000);
        assert!(needed(200, 1) > 1_024);
        assert_eq!(needed(-1, 3), FILES_BESIDES_STORES);
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
