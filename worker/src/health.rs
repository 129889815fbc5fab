//! The optional health port: any HTTP request gets `200` and the worker's phase as JSON, so
//! an orchestrator (Kubernetes probes, Compose health checks) can tell a live worker.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::link::HealthState;

/// Serve health checks on `listener` until the runtime stops.
pub async fn serve(listener: TcpListener, state: Arc<HealthState>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            // Read (and ignore) the request head; answer whatever was asked.
            let mut buf = [0u8; 1024];
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), socket.read(&mut buf))
                .await;
            let body = format!("{{\"status\":\"ok\",\"phase\":\"{}\"}}", state.phase_name());
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}
