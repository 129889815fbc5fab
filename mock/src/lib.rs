//! The mock LLM server of `llm-replay mock`: all four response families byte-correctly, with
//! exact frame timing (frames paced by `common::pacer` at absolute deadlines), fault
//! injection and a recording-replay mode.
//!
//! Layers: [`MockArgs`] (clap) → [`MockArgs::into_config`] → [`MockConfig`] (validated) →
//! [`serve`] (takes its listener and shutdown signal; the CLI, the embedded default of `run`
//! and the tests call it). The CLI binds, prints the readiness line and picks the exit code.
//! Wire formats come from `common::formats::encode`; this module only decides what to say and
//! when: frame `i` of a synthetic stream goes out at the absolute deadline
//! `start + ttft + i * itl`. `GET /metrics` (every listener) shows what it did, counted
//! exactly, under vLLM's Prometheus names (`metrics`); a scrape is no model request.
//! A client that leaves before its response's last frame is a cancel the server logs
//! (`body::CancelWatch`: the request log's `cancelled` line, the truth log's `cancelled_ns`).
//! With `--tokenizer` (`tokenized`), the output is words of a known token count under a real
//! tokenizer and usage is exact under it.

mod body;
mod metrics;
mod recorded;
mod request_log;
mod synth;
mod tokenized;
mod truth;

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::accept;
use common::duration::{parse_duration, parse_rate};
use common::formats::encode::{self, Finish, StreamParams, Wire};
use common::formats::request;
use common::pacer;
use common::replay::EXCHANGE_HEADER;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng, rngs::StdRng};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use body::{CancelWatch, Ending, TimedBody, TokenCounts};
use metrics::Grouping;
pub use recorded::Recorded;
use recorded::{Lookup, RecordedResponse};
pub use synth::{DEFAULT_TOKENS, MAX_REQUESTED_TOKENS, TOKEN_WORDS, token_text};
use synth::{MidStreamFault, OutputWords, SynthPlan, SynthSchedule};
pub use tokenized::{MockTokenizer, MockTokenizerError};

/// Largest request body the mock reads; bigger ones get 413.
const MAX_REQUEST_BODY: usize = 32 * 1024 * 1024;

/// Largest `--tokens`: a stream is encoded whole when its request arrives (~300 bytes a token).
pub const MAX_TOKENS_FLAG: u64 = 1_000_000;

/// How long in-flight responses may continue after the shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The time a connection gets to send its first byte, its TLS handshake, and each request
/// head (on a kept-alive connection, counted from the previous response's end: so it is also
/// the idle limit, longer than the clients' pool idle times — the worker's 90 s, the
/// recording proxy's `--upstream-idle-timeout` default of 300 s).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(600);

/// The mock is a load target: its cap (connections served at once) is far above any
/// benchmark's concurrency and only bounds a runaway client.
pub const MAX_CONNECTIONS: usize = 65_536;

/// How the mock accepts connections (`common::accept`).
const ACCEPT_LIMITS: accept::AcceptLimits = accept::AcceptLimits {
    name: "mock",
    max_connections: MAX_CONNECTIONS,
    head_timeout: Some(HEAD_TIMEOUT),
};

