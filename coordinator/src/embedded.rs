//! The embedded default: `run` without `--target` starts the mock in-process on
//! 127.0.0.1:0, serving the recording's own responses at their recorded timing, so a
//! recording replays with no server to start by hand.

use std::path::Path;

use std::sync::Arc;

use anyhow::Context;

use mock::{MockConfig, Recorded, serve};

/// A running embedded mock.
pub struct EmbeddedMock {
    pub url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl EmbeddedMock {
    /// Stop serving and wait for the server to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::task::spawn_blocking(move || self.thread.join()).await;
    }
}

/// Start the mock on 127.0.0.1:0 with `--recording recording`.
pub fn start_embedded(recording: &Path) -> anyhow::Result<EmbeddedMock> {
    // The mock's defaults (those of `llm-replay mock`), serving the recording's responses.
    let config = MockConfig {
        recording: Some(Arc::new(Recorded::load(recording)?)),
        ..MockConfig::default()
    };
    // The mock gets its own runtime and threads: it must answer on time whatever the
    // coordinator is doing (feeding slices, merging reports).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("llm-replay-mock")
        .enable_all()
        .build()
        .context("embedded mock runtime")?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .context("embedded mock: cannot listen on 127.0.0.1")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("llm-replay-mock".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                serve(listener, config, async {
                    let _ = stopped.await;
                })
                .await?;
                anyhow::Ok(())
            });
            if let Err(error) = served {
                tracing::error!(%error, "embedded mock stopped");
            }
        })
        .context("embedded mock thread")?;
    Ok(EmbeddedMock {
        url: format!("http://{addr}"),
        stop,
        thread,
    })
}
