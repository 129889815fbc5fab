//! The scraper: one tokio task that probes every endpoint, scrapes those that answered
//! Prometheus text every interval, and once more when asked to finish.
//!
//! Each round fetches every live endpoint concurrently, each fetch bounded by
//! [`request_timeout`] (the interval, but at least 1 s and at most 5 s: a scrape never
//! outlives the next tick by much, a slow exporter still gets a second, and a hung one
//! cannot hold `finish` for long). A round in progress when `finish` is called is
//! abandoned for the final one, so `finish` returns within one timeout (plus what is
//! left of the probe, which doubles as the final scrape when `finish` comes first).
//! Ticks missed during a slow round are skipped, not bunched.
//!
//! TLS trusts what the workers trust for the target: Mozilla's roots, the `--target-ca`
//! PEM contents (also as pinned end certificates, as `worker::client` does), or nothing
//! with `--insecure`. A redirect is followed within the endpoint's origin only (at most 3):
//! an endpoint's headers may carry the target's credentials, which must not reach another
//! origin; a redirect elsewhere is the answer, named with its Location in the note.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::assignment::TargetTransport;
use common::recording::redact_url;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use super::parse::{self, ParseError};
use super::{EndpointLog, Families, Round, ScrapeLog};

/// The largest body read from an endpoint (4 MiB; vLLM's is about 100 KiB): a larger one
/// is an error, so a hostile endpoint cannot exhaust memory.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// One endpoint to scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeEndpoint {
    /// Its URL (`http(s)://host:port/metrics`).
    pub url: String,
    /// Headers sent with each scrape (the caller decides: the target's credentials only to
    /// the target's own origin, `--server-metrics-header`s to the other endpoints), never
    /// across a redirect to another origin.
    pub headers: Vec<(String, String)>,
    /// The target's own `/metrics`: its token counters count the run's own requests and
    /// nothing else's when it is one server ([`super::ScrapeLog::section_against`]).
    pub target: bool,
    /// Appended to the note when the endpoint fails its probe (a path-prefixed target's
    /// `<prefix>/metrics`, [`super::prefix_hint`]).
    pub hint: Option<String>,
}

impl ScrapeEndpoint {
    /// An endpoint that is not the target's, without a hint.
    pub fn new(url: impl Into<String>, headers: Vec<(String, String)>) -> ScrapeEndpoint {
        ScrapeEndpoint {
            url: url.into(),
            headers,
            target: false,
            hint: None,
        }
    }
}

/// How the scraper's HTTP client trusts servers: as the workers do for the target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrapeClientOptions {
    /// PEM contents of the `--target-ca` files.
    pub ca_pem: Vec<String>,
    /// `--insecure`: no certificate verification.
    pub insecure: bool,
}

impl From<&TargetTransport> for ScrapeClientOptions {
    fn from(transport: &TargetTransport) -> ScrapeClientOptions {
        ScrapeClientOptions {
            ca_pem: transport.ca_pem.clone(),
            insecure: transport.insecure,
        }
    }
}

/// The time limit of one scrape for a scrape `interval`: the interval, clamped to 1..=5 s.
pub fn request_timeout(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(1), Duration::from_secs(5))
}

/// A running scraper; [`Scraper::finish`] stops it and hands over the log. Dropping it
/// without finishing aborts the task.
#[derive(Debug)]
pub struct Scraper {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<ScrapeLog>>,
    /// Asks the task for a round now and a copy of its log ([`Scraper::snapshot`]).
    snapshots: mpsc::Sender<oneshot::Sender<ScrapeLog>>,
}

impl Scraper {
    /// Spawn the scraping task (on the current tokio runtime): probe each endpoint now,
    /// then scrape the ones that answered Prometheus text every `interval` (at least
    /// 10 ms). Returns at once.
    pub fn start(
        endpoints: Vec<ScrapeEndpoint>,
        interval: Duration,
        client: &ScrapeClientOptions,
    ) -> Scraper {
        let (stop, stopped) = oneshot::channel();
        let (snapshots, asked) = mpsc::channel(1);
        let client = build_client(client);
        let interval = interval.max(Duration::from_millis(10));
        let task = tokio::spawn(run(endpoints, interval, client, stopped, asked));
        Scraper {
            stop: Some(stop),
            task: Some(task),
            snapshots,
        }
    }

