//! The `run` command's flags and its `--config` file (YAML or TOML), merged and checked into
//! the library's [`RunConfig`]: the coordinator never sees a flag. The command line wins over
//! the file; every error names the flag (or the file and line) at fault.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use common::duration::parse_duration;
use common::formats::pin::PinMode;
use common::load::{Arrival, Schedule};
use common::replay::{DEFAULT_REORDER_WINDOW, DEFAULT_REQUEST_TIMEOUT};
use coordinator::{
    BaselineSource, GlobalLoad, LinkTls, MIN_SERVER_METRICS_INTERVAL, MIN_TOKEN_CHARS, ReportFiles,
    RunConfig, ServerMetricsOptions, TargetTransport, WorkerSource, check_target,
    listen_is_loopback, load_tokenizer, max_local_workers,
};
use coordinator::{FaithfulOptions, SessionSample};

/// `llm-replay run` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Recording to replay (recording format v1, .jsonl or .jsonl.gz).
    pub recording: PathBuf,

    /// Target base URL (e.g. http://gpu-box:8000). Without it, an embedded mock serves the
    /// recorded streams at their recorded timing.
    #[arg(long)]
    pub target: Option<String>,
    /// `recorded` (send at the recorded arrival offsets) or `asap`. Default: recorded when the
    /// recording has arrival times and neither --concurrency nor --rate is given.
    #[arg(long, value_parser = ["recorded", "asap"])]
    pub schedule: Option<String>,
    /// Time scale of the recorded schedule (2 = twice as fast).
    #[arg(long)]
    pub speed: Option<f64>,
    /// Closed-loop concurrency (in-flight requests across all workers).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open-loop arrival rate, requests per second across all workers.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Inter-arrival distribution for --rate.
    #[arg(long, value_parser = ["constant", "poisson"])]
    pub arrival: Option<String>,
    /// Number of requests to send in all (the recording loops when shorter).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Stop issuing requests after this long (e.g. 90s, 5m).
    #[arg(long)]
    pub duration: Option<String>,
    /// Leading requests measured as warm-up and left out of the report.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Replay once per concurrency level (e.g. 1,2,5,10) into one report.
    #[arg(long, value_delimiter = ',')]
    pub sweep_concurrency: Vec<usize>,

    /// Local worker processes.
    #[arg(long, conflicts_with = "expect_workers")]
    pub workers: Option<usize>,
    /// Listen for remote workers on this address (HOST:PORT) instead of starting local ones.
    #[arg(long, requires = "expect_workers")]
    pub listen: Option<String>,
    /// Number of remote workers to wait for before starting (with --listen).
    #[arg(long, requires = "listen")]
    pub expect_workers: Option<usize>,
    /// What to do when a worker is lost: `fail` (abort, partial report, exit 3) or
    /// `reassign` (its unstarted exchanges go to the others).
    #[arg(long, value_parser = ["fail", "reassign"], default_value = "fail")]
    pub on_worker_loss: String,
    /// Shared secret workers must present; required unless --listen is a loopback address.
    #[arg(long, env = "LLM_REPLAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM certificate for the worker link (TLS), with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that signs worker client certificates: workers must present one (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Start skew across workers above which a scheduled run warns (e.g. 5ms).
    #[arg(long, default_value = "5ms")]
    pub max_skew: String,
    /// How long to wait for workers to join (e.g. 60s).
    #[arg(long, default_value = "60s")]
    pub join_timeout: String,
    /// Extra header, `Name: value`; `${VAR}` expands from each worker's environment.
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// Override a top-level JSON body field of every request, FIELD=VALUE (VALUE is JSON when
    /// it parses as JSON, else a string).
    #[arg(long = "set")]
    pub sets: Vec<String>,
    /// Per-request time limit (e.g. 60s).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Send `x-llm-replay-exchange: <index in the recording>` with every request, to match
    /// replayed requests to recorded exchanges in server logs.
    #[arg(long)]
    pub tag_requests: bool,
    /// PEM file of a CA an https target's certificate may chain to, trusted besides the
    /// Mozilla roots (repeatable). Its contents go to the workers.
    #[arg(long = "target-ca", value_name = "FILE")]
    pub target_ca: Vec<PathBuf>,
    /// Skip verification of an https target's certificate (the report warns).
    #[arg(long)]
    pub insecure: bool,
    /// Speak cleartext HTTP/2 (prior knowledge) to an http:// target. https targets use
    /// HTTP/2 whenever the server offers it (ALPN).
    #[arg(long)]
    pub target_h2c: bool,
    /// Re-sign every request with AWS SigV4 for Bedrock in REGION, with credentials from each
    /// worker's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN).
    #[arg(long, value_name = "REGION")]
    pub aws_sigv4: Option<String>,
    /// Write one JSON line per measured request (merged from every worker) to this file.
    #[arg(long)]
    pub requests_out: Option<PathBuf>,
    /// Exchanges a worker reads ahead on a recorded schedule to send them in `at_ms` order
    /// whatever the order of lines (a recording proxy writes exchanges as they complete).
    #[arg(long)]
    pub reorder_window: Option<usize>,
    /// Serve live Prometheus metrics on http://ADDR/metrics while the run goes (merged
    /// TTFT, ITL, latency and schedule-lag histograms, request counters by outcome, tokens,
    /// in-flight requests, workers alive), labelled with the run id.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// With --metrics-listen: keep serving the final numbers this long after the run, so a
    /// scraper gets them (e.g. 15s for a 10 s scrape interval).
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub metrics_linger: String,

    /// Ask each request for the output length the recording measured (usage, else content
    /// frames) with the family's max-tokens field. `--pin-output-length=strict` also sends
    /// `min_tokens` and `ignore_eos` to OpenAI-compatible paths (vLLM, llama.cpp, TGI read
    /// them; OpenAI itself rejects unknown fields).
    #[arg(
        long,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "max",
        value_parser = ["max", "strict"]
    )]
    pub pin_output_length: Option<String>,
    /// `open` (default): a session's turns keep their recorded offsets. `closed`: a turn
    /// goes out at the previous turn's replayed end plus its recorded think time.
    #[arg(long, value_parser = ["open", "closed"])]
    pub session_mode: Option<String>,
    /// Replay a deterministic subset of whole sessions (e.g. 0.25); exchanges without a
    /// session are sampled one by one. Chosen by a hash of --seed and the session id.
    #[arg(long, value_name = "FRACTION")]
    pub sample_sessions: Option<f64>,
    /// Seed of --sample-sessions (default 0), of Poisson arrivals and of --cancel-rate.
    #[arg(long)]
    pub seed: Option<u64>,
    /// A Hugging Face `tokenizer.json`: exact token counts where a stream has no usage
    /// report (output) and for prompts (input); its `tokenizer_config.json` beside it is
    /// read too when there is one. Sent to every worker (remote ones included).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Cancel this share of the requests (`P` or `P%`, 0-100), drawn per exchange from
    /// --seed, as AIPerf's --request-cancellation-rate: a what-if of users who give up.
    #[arg(long, value_name = "P%")]
    pub cancel_rate: Option<String>,
    /// How long after a drawn request is written it is cancelled (default 0s: right after
    /// it was written); needs --cancel-rate.
    #[arg(long, value_name = "DURATION")]
    pub cancel_after: Option<String>,
    /// Ask OpenAI-compatible chat and completions streams that do not ask for usage to
    /// report it (`stream_options.include_usage: true`), so token counts are the server's
    /// own; it changes nothing of what the server generates. Stated in the report.
    #[arg(long)]
    pub request_usage: bool,

    /// Goal that fails the run (exit 1) when it holds, e.g. 'llm.ttft-p95 > 800'.
    #[arg(long = "fail-if")]
    pub fail_if: Vec<String>,
    /// Per-request objective NAME:LIMIT (repeatable): ttft, ttst, itl, latency (a duration
    /// the request's value must not exceed) or tokens-per-second (per user, a floor). A
    /// request that succeeded within every one is good: the report's goodput section.
    #[arg(long = "slo", value_name = "NAME:LIMIT")]
    pub slos: Vec<String>,
    /// Search for the largest load at which every --fail-if goal holds: `concurrency`,
    /// `rate` (requests/s) or `speed` (the recording's own schedule, ×S). Each probe is a
    /// full replay with the run's budget (--requests, --duration, or the whole recording).
    #[arg(long, value_name = "DIMENSION", value_parser = ["concurrency", "rate", "speed"])]
    pub find_max: Option<String>,
    /// The loads --find-max may try, LOW:HIGH (defaults: concurrency 1:4096, rate
    /// 0.1:100000, speed 0.1:1000).
    #[arg(long, value_name = "LOW:HIGH")]
    pub find_max_range: Option<String>,
    /// Stop --find-max when the lowest failing and the highest passing load are within
    /// this many percent (default 5%).
    #[arg(long, value_name = "P%")]
    pub find_max_precision: Option<String>,

    /// Another Prometheus endpoint to scrape during the run (repeatable): a replica, a GPU
    /// exporter. The target's own `<origin>/metrics` is tried without asking.
    #[arg(long = "server-metrics", value_name = "URL")]
    pub server_metrics: Vec<String>,
    /// A header for the --server-metrics endpoints, `Name: value` (repeatable; `${VAR}`
    /// expands from this process's environment). Sent to those endpoints' own origins only,
    /// never across a redirect to another origin; the target's own `/metrics` gets the
    /// --header values instead.
    #[arg(long = "server-metrics-header", value_name = "NAME: VALUE")]
    pub server_metrics_headers: Vec<String>,
    /// How often the server's metrics are scraped during the run (default 1s).
    #[arg(long, value_name = "DURATION")]
    pub server_metrics_interval: Option<String>,
    /// Do not scrape the target's `/metrics` (nor any --server-metrics endpoint).
    #[arg(long)]
    pub no_server_metrics: bool,
    /// YAML or TOML file with goals and run options.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// `recorded` (default), `none`, or a saved report JSON to compare against.
    #[arg(long)]
    pub baseline: Option<String>,
    #[command(flatten)]
    pub files: ReportFileArgs,
    /// Silence after which a worker counts as lost (e.g. 5s, 500ms; a bare number is
    /// seconds).
    #[arg(long, default_value = "5s")]
    pub heartbeat_timeout: String,
}

