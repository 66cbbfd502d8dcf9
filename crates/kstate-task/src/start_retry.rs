//! Trying a step of a start again while the cluster is in motion, until the task timeout
//! ([`AppBuilder::task_timeout`](crate::AppBuilder::task_timeout)): the application's first
//! metadata ([`crate::input_check`]) and a worker's transactional producer
//! (`worker::transactional_start`) each make a new client per attempt, so that one stuck on a
//! node that does not answer is left behind. A task's own start is tried again by the worker's
//! events, not in a loop, and bounded by `worker::start_timeouts` instead.

use std::time::{Duration, Instant};

use crate::error::TaskError;

/// Calls `attempt` until it succeeds, fails otherwise than `transient`ly, `timeout` has passed
/// since the first call, or `stopping` says so. A failure after more than one attempt is
/// [`TaskError::TimedOut`] naming `what`, with the last failure; after one, that failure.
pub(crate) fn until_task_timeout<T>(
    what: &str,
    timeout: Duration,
    stopping: &dyn Fn() -> bool,
    transient: impl Fn(&TaskError) -> bool,
    mut attempt: impl FnMut() -> Result<T, TaskError>,
) -> Result<T, TaskError> {
    let started = Instant::now();
    let mut retried = false;
    loop {
        let e = match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if transient(&e) => e,
            Err(e) => return Err(e),
        };
        let waited = started.elapsed();
        if waited < timeout && !stopping() {
            tracing::warn!(error = %e, ?waited, task_timeout = ?timeout, "{what} could not start while the cluster is in motion; trying again with a new client");
            retried = true;
        } else if retried {
            return Err(TaskError::TimedOut {
                what: what.to_string(),
                waited,
                timeout,
                last: Box::new(e),
            });
        } else {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> TaskError {
        TaskError::Thread {
            name: "t".into(),
            message: "transient".into(),
        }
    }

    #[test]
    fn a_transient_failure_is_tried_again_and_one_past_the_timeout_is_timed_out() {
        let mut calls = 0;
        let answer = until_task_timeout(
            "x",
            Duration::from_secs(60),
            &|| false,
            |_| true,
            || {
                calls += 1;
                if calls < 3 { Err(failure()) } else { Ok(calls) }
            },
        );
        assert_eq!(answer.ok(), Some(3));
        let once: Result<(), _> =
            until_task_timeout("x", Duration::ZERO, &|| false, |_| true, || Err(failure()));
        assert!(matches!(once, Err(TaskError::Thread { .. })), "{once:?}");
        let calls = std::cell::Cell::new(0);
        let stopped: Result<(), _> = until_task_timeout(
            "x",
            Duration::from_secs(60),
            &|| calls.get() >= 2,
            |_| true,
            || {
                calls.set(calls.get() + 1);
                Err(failure())
            },
        );
        assert!(
            matches!(stopped, Err(TaskError::TimedOut { .. })),
            "{stopped:?}"
        );
    }
}
