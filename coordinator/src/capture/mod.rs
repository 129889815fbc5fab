//! Capture: the recording reverse proxy (`llm-replay record`), body redaction, and response
//! completeness shared with the importers.
//!
//! `run` takes its listener, shutdown signal and typed config from the caller, so tests and
//! the CLI drive the same code.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use crate::commands::exit;

pub mod complete;
pub mod proxy;
pub mod redact;
pub mod writer;

/// `llm-replay record` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RecordArgs {
    /// Address to listen on (e.g. 127.0.0.1:8080; port 0 picks a free one).
    #[arg(long)]
    pub listen: String,
    /// Upstream base URL (http:// or https://; a path prefix is put before every request).
    #[arg(long)]
    pub upstream: String,
    /// Recording to write (truncated first).
    #[arg(long)]
    pub out: PathBuf,
    /// Another header never to write, besides the built-in credential list (repeatable).
    #[arg(long = "redact-header", value_name = "NAME")]
    pub redact_header: Vec<String>,
    /// Replace matches of REGEX in recorded bodies with REDACTED-<hash> (repeatable).
    #[arg(long = "redact-body", value_name = "REGEX")]
    pub redact_body: Vec<String>,
    /// Request header whose value becomes the exchange's session id.
    #[arg(long, value_name = "NAME")]
    pub session_header: Option<String>,
    /// Speak HTTP/2 with prior knowledge to a plain-http upstream (h2c).
    #[arg(long)]
    pub upstream_h2c: bool,
    /// PEM file of extra CA certificates to trust for an https upstream (besides the
    /// Mozilla roots).
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// On SIGINT/SIGTERM, how long to let open streams finish before exiting.
    #[arg(long, default_value = "10s")]
    pub drain: String,
}

/// The validated configuration of one recording proxy.
#[derive(Clone)]
pub struct RecordConfig {
    pub upstream: proxy::Upstream,
    pub out: PathBuf,
    pub scrub: writer::Scrub,
    pub session_header: Option<http::HeaderName>,
    pub upstream_h2c: bool,
    pub upstream_ca: Option<PathBuf>,
    pub drain: Duration,
}

/// A problem running the proxy.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Writer(#[from] writer::WriterError),
    #[error("cannot listen: {0}")]
    Listen(#[source] std::io::Error),
}

impl RecordArgs {
    /// Validate into a [`RecordConfig`].
    pub fn into_config(self) -> Result<RecordConfig, RecordError> {
        let upstream = proxy::Upstream::parse(&self.upstream).map_err(RecordError::Usage)?;
        if self
            .out
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
        {
            return Err(RecordError::Usage(format!(
                "--out {}: record writes plain JSONL (a gzip stream cut by a crash loses \
                 everything after its last flush); compress the file afterwards",
                self.out.display()
            )));
        }
        let redactor = redact::Redactor::new(&self.redact_body)
            .map_err(|e| RecordError::Usage(e.to_string()))?;
        let session_header = self
            .session_header
            .map(|h| {
                http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                    .map_err(|e| RecordError::Usage(format!("--session-header {h:?}: {e}")))
            })
            .transpose()?;
        let drain = crate::duration::parse_duration(&self.drain)
            .map_err(|e| RecordError::Usage(format!("--drain: {e}")))?;
        Ok(RecordConfig {
            upstream,
            out: self.out,
            scrub: writer::Scrub {
                redact_headers: self.redact_header,
                redactor,
            },
            session_header,
            upstream_h2c: self.upstream_h2c,
            upstream_ca: self.upstream_ca,
            drain,
        })
    }
}

/// What one proxy run did.
#[derive(Debug, Clone, Copy)]
pub struct RecordSummary {
    pub written: u64,
    /// Streams still open when the drain time ran out (not written).
    pub abandoned: u64,
}

/// Serve `listener` until `shutdown` resolves, then let open streams finish (up to
/// `config.drain`) and write everything queued.
pub async fn run(
    listener: TcpListener,
    config: RecordConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RecordSummary, RecordError> {
    let client = proxy::upstream_client(config.upstream_h2c, config.upstream_ca.as_deref())
        .map_err(|e| RecordError::Usage(e.to_string()))?;
    let (handle, writer) = writer::start(&config.out, config.scrub.clone())?;
    let state = Arc::new(proxy::ProxyState {
        upstream: config.upstream.clone(),
        client,
        writer: handle,
        session_header: config.session_header.clone(),
        first_arrival: std::sync::OnceLock::new(),
        in_flight: AtomicU64::new(0),
        next_id: AtomicU64::new(0),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let mut stop = stop_rx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| proxy::handle(state.clone(), request));
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        result = connection => {
                            if let Err(error) = result {
                                tracing::debug!(%error, %peer, "client connection ended with an error");
                            }
                        }
                        _ = stop.wait_for(|stop| *stop) => {}
                    }
                });
            }
        }
    }
    drop(listener);
    // Let open streams finish.
    let deadline = Instant::now() + config.drain;
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let abandoned = state.in_flight.load(Ordering::SeqCst);
    let _ = stop_tx.send(true);
    // Connection tasks drop their bodies (recording cut streams as incomplete) as they stop.
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(state);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|_| writer::WriterError::Panicked)??;
    Ok(RecordSummary { written, abandoned })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// `llm-replay record`.
pub async fn record_command(args: RecordArgs) -> ExitCode {
    let listen = args.listen.clone();
    let config = match args.into_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("llm-replay: {error}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let listener = match TcpListener::bind(&listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("llm-replay: --listen {listen}: {error}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let address: SocketAddr = match listener.local_addr() {
        Ok(address) => address,
        Err(error) => {
            eprintln!("llm-replay: {}", RecordError::Listen(error));
            return ExitCode::from(exit::RUN_FAILED);
        }
    };
    let out = config.out.clone();
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "llm-replay record listening on http://{address}");
        let _ = stdout.flush();
    }
    match run(listener, config, shutdown_signal()).await {
        Ok(summary) => {
            eprintln!(
                "llm-replay record: wrote {} exchanges to {}{}",
                summary.written,
                out.display(),
                if summary.abandoned > 0 {
                    format!(
                        "; {} streams still open at exit were not written",
                        summary.abandoned
                    )
                } else {
                    String::new()
                }
            );
            ExitCode::from(exit::OK)
        }
        Err(RecordError::Usage(message)) => {
            eprintln!("llm-replay: {message}");
            ExitCode::from(exit::USAGE)
        }
        Err(error) => {
            eprintln!("llm-replay: {error}");
            ExitCode::from(exit::RUN_FAILED)
        }
    }
}

#[cfg(test)]
mod tests;