/// Files the report is written to, besides the terminal (`run` and `report` alike): the flags
/// of [`ReportFiles`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReportFileArgs {
    /// Write the report as JSON.
    #[arg(long)]
    pub report_json: Option<PathBuf>,
    /// Write the report as Markdown.
    #[arg(long)]
    pub report_md: Option<PathBuf>,
    /// Write the report as a self-contained HTML page.
    #[arg(long)]
    pub report_html: Option<PathBuf>,
    /// Write goals as JUnit XML.
    #[arg(long)]
    pub junit: Option<PathBuf>,
}

/// Options a config file may carry; the command line wins over the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub goals: Vec<String>,
    pub target: Option<String>,
    pub schedule: Option<String>,
    pub speed: Option<f64>,
    pub concurrency: Option<usize>,
    pub rate: Option<f64>,
    pub arrival: Option<String>,
    pub requests: Option<u64>,
    pub duration: Option<String>,
    pub warmup: Option<u64>,
    pub workers: Option<usize>,
    #[serde(default)]
    pub headers: Vec<String>,
    #[serde(default)]
    pub sets: Vec<String>,
    pub timeout: Option<String>,
    pub baseline: Option<String>,
    #[serde(default)]
    pub target_ca: Vec<PathBuf>,
    pub insecure: Option<bool>,
    pub target_h2c: Option<bool>,
    pub aws_sigv4: Option<String>,
    pub requests_out: Option<PathBuf>,
    pub reorder_window: Option<usize>,
    /// `max` or `strict` (`true` = `max`).
    pub pin_output_length: Option<PinSetting>,
    pub session_mode: Option<String>,
    pub sample_sessions: Option<f64>,
    pub seed: Option<u64>,
    pub tokenizer: Option<PathBuf>,
    /// `50`, `"50%"`.
    pub cancel_rate: Option<CancelRateSetting>,
    pub cancel_after: Option<String>,
    pub request_usage: Option<bool>,
    #[serde(default)]
    pub slos: Vec<String>,
    pub find_max: Option<String>,
    pub find_max_range: Option<String>,
    pub find_max_precision: Option<String>,
    #[serde(default)]
    pub server_metrics: Vec<String>,
    #[serde(default)]
    pub server_metrics_headers: Vec<String>,
    pub server_metrics_interval: Option<String>,
    pub no_server_metrics: Option<bool>,
}