/// Why the mock could not start: its options, its files or its threads. Displays like
/// `--tls-cert cert.pem`, with the cause as its [`std::error::Error::source`] (the CLI prints
/// the chain).
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    #[error("opening recording {}", path.display())]
    OpenRecording {
        path: PathBuf,
        #[source]
        source: common::recording::RecordingError,
    },
    #[error(transparent)]
    Recording(#[from] common::recording::RecordingError),
    #[error("{}:{line}: response.status: {status} is not an HTTP status", path.display())]
    RecordedStatus {
        path: PathBuf,
        line: u64,
        status: u16,
        #[source]
        source: http::status::InvalidStatusCode,
    },
    #[error("--tls-cert {}", path.display())]
    TlsCert {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("--tls-cert {}: holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("--tls-key {}", path.display())]
    TlsKey {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("TLS protocol versions")]
    TlsVersions(#[source] rustls::Error),
    #[error("--tls-cert/--tls-key")]
    TlsCertKey(#[source] rustls::Error),
    #[error("starting the pacer thread")]
    Pacer(#[source] std::io::Error),
    #[error("--fail-body-file {}", path.display())]
    FailBody {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("truth log {}", path.display())]
    WriteLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening request log {}", path.display())]
    RequestLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] MockTokenizerError),
}

/// When to report usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageMode {
    /// Always send usage.
    On,
    /// No usage where clients tolerate its absence: OpenAI no usage chunk, Responses
    /// `usage: null`, Ollama no counts, Bedrock no usage/invocation metrics; Anthropic keeps it
    /// (its SDK requires it).
    Off,
    /// OpenAI chat/completions: only when `stream_options.include_usage` is true; other
    /// families always.
    Requested,
    /// Like llama.cpp's server: OpenAI chat/completions send usage only when
    /// `stream_options.include_usage` is true, and their last chunk carries `timings`
    /// (`predicted_n`, `prompt_n`, `cache_n`) either way; every 12th frame carries two
    /// tokens, so the stated count differs from the frame count. Other families as
    /// `requested`.
    Timings,
}

/// `llm-replay mock` flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Besides the model APIs, every listener (HTTP/1.1, h2, TLS) answers GET /metrics: \
the mock's own state in the Prometheus text format under vLLM's names, counted, not estimated: \
vllm:num_requests_running, vllm:num_requests_waiting (queued for a --max-streams slot), \
vllm:kv_cache_usage_perc (--max-streams slot occupancy; the mock has no KV cache), \
vllm:num_preemptions_total (0), vllm:prompt_tokens_total, vllm:generation_tokens_total, \
vllm:request_success_total, vllm:time_to_first_token_seconds and \
vllm:e2e_request_latency_seconds, per model_name. Scrapes are not model requests: never \
logged, timed or failed."
)]
pub struct MockArgs {
    /// Address to listen on (port 0 picks a free port; the readiness line shows the real one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Time to first token, e.g. 100ms.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub ttft: Duration,
    /// Inter-token latency, e.g. 10ms.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub itl: Duration,
    /// Tokens per response (default: the request's max tokens, else 16; at most 1,000,000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=MAX_TOKENS_FLAG))]
    pub tokens: Option<u64>,
    /// Extra time to first token per input token (input tokens ≈ prompt characters / 4).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub prefill_per_token: Duration,
    /// Usage reports: on (always), off, requested (OpenAI: only with include_usage), timings
    /// (as requested, plus llama.cpp's `timings` counts on the last chunk).
    #[arg(long, value_enum, default_value = "on")]
    pub usage: UsageMode,
    /// Concurrent streams; more wait in a FIFO queue (queue time adds to TTFT). 0 = no cap.
    #[arg(long, default_value_t = 0)]
    pub max_streams: usize,
    /// Requests allowed to wait for a stream slot; beyond it answer 429 (default: no limit).
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Share of requests answered HTTP 500 before streaming (0.1 or 10%).
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub fail_rate: f64,
    /// Share of streams that send the family's error frame after half the tokens.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub error_frame_rate: f64,
    /// Share of streams whose connection is cut after half the tokens (no terminating chunk).
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub drop_rate: f64,
    /// Share of streams whose connection (HTTP/2: stream) is cut right after the `200`
    /// head, before any frame, at the first token's time (a gateway whose read timeout is
    /// shorter than the TTFT, e.g. nginx `proxy_read_timeout`).
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub cut_after_head_rate: f64,
    /// Share of streams that pause for --stall after half the tokens.
    #[arg(long, default_value = "0", value_parser = parse_rate)]
    pub stall_rate: f64,
    /// Length of an injected stall.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub stall: Duration,
    /// Serve the first N requests, then fail every one after (a server or a gateway's
    /// upstream that dies mid-run), with --fail-status, --fail-delay and --fail-body.
    #[arg(long, value_name = "N")]
    pub fail_after: Option<u64>,
    /// HTTP status of injected failures (--fail-rate, --fail-after).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u16).range(400..=599))]
    pub fail_status: u16,
    /// Wait this long before answering an injected failure (e.g. a gateway's upstream timeout).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub fail_delay: Duration,
    /// Body of injected failures, sent as is (an object or array as application/json,
    /// anything else as text/plain); default: the family's error object.
    #[arg(long, value_name = "TEXT", conflicts_with = "fail_body_file")]
    pub fail_body: Option<String>,
    /// --fail-body read from a file (for large or binary bodies).
    #[arg(long, value_name = "FILE")]
    pub fail_body_file: Option<PathBuf>,
    /// Seed for fault choice (deterministic in request arrival order).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Append one JSON line per request on arrival to this file, and one more
    /// (`"event":"cancelled"`, with `frames_sent` and `after_ms`) when a client leaves
    /// before its response's last frame.
    #[arg(long)]
    pub request_log: Option<PathBuf>,
    /// Log, per request, when its head arrived and when its first and last frames were
    /// written to the socket, and were due (Unix ns, CLOCK_REALTIME), with its
    /// `x-llm-replay-exchange` tag, its input and output tokens (as its usage reports them,
    /// or would) and, when its client left mid-response, when (`cancelled_ns`): server truth
    /// for benchmarks and tests. Kept in memory, written as JSON lines at shutdown.
    #[arg(long, value_name = "FILE")]
    pub write_log: Option<PathBuf>,
    /// Serve the responses of this recording (format v1) at their recorded timing.
    #[arg(long)]
    pub recording: Option<PathBuf>,
    /// A Hugging Face tokenizer.json: the output is words whose token count under it is
    /// exact (max tokens N gives exactly N tokens), usage counts are exact under it (input:
    /// the prompt tokenized), and every 12th token frame carries two tokens, as real servers'
    /// streams sometimes do.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Speak HTTP/1.1 only: no cleartext HTTP/2, no h2 offered by ALPN (like most model
    /// servers).
    #[arg(long, conflicts_with = "http2_only")]
    pub http1_only: bool,
    /// Speak HTTP/2 only: cleartext with prior knowledge (h2c), and only h2 offered by ALPN
    /// (like a gRPC-style or h2-only ingress); an HTTP/1.1 request gets HTTP/2's SETTINGS.
    #[arg(long)]
    pub http2_only: bool,
    /// PEM certificate chain: serve https (HTTP/1.1 and HTTP/2 by ALPN), with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Fault injection rates (fractions in `[0, 1]`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    pub fail_rate: f64,
    pub error_frame_rate: f64,
    pub drop_rate: f64,
    pub stall_rate: f64,
    pub stall: Duration,
    /// Share of streams cut right after their head.
    pub cut_after_head_rate: f64,
}

