//! The validated [`RunConfig`] a run is made of, and the types it is built from. The library
//! never sees a flag: the CLI parses its flags and `--config` files into a `RunConfig`
//! (`cli::run_args`), a library user builds one in code (`RunConfig::builder`, in
//! `builder`), and `RunConfig::validate` checks either.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use common::load::{Arrival, LoadModel, Schedule};

use crate::faithful::FaithfulOptions;

pub use common::assignment::TargetTransport;

/// Files the report is written to, besides the terminal (`run` and `report` alike).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportFiles {
    /// The report as JSON.
    pub report_json: Option<PathBuf>,
    /// The report as Markdown.
    pub report_md: Option<PathBuf>,
    /// The report as a self-contained HTML page.
    pub report_html: Option<PathBuf>,
    /// The goals as JUnit XML.
    pub junit: Option<PathBuf>,
}

/// The run's load across all workers, in `common::load`'s terms; each worker gets its share
/// (`GlobalLoad::worker_share`).
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalLoad {
    pub schedule: Schedule,
    /// Closed-loop concurrency of the whole run, or its cap on in-flight requests.
    pub concurrency: Option<usize>,
    /// Open-loop requests per second of the whole run.
    pub rate: Option<f64>,
    pub arrival: Arrival,
    /// `--requests`: stop after this many exchanges.
    pub requests: Option<u64>,
    pub duration: Option<Duration>,
    /// Leading requests of the whole run measured as warm-up.
    pub warmup: u64,
}

impl GlobalLoad {
    /// The load model of worker `index` out of `workers`: its share of the concurrency, rate
    /// and warm-up (shares differ by at most one; every worker holds at least one stream),
    /// the run's schedule, arrival and duration, and its own seed.
    pub fn worker_share(&self, workers: usize, index: usize, seed: u64) -> LoadModel {
        let share = |total: u64| split_evenly(total, workers, index);
        LoadModel {
            schedule: self.schedule,
            concurrency: self.concurrency.map(|c| share(c as u64).max(1) as usize),
            rate: self.rate.map(|r| r / workers.max(1) as f64),
            arrival: self.arrival,
            duration: self.duration,
            warmup: share(self.warmup),
            seed: seed.wrapping_add(index as u64),
        }
    }

    /// Whether the slices never end and `--duration` stops the run
    /// (`common::replay::is_open_ended`).
    pub fn is_open_ended(&self) -> bool {
        common::replay::is_open_ended(self.requests, self.duration, self.schedule.is_recorded())
    }

    /// Whether requests go out at set instants (the recording's offsets or a rate), so that
    /// a worker's start skew shows in its timing.
    pub fn is_scheduled(&self) -> bool {
        self.schedule.is_recorded() || self.rate.is_some()
    }
}

/// Where the baseline comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum BaselineSource {
    Recorded,
    None,
    Report(PathBuf),
}

/// Where workers come from.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerSource {
    /// Start this many local worker processes on loopback.
    Local(usize),
    /// Listen on this address and wait for this many remote workers.
    Remote { listen: String, expect: usize },
}

/// TLS of the worker link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client CA: when set, workers must present a certificate it signed.
    pub client_ca: Option<PathBuf>,
}