/// `cancel-rate:` in a config file: a number (`50`) or text (`"50%"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CancelRateSetting {
    Number(f64),
    Text(String),
}

impl CancelRateSetting {
    fn text(self) -> String {
        match self {
            CancelRateSetting::Number(n) => n.to_string(),
            CancelRateSetting::Text(text) => text,
        }
    }
}

/// `pin-output-length:` in a config file: `true`/`false`, or a mode name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PinSetting {
    On(bool),
    Mode(String),
}

impl FileConfig {
    /// Read a YAML (`.yaml`/`.yml`) or TOML (`.toml`) file.
    pub fn load(path: &Path) -> anyhow::Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read config file", path.display()))?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        match ext.as_str() {
            "toml" => toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display())),
            "yaml" | "yml" => serde_yaml::from_str(&text).map_err(|e| {
                let at = e
                    .location()
                    .map(|l| format!(":{}", l.line()))
                    .unwrap_or_default();
                anyhow::anyhow!("{}{at}: {e}", path.display())
            }),
            _ => bail!(
                "{}: config files must end in .yaml, .yml or .toml",
                path.display()
            ),
        }
    }
}

/// What `--find-max` is checked against: the rest of the run's options.
struct SearchContext {
    concurrency: Option<usize>,
    has_goals: bool,
    sweeping: bool,
    has_arrival_times: bool,
    asap: bool,
}

/// `--find-max` checked against the other options; `--concurrency N` with `--find-max
/// concurrency` is the search's first load.
fn search_options(
    find_max: Option<coordinator::FindMax>,
    context: SearchContext,
) -> anyhow::Result<Option<coordinator::FindMax>> {
    use coordinator::Dimension;
    let Some(find_max) = find_max else {
        return Ok(None);
    };
    let find_max = match context.concurrency {
        Some(start) if find_max.dimension == Dimension::Concurrency => {
            find_max.starting_at(start as f64)?
        }
        _ => find_max,
    };
    if !context.has_goals {
        bail!(
            "--find-max {}: needs at least one --fail-if goal: the search looks for the largest load at which every goal holds (e.g. --fail-if 'llm.ttft-p95 > 800')",
            find_max.dimension.name()
        );
    }
    if context.sweeping {
        bail!("--find-max and --sweep-concurrency are exclusive: each chooses the loads to replay");
    }
    if find_max.dimension == Dimension::Speed && !context.has_arrival_times {
        bail!(
            "--find-max speed scales the recorded schedule: the recording has no arrival times (at_ms); use --find-max rate or concurrency"
        );
    }
    if find_max.dimension == Dimension::Speed && context.asap {
        bail!(
            "--find-max speed scales the recorded schedule: it cannot be used with --schedule asap"
        );
    }
    Ok(Some(find_max))
}

/// `--cancel-rate P%` and `--cancel-after D`: a rate from 0 to 100 (`P` or `P%`), a delay
/// only with a rate.
fn cancel_options(
    rate: Option<String>,
    after: Option<String>,
    seed: Option<u64>,
) -> anyhow::Result<common::assignment::CancelOptions> {
    let Some(rate_text) = rate else {
        if let Some(after) = after {
            bail!(
                "--cancel-after {after:?}: needs --cancel-rate (the share of requests to cancel)"
            );
        }
        return Ok(common::assignment::CancelOptions::default());
    };
    let trimmed = rate_text.trim();
    let number = trimmed.strip_suffix('%').unwrap_or(trimmed).trim();
    let rate_pct: f64 = number
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite() && (0.0..=100.0).contains(p))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--cancel-rate {rate_text:?}: expected a percentage from 0 to 100 (e.g. 10 or 10%)"
            )
        })?;
    let after = match after {
        None => Duration::ZERO,
        Some(text) => duration_arg("--cancel-after", &text)?,
    };
    Ok(common::assignment::CancelOptions {
        rate_pct,
        after,
        seed: seed.unwrap_or(0),
    })
}

/// Read a `--target-ca` file: it must hold at least one PEM certificate.
fn read_target_ca(path: &Path) -> anyhow::Result<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--target-ca {}: cannot read", path.display()))?;
    let mut certificates = 0;
    for cert in CertificateDer::pem_slice_iter(text.as_bytes()) {
        cert.map_err(|e| anyhow::anyhow!("--target-ca {}: {e}", path.display()))?;
        certificates += 1;
    }
    if certificates == 0 {
        bail!(
            "--target-ca {}: holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        );
    }
    Ok(text)
}

/// A `--server-metrics` endpoint must be an absolute http:// or https:// URL.
fn check_metrics_url(url: &str) -> anyhow::Result<()> {
    let shown = common::recording::redact_url(url);
    let uri: http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("--server-metrics {shown:?}: not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        bail!("--server-metrics {shown:?}: expected http://HOST[:PORT]/PATH or https://...");
    }
    Ok(())
}

/// Parse `Name: value`. Errors never echo the value: it is often a secret.
fn split_header(text: &str) -> anyhow::Result<(String, String)> {
    split_header_of("--header", text)
}

/// A `--server-metrics-header`: `Name: value` as for `--header`, each `${VAR}` set in this
/// process's environment (the coordinator scrapes; an unset one is an error naming it).
fn server_metrics_header(text: &str) -> anyhow::Result<(String, String)> {
    const FLAG: &str = "--server-metrics-header";
    let (name, template) = split_header_of(FLAG, text)?;
    if let Err(var) = common::env_template::expand(&template, &|var| std::env::var(var).ok()) {
        bail!("{FLAG} {name}: {var}");
    }
    Ok((name, template))
}

