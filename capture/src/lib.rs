//! Capture: the recording reverse proxy of `llm-replay record`.
//!
//! `run` takes its listener, shutdown signal and typed config from the caller, so tests and
//! the CLI drive the same code; it returns what it did ([`RecordSummary`]) or a typed
//! [`RecordError`], and the CLI prints and picks the exit code. Redaction
//! (`common::redact`) and response completeness (`common::formats::complete`) live in
//! `common`, shared with the importers and `export`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use tokio::net::TcpListener;

use common::accept;
use common::duration::parse_duration;
use common::redact::{RedactError, Redactor};

mod health;
pub mod metrics;
pub mod proxy;
pub mod routes;
pub mod sink;
pub mod upstream;
pub mod writer;

pub use metrics::{DropReason, RecordMetrics};
pub use writer::OnRecordError;

/// `llm-replay record` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RecordArgs {
    /// Address to listen on (e.g. 127.0.0.1:8080; port 0 picks a free one).
    #[arg(long)]
    pub listen: String,
    /// Where requests go (repeatable): `URL` — the default upstream (http:// or https://; a
    /// path in it is put before every request path); `/PREFIX=URL` — requests whose path
    /// starts with the whole segments PREFIX, which is stripped (the longest prefix wins);
    /// `HOST=URL` — requests whose Host (or :authority) is HOST, port ignored. A request no
    /// route takes gets a 404 from the proxy.
    #[arg(long, required = true, value_name = "URL|/PREFIX=URL|HOST=URL")]
    pub upstream: Vec<String>,
    /// Recording to write: a file (truncated first; compressed when it ends in `.gz`), or a
    /// directory (existing, or ending in `/`) of rotated `recording-<UTC time>-<seq>.jsonl.gz`
    /// files.
    #[arg(long)]
    pub out: PathBuf,
    /// With a directory --out: start a new file once the open one reaches SIZE (e.g. 100MiB).
    #[arg(long, value_name = "SIZE")]
    pub rotate_size: Option<String>,
    /// With a directory --out: start a new file once the open one is DURATION old (e.g. 1h).
    #[arg(long, value_name = "DURATION")]
    pub rotate_every: Option<String>,
    /// With a directory --out: delete the oldest files while the recording files take more
    /// than SIZE (e.g. 10GiB).
    #[arg(long, value_name = "SIZE")]
    pub max_disk: Option<String>,
    /// With a directory --out: keep at most N files (the oldest are deleted).
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Record only P% of the traffic (e.g. 10%), chosen deterministically: by session when
    /// --session-header is set (sessions stay whole), else by exchange.
    #[arg(long, value_name = "P%")]
    pub sample: Option<String>,
    /// When the recording cannot be written (a full disk, a slow disk): `skip` proxies the
    /// exchange untouched and leaves it out of the recording (counted, the gap marked);
    /// `refuse` answers 503 to every request from then on.
    #[arg(long, value_enum, default_value = "skip")]
    pub on_record_error: writer::OnRecordError,
    /// Serve /healthz, /readyz and /metrics (Prometheus) on ADDR (e.g. 0.0.0.0:9464).
    #[arg(long, value_name = "ADDR")]
    pub health_listen: Option<String>,
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
    /// Most response bytes recorded per exchange (e.g. 16MiB, 500KB, 1048576); the client
    /// still gets every byte, the recording keeps the frames up to the cap and marks the
    /// exchange truncated.
    #[arg(long, default_value = "16MiB", value_name = "SIZE")]
    pub max_recorded_bytes: String,
    /// How long the upstream may stay silent — before its response headers, or between two
    /// reads of the body — before the response is cut and recorded as incomplete.
    #[arg(long, default_value = "300s", value_name = "DURATION")]
    pub upstream_idle_timeout: String,
}