/// How injected failures answer (`--fail-after`, `--fail-status`, `--fail-delay`,
/// `--fail-body`); `--fail-rate` failures answer the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureConfig {
    /// Serve this many requests, then fail every one after; `None` = never.
    pub after: Option<u64>,
    /// The HTTP status of an injected failure.
    pub status: u16,
    /// Wait before answering it.
    pub delay: Duration,
    /// Its body, as is; `None` = the family's error object.
    pub body: Option<Bytes>,
}

impl Default for FailureConfig {
    fn default() -> Self {
        FailureConfig {
            after: None,
            status: 500,
            delay: Duration::ZERO,
            body: None,
        }
    }
}

/// The validated mock configuration.
#[derive(Debug, Clone)]
pub struct MockConfig {
    pub ttft: Duration,
    pub itl: Duration,
    /// Fixed tokens per response; `None` = the request's max tokens, else [`DEFAULT_TOKENS`].
    pub tokens: Option<u64>,
    pub prefill_per_token: Duration,
    pub usage: UsageMode,
    /// Concurrent-stream cap; `None` = no cap.
    pub max_streams: Option<usize>,
    /// Waiting requests allowed beyond the cap; `None` = no limit.
    pub max_queue: Option<usize>,
    pub faults: FaultConfig,
    /// How injected failures answer, and when every request starts failing.
    pub failure: FailureConfig,
    pub seed: Option<u64>,
    pub request_log: Option<PathBuf>,
    /// Server-truth timing log (`--write-log`), written when the server stops.
    pub write_log: Option<PathBuf>,
    /// Recorded responses to serve, if any.
    pub recording: Option<Arc<Recorded>>,
    /// `--tokenizer`: output words of known token count, exact usage, some two-token frames.
    pub tokenizer: Option<Arc<MockTokenizer>>,
    /// Serve https with this configuration (ALPN h2 and http/1.1) instead of cleartext.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// HTTP/1.1 only (no h2c, no ALPN h2).
    pub http1_only: bool,
    /// HTTP/2 only (h2c with prior knowledge, ALPN h2 only).
    pub http2_only: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            ttft: Duration::from_millis(100),
            itl: Duration::from_millis(10),
            tokens: None,
            prefill_per_token: Duration::ZERO,
            usage: UsageMode::On,
            max_streams: None,
            max_queue: None,
            faults: FaultConfig {
                stall: Duration::from_secs(1),
                ..FaultConfig::default()
            },
            failure: FailureConfig::default(),
            seed: None,
            request_log: None,
            write_log: None,
            recording: None,
            tokenizer: None,
            tls: None,
            http1_only: false,
            http2_only: false,
        }
    }
}

impl MockArgs {
    /// Validate the flags and load the recording, if any.
    pub fn into_config(self) -> Result<MockConfig, MockError> {
        let recording = match &self.recording {
            Some(path) => Some(Arc::new(Recorded::load(path)?)),
            None => None,
        };
        let tokenizer = match &self.tokenizer {
            Some(path) => Some(Arc::new(MockTokenizer::load(path)?)),
            None => None,
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let mut config = tls_server_config(cert, key)?;
                if self.http1_only {
                    config.alpn_protocols = vec![b"http/1.1".to_vec()];
                }
                if self.http2_only {
                    config.alpn_protocols = vec![b"h2".to_vec()];
                }
                Some(Arc::new(config))
            }
            _ => None,
        };
        let fail_body = match (&self.fail_body, &self.fail_body_file) {
            (Some(text), _) => Some(Bytes::from(text.clone())),
            (None, Some(path)) => Some(Bytes::from(std::fs::read(path).map_err(|source| {
                MockError::FailBody {
                    path: path.clone(),
                    source,
                }
            })?)),
            (None, None) => None,
        };
        Ok(MockConfig {
            ttft: self.ttft,
            itl: self.itl,
            tokens: self.tokens,
            prefill_per_token: self.prefill_per_token,
            usage: self.usage,
            max_streams: (self.max_streams > 0).then_some(self.max_streams),
            max_queue: self.max_queue,
            faults: FaultConfig {
                fail_rate: self.fail_rate,
                error_frame_rate: self.error_frame_rate,
                drop_rate: self.drop_rate,
                stall_rate: self.stall_rate,
                stall: self.stall,
                cut_after_head_rate: self.cut_after_head_rate,
            },
            failure: FailureConfig {
                after: self.fail_after,
                status: self.fail_status,
                delay: self.fail_delay,
                body: fail_body,
            },
            seed: self.seed,
            request_log: self.request_log,
            write_log: self.write_log,
            recording,
            tokenizer,
            tls,
            http1_only: self.http1_only,
            http2_only: self.http2_only,
        })
    }
}