    /// Scrape every live endpoint now and return a copy of the log so far (for a window
    /// that just ended while the scraper goes on: a capacity probe's goals). `None` when
    /// the task has ended (every endpoint dropped, or the client could not be built): the
    /// log [`Scraper::finish`] returns says why.
    pub async fn snapshot(&self) -> Option<ScrapeLog> {
        let (reply, answer) = oneshot::channel();
        self.snapshots.send(reply).await.ok()?;
        answer.await.ok()
    }

    /// Scrape each live endpoint once more, stop, and return everything scraped.
    pub async fn finish(mut self) -> ScrapeLog {
        if let Some(stop) = self.stop.take() {
            // An error means the task ended already (every endpoint was dropped).
            let _ = stop.send(());
        }
        let Some(task) = self.task.take() else {
            return ScrapeLog::default();
        };
        match task.await {
            Ok(log) => log,
            Err(error) => {
                tracing::warn!(%error, "the server-metrics scraper ended abnormally");
                ScrapeLog::default()
            }
        }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Why one scrape failed (shown after the endpoint's URL in a note).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum ScrapeFailure {
    #[error("no Prometheus metrics (HTTP {0})")]
    Status(u16),
    #[error(
        "no Prometheus metrics (HTTP {0}: the endpoint asks for credentials; give them with \
         --server-metrics-header 'Authorization: Bearer ${{KEY}}' for a --server-metrics \
         endpoint, or --header for the target's own /metrics)"
    )]
    Credentials(u16),
    #[error(
        "no Prometheus metrics (HTTP {status} to {location}: not followed, as it leaves the \
         endpoint's origin or redirects more than 3 times, so no credentials go there; scrape \
         it with --server-metrics {location} if it is the server's)"
    )]
    Redirect { status: u16, location: String },
    #[error("answered {0}, not Prometheus text")]
    ContentType(String),
    #[error("not Prometheus text: {0}")]
    Parse(#[source] ParseError),
    #[error("answered more than {} MiB", MAX_BODY_BYTES >> 20)]
    TooLarge,
    #[error("could not be fetched: {0}")]
    Unreachable(String),
}

/// One fetch's outcome: the instant its read returned, its families and which replica
/// answered as far as its labels say (`parse::replica_identity`).
type Fetched = Result<(SystemTime, Families, Option<String>), (SystemTime, ScrapeFailure)>;

/// The task: probe, scrape every interval until told to stop, scrape once more.
async fn run(
    endpoints: Vec<ScrapeEndpoint>,
    interval: Duration,
    client: Result<reqwest::Client, String>,
    mut stop: oneshot::Receiver<()>,
    mut asked: mpsc::Receiver<oneshot::Sender<ScrapeLog>>,
) -> ScrapeLog {
    let mut log = ScrapeLog {
        endpoints: endpoints
            .iter()
            .map(|endpoint| EndpointLog {
                url: redact_url(&endpoint.url),
                target: endpoint.target,
                ..EndpointLog::default()
            })
            .collect(),
        rounds: Vec::new(),
    };
    let client = match client {
        Ok(client) => client,
        Err(error) => {
            for endpoint in &mut log.endpoints {
                endpoint.note = Some(format!("{}: {error}", endpoint.url));
            }
            return log;
        }
    };
    let endpoints: Arc<[ScrapeEndpoint]> = endpoints.into();
    let timeout = request_timeout(interval);
    let mut live: Vec<usize> = (0..endpoints.len()).collect();

    let (results, stopped) = {
        let probe = fetch_round(&client, &endpoints, &live, timeout);
        tokio::pin!(probe);
        tokio::select! {
            results = &mut probe => (results, false),
            _ = &mut stop => (probe.await, true),
        }
    };
    let hints: Vec<Option<String>> = endpoints.iter().map(|e| e.hint.clone()).collect();
    record(&mut log, results, Some(&mut live), &hints);
    if stopped || live.is_empty() {
        return log;
    }

    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reply = tokio::select! {
            biased;
            _ = &mut stop => break,
            reply = asked.recv() => reply,
            _ = ticker.tick() => None,
        };
        let results = tokio::select! {
            biased;
            _ = &mut stop => break,
            results = fetch_round(&client, &endpoints, &live, timeout) => results,
        };
        record(&mut log, results, None, &[]);
        if let Some(reply) = reply {
            // The asker may have gone: nothing to do then.
            let _ = reply.send(log.clone());
        }
    }
    let results = fetch_round(&client, &endpoints, &live, timeout).await;
    record(&mut log, results, None, &[]);
    log
}