/// The validated run configuration.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub tag_requests: bool,
    pub source: WorkerSource,
    pub reassign_on_loss: bool,
    pub token: Option<String>,
    pub tls: Option<LinkTls>,
    pub max_skew: Duration,
    pub join_timeout: Duration,
    pub recording: PathBuf,
    pub target: Option<String>,
    pub load: GlobalLoad,
    pub sweep: Vec<usize>,
    pub workers: usize,
    pub headers: Vec<(String, String)>,
    pub sets: Vec<(String, String)>,
    pub timeout: Duration,
    pub goals: Vec<String>,
    pub baseline: BaselineSource,
    pub files: ReportFiles,
    pub heartbeat_timeout: Duration,
    /// `--requests-out`: one JSON line per request.
    pub requests_out: Option<PathBuf>,
    /// Read-ahead of the recorded schedule, in exchanges.
    pub reorder_window: usize,
    /// `--metrics-listen`: where live Prometheus metrics are served.
    pub metrics_listen: Option<String>,
    /// How long the final metrics stay served after the run.
    pub metrics_linger: Duration,
    pub transport: TargetTransport,
    /// `--pin-output-length`, `--session-mode`, `--sample-sessions`.
    pub faithful: FaithfulOptions,
    /// `--seed`, when given.
    pub seed: Option<u64>,
    /// `--slo`: per-request objectives (empty: no goodput section).
    pub slos: common::slo::Slos,
    /// `--find-max`: the capacity search, when asked for.
    pub find_max: Option<crate::capacity::FindMax>,
    /// What the coordinator scrapes of the server's own metrics.
    pub server_metrics: ServerMetricsOptions,
    /// `--tokenizer FILE`, loaded once.
    pub tokenizer: Option<RunTokenizer>,
    /// `--cancel-rate`, `--cancel-after` (`rate_pct` 0: off).
    pub cancel: common::assignment::CancelOptions,
    /// `--request-usage`: OpenAI-compatible streams that do not ask for usage ask for it.
    pub request_usage: bool,
    /// The recording may hold recorded client cancellations: the feeders look for them
    /// (`crate::shard::may_hold_cancellations`, set once the recording was read).
    pub recorded_cancels: bool,
}

/// `--tokenizer FILE`: the tokenizer the coordinator counts with (pins, baseline) and the
/// files every worker gets (`common::assignment::TokenizerFiles`: bytes, not a path).
#[derive(Clone)]
pub struct RunTokenizer {
    pub tokenizer: std::sync::Arc<common::tokenizer::Tokenizer>,
    pub files: common::assignment::TokenizerFiles,
}

impl std::fmt::Debug for RunTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTokenizer")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl RunTokenizer {
    /// The file's name for the report (`requests.token_source.tokenizer`).
    pub fn name(&self) -> &str {
        &self.files.name
    }
}

/// The largest `--tokenizer` file: compressed or not, it fits the 64 MiB a worker accepts in
/// one message (its assignment) with room to spare (real ones are 2-11 MB).
pub const MAX_TOKENIZER_FILE_BYTES: usize = 48 << 20;

/// Read `--tokenizer FILE` (and the `tokenizer_config.json` beside it, when there is one)
/// and build the tokenizer once: a file that cannot be read or is not a tokenizer is a usage
/// error naming it.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<RunTokenizer> {
    let tokenizer_json = std::fs::read(path)
        .with_context(|| format!("--tokenizer {}: cannot read", path.display()))?;
    // `tokenizer_config.json` beside it, with a `chat_template.jinja`'s template merged in.
    let config_json = common::tokenizer::config_beside(path)
        .map_err(|e| anyhow::anyhow!("--tokenizer {}: {e}", path.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let tokenizer =
        common::tokenizer::Tokenizer::from_parts(&tokenizer_json, config_json.as_deref(), &name)
            .map_err(|e| anyhow::anyhow!("--tokenizer {}: {e}", path.display()))?;
    if tokenizer_json.len() > MAX_TOKENIZER_FILE_BYTES {
        bail!(
            "--tokenizer {}: {} bytes; at most {MAX_TOKENIZER_FILE_BYTES} can be sent to the workers",
            path.display(),
            tokenizer_json.len(),
        );
    }
    Ok(RunTokenizer {
        tokenizer: std::sync::Arc::new(tokenizer),
        files: common::assignment::TokenizerFiles::new(name, tokenizer_json, config_json),
    })
}

/// `--server-metrics`, `--server-metrics-interval`, `--no-server-metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerMetricsOptions {
    /// Try the target's `<origin>/metrics` (with `--target`, unless turned off).
    pub target: bool,
    /// More endpoints, as given.
    pub extra: Vec<String>,
    /// `--server-metrics-header`s for the `extra` endpoints: `(name, template)`, `${VAR}`
    /// expanded from the coordinator's environment when the scraper starts (every variable
    /// was checked to be set here).
    pub extra_headers: Vec<(String, String)>,
    /// Between scrapes.
    pub interval: Duration,
}

/// The shortest `--server-metrics-interval`: a scrape is an HTTP request and a parse.
pub const MIN_SERVER_METRICS_INTERVAL: Duration = Duration::from_millis(10);

