//! The contract between a run and the local workers it starts: the coordinator asks a
//! [`WorkerLauncher`] for each one, without knowing what runs it. The coordinator's
//! `ProcessLauncher` starts the `llm-replay worker` program (the CLI's default); the worker
//! crate's `worker::InProcess` runs the worker's own code on the caller's runtime (a library
//! user, the tests). Either way the worker dials the coordinator's gRPC listener over
//! loopback, as a remote one does: the link is the same, only the process is not.
//!
//! Here, in `common`, because the coordinator must not depend on the worker crate
//! (ARCHITECTURE.md): both see this trait, and the caller joins them.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

/// What one local worker needs to join a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalWorker {
    /// Its id in the run (`local-0`, `local-1`, ...).
    pub id: String,
    /// Where it dials: the coordinator's gRPC listener.
    pub coordinator: SocketAddr,
    /// The link token it proves (local workers always get one).
    pub token: Option<String>,
    /// Coordinator silence after which it gives up.
    pub heartbeat_timeout: Duration,
    /// Environment variables the assignment may expand on it (the run's own `${VAR}`s).
    pub allow_env: Vec<String>,
}

/// A worker could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start local worker {worker}: {message}")]
pub struct LaunchError {
    pub worker: String,
    pub message: String,
}

/// A future a launched worker's end is awaited with.
pub type Finish = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Starts the run's local workers.
pub trait WorkerLauncher: Send + Sync {
    /// Start one worker: it dials `worker.coordinator` and joins with `worker.token`. It
    /// stays joined for every level of the run and ends when the coordinator says the run is
    /// over.
    fn launch(&self, worker: LocalWorker) -> Result<Box<dyn LaunchedWorker>, LaunchError>;
}

/// A started worker, held until the run is over.
pub trait LaunchedWorker: Send {
    /// Wait for it to end, at most `patience`; then stop it as far as the launcher can.
    fn finish(self: Box<Self>, patience: Duration) -> Finish;
}
