//! The embedded default: `run` without `--target` starts the mock in-process, serving the
//! recording's own responses at their recorded timing.

use std::path::Path;

/// A running embedded mock.
pub struct EmbeddedMock {
    pub url: String,
}

impl EmbeddedMock {
    pub async fn stop(self) {}
}

/// Start the mock on 127.0.0.1:0 with `--recording recording`.
pub async fn start_embedded(_recording: &Path) -> anyhow::Result<EmbeddedMock> {
    anyhow::bail!("not wired yet")
}