/// Parse `Name: value` for `flag`. Errors never echo the value: it is often a secret.
fn split_header_of(flag: &str, text: &str) -> anyhow::Result<(String, String)> {
    let Some((name, value)) = text.split_once(':') else {
        bail!(
            "{flag}: expected 'Name: value' ({} characters given, not shown: a header value is often a secret)",
            text.chars().count()
        );
    };
    let name = name.trim();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    {
        bail!(
            "{flag}: {:?} is not a valid header name (the value is not shown)",
            name.chars().take(64).collect::<String>()
        );
    }
    let value = value.trim();
    // The worker sends a value only when every byte is visible ASCII or a tab (what
    // `http::HeaderValue::from_str` accepts); CR or LF would split the request head. Found
    // here, the run never starts; found by the worker, it fails mid-run.
    if let Some(bad) = value
        .bytes()
        .find(|&b| !(b == b'\t' || (0x20..0x7f).contains(&b)))
    {
        let what = if bad.is_ascii_control() {
            "a control character (CR, LF, DEL or another below 0x20)"
        } else {
            "a non-ASCII character"
        };
        bail!(
            "{flag} {name}: the value holds {what}; header values must be visible ASCII (the value is not shown)"
        );
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// A duration flag that must be above zero.
fn positive_duration_arg(flag: &str, text: &str) -> anyhow::Result<Duration> {
    let duration = duration_arg(flag, text)?;
    if duration.is_zero() {
        bail!("{flag} {text:?}: must be above zero");
    }
    Ok(duration)
}

fn split_set(text: &str) -> anyhow::Result<(String, String)> {
    let Some((field, value)) = text.split_once('=') else {
        bail!("--set {text:?}: expected FIELD=VALUE");
    };
    if field.trim().is_empty() {
        bail!("--set {text:?}: empty field name");
    }
    Ok((field.trim().to_owned(), value.to_owned()))
}

fn duration_arg(flag: &str, text: &str) -> anyhow::Result<Duration> {
    parse_duration(text).map_err(|e| anyhow::anyhow!("{flag} {text:?}: {e}"))
}

impl RunArgs {
    /// Files the run reads: (what, path), for the CLI's check that no output overwrites one.
    pub fn read_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut read_files = vec![("the recording", self.recording.clone())];
        for (what, path) in [
            ("the --config file", &self.config),
            ("the --tls-cert file", &self.tls_cert),
            ("the --tls-key file", &self.tls_key),
            ("the --tls-ca file", &self.tls_ca),
        ] {
            read_files.extend(path.clone().map(|path| (what, path)));
        }
        read_files.extend(
            self.target_ca
                .iter()
                .map(|path| ("a --target-ca file", path.clone())),
        );
        read_files
    }

    /// Merge with the config file (if any) and validate. `has_arrival_times` tells whether
    /// the recording carries arrival offsets (it decides the default schedule).
    pub fn into_config(self, has_arrival_times: bool) -> anyhow::Result<RunConfig> {
        let file = match &self.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let load = self.load_choice(&file, has_arrival_times)?;
        let (target, transport) = self.target_transport(&file)?;
        let server_metrics = self.server_metrics_options(&file)?;
        let (workers, source) = self.worker_source(&file, &load)?;
        let LinkSettings {
            tls,
            token,
            max_skew,
            join_timeout,
            heartbeat_timeout,
            metrics_linger,
        } = self.link_settings(&source)?;
        let requests = self.request_shape(&file)?;
        let options = self.run_options(&file, &load, has_arrival_times)?;
        let global = global_load(&load, options.find_max.is_some(), &requests, workers);
        let mut config = RunConfig {
            server_metrics,
            slos: options.slos,
            find_max: options.find_max,
            transport,
            tag_requests: self.tag_requests,
            source,
            reassign_on_loss: self.on_worker_loss == "reassign",
            token,
            tls,
            max_skew,
            join_timeout,
            load: global,
            recording: self.recording,
            target,
            sweep: self.sweep_concurrency,
            workers,
            headers: requests.headers,
            sets: requests.sets,
            timeout: requests.timeout,
            goals: options.goals,
            baseline: options.baseline,
            files: self.files.into(),
            heartbeat_timeout,
            requests_out: self.requests_out.or(file.requests_out),
            reorder_window: options.reorder_window,
            metrics_listen: self.metrics_listen,
            metrics_linger,
            faithful: options.faithful,
            seed: options.seed,
            tokenizer: options.tokenizer,
            cancel: options.cancel,
            request_usage: self.request_usage || file.request_usage.unwrap_or(false),
            recorded_cancels: true,
        };
        // `--requests N` gives the run N exchanges whatever the recording holds.
        config.fit_workers_to(u64::MAX);
        Ok(config)
    }

    /// How many workers, and where they come from: local processes (at most
    /// [`max_local_workers`], never more than a closed loop's streams) or `--expect-workers`
    /// joining `--listen`.
    fn worker_source(
        &self,
        file: &FileConfig,
        load: &LoadChoice,
    ) -> anyhow::Result<(usize, WorkerSource)> {
        let mut workers = self.workers.or(file.workers).unwrap_or(1);
        if workers == 0 {
            bail!("--workers must be at least 1");
        }
        let limit = max_local_workers();
        if workers > limit && self.listen.is_none() {
            bail!(
                "--workers {workers}: at most {limit} local workers on this machine (8 per core, at least 64: each is a process of its own); for more, run workers on other machines with --listen and --expect-workers"
            );
        }
        if !load.recorded_schedule
            && load.rate.is_none()
            && let Some(c) = load.concurrency
            && c < workers
        {
            // A closed loop cannot give every worker at least one stream.
            workers = c;
        }
        match (&self.listen, self.expect_workers) {
            (Some(listen), Some(expect)) => {
                if expect == 0 {
                    bail!("--expect-workers must be at least 1");
                }
                let source = WorkerSource::Remote {
                    listen: listen.clone(),
                    expect,
                };
                Ok((expect, source))
            }
            _ => Ok((workers, WorkerSource::Local(workers))),
        }
    }

    /// What every request carries and how long it may take: `--header`, `--set`,
    /// `--timeout`, and how long the run lasts (`--duration`, `--requests`, `--warmup`).
    fn request_shape(&self, file: &FileConfig) -> anyhow::Result<RequestShape> {
        let duration = match self.duration.clone().or_else(|| file.duration.clone()) {
            Some(text) => Some(positive_duration_arg("--duration", &text)?),
            None => None,
        };
        let timeout = match self.timeout.clone().or_else(|| file.timeout.clone()) {
            Some(text) => positive_duration_arg("--timeout", &text)?,
            None => DEFAULT_REQUEST_TIMEOUT,
        };
        let mut headers = Vec::new();
        for text in file.headers.iter().chain(&self.headers) {
            headers.push(split_header(text)?);
        }
        let mut sets = Vec::new();
        for text in file.sets.iter().chain(&self.sets) {
            sets.push(split_set(text)?);
        }
        Ok(RequestShape {
            headers,
            sets,
            timeout,
            duration,
            requests: self.requests.or(file.requests),
            warmup: self.warmup.or(file.warmup).unwrap_or(0),
        })
    }

    /// Goals, baseline, read-ahead, seed, faithful replay, cancellations, the tokenizer,
    /// SLOs and the capacity search: the run's options beyond its load and its link.
    fn run_options(
        &self,
        file: &FileConfig,
        load: &LoadChoice,
        has_arrival_times: bool,
    ) -> anyhow::Result<RunOptions> {
        let mut goals = file.goals.clone();
        goals.extend(self.fail_if.iter().cloned());
        let baseline = match self.baseline.as_deref().or(file.baseline.as_deref()) {
            None | Some("recorded") => BaselineSource::Recorded,
            Some("none") => BaselineSource::None,
            Some(path) => BaselineSource::Report(PathBuf::from(path)),
        };
        if self.sweep_concurrency.contains(&0) {
            bail!("--sweep-concurrency levels must be at least 1");
        }
        let reorder_window = self
            .reorder_window
            .or(file.reorder_window)
            .unwrap_or(DEFAULT_REORDER_WINDOW);
        if reorder_window == 0 || reorder_window > u32::MAX as usize {
            bail!("--reorder-window must be between 1 and {}", u32::MAX);
        }
        let seed = self.seed.or(file.seed);
        let faithful = faithful_options(
            self.pin_output_length
                .clone()
                .map(PinSetting::Mode)
                .or_else(|| file.pin_output_length.clone()),
            self.session_mode
                .clone()
                .or_else(|| file.session_mode.clone()),
            self.sample_sessions.or(file.sample_sessions),
            seed,
        )?;
        let cancel = cancel_options(
            self.cancel_rate
                .clone()
                .or_else(|| file.cancel_rate.clone().map(CancelRateSetting::text)),
            self.cancel_after
                .clone()
                .or_else(|| file.cancel_after.clone()),
            seed,
        )?;
        let tokenizer = match self.tokenizer.as_ref().or(file.tokenizer.as_ref()) {
            Some(path) => Some(load_tokenizer(path)?),
            None => None,
        };
        let mut slos = Vec::new();
        for text in file.slos.iter().chain(&self.slos) {
            slos.push(common::slo::Slo::parse(text).map_err(anyhow::Error::msg)?);
        }
        let find_max = self.find_max(file, load, !goals.is_empty(), has_arrival_times)?;
        Ok(RunOptions {
            goals,
            baseline,
            reorder_window,
            seed,
            faithful,
            cancel,
            tokenizer,
            slos: common::slo::Slos(slos),
            find_max,
        })
    }

    /// `--find-max`, `--find-max-range` and `--find-max-precision`, checked against the
    /// rest of the run's options.
    fn find_max(
        &self,
        file: &FileConfig,
        load: &LoadChoice,
        has_goals: bool,
        has_arrival_times: bool,
    ) -> anyhow::Result<Option<coordinator::FindMax>> {
        let find_max = coordinator::FindMax::from_options(
            self.find_max.as_deref().or(file.find_max.as_deref()),
            self.find_max_range
                .as_deref()
                .or(file.find_max_range.as_deref()),
            self.find_max_precision
                .as_deref()
                .or(file.find_max_precision.as_deref()),
        )?;
        search_options(
            find_max,
            SearchContext {
                concurrency: load.concurrency,
                has_goals,
                sweeping: !self.sweep_concurrency.is_empty(),
                has_arrival_times,
                asap: load.schedule.as_deref() == Some("asap"),
            },
        )
    }
}

/// The run's load across its workers from the checked choice: by default a closed loop of
/// one stream a worker (remote workers cannot be fewer than `--expect-workers`, and each runs
/// a stream at least), unless the arrivals are set (a schedule, a rate) or a search sets the
/// load of each probe: then only a cap the user gave limits the requests in flight (issue
/// 32: a rate probe is an open loop).
fn global_load(
    load: &LoadChoice,
    searching: bool,
    requests: &RequestShape,
    workers: usize,
) -> GlobalLoad {
    let paced = load.recorded_schedule || load.rate.is_some() || searching;
    GlobalLoad {
        schedule: if load.recorded_schedule {
            Schedule::Recorded { speed: load.speed }
        } else {
            Schedule::Asap
        },
        concurrency: if paced {
            load.concurrency
        } else {
            Some(load.concurrency.unwrap_or(workers.max(1)))
        },
        rate: load.rate,
        arrival: load.arrival,
        requests: requests.requests,
        duration: requests.duration,
        warmup: requests.warmup,
    }
}

/// What every request carries, and how long the run lasts.
struct RequestShape {
    headers: Vec<(String, String)>,
    sets: Vec<(String, String)>,
    timeout: Duration,
    duration: Option<Duration>,
    requests: Option<u64>,
    warmup: u64,
}

/// The run's options beyond its load and its link, checked.
struct RunOptions {
    goals: Vec<String>,
    baseline: BaselineSource,
    reorder_window: usize,
    seed: Option<u64>,
    faithful: FaithfulOptions,
    cancel: common::assignment::CancelOptions,
    tokenizer: Option<coordinator::RunTokenizer>,
    slos: common::slo::Slos,
    find_max: Option<coordinator::FindMax>,
}

/// The arrivals the flags and the file ask for, checked.
struct LoadChoice {
    concurrency: Option<usize>,
    rate: Option<f64>,
    /// `--schedule` as given (`asap` matters to a search).
    schedule: Option<String>,
    recorded_schedule: bool,
    speed: f64,
    arrival: Arrival,
}

/// How the workers' link is secured and timed.
struct LinkSettings {
    tls: Option<LinkTls>,
    token: Option<String>,
    max_skew: Duration,
    join_timeout: Duration,
    heartbeat_timeout: Duration,
    metrics_linger: Duration,
}

impl RunArgs {
    /// The schedule (recorded or as fast as possible), the closed loop's cap, the rate, the
    /// speed and the arrival process; `has_arrival_times` decides the default schedule.
    fn load_choice(
        &self,
        file: &FileConfig,
        has_arrival_times: bool,
    ) -> anyhow::Result<LoadChoice> {
        let concurrency = self.concurrency.or(file.concurrency);
        let rate = self.rate.or(file.rate);
        let schedule = self.schedule.clone().or_else(|| file.schedule.clone());
        let recorded_schedule = match schedule.as_deref() {
            Some("recorded") => {
                if !has_arrival_times {
                    bail!("--schedule recorded: the recording has no arrival times (at_ms)");
                }
                true
            }
            Some("asap") => false,
            Some(other) => bail!("--schedule {other:?}: expected recorded or asap"),
            None => has_arrival_times && concurrency.is_none() && rate.is_none(),
        };
        if recorded_schedule && rate.is_some() {
            bail!("--rate and --schedule recorded are exclusive: the rate sets the arrivals");
        }
        if concurrency == Some(0) {
            bail!("--concurrency must be at least 1");
        }
        if let Some(rate) = rate
            && !(rate.is_finite() && (1e-6..=1e9).contains(&rate))
        {
            bail!("--rate must be between 0.000001 and 1e9 requests per second");
        }
        let speed = self.speed.or(file.speed).unwrap_or(1.0);
        if !(speed.is_finite() && (1e-3..=1e6).contains(&speed)) {
            bail!("--speed must be between 0.001 and 1000000 (a time scale of the recording)");
        }
        // Poisson unless `constant` is asked for (the file's value is not checked further).
        let arrival = match self.arrival.as_deref().or(file.arrival.as_deref()) {
            None | Some("poisson") => Arrival::Poisson,
            Some(_) => Arrival::Constant,
        };
        Ok(LoadChoice {
            concurrency,
            rate,
            schedule,
            recorded_schedule,
            speed,
            arrival,
        })
    }

    /// The link's TLS, token (required off loopback) and timings.
    fn link_settings(&self, source: &WorkerSource) -> anyhow::Result<LinkSettings> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(LinkTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_ca.clone(),
            }),
            _ => None,
        };
        // An empty or blank token is no token.
        let token = self
            .token
            .as_deref()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        if let WorkerSource::Remote { listen, .. } = source {
            let loopback = listen_is_loopback(listen)?;
            match &token {
                None if !loopback => bail!(
                    "--listen {listen}: a --token (or LLM_REPLAY_TOKEN) is required when workers may join from other hosts"
                ),
                Some(t) if !loopback && t.chars().count() < MIN_TOKEN_CHARS => bail!(
                    "--listen {listen}: the token is {} characters; use at least {MIN_TOKEN_CHARS} when workers may join from other hosts (e.g. `openssl rand -hex 16`)",
                    t.chars().count()
                ),
                _ => {}
            }
        } else if tls.is_some() {
            bail!("--tls-cert secures remote workers: use it with --listen and --expect-workers");
        }
        let max_skew = duration_arg("--max-skew", &self.max_skew)?;
        let join_timeout = positive_duration_arg("--join-timeout", &self.join_timeout)?;
        let heartbeat_timeout =
            positive_duration_arg("--heartbeat-timeout", &self.heartbeat_timeout)?;
        let metrics_linger = duration_arg("--metrics-linger", &self.metrics_linger)?;
        if metrics_linger > Duration::from_secs(86_400) {
            bail!("--metrics-linger {:?}: at most a day", self.metrics_linger);
        }
        if heartbeat_timeout > Duration::from_secs(86_400) {
            bail!("--heartbeat-timeout must be at most a day");
        }
        Ok(LinkSettings {
            tls,
            token,
            max_skew,
            join_timeout,
            heartbeat_timeout,
            metrics_linger,
        })
    }

    /// The target (checked) and how to reach it: CA files, `--insecure`, h2c, SigV4.
    fn target_transport(
        &self,
        file: &FileConfig,
    ) -> anyhow::Result<(Option<String>, TargetTransport)> {
        let target = self.target.clone().or_else(|| file.target.clone());
        let target_h2c = self.target_h2c || file.target_h2c.unwrap_or(false);
        if let Some(target) = &target {
            check_target(target, target_h2c)?;
        }
        let mut ca_pem = Vec::new();
        for path in file.target_ca.iter().chain(&self.target_ca) {
            ca_pem.push(read_target_ca(path)?);
        }
        let aws_sigv4_region = self.aws_sigv4.clone().or_else(|| file.aws_sigv4.clone());
        if aws_sigv4_region
            .as_deref()
            .is_some_and(|r| r.trim().is_empty())
        {
            bail!("--aws-sigv4 needs a region, e.g. us-east-1");
        }
        let transport = TargetTransport {
            ca_pem,
            insecure: self.insecure || file.insecure.unwrap_or(false),
            h2c: target_h2c,
            aws_sigv4_region,
        };
        Ok((target, transport))
    }

    /// What to scrape of the server's side: the target's `/metrics`, other endpoints with
    /// their headers, and how often.
    fn server_metrics_options(&self, file: &FileConfig) -> anyhow::Result<ServerMetricsOptions> {
        let no_server_metrics = self.no_server_metrics || file.no_server_metrics.unwrap_or(false);
        let mut extra_metrics = file.server_metrics.clone();
        extra_metrics.extend(self.server_metrics.iter().cloned());
        if no_server_metrics && !extra_metrics.is_empty() {
            bail!("--no-server-metrics and --server-metrics are exclusive");
        }
        for url in &extra_metrics {
            check_metrics_url(url)?;
        }
        let mut extra_headers = Vec::new();
        for text in file
            .server_metrics_headers
            .iter()
            .chain(&self.server_metrics_headers)
        {
            extra_headers.push(server_metrics_header(text)?);
        }
        if !extra_headers.is_empty() && extra_metrics.is_empty() {
            bail!(
                "--server-metrics-header: no --server-metrics endpoint to send it to (the \
                     target's own /metrics gets the --header values)"
            );
        }
        let metrics_interval = match self
            .server_metrics_interval
            .as_deref()
            .or(file.server_metrics_interval.as_deref())
        {
            Some(text) => {
                let interval = positive_duration_arg("--server-metrics-interval", text)?;
                if interval < MIN_SERVER_METRICS_INTERVAL {
                    bail!("--server-metrics-interval {text:?}: at least 10ms");
                }
                interval
            }
            None => Duration::from_secs(1),
        };
        let server_metrics = ServerMetricsOptions {
            target: !no_server_metrics,
            extra: extra_metrics,
            extra_headers,
            interval: metrics_interval,
        };
        Ok(server_metrics)
    }
}

