//! [`InProcess`]: local workers without a process. Each runs the worker's own code
//! (`link::run_once`, the load on the caller's runtime) and dials the coordinator's gRPC
//! listener over loopback as a worker process does; embedding the coordinator needs no
//! `llm-replay` binary on disk.

use std::sync::Arc;
use std::time::Duration;

use common::launch::{Finish, LaunchError, LaunchedWorker, LocalWorker, WorkerLauncher};

use crate::link::{HealthState, LinkError, LinkOptions, run_once};

/// How long an in-process worker keeps trying to reach the coordinator: it is on the same
/// machine, listening already.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// Launches workers in this process, on the runtime `launch` is called from (the caller's).
#[derive(Debug, Clone, Default)]
pub struct InProcess;

impl WorkerLauncher for InProcess {
    fn launch(&self, worker: LocalWorker) -> Result<Box<dyn LaunchedWorker>, LaunchError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| LaunchError {
            worker: worker.id.clone(),
            message: format!("in-process workers need a Tokio runtime: {e}"),
        })?;
        let options = LinkOptions {
            coordinator: worker.coordinator.to_string(),
            worker_id: worker.id.clone(),
            host: "localhost".to_owned(),
            token: worker.token,
            connect_patience: CONNECT_PATIENCE,
            heartbeat_timeout: worker.heartbeat_timeout,
            report_interval: Duration::from_millis(500),
            tls: None,
            health: Arc::new(HealthState::default()),
            allow_env: worker.allow_env,
        };
        let (done, ended) = tokio::sync::oneshot::channel();
        // The link's future holds its `on_joined` callback across awaits (it is not `Send`):
        // it runs on a thread of its own, driven by the caller's runtime (its timers and
        // sockets), and the load it starts is spawned on that runtime.
        let load = runtime.clone();
        std::thread::Builder::new()
            .name(format!("llm-replay-{}", worker.id))
            .spawn(move || {
                let result = runtime.block_on(run_once(&options, load, &mut |_| {}));
                if let Err(error) = &result {
                    tracing::warn!("in-process worker {}: {error}", options.worker_id);
                }
                let _ = done.send(result);
            })
            .map_err(|e| LaunchError {
                worker: worker.id,
                message: e.to_string(),
            })?;
        Ok(Box::new(Running { ended }))
    }
}

/// An in-process worker's thread, until it says it ended.
struct Running {
    ended: tokio::sync::oneshot::Receiver<Result<(), LinkError>>,
}

impl LaunchedWorker for Running {
    fn finish(self: Box<Self>, patience: Duration) -> Finish {
        Box::pin(async move {
            // A worker still running after `patience` ends by itself once its heartbeat
            // timeout passes without the coordinator.
            let _ = tokio::time::timeout(patience, self.ended).await;
        })
    }
}