/// The mock's https configuration: the certificate chain and key of `cert`/`key` (PEM), ring,
/// ALPN `h2` then `http/1.1`.
pub fn tls_server_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<rustls::ServerConfig, MockError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert_error = |source| MockError::TlsCert {
        path: cert.to_owned(),
        source,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(cert_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(cert_error)?;
    if chain.is_empty() {
        return Err(MockError::NoCertificate {
            path: cert.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| MockError::TlsKey {
        path: key.to_owned(),
        source,
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(MockError::TlsVersions)?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(MockError::TlsCertKey)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Serve mock responses on `listener` until `shutdown` resolves; then let in-flight responses
/// finish for a short grace period, abort the rest, and return with nothing left running.
/// Connections are accepted by `common::accept` under [`ACCEPT_LIMITS`].
pub async fn serve(
    listener: TcpListener,
    config: MockConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MockError> {
    let mut pacer_thread = pacer::PacerThread::start().map_err(MockError::Pacer)?;
    let state = Arc::new(State::new(config, pacer_thread.pacer())?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut builder = accept::http_builder(HEAD_TIMEOUT);
    if state.config.http1_only {
        builder = builder.http1_only();
    }
    if state.config.http2_only {
        builder = builder.http2_only();
    }
    let acceptor = state
        .config
        .tls
        .clone()
        .map(tokio_rustls::TlsAcceptor::from);
    let shared = Arc::clone(&state);
    let connections = accept::serve(listener, &ACCEPT_LIMITS, shutdown, move |stream, peer| {
        let accepted = Accepted {
            state: Arc::clone(&shared),
            builder: builder.clone(),
            stop: stop_rx.clone(),
            acceptor: acceptor.clone(),
            peer,
        };
        let truth = shared.truth.is_some();
        async move {
            if truth {
                let current = truth::CurrentResponse::default();
                let stamped = truth::StampedIo::new(stream, Arc::clone(&current));
                accepted.serve(stamped, Some(current)).await;
            } else {
                accepted.serve(stream, None).await;
            }
        }
    })
    .await;
    state.stopping.store(true, Ordering::SeqCst);
    let _ = stop_tx.send(true);
    let aborted = connections.drain(SHUTDOWN_GRACE).await;
    if aborted > 0 {
        tracing::info!(open = aborted, "grace period over: aborted open streams");
    }
    // Every body is gone with its connection; only now stop the thread that paces them.
    pacer_thread.stop();
    if let Some(log) = &state.truth {
        let written = log.finish().map_err(|source| MockError::WriteLog {
            path: log.path().to_owned(),
            source,
        })?;
        tracing::info!(requests = written, path = %log.path().display(), "truth log written");
    }
    Ok(())
}

/// One accepted connection and what serving it needs.
struct Accepted {
    state: Arc<State>,
    builder: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    stop: watch::Receiver<bool>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    peer: SocketAddr,
}

impl Accepted {
    /// TLS handshake if any, then HTTP until the connection ends or the server stops.
    /// `current` is the connection's response slot for the truth log (`--write-log`).
    async fn serve<T>(self, stream: T, current: Option<truth::CurrentResponse>)
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Accepted {
            state,
            builder,
            stop,
            acceptor,
            peer,
        } = self;
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let state = Arc::clone(&state);
            let current = current.clone();
            async move {
                // Not a model request: no request log, no truth log, no fault, no count.
                if req.method() == Method::GET && req.uri().path() == "/metrics" {
                    return Ok::<_, Infallible>(metrics_response(&state));
                }
                Ok::<_, Infallible>(handle_logged(&state, current.as_ref(), req).await)
            }
        });
        match acceptor {
            None => {
                serve_connection(
                    &builder,
                    accept::http_io(stream, HEAD_TIMEOUT),
                    service,
                    stop,
                    peer,
                )
                .await
            }
            // The handshake is part of the head: it gets the same time.
            Some(acceptor) => {
                match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        serve_connection(
                            &builder,
                            accept::http_io(tls, HEAD_TIMEOUT),
                            service,
                            stop,
                            peer,
                        )
                        .await
                    }
                    Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        }
    }
}

/// [`handle`], plus the request's truth-log entry when `--write-log` is on: the head's
/// arrival is stamped before anything else, and the response's frames are stamped as they are
/// handed to hyper and (HTTP/1) written to the socket.
async fn handle_logged(
    state: &State,
    current: Option<&truth::CurrentResponse>,
    req: Request<Incoming>,
) -> MockResponse {
    let Some(log) = &state.truth else {
        return handle(state, req).await;
    };
    let head_ns = truth::unix_ns();
    let http2 = req.version() == http::Version::HTTP_2;
    let trace = Arc::new(truth::RequestTrace::new(
        Arc::clone(log),
        state.next_trace.fetch_add(1, Ordering::Relaxed),
        req.headers()
            .get(EXCHANGE_HEADER)
            .and_then(|v| v.to_str().ok()),
        http2,
        head_ns,
    ));
    let mut response = handle(state, req).await;
    trace.set_status(response.status().as_u16());
    if let (false, Some(current)) = (http2, current) {
        // HTTP/1: this response is the only one the connection writes until it ends.
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&trace));
    }
    response.body_mut().set_trace(trace);
    response
}

/// Serve one accepted connection (cleartext or TLS) until it ends or the server stops.
async fn serve_connection<I, S>(
    builder: &hyper_util::server::conn::auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    mut stop: watch::Receiver<bool>,
    peer: SocketAddr,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = MockResponse, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let stopping = tokio::select! {
        result = conn.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
            false
        }
        _ = stop.wait_for(|stopped| *stopped) => true,
    };
    if stopping {
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
    }
}

/// Shared server state.
struct State {
    config: MockConfig,
    /// Fault draws, in request arrival order (deterministic with `--seed`).
    rng: Mutex<StdRng>,
    /// Concurrent-stream slots; `Semaphore` is fair, so waiters form a FIFO queue.
    slots: Option<Arc<Semaphore>>,
    waiting: AtomicUsize,
    /// Request log, written synchronously one line per `write` so lines are whole and
    /// flushed at arrival (tests read it while the server runs).
    request_log: Option<Arc<request_log::RequestLog>>,
    /// The server began to stop: a body dropped from then on was not cancelled by its client.
    stopping: Arc<AtomicBool>,
    next_id: AtomicU64,
    pacer: pacer::Pacer,
    /// `--write-log`: the server-truth records, written when the server stops.
    truth: Option<Arc<truth::TruthLog>>,
    /// Request numbers of the truth log (every request, routed or not).
    next_trace: AtomicU64,
    /// Synthetic requests seen so far (`--fail-after` counts them).
    synthetic_seen: AtomicU64,
    /// What `GET /metrics` shows.
    metrics: metrics::Metrics,
}

impl State {
    fn new(config: MockConfig, pacer: pacer::Pacer) -> Result<State, MockError> {
        let seed = config.seed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let request_log = match &config.request_log {
            Some(path) => Some(Arc::new(request_log::RequestLog::open(path).map_err(
                |source| MockError::RequestLog {
                    path: path.clone(),
                    source,
                },
            )?)),
            None => None,
        };
        let truth = match &config.write_log {
            Some(path) => Some(Arc::new(truth::TruthLog::create(path).map_err(
                |source| MockError::WriteLog {
                    path: path.clone(),
                    source,
                },
            )?)),
            None => None,
        };
        Ok(State {
            truth,
            next_trace: AtomicU64::new(1),
            synthetic_seen: AtomicU64::new(0),
            metrics: metrics::Metrics::new(config.max_streams),
            slots: config.max_streams.map(|n| Arc::new(Semaphore::new(n))),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            waiting: AtomicUsize::new(0),
            request_log,
            stopping: Arc::new(AtomicBool::new(false)),
            next_id: AtomicU64::new(1),
            pacer,
            config,
        })
    }

    fn log_request(
        &self,
        method: &Method,
        path: &str,
        exchange: Option<&str>,
        version: http::Version,
    ) {
        let Some(log) = &self.request_log else {
            return;
        };
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        log.request(unix_ms, method.as_str(), path, exchange, version);
    }

    /// Make `response` report its client leaving before its last frame.
    fn watch_cancel(
        &self,
        mut response: MockResponse,
        exchange: Option<String>,
        path: &str,
        arrival: Instant,
    ) -> MockResponse {
        response.body_mut().watch_cancel(CancelWatch {
            request_log: self.request_log.clone(),
            stopping: Arc::clone(&self.stopping),
            exchange,
            path: path.to_owned(),
            arrival,
        });
        response
    }

    /// Draw this request's faults (always four draws, so the sequence depends only on the
    /// number of requests, not on which faults fired).
    fn draw_faults(&self) -> (bool, MidStreamFault, bool) {
        let f = self.config.faults;
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let draws: [f64; 4] = [rng.random(), rng.random(), rng.random(), rng.random()];
        let fail = draws[0] < f.fail_rate;
        let fault = if draws[1] < f.drop_rate {
            MidStreamFault::Drop
        } else if draws[1] < f.drop_rate + f.cut_after_head_rate {
            MidStreamFault::CutAfterHead
        } else if draws[2] < f.error_frame_rate {
            MidStreamFault::ErrorFrame
        } else {
            MidStreamFault::None
        };
        (fail, fault, draws[3] < f.stall_rate)
    }

    /// Wait for a stream slot, counted waiting in `series` meanwhile. `Err` = the queue is
    /// full (answer 429). Returns the permit and the instant the stream starts (arrival when
    /// no wait).
    async fn admit(
        &self,
        arrival: Instant,
        series: &Arc<metrics::ModelSeries>,
    ) -> Result<(Option<OwnedSemaphorePermit>, Instant), ()> {
        let Some(slots) = &self.slots else {
            return Ok((None, arrival));
        };
        if let Ok(permit) = Arc::clone(slots).try_acquire_owned() {
            return Ok((Some(permit), arrival));
        }
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        if self.config.max_queue.is_some_and(|max| waiting >= max) {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(());
        }
        // Decrement even if the client goes away while waiting (the future is dropped).
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.waiting);
        let _waiting = series.wait();
        match Arc::clone(slots).acquire_owned().await {
            Ok(permit) => Ok((Some(permit), Instant::now())),
            // The semaphore is never closed; treat it as "no cap" if it were.
            Err(_) => Ok((None, Instant::now())),
        }
    }
}

type MockResponse = Response<TimedBody>;

async fn handle(state: &State, req: Request<Incoming>) -> MockResponse {
    // Timestamp at the edge: the schedule starts when the request head arrived.
    let arrival = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
    let exchange = req
        .headers()
        .get(EXCHANGE_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    state.log_request(&method, &path, exchange.as_deref(), req.version());

    if method == Method::GET {
        return match path.as_str() {
            "/v1/models" => json_response(
                StatusCode::OK,
                br#"{"object":"list","data":[{"id":"mock-model","object":"model","created":1735689600,"owned_by":"llm-replay"}]}"#,
            ),
            "/api/tags" => json_response(
                StatusCode::OK,
                br#"{"models":[{"name":"mock-model","model":"mock-model","modified_at":"2025-01-01T00:00:00Z","size":0,"digest":"","details":{}}]}"#,
            ),
            "/api/version" => json_response(StatusCode::OK, br#"{"version":"0.0.0-llm-replay-mock"}"#),
            "/health" | "/healthz" => json_response(StatusCode::OK, br#"{"status":"ok"}"#),
            _ => error_response(Wire::OpenAiChat, 404, &format!("no route for GET {path}")),
        };
    }
    let wire = Wire::from_path(&path);
    if method != Method::POST {
        return error_response(
            wire.unwrap_or(Wire::OpenAiChat),
            405,
            &format!("method {method} is not supported on {path}"),
        );
    }

    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            let wire = wire.unwrap_or(Wire::OpenAiChat);
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return error_response(
                    wire,
                    413,
                    &format!("request body over {MAX_REQUEST_BODY} bytes"),
                );
            }
            return error_response(wire, 400, &format!("reading the request body: {error}"));
        }
    };

    if let Some(recording) = &state.config.recording {
        match recording.lookup(exchange.as_deref(), method.as_str(), &path_and_query, &body) {
            Lookup::Response(recorded) => {
                let response = serve_recorded(state, wire, recorded, &path, &body, arrival).await;
                return state.watch_cancel(response, exchange, &path, arrival);
            }
            Lookup::BadIndex(message) => {
                return error_response(wire.unwrap_or(Wire::OpenAiChat), 400, &message);
            }
            Lookup::Synthetic => {}
        }
    }

    let Some(wire) = wire else {
        return error_response(
            Wire::OpenAiChat,
            404,
            &format!(
                "no route for POST {path}: the mock serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /api/chat, /api/generate, /model/{{modelId}}/converse-stream and /model/{{modelId}}/invoke-with-response-stream"
            ),
        );
    };
    let response = serve_synthetic(state, wire, &path, &body, arrival).await;
    state.watch_cancel(response, exchange, &path, arrival)
}

async fn serve_synthetic(
    state: &State,
    wire: Wire,
    path: &str,
    body: &Bytes,
    arrival: Instant,
) -> MockResponse {
    let config = &state.config;
    let info = match synth::analyze(wire, body) {
        Ok(info) => info,
        Err(message) => return error_response(wire, 400, &message),
    };
    let (fail, fault, stall) = state.draw_faults();
    let seen = state.synthetic_seen.fetch_add(1, Ordering::SeqCst);
    let failing = config.failure.after.is_some_and(|after| seen >= after);
    if fail || failing {
        return injected_failure(&config.failure, wire).await;
    }
    let model = match wire {
        Wire::BedrockConverse | Wire::BedrockInvokeAnthropic => request::path_model(path),
        _ => info.model.clone(),
    }
    .unwrap_or_else(|| metrics::DEFAULT_MODEL.to_owned());
    let series = state.metrics.series(&model);
    let (permit, start) = match state.admit(arrival, &series).await {
        Ok(admitted) => admitted,
        Err(()) => {
            return error_response(wire, 429, "Too many requests: the mock's queue is full.");
        }
    };
    // With `--tokenizer`, the prompt's own count (else the estimate, as without it).
    let input_tokens = config
        .tokenizer
        .as_ref()
        .and_then(|tokenizer| tokenizer.count_prompt(path, body))
        .unwrap_or(info.input_tokens);
    let schedule = synth_schedule(config, &info, input_tokens, fault, stall);
    let words = match &config.tokenizer {
        Some(tokenizer) => OutputWords::Tokenizer(tokenizer),
        None => OutputWords::Lorem,
    };
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let params = StreamParams {
        id: format!("mock{id:012}"),
        model,
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        input_tokens,
        usage: sends_usage(config.usage, wire, &info),
        system_fingerprint: "fp_llm_replay_mock".to_owned(),
        timings: synth::timings(&schedule),
    };
    let plan = synth::plan(wire, params, info.stream, &schedule, words);
    let body = SynthBody {
        state,
        series,
        arrival,
        start,
        permit,
        input_tokens,
    };
    body.response(wire, &schedule, plan)
}

/// A synthetic answer's timing: the configured TTFT (plus the prefill of `input_tokens`)
/// and ITL, the request's token budget (`--tokens`, else its `max_tokens`), and the faults
/// drawn for it (mid-stream ones only on a stream).
fn synth_schedule(
    config: &MockConfig,
    info: &synth::RequestInfo,
    input_tokens: u64,
    fault: MidStreamFault,
    stall: bool,
) -> SynthSchedule {
    let requested_max = info.max_tokens.map(|m| m.min(MAX_REQUESTED_TOKENS));
    let tokens = config.tokens.or(requested_max).unwrap_or(DEFAULT_TOKENS);
    let finish = if config.tokens.is_none() && requested_max == Some(tokens) {
        Finish::Length
    } else {
        Finish::Stop
    };
    let prefill = config
        .prefill_per_token
        .saturating_mul(input_tokens.min(u32::MAX as u64) as u32);
    SynthSchedule {
        ttft: config.ttft + prefill,
        itl: config.itl,
        tokens,
        finish,
        fault: if info.stream {
            fault
        } else {
            MidStreamFault::None
        },
        stall: (stall && info.stream).then_some(config.faults.stall),
        grouping: if config.tokenizer.is_some() || config.usage == UsageMode::Timings {
            Grouping::PairEvery(synth::PAIR_EVERY)
        } else {
            Grouping::OnePerFrame
        },
        llama_timings: config.usage == UsageMode::Timings,
    }
}

/// Whether a synthetic answer carries usage: always or never by `--usage`, else as the
/// request asked (OpenAI's `stream_options.include_usage`; the other families always do).
fn sends_usage(mode: UsageMode, wire: Wire, info: &synth::RequestInfo) -> bool {
    match mode {
        UsageMode::On => true,
        UsageMode::Off => false,
        UsageMode::Requested | UsageMode::Timings => match wire {
            Wire::OpenAiChat | Wire::OpenAiCompletions => info.include_usage,
            _ => true,
        },
    }
}

/// What a synthetic answer's body holds on to: its slot, its start and its metrics' series.
struct SynthBody<'a> {
    state: &'a State,
    series: Arc<metrics::ModelSeries>,
    arrival: Instant,
    start: Instant,
    permit: Option<OwnedSemaphorePermit>,
    input_tokens: u64,
}