/// Validate the faithful-replay options.
fn faithful_options(
    pin: Option<PinSetting>,
    session_mode: Option<String>,
    sample: Option<f64>,
    seed: Option<u64>,
) -> anyhow::Result<FaithfulOptions> {
    let pin = match pin {
        None | Some(PinSetting::On(false)) => None,
        Some(PinSetting::On(true)) => Some(PinMode::Max),
        Some(PinSetting::Mode(name)) => Some(PinMode::from_name(&name).ok_or_else(|| {
            anyhow::anyhow!("--pin-output-length={name:?}: expected max or strict")
        })?),
    };
    let closed_sessions = match session_mode.as_deref() {
        None | Some("open") => false,
        Some("closed") => true,
        Some(other) => bail!("--session-mode {other:?}: expected open or closed"),
    };
    let sample = match sample {
        None => None,
        Some(fraction) if fraction.is_finite() && fraction > 0.0 && fraction <= 1.0 => {
            Some(SessionSample {
                fraction,
                seed: seed.unwrap_or(0),
            })
        }
        Some(fraction) => bail!(
            "--sample-sessions {fraction}: expected a fraction above 0 and at most 1 (e.g. 0.25)"
        ),
    };
    Ok(FaithfulOptions {
        pin,
        closed_sessions,
        sample,
    })
}

