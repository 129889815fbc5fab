//! The embedded default: `run` without `--target` starts the mock in-process on
//! 127.0.0.1:0, serving the recording's own responses at their recorded timing, so a
//! recording replays with no server to start by hand.

use std::path::Path;

use anyhow::Context;
use clap::Parser;

use crate::mock::{MockArgs, serve};

/// The mock's own command line, so the embedded mock is configured exactly as
/// `llm-replay mock --recording FILE` would be.
#[derive(Parser)]
struct EmbeddedArgs {
    #[command(flatten)]
    mock: MockArgs,
}

/// A running embedded mock.
pub struct EmbeddedMock {
    pub url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl EmbeddedMock {
    /// Stop serving and wait for the server to finish.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Start the mock on 127.0.0.1:0 with `--recording recording`.
pub async fn start_embedded(recording: &Path) -> anyhow::Result<EmbeddedMock> {
    let recording_arg = recording
        .to_str()
        .context("the recording path is not UTF-8")?;
    let args = EmbeddedArgs::try_parse_from([
        "mock",
        "--listen",
        "127.0.0.1:0",
        "--recording",
        recording_arg,
    ])
    .context("embedded mock options")?;
    let listen = args.mock.listen;
    let config = args.mock.into_config()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .context("embedded mock: cannot listen on 127.0.0.1")?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, config, async {
        let _ = stopped.await;
    }));
    Ok(EmbeddedMock {
        url: format!("http://{addr}"),
        stop,
        task,
    })
}