/// A target must be an absolute http:// or https:// URL. Messages show it redacted: its query
/// may carry a credential.
pub fn check_target(target: &str, h2c: bool) -> anyhow::Result<()> {
    let shown = common::recording::redact_url(target);
    let uri: http::Uri = target
        .parse()
        .map_err(|e| anyhow::anyhow!("--target {shown:?}: not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") if h2c => bail!(
            "--target-h2c is cleartext HTTP/2 for http:// targets; https targets negotiate HTTP/2 by ALPN"
        ),
        Some("https") => {}
        Some(other) => {
            bail!("--target {shown:?}: scheme {other:?} is not supported (use http:// or https://)")
        }
        None => bail!("--target {shown:?}: expected http://HOST[:PORT] or https://HOST[:PORT]"),
    }
    if uri.authority().is_none() {
        bail!("--target {shown:?}: no host");
    }
    Ok(())
}

/// The most local worker processes a run may start: 8 per core, and at least 64. Each is a
/// process with two runtimes, its connections to the target and a gRPC link; past this a
/// machine spends its cores switching between workers, and an unbounded `--workers` forks
/// until `fork` fails. More workers belong on other machines (`--listen`).
pub fn max_local_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_mul(8).max(64)
}

/// Whether workers can only join `--listen ADDR` from this machine: every address it
/// resolves to is loopback (`127.0.0.0/8`, `::1`, or `::ffff:127.x.y.z`). A name is resolved
/// (`localhost:7000` is loopback, `127.evil.example:7000` is what its DNS says); `0.0.0.0`
/// and `::` listen everywhere. An address that does not resolve is an error naming it.
pub fn listen_is_loopback(listen: &str) -> anyhow::Result<bool> {
    use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
    let loopback = |addr: &SocketAddr| match addr.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip.to_canonical().is_loopback(),
    };
    if let Ok(addr) = listen.parse::<SocketAddr>() {
        return Ok(loopback(&addr));
    }
    let resolved: Vec<SocketAddr> = listen
        .to_socket_addrs()
        .with_context(|| format!("--listen {listen}: cannot resolve (expected HOST:PORT)"))?
        .collect();
    if resolved.is_empty() {
        bail!("--listen {listen}: resolves to no address");
    }
    Ok(resolved.iter().all(loopback))
}

/// Shortest `--token` accepted when workers may join from other hosts.
pub const MIN_TOKEN_CHARS: usize = 16;

impl RunConfig {
    /// The options every worker applies as they are (`common::assignment::RequestOptions`):
    /// a new run option a worker needs is parsed above and handed over here.
    pub fn request_options(&self) -> common::assignment::RequestOptions {
        common::assignment::RequestOptions {
            timeout: self.timeout,
            requests_out: self.requests_out.is_some(),
            reorder_window: self.reorder_window,
            faithful: common::assignment::Faithful {
                pin: self.faithful.pin,
                closed_sessions: self.faithful.closed_sessions,
            },
            slos: self.slos.clone(),
            steady_metrics: self.find_max.is_some(),
            tokenizer: self.tokenizer.as_ref().map(|t| t.files.clone()),
            cancel: self.cancel,
            request_usage: self.request_usage,
        }
    }

    /// Never more local workers than exchanges the run has to give (`--requests`, else the
    /// recording's `exchanges`), unless the run is open-ended: a worker past that count would
    /// start, join and get nothing. Returns the count asked for when it was lowered.
    pub fn fit_workers_to(&mut self, exchanges: u64) -> Option<usize> {
        let WorkerSource::Local(asked) = self.source else {
            return None;
        };
        if self.load.is_open_ended() {
            return None;
        }
        let given = self.load.requests.unwrap_or(exchanges).max(1);
        let fitted = usize::try_from(given).unwrap_or(usize::MAX).min(asked);
        if fitted == asked {
            return None;
        }
        self.source = WorkerSource::Local(fitted);
        self.workers = fitted;
        Some(asked)
    }
}

/// Split `total` into `parts` shares that differ by at most one (the first ones get more).
pub fn split_evenly(total: u64, parts: usize, index: usize) -> u64 {
    let parts = parts.max(1) as u64;
    total / parts + u64::from((index as u64) < total % parts)
}
