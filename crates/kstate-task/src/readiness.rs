//! Whether a process is ready to be counted on, for an orchestrator's readiness probe.
//!
//! A process whose tasks restore has its inputs paused: it is alive, but it answers no query
//! and makes no progress on those partitions until the restore ends, which with a large state
//! takes minutes. An orchestrator that routes traffic or rolls the next instance only once this
//! one is ready must tell the two apart; [`Running::readiness`](crate::Running::readiness) does,
//! from the same registry as [`Running::tasks`](crate::Running::tasks). Standby tasks do not
//! count: a standby catching up holds nothing back.

use std::sync::Arc;

use crate::error::TaskError;

/// Where a process is, as a readiness probe sees it. Only [`Readiness::Ready`] is ready.
#[derive(Debug, Clone)]
pub enum Readiness {
    /// Some worker has not had its first assignment from the group yet.
    Joining,
    /// `restoring` of this process's `tasks` active tasks are restoring their stores (their
    /// inputs paused).
    Restoring {
        /// Tasks restoring.
        restoring: usize,
        /// Active tasks of this process, restoring or not.
        tasks: usize,
    },
    /// Every worker has joined and none of its `tasks` active tasks is restoring (a worker
    /// the group gave no partition is ready too).
    Ready {
        /// Active tasks of this process.
        tasks: usize,
    },
    /// Shutting down, or stopped.
    Stopping,
    /// A worker failed, and the application with it: the first failure.
    Failed(Arc<TaskError>),
}

impl Readiness {
    /// Whether a readiness probe should pass.
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready { .. })
    }
}

impl std::fmt::Display for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Readiness::Joining => write!(f, "joining the group"),
            Readiness::Restoring { restoring, tasks } => {
                write!(f, "restoring {restoring} of {tasks} tasks")
            }
            Readiness::Ready { tasks } => write!(f, "ready: {tasks} tasks running"),
            Readiness::Stopping => write!(f, "stopping"),
            Readiness::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}