impl SynthBody<'_> {
    /// The response for `plan`: a timed stream with the family's headers, or a whole body at
    /// its offset; counted running (the slot is held) until the body ends or is dropped.
    fn response(self, wire: Wire, schedule: &SynthSchedule, plan: SynthPlan) -> MockResponse {
        let finished = match schedule.finish {
            Finish::Length => metrics::FinishedReason::Length,
            _ => metrics::FinishedReason::Stop,
        };
        let (series, arrival, input_tokens) = (self.series, self.arrival, self.input_tokens);
        let stream_metrics = |tokens, success| {
            metrics::StreamMetrics::start(series, arrival, input_tokens, tokens, finished, success)
        };
        let pacer = self.state.pacer.clone();
        match plan {
            SynthPlan::Stream {
                frames,
                ending,
                first_token,
                tokens_sent,
            } => {
                let tokens = match schedule.grouping {
                    Grouping::OnePerFrame => metrics::FrameTokens::OnePerFrame {
                        start: first_token,
                        count: usize::try_from(tokens_sent).unwrap_or(usize::MAX),
                    },
                    grouping => metrics::FrameTokens::Grouped {
                        start: first_token,
                        tokens: tokens_sent,
                        grouping,
                    },
                };
                let success = schedule.fault == MidStreamFault::None;
                let mut response = Response::new(
                    TimedBody::stream(frames, self.start, ending, pacer, self.permit)
                        .with_first_token(first_token)
                        .with_metrics(stream_metrics(tokens, success))
                        .with_tokens(TokenCounts {
                            input: input_tokens,
                            output: tokens_sent,
                        }),
                );
                let headers = response.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(wire.stream_content_type()),
                );
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                for (name, value) in wire.stream_extra_headers() {
                    headers.insert(*name, HeaderValue::from_static(value));
                }
                response
            }
            SynthPlan::Whole {
                body,
                content_type,
                offset,
            } => {
                let counts = TokenCounts {
                    input: input_tokens,
                    output: schedule.tokens,
                };
                let tokens = metrics::FrameTokens::One {
                    index: 0,
                    tokens: schedule.tokens,
                };
                let mut response = Response::new(
                    TimedBody::full_at(body, self.start, offset, pacer, self.permit)
                        .with_metrics(stream_metrics(tokens, true))
                        .with_tokens(counts),
                );
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                response
            }
        }
    }
}