/// Default of `--max-recorded-bytes`.
pub const DEFAULT_MAX_RECORDED_BYTES: usize = 16 << 20;
/// Default of `--upstream-idle-timeout`.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The validated configuration of one recording proxy.
#[derive(Clone)]
pub struct RecordConfig {
    /// The `--upstream` routes (one default upstream, or several routes).
    pub routes: routes::Routes,
    pub out: PathBuf,
    pub scrub: writer::Scrub,
    pub session_header: Option<http::HeaderName>,
    pub upstream_h2c: bool,
    pub upstream_ca: Option<PathBuf>,
    pub drain: Duration,
    /// Most response bytes recorded per exchange (`--max-recorded-bytes`).
    pub max_recorded_bytes: usize,
    /// Longest silence of the upstream (`--upstream-idle-timeout`).
    pub upstream_idle_timeout: Duration,
    /// Reports a write error the moment the writer has one (the command prints it).
    pub health: writer::WriterHealth,
    /// Rotation, retention, sampling, error policy and the health endpoint.
    pub recording: RecordingOptions,
}

/// The long-running sidecar's options (defaults: one file, everything recorded, `skip`).
#[derive(Debug, Clone)]
pub struct RecordingOptions {
    /// `--out` names a directory of rotated files.
    pub directory: bool,
    pub rotate_size: Option<u64>,
    pub rotate_every: Option<Duration>,
    pub max_disk: Option<u64>,
    pub keep: Option<usize>,
    /// The share recorded (`--sample`), 1 for all.
    pub sample: f64,
    pub on_error: writer::OnRecordError,
    pub health_listen: Option<String>,
}

impl Default for RecordingOptions {
    fn default() -> RecordingOptions {
        RecordingOptions {
            directory: false,
            rotate_size: None,
            rotate_every: None,
            max_disk: None,
            keep: None,
            sample: 1.0,
            on_error: writer::OnRecordError::Skip,
            health_listen: None,
        }
    }
}

/// Parse `--sample`: `P%` (0 < P <= 100) or a fraction (0 < F <= 1).
pub fn parse_share(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    let share = match trimmed.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => trimmed.parse::<f64>(),
    }
    .map_err(|_| format!("invalid share {text:?}: expected a percentage such as 10%"))?;
    if !(share > 0.0 && share <= 1.0) {
        return Err(format!(
            "invalid share {text:?}: expected above 0% and at most 100%"
        ));
    }
    Ok(share)
}

