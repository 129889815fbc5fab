//! [`ProcessLauncher`]: local workers as child processes of a program's `worker` command (the
//! `llm-replay` binary: the CLI's default). The one place their command line is written.
//! A library user who has no binary passes `worker::InProcess` instead (`common::launch`).

use std::path::PathBuf;
use std::time::Duration;

use common::launch::{Finish, LaunchError, LaunchedWorker, LocalWorker, WorkerLauncher};

/// Starts each local worker as `PROGRAM worker --once ...`, dialling the coordinator over
/// loopback gRPC with the link token (in its environment, never on its command line).
#[derive(Debug, Clone)]
pub struct ProcessLauncher {
    program: PathBuf,
}

impl ProcessLauncher {
    /// Workers run `program` (the `llm-replay` binary).
    pub fn new(program: impl Into<PathBuf>) -> ProcessLauncher {
        ProcessLauncher {
            program: program.into(),
        }
    }
}

impl WorkerLauncher for ProcessLauncher {
    fn launch(&self, worker: LocalWorker) -> Result<Box<dyn LaunchedWorker>, LaunchError> {
        let child = tokio::process::Command::new(&self.program)
            .args([
                "worker",
                "--coordinator",
                &worker.coordinator.to_string(),
                "--once",
                "--worker-id",
                &worker.id,
                "--heartbeat-timeout",
                &worker.heartbeat_timeout.as_secs_f64().to_string(),
            ])
            .args(
                worker
                    .allow_env
                    .iter()
                    .flat_map(|v| ["--allow-env", v.as_str()]),
            )
            .env("LLM_REPLAY_TOKEN", worker.token.unwrap_or_default())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            // Their own process group: a Ctrl-C on the terminal reaches the coordinator
            // alone, which stops them over the link and keeps their data.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LaunchError {
                worker: worker.id,
                message: e.to_string(),
            })?;
        Ok(Box::new(Child(child)))
    }
}

/// A worker process.
struct Child(tokio::process::Child);

impl LaunchedWorker for Child {
    fn finish(self: Box<Self>, patience: Duration) -> Finish {
        let Child(mut child) = *self;
        Box::pin(async move {
            if tokio::time::timeout(patience, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        })
    }
}