/// Serve a recorded response at its recorded offsets. Faults apply as to synthetic streams:
/// `--fail-rate` answers 500 instead; the mid-stream faults cut in after half the frames (the
/// error frame only on a path whose family is known).
async fn serve_recorded(
    state: &State,
    wire: Option<Wire>,
    recorded: &RecordedResponse,
    path: &str,
    body: &Bytes,
    arrival: Instant,
) -> MockResponse {
    let error_wire = wire.unwrap_or(Wire::OpenAiChat);
    let (fail, fault, stall) = state.draw_faults();
    if fail {
        return error_response(
            error_wire,
            500,
            "The server had an error while processing your request (injected by llm-replay mock).",
        );
    }
    // The request's own model and (without a recorded usage report) its estimated input, as
    // for a synthetic answer.
    let request_json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let model = request::model_of(path, request_json.as_ref())
        .unwrap_or_else(|| metrics::DEFAULT_MODEL.to_owned());
    let prompt_tokens = recorded.tokens.prompt_tokens.unwrap_or_else(|| {
        state
            .config
            .tokenizer
            .as_ref()
            .and_then(|tokenizer| tokenizer.count_prompt(path, body))
            .unwrap_or_else(|| {
                request_json
                    .as_ref()
                    .map_or(0, request::estimated_input_tokens)
            })
    });
    let series = state.metrics.series(&model);
    let (permit, start) = match state.admit(arrival, &series).await {
        Ok(admitted) => admitted,
        Err(()) => {
            return error_response(
                error_wire,
                429,
                "Too many requests: the mock's queue is full.",
            );
        }
    };
    let config = &state.config;
    let half = recorded.frames.len() / 2;
    let offset_of = |i: usize| -> Duration {
        let recorded_or_paced = match recorded.frames.get(i) {
            Some((Some(offset), _)) => *offset,
            // Frames without a recorded offset are paced like synthetic tokens.
            _ => config.ttft + config.itl.saturating_mul(i.min(u32::MAX as usize) as u32),
        };
        if stall && i >= half && i > 0 {
            recorded_or_paced + config.faults.stall
        } else {
            recorded_or_paced
        }
    };
    let keep = match fault {
        MidStreamFault::None => recorded.frames.len(),
        MidStreamFault::ErrorFrame | MidStreamFault::Drop => half,
        MidStreamFault::CutAfterHead => 0,
    };
    let mut frames: Vec<body::PlannedFrame> = recorded.frames[..keep]
        .iter()
        .enumerate()
        .map(|(i, (_, bytes))| body::PlannedFrame {
            bytes: bytes.clone(),
            offset: offset_of(i),
        })
        .collect();
    let mut ending = Ending::Clean;
    match (fault, wire) {
        (MidStreamFault::None, _) => {}
        (MidStreamFault::Drop | MidStreamFault::CutAfterHead, _) => {
            ending = Ending::Abort(offset_of(keep))
        }
        (MidStreamFault::ErrorFrame, Some(wire)) => {
            let mut encoder = encode::StreamEncoder::new(
                wire,
                StreamParams {
                    id: "recorded".to_owned(),
                    model: "recorded".to_owned(),
                    created_unix_ms: 0,
                    input_tokens: 0,
                    usage: false,
                    system_fingerprint: String::new(),
                    timings: Default::default(),
                },
            );
            let mut out = Vec::new();
            encoder.error_frame(
                "The server had an error while processing your request (injected by llm-replay mock).",
                &mut out,
            );
            frames.push(body::PlannedFrame {
                bytes: Bytes::from(out),
                offset: offset_of(keep),
            });
        }
        // Unknown family: no error frame to speak; end the stream early instead.
        (MidStreamFault::ErrorFrame, None) => {}
    }
    // Only the recorded frames kept carry tokens (not an injected error frame after them).
    let tokens = if keep == recorded.frames.len() {
        metrics::FrameTokens::Listed(Arc::clone(&recorded.tokens.per_frame))
    } else {
        let kept = &recorded.tokens.per_frame[..keep.min(recorded.tokens.per_frame.len())];
        metrics::FrameTokens::Listed(Arc::from(kept))
    };
    let output_tokens = (0..frames.len()).map(|i| tokens.of(i)).sum();
    let stream_metrics = metrics::StreamMetrics::start(
        series,
        arrival,
        prompt_tokens,
        tokens,
        recorded.tokens.finished,
        recorded.status.is_success() && fault == MidStreamFault::None,
    );
    let mut response = Response::new(
        TimedBody::stream(frames, start, ending, state.pacer.clone(), permit)
            .with_metrics(stream_metrics)
            .with_tokens(TokenCounts {
                input: prompt_tokens,
                output: output_tokens,
            }),
    );
    *response.status_mut() = recorded.status;
    let headers = response.headers_mut();
    for (name, value) in &recorded.headers {
        headers.append(name.clone(), value.clone());
    }
    response
}