/// Add one round's results to the log; on the probe (`live` given), drop the endpoints
/// that failed, with a note.
fn record(
    log: &mut ScrapeLog,
    results: Vec<(usize, Fetched)>,
    mut live: Option<&mut Vec<usize>>,
    hints: &[Option<String>],
) {
    let mut values: Vec<Option<Families>> = vec![None; log.endpoints.len()];
    let mut replicas: Vec<Option<String>> = vec![None; log.endpoints.len()];
    let mut failed = Vec::new();
    let mut at = None;
    for (index, result) in results {
        let Some(endpoint) = log.endpoints.get_mut(index) else {
            continue;
        };
        match result {
            Ok((read_at, families, replica)) => {
                at = Some(at.map_or(read_at, |at: SystemTime| at.max(read_at)));
                values[index] = Some(families);
                replicas[index] = replica;
            }
            Err((failed_at, failure)) => {
                failed.push((index, failed_at));
                if let Some(live) = live.as_deref_mut() {
                    tracing::info!(url = %endpoint.url, %failure, "server metrics: endpoint dropped");
                    let hint = hints.get(index).cloned().flatten();
                    endpoint.note = Some(match hint {
                        Some(hint) => format!("{}: {failure}; {hint}", endpoint.url),
                        None => format!("{}: {failure}", endpoint.url),
                    });
                    live.retain(|&live| live != index);
                } else {
                    tracing::debug!(url = %endpoint.url, %failure, "server metrics: scrape failed");
                }
            }
        }
    }
    // A failure counts at its round's instant, so a window that uses the round counts it.
    for (index, failed_at) in failed {
        if let Some(endpoint) = log.endpoints.get_mut(index) {
            endpoint.errors.push(at.unwrap_or(failed_at));
        }
    }
    if let Some(at) = at {
        log.rounds.push(Round {
            at,
            values,
            replicas,
        });
    }
}

/// Fetch every endpoint of `live` concurrently. Dropping the future aborts the fetches.
async fn fetch_round(
    client: &reqwest::Client,
    endpoints: &Arc<[ScrapeEndpoint]>,
    live: &[usize],
    timeout: Duration,
) -> Vec<(usize, Fetched)> {
    let mut fetches = JoinSet::new();
    for &index in live {
        let client = client.clone();
        let endpoints = Arc::clone(endpoints);
        fetches.spawn(async move {
            let result =
                match tokio::time::timeout(timeout, fetch(&client, &endpoints[index])).await {
                    Ok(result) => result,
                    Err(_) => Err((
                        SystemTime::now(),
                        ScrapeFailure::Unreachable(format!(
                            "no answer within {} ms",
                            timeout.as_millis()
                        )),
                    )),
                };
            (index, result)
        });
    }
    let mut results = Vec::with_capacity(live.len());
    while let Some(joined) = fetches.join_next().await {
        match joined {
            Ok(result) => results.push(result),
            Err(error) => tracing::warn!(%error, "server metrics: a scrape task ended abnormally"),
        }
    }
    results.sort_by_key(|(index, _)| *index);
    results
}