impl From<ReportFileArgs> for ReportFiles {
    fn from(args: ReportFileArgs) -> ReportFiles {
        ReportFiles {
            report_json: args.report_json,
            report_md: args.report_md,
            report_html: args.report_html,
            junit: args.junit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn config(args: &[&str]) -> anyhow::Result<RunConfig> {
        let mut all = vec!["llm-replay", "rec.jsonl"];
        all.extend_from_slice(args);
        TestCli::try_parse_from(all)
            .expect("the arguments parse")
            .run
            .into_config(false)
    }

    fn error(args: &[&str]) -> String {
        match config(args) {
            Ok(_) => panic!("{args:?} was accepted"),
            Err(error) => format!("{error:#}"),
        }
    }

    /// Issue 32: a search sets each probe's load, so a recording without arrival times
    /// gets no implicit closed loop of 1 (a rate probe is an open loop); `--concurrency N`
    /// with `--find-max concurrency` is the first load, within the range.
    #[test]
    fn a_search_has_no_implicit_closed_loop_and_starts_at_the_given_concurrency() {
        let goal = ["--fail-if", "llm.ttft-p95 > 60"];
        let plain = config(&[]).expect("valid");
        assert_eq!(
            plain.load.concurrency,
            Some(1),
            "a plain run's closed loop of 1"
        );
        let rate = config(&[&["--find-max", "rate"][..], &goal].concat()).expect("valid");
        assert_eq!(rate.load.concurrency, None);
        let capped = config(&[&["--find-max", "rate", "--concurrency", "4"][..], &goal].concat())
            .expect("valid");
        assert_eq!(
            capped.load.concurrency,
            Some(4),
            "a cap the user gave stays"
        );
        let start = config(
            &[
                &["--find-max", "concurrency", "--concurrency", "8"][..],
                &goal,
            ]
            .concat(),
        )
        .expect("valid");
        assert_eq!(start.find_max.expect("search").start, 8.0);
        let message = error(
            &[
                &[
                    "--find-max",
                    "concurrency",
                    "--find-max-range",
                    "1:64",
                    "--concurrency",
                    "100",
                ][..],
                &goal,
            ]
            .concat(),
        );
        assert!(
            message.contains("first load") && message.contains("1:64"),
            "{message}"
        );
    }

    /// The implicit closed loop is one stream a worker: three local workers hold three
    /// streams, and the report's concurrency says three (it said 1 while three ran).
    #[test]
    fn the_implicit_closed_loop_is_one_stream_a_worker() {
        let three = config(&["--workers", "3"]).expect("valid");
        assert_eq!(three.load.concurrency, Some(3));
        let capped = config(&["--workers", "3", "--concurrency", "6"]).expect("valid");
        assert_eq!(
            capped.load.concurrency,
            Some(6),
            "a cap the user gave stays"
        );
    }

    #[test]
    fn cancel_rate_and_delay_are_checked() {
        let off = config(&[]).expect("valid");
        assert_eq!(off.cancel, common::assignment::CancelOptions::default());
        let half = config(&["--cancel-rate", "50%", "--seed", "9"]).expect("valid");
        assert_eq!(half.cancel.rate_pct, 50.0);
        assert_eq!(half.cancel.after, Duration::ZERO);
        assert_eq!(half.cancel.seed, 9);
        let later = config(&["--cancel-rate", "12.5", "--cancel-after", "1.5s"]).expect("valid");
        assert_eq!(later.cancel.rate_pct, 12.5);
        assert_eq!(later.cancel.after, Duration::from_millis(1500));
        assert_eq!(later.request_options().cancel, later.cancel);
        for bad in ["101", "-1", "x", "NaN", "50%%"] {
            let message = error(&[&format!("--cancel-rate={bad}")]);
            assert!(
                message.contains("--cancel-rate") && message.contains("0 to 100"),
                "{bad}: {message}"
            );
        }
        let message = error(&["--cancel-after", "2s"]);
        assert!(message.contains("needs --cancel-rate"), "{message}");
        let message = error(&["--cancel-rate", "5", "--cancel-after", "soon"]);
        assert!(message.starts_with("--cancel-after"), "{message}");
    }

    #[test]
    fn cancel_options_and_the_tokenizer_come_from_a_config_file_too() {
        let dir = std::env::temp_dir().join(format!("llm-replay-cancel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let yaml = dir.join("run.yaml");
        std::fs::write(
            &yaml,
            "cancel-rate: \"25%\"\ncancel-after: 100ms\nseed: 3\n",
        )
        .expect("write");
        let from_file = config(&["--config", yaml.to_str().expect("utf-8")]).expect("valid");
        assert_eq!(from_file.cancel.rate_pct, 25.0);
        assert_eq!(from_file.cancel.after, Duration::from_millis(100));
        assert_eq!(from_file.cancel.seed, 3);
        let toml = dir.join("run.toml");
        std::fs::write(&toml, "cancel-rate = 10\n").expect("write");
        let from_toml = config(&["--config", toml.to_str().expect("utf-8")]).expect("valid");
        assert_eq!(from_toml.cancel.rate_pct, 10.0);

        // A tokenizer that is not there, or not a tokenizer, is an error naming the file.
        let missing = dir.join("missing-tokenizer.json");
        let message = error(&["--tokenizer", missing.to_str().expect("utf-8")]);
        assert!(
            message.starts_with("--tokenizer ") && message.contains("missing-tokenizer.json"),
            "{message}"
        );
        let bad = dir.join("bad-tokenizer.json");
        std::fs::write(&bad, "{\"not\": \"a tokenizer\"}").expect("write");
        let message = error(&["--tokenizer", bad.to_str().expect("utf-8")]);
        assert!(message.contains("bad-tokenizer.json"), "{message}");
        let yaml = dir.join("tok.yaml");
        std::fs::write(&yaml, format!("tokenizer: {}\n", bad.display())).expect("write");
        let message = error(&["--config", yaml.to_str().expect("utf-8")]);
        assert!(message.contains("bad-tokenizer.json"), "{message}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn loopback_is_decided_on_the_resolved_address() {
        for listen in [
            "127.0.0.1:7000",
            "127.8.9.10:7000",
            "[::1]:7000",
            "[::ffff:127.0.0.1]:7000",
            "localhost:7000",
        ] {
            assert!(
                listen_is_loopback(listen).expect("resolves"),
                "{listen} is loopback"
            );
        }
        for listen in [
            "0.0.0.0:7000",
            "[::]:7000",
            "10.0.0.1:7000",
            "[2001:db8::1]:7000",
        ] {
            assert!(
                !listen_is_loopback(listen).expect("an address"),
                "{listen} is not loopback"
            );
        }
        // A name that starts like a loopback address is whatever it resolves to; `.example`
        // never resolves, which is an error naming it (never "loopback").
        let error = listen_is_loopback("127.evil.example:7000").expect_err("does not resolve");
        assert!(
            format!("{error:#}").contains("127.evil.example:7000"),
            "{error:#}"
        );
        assert!(listen_is_loopback("no-port").is_err());
    }

    #[test]
    fn a_listen_address_that_is_not_loopback_needs_a_token() {
        let needs_token = error(&["--listen", "127.evil.example:7000", "--expect-workers", "1"]);
        assert!(
            needs_token.contains("127.evil.example:7000"),
            "{needs_token}"
        );
        let needs_token = error(&["--listen", "0.0.0.0:7000", "--expect-workers", "1"]);
        assert!(needs_token.contains("--token"), "{needs_token}");
        for listen in ["localhost:7000", "127.0.0.1:0", "[::1]:0"] {
            let config = config(&["--listen", listen, "--expect-workers", "1"])
                .unwrap_or_else(|e| panic!("{listen}: {e:#}"));
            assert!(config.token.is_none());
        }
    }

    #[test]
    fn a_header_value_with_a_control_character_is_refused_without_showing_it() {
        for value in ["b\u{1}c", "b\rX-Injected: 1", "b\nc", "b\u{7f}", "sécret"] {
            let header = format!("x-api-key: secret-{value}");
            let message = error(&["--header", &header]);
            assert!(message.contains("x-api-key"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
        let config = config(&["--header", "x-api-key: a\tb ${KEY}"]).expect("visible ASCII");
        assert_eq!(
            config.headers,
            [("x-api-key".to_owned(), "a\tb ${KEY}".to_owned())]
        );
    }

    #[test]
    fn local_workers_are_bounded() {
        let limit = max_local_workers();
        assert!(limit >= 64);
        let message = error(&["--workers", "100000"]);
        assert!(message.contains(&limit.to_string()), "{message}");
        assert!(message.contains("--listen"), "{message}");
        let at_limit = limit.to_string();
        let config = config(&["--workers", &at_limit, "--rate", "10", "--duration", "1s"])
            .expect("the limit itself is fine");
        assert_eq!(config.workers, limit);
    }

    #[test]
    fn never_more_local_workers_than_exchanges_to_give() {
        // `--requests` is known at parse.
        let fitted = config(&["--workers", "8", "--rate", "10", "--requests", "3"]).expect("ok");
        assert_eq!(
            (fitted.workers, fitted.source.clone()),
            (3, WorkerSource::Local(3))
        );
        // The recording's count, once scanned.
        let mut fitted = config(&["--workers", "8", "--rate", "10"]).expect("ok");
        assert_eq!(fitted.fit_workers_to(5), Some(8));
        assert_eq!(fitted.source, WorkerSource::Local(5));
        assert_eq!(fitted.fit_workers_to(5), None);
        // An open-ended run loops the recording: every worker gets exchanges.
        let mut open = config(&["--workers", "8", "--rate", "10", "--duration", "5s"]).expect("ok");
        assert_eq!(open.fit_workers_to(2), None);
        assert_eq!(open.workers, 8);
    }
}