/// `GET /metrics`: the mock's state in the Prometheus text format, under vLLM's names.
fn metrics_response(state: &State) -> MockResponse {
    let mut response = Response::new(TimedBody::full(Bytes::from(state.metrics.render())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    response
}

fn json_response(status: StatusCode, body: &'static [u8]) -> MockResponse {
    let mut response = Response::new(TimedBody::full(Bytes::from_static(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An injected failure: after `--fail-delay`, `--fail-status` with `--fail-body` (or the
/// family's error object).
async fn injected_failure(failure: &FailureConfig, wire: Wire) -> MockResponse {
    if !failure.delay.is_zero() {
        tokio::time::sleep(failure.delay).await;
    }
    let Some(body) = &failure.body else {
        return error_response(
            wire,
            failure.status,
            "The server had an error while processing your request (injected by llm-replay mock).",
        );
    };
    // By its first byte: a body of megabytes is not parsed for each answer.
    let is_json = matches!(body.trim_ascii_start().first(), Some(b'{' | b'['));
    let mut response = Response::new(TimedBody::full(body.clone()));
    *response.status_mut() =
        StatusCode::from_u16(failure.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if is_json {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        }),
    );
    response
}

/// An HTTP error in `wire`'s family shape.
fn error_response(wire: Wire, status: u16, message: &str) -> MockResponse {
    let error = encode::http_error(wire, status, message);
    let mut response = Response::new(TimedBody::full(Bytes::from(error.body)));
    *response.status_mut() =
        StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(error.content_type),
    );
    for (name, value) in error.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}
