//! The optional health port: any HTTP request gets `200` and the worker's phase as JSON, so
//! an orchestrator (Kubernetes probes, Compose health checks) can tell a live worker.
//!
//! A probe is one short request: accepted by `common::accept`, at most [`MAX_CONNECTIONS`]
//! are served at once (more wait in the kernel's backlog), each for at most [`READ_TIMEOUT`]
//! of silence, and a failed accept (out of descriptors) pauses the loop instead of spinning
//! a core.

use std::sync::Arc;
use std::time::Duration;

use common::accept;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::link::HealthState;

/// Health checks answered at once.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a check may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How the health port accepts connections (`common::accept`). No head timeout of the
/// loop's: a check that sends nothing within [`READ_TIMEOUT`] is answered anyway.
const LIMITS: accept::AcceptLimits = accept::AcceptLimits {
    name: "health port",
    max_connections: MAX_CONNECTIONS,
    head_timeout: None,
};

/// Serve health checks on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, state: Arc<HealthState>) {
    let _connections = accept::serve(
        listener,
        &LIMITS,
        std::future::pending(),
        move |socket, _peer| answer(socket, state.clone()),
    )
    .await;
}

/// Read (and ignore) the request head; answer whatever was asked.
async fn answer(mut socket: TcpStream, state: Arc<HealthState>) {
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(READ_TIMEOUT, socket.read(&mut buf)).await;
    let body = format!("{{\"status\":\"ok\",\"phase\":\"{}\"}}", state.phase_name());
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        socket.write_all(response.as_bytes()).await?;
        socket.shutdown().await
    };
    let _ = tokio::time::timeout(READ_TIMEOUT, write).await;
}