/// A problem running the proxy.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Redact(#[from] RedactError),
    #[error(transparent)]
    Writer(#[from] writer::WriterError),
    #[error("cannot listen: {0}")]
    Listen(#[source] std::io::Error),
}

impl RecordError {
    /// The options or the environment were wrong (rather than the run failing).
    pub fn is_usage(&self) -> bool {
        matches!(self, RecordError::Usage(_) | RecordError::Redact(_))
    }
}

impl RecordArgs {
    /// Validate into a [`RecordConfig`].
    pub fn into_config(self) -> Result<RecordConfig, RecordError> {
        let routes = routes::Routes::parse(&self.upstream).map_err(RecordError::Usage)?;
        let recording = self.recording_options()?;
        let redactor = Redactor::new(&self.redact_body)?;
        let session_header = self
            .session_header
            .map(|h| {
                http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                    .map_err(|e| RecordError::Usage(format!("--session-header {h:?}: {e}")))
            })
            .transpose()?;
        let drain =
            parse_duration(&self.drain).map_err(|e| RecordError::Usage(format!("--drain: {e}")))?;
        let max_recorded_bytes = parse_size(&self.max_recorded_bytes)
            .map_err(|e| RecordError::Usage(format!("--max-recorded-bytes: {e}")))?;
        let upstream_idle_timeout = parse_duration(&self.upstream_idle_timeout)
            .map_err(|e| RecordError::Usage(format!("--upstream-idle-timeout: {e}")))?;
        if upstream_idle_timeout.is_zero() {
            return Err(RecordError::Usage(
                "--upstream-idle-timeout: must be above zero (e.g. 300s)".to_owned(),
            ));
        }
        Ok(RecordConfig {
            routes,
            out: self.out,
            scrub: writer::Scrub {
                redact_headers: self.redact_header,
                redactor,
            },
            session_header,
            upstream_h2c: self.upstream_h2c,
            upstream_ca: self.upstream_ca,
            drain,
            max_recorded_bytes,
            upstream_idle_timeout,
            health: writer::WriterHealth::default(),
            recording,
        })
    }

    /// The rotation, retention, sampling and health options, checked.
    fn recording_options(&self) -> Result<RecordingOptions, RecordError> {
        let usage = |flag: &str, e: String| RecordError::Usage(format!("{flag}: {e}"));
        let directory = self.out.is_dir() || self.out.to_string_lossy().ends_with('/');
        let size = |flag: &str, value: &Option<String>| {
            value
                .as_deref()
                .map(|v| parse_size(v).map(|n| n as u64).map_err(|e| usage(flag, e)))
                .transpose()
        };
        let rotate_size = size("--rotate-size", &self.rotate_size)?;
        let max_disk = size("--max-disk", &self.max_disk)?;
        let rotate_every = self
            .rotate_every
            .as_deref()
            .map(|v| parse_duration(v).map_err(|e| usage("--rotate-every", e.to_string())))
            .transpose()?;
        if rotate_every.is_some_and(|d| d.is_zero()) || rotate_size == Some(0) {
            return Err(RecordError::Usage(
                "--rotate-size and --rotate-every must be above zero".to_owned(),
            ));
        }
        let rotating = rotate_size.is_some()
            || rotate_every.is_some()
            || max_disk.is_some()
            || self.keep.is_some();
        if rotating && !directory {
            return Err(RecordError::Usage(format!(
                "--out {}: --rotate-size, --rotate-every, --max-disk and --keep need a directory \
                 (an existing one, or a path ending in /)",
                self.out.display()
            )));
        }
        let sample = self
            .sample
            .as_deref()
            .map(|v| parse_share(v).map_err(|e| usage("--sample", e)))
            .transpose()?
            .unwrap_or(1.0);
        Ok(RecordingOptions {
            directory,
            rotate_size,
            rotate_every,
            max_disk,
            keep: self.keep,
            sample,
            on_error: self.on_record_error,
            health_listen: self.health_listen.clone(),
        })
    }
}

/// Parse a byte size: a whole number with an optional unit, `B`, `KB`/`MB`/`GB` (powers of
/// 1000) or `KiB`/`MiB`/`GiB` (powers of 1024), any case; a bare number is bytes.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => {
            return Err(format!(
                "invalid size {text:?}: unknown unit {other:?} (expected B, KB, MB, GB, KiB, MiB or GiB)"
            ));
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid size {text:?}: expected a whole number, e.g. 16MiB"))?;
    value
        .checked_mul(multiplier)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| format!("invalid size {text:?}: too large"))
}

/// What one proxy run did.
#[derive(Debug, Clone)]
pub struct RecordSummary {
    pub written: u64,
    /// Exchanges proxied but not recorded (a full disk, a slow writer, ...).
    pub dropped: u64,
    /// The same by reason, `disk_full=3, writer_behind=1` (empty when none).
    pub dropped_by_reason: String,
    /// Exchanges left out by `--sample`.
    pub sampled_out: u64,
    /// Streams still open when the drain time ran out (not written).
    pub abandoned: u64,
    /// Requests sent to the upstream a second time, on a new connection, because the reused
    /// connection they were written to closed before any byte of response.
    pub resent: u64,
}

