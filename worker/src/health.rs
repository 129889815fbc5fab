//! The optional health port: any HTTP request gets `200` and the worker's phase as JSON, so
//! an orchestrator (Kubernetes probes, Compose health checks) can tell a live worker.
//!
//! A probe is one short request: at most [`MAX_CONNECTIONS`] are served at once (more wait
//! in the kernel's backlog), each for at most [`READ_TIMEOUT`] of silence, and a failed
//! accept (out of descriptors) pauses the loop instead of spinning a core.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::link::HealthState;

/// Health checks answered at once.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a check may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The pause after a failed accept: the error would come back at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serve health checks on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, state: Arc<HealthState>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut accept_failed = false;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(error) => {
                if !accept_failed {
                    accept_failed = true;
                    tracing::warn!(%error, "health port: accepting a connection failed; retrying (logged once)");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // Read (and ignore) the request head; answer whatever was asked.
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
        });
    }
}