/// One scrape: GET, check status and content type, read at most [`MAX_BODY_BYTES`],
/// take the clock, parse.
async fn fetch(client: &reqwest::Client, endpoint: &ScrapeEndpoint) -> Fetched {
    let failed = |failure| Err((SystemTime::now(), failure));
    let mut request = client.get(&endpoint.url).header(
        reqwest::header::ACCEPT,
        "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    );
    for (name, value) in &endpoint.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            return failed(ScrapeFailure::Unreachable(error_chain(
                &error.without_url(),
            )));
        }
    };
    let status = response.status();
    if status.is_redirection()
        && let Some(location) = redirect_location(&response)
    {
        return failed(ScrapeFailure::Redirect {
            status: status.as_u16(),
            location,
        });
    }
    if matches!(status.as_u16(), 401 | 403) {
        return failed(ScrapeFailure::Credentials(status.as_u16()));
    }
    if !status.is_success() {
        return failed(ScrapeFailure::Status(status.as_u16()));
    }
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if content_type.contains("html")
        || content_type.contains("json")
        || content_type.contains("xml")
        || content_type.contains("protobuf")
    {
        return failed(ScrapeFailure::ContentType(content_type));
    }
    if response
        .content_length()
        .is_some_and(|length| length > MAX_BODY_BYTES as u64)
    {
        return failed(ScrapeFailure::TooLarge);
    }
    let mut body: Vec<u8> = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY_BYTES {
                    return failed(ScrapeFailure::TooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(error) => {
                return failed(ScrapeFailure::Unreachable(error_chain(
                    &error.without_url(),
                )));
            }
        }
    }
    // Timestamp at the edge: when the read returned, before parsing.
    let at = SystemTime::now();
    match parse::parse(&body) {
        Ok(exposition) => Ok((
            at,
            parse::reduce(&exposition),
            parse::replica_identity(&exposition),
        )),
        Err(error) => failed(ScrapeFailure::Parse(error)),
    }
}

/// Where a redirect not followed points, resolved against the URL answered, credentials
/// redacted and control characters escaped (it comes from the server).
fn redirect_location(response: &reqwest::Response) -> Option<String> {
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    let resolved = response.url().join(location).ok()?;
    Some(common::text::escape_controls(&redact_url(resolved.as_str())).into_owned())
}

/// An error and its causes on one line (reqwest's own message names no cause).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The HTTP client: rustls with ring, the workers' trust, same-origin redirects only,
/// HTTP/2 by ALPN.
fn build_client(options: &ScrapeClientOptions) -> Result<reqwest::Client, String> {
    let tls = tls_config(options)?;
    reqwest::Client::builder()
        .redirect(same_origin_redirects())
        .pool_max_idle_per_host(2)
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|error| format!("could not build the HTTP client: {}", error_chain(&error)))
}

/// At most this many redirects are followed for one scrape.
const MAX_REDIRECTS: usize = 3;

/// Follow a redirect within the same origin (scheme, host and port: LiteLLM's
/// `/metrics` → `/metrics/`), at most [`MAX_REDIRECTS`]; never to another origin, where the
/// endpoint's headers (the target's credentials) must not go: that 3xx is the answer.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .last()
            .is_some_and(|from| same_origin(from, attempt.url()));
        if same && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// True when `a` and `b` have one origin: scheme, host and port.
fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The rustls configuration: the one TLS module's (`common::tls`), with the workers' trust:
/// Mozilla roots plus the extra CAs (each also trusted as a pinned end certificate), or no
/// verification with `insecure`; ALPN `h2` then `http/1.1`.
fn tls_config(options: &ScrapeClientOptions) -> Result<rustls::ClientConfig, String> {
    let trust = common::tls::Trust {
        ca: common::tls::CaPem::numbered("target CA", &options.ca_pem),
        insecure: options.insecure,
    };
    common::tls::client_config(&trust, common::tls::Alpn::H2ThenHttp1)
        .map_err(|error| error.to_string())
}