/// Serve `listener` until `shutdown` resolves, then let open streams finish (up to
/// `config.drain`) and write everything queued (the open file closed whole).
pub async fn run(
    listener: TcpListener,
    config: RecordConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RecordSummary, RecordError> {
    let client = upstream::upstream_client(config.upstream_h2c, config.upstream_ca.as_deref())
        .map_err(|e| RecordError::Usage(e.to_string()))?;
    // A file size limit (RLIMIT_FSIZE) must fail the write (EFBIG), not kill the proxy:
    // SIGXFSZ (25 on Linux) is caught and ignored while the proxy runs.
    let _sigxfsz = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(25)).ok();
    let metrics = Arc::new(RecordMetrics::default());
    metrics.register_upstreams(config.routes.iter().map(|route| route.name.as_str()));
    if config.routes.names_upstreams() {
        tracing::info!(routes = %config.routes.describe(), "upstream routes");
    }
    let options = &config.recording;
    let (handle, writer) = writer::start(writer::WriterSetup {
        plan: sink::OutputPlan {
            path: config.out.clone(),
            directory: options.directory,
            rotate_size: options.rotate_size,
            rotate_every: options.rotate_every,
            max_disk: options.max_disk,
            keep: options.keep,
            sample: options.sample,
        },
        scrub: config.scrub.clone(),
        health: config.health.clone(),
        on_error: options.on_error,
        metrics: metrics.clone(),
    })?;
    let state = Arc::new(proxy::ProxyState {
        routes: config.routes.clone(),
        client,
        writer: handle,
        session_header: config.session_header.clone(),
        max_recorded_bytes: config.max_recorded_bytes,
        upstream_idle_timeout: config.upstream_idle_timeout,
        first_arrival: std::sync::OnceLock::new(),
        in_flight: AtomicU64::new(0),
        next_id: AtomicU64::new(0),
        sampler: proxy::Sampler::new(options.sample),
        metrics: metrics.clone(),
    });
    let health = match &options.health_listen {
        Some(address) => Some(health::start(address, &state).await?),
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    serve(listener, &state, stop_rx, shutdown).await;
    // Let open streams finish.
    let deadline = Instant::now() + config.drain;
    while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let abandoned = state.in_flight.load(Ordering::SeqCst);
    let resent = state.client.resent();
    if resent > 0 {
        // Said even when every resend succeeded: the upstream closes kept-alive connections
        // without `Connection: close` (llama.cpp's server does), which costs a new connection.
        tracing::warn!(
            upstreams = %config.routes.describe(),
            "{resent} requests resent on a new connection: the upstream closed the reused connection they were written to before any byte of response"
        );
    }
    let _ = stop_tx.send(true);
    // Connection tasks drop their bodies (recording cut streams as incomplete) as they stop.
    tokio::time::sleep(Duration::from_millis(50)).await;
    if let Some(health) = &health {
        health.abort();
    }
    drop(state);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|_| writer::WriterError::Panicked)??;
    if let Some(health) = health {
        health.abort();
    }
    Ok(RecordSummary {
        written,
        dropped: metrics.dropped_total(),
        dropped_by_reason: metrics.dropped_summary(),
        sampled_out: metrics.sampled_out.load(Ordering::Relaxed),
        abandoned,
        resent,
    })
}

/// The time a client connection gets to send each request head; on a kept-alive connection
/// it counts from the previous response's end, so it is also the idle limit: longer than the
/// usual client pools keep an idle connection (90 s for Go's and hyper's).
const CLIENT_HEAD_TIMEOUT: Duration = Duration::from_secs(120);

/// How the proxy accepts its clients: a cap far above an application's concurrency that
/// bounds a runaway client, the head timeout for the first byte too.
const CLIENT_LIMITS: accept::AcceptLimits = accept::AcceptLimits {
    name: "record --listen",
    max_connections: 16_384,
    head_timeout: Some(CLIENT_HEAD_TIMEOUT),
};

/// Accept and serve client connections until `shutdown` (by `common::accept`, under
/// [`CLIENT_LIMITS`]). The open ones go on serving until `stop_rx` turns true, which ends them
/// all (their bodies dropped: cut streams are recorded incomplete).
async fn serve(
    listener: TcpListener,
    state: &Arc<proxy::ProxyState>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
) {
    let builder = accept::http_builder(CLIENT_HEAD_TIMEOUT);
    let shared = state.clone();
    let stop = stop_rx.clone();
    let connections = accept::serve(listener, &CLIENT_LIMITS, shutdown, move |stream, peer| {
        let state = shared.clone();
        let mut stop = stop.clone();
        let builder = builder.clone();
        async move {
            let service = service_fn(move |request| proxy::handle(state.clone(), request));
            let connection =
                builder.serve_connection(accept::http_io(stream, CLIENT_HEAD_TIMEOUT), service);
            tokio::select! {
                result = connection => {
                    if let Err(error) = result {
                        tracing::debug!(%error, %peer, "client connection ended with an error");
                    }
                }
                _ = stop.wait_for(|stop| *stop) => {}
            }
        }
    })
    .await;
    // Also ends the connections still waiting for their first byte, which hold the state.
    let mut stop = stop_rx;
    tokio::spawn(async move {
        let _ = stop.wait_for(|stop| *stop).await;
        connections.abort().await;
    });
}

#[cfg(test)]
mod tests;
