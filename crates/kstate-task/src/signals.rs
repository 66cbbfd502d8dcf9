//! [`Running::run_until_signal`]: the end of a service's `main`. An orchestrator stops a process
//! with SIGTERM, a terminal with SIGINT; either must end in the clean shutdown a restart relies on
//! (final commit, stores closed, group left, so the next copy restores nothing it need not), not
//! in the kill that follows an ignored signal. Every program that runs an application until it
//! is told to stop ends the same way, so the runtime offers it once.

use std::sync::Arc;

use crate::app::Running;
use crate::error::TaskError;

/// Why [`Running::run_until_signal`] returned after a clean shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// SIGTERM or SIGINT arrived, and the application shut down.
    Signalled,
    /// The application stopped without a signal: something called [`Running::shutdown`].
    Stopped,
}

impl Running {
    /// Runs until SIGTERM or SIGINT, then shuts the application down, or until it stops or fails
    /// by itself; waits (off the async runtime) until every worker has committed and closed its
    /// stores. `Err` when the application failed (the failure
    /// [`AppState::Failed`](crate::AppState::Failed) holds) or a signal handler could not be
    /// installed ([`TaskError::Signal`], before anything stops).
    pub async fn run_until_signal(self: Arc<Self>) -> Result<Ending, Arc<TaskError>> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &'static str| {
            signal(kind).map_err(|source| {
                Arc::new(TaskError::Signal {
                    signal: name,
                    source,
                })
            })
        };
        let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
        let mut int = listen(SignalKind::interrupt(), "SIGINT")?;
        let ending = tokio::select! {
            _ = term.recv() => Ending::Signalled,
            _ = int.recv() => Ending::Signalled,
            _ = self.stopped() => Ending::Stopped,
        };
        if ending == Ending::Signalled {
            tracing::info!("signal received: shutting down");
            self.shutdown();
        }
        // `wait` returns the failure `AppState::Failed` holds, if any.
        let waiting = self.clone();
        match tokio::task::spawn_blocking(move || waiting.wait()).await {
            Ok(waited) => waited.map(|()| ending),
            Err(join) => Err(Arc::new(TaskError::Thread {
                name: "run_until_signal".to_string(),
                message: join.to_string(),
            })),
        }
    }
}
