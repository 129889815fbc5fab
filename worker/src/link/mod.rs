//! The worker's gRPC link to the coordinator, the protocol boundary of the worker: connect,
//! say hello, answer the token challenge, take the assignment (converted and checked by
//! `proto::convert::assignment_from_proto`, then turned into a `ReplayConfig`), open the slice
//! stream, and from then on turn every protocol message into a `session::CoordinatorEvent`
//! and every `session::ToCoordinator` into a protocol message. What a worker does in a run
//! (wait for the start, load, report, stop) is the `session` actor's.
//!
//! The link runs on its own runtime (see `cli`), apart from the load: heartbeats and aborts
//! are never starved by thousands of open streams.

mod join;
mod level;
mod session;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::assignment::Assignment;
use common::metrics::HistogramEncoding;
use proto::convert::AssignmentError;
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::mpsc;

use crate::config::{ReplayConfig, TransportConfig, WorkItem};
use crate::request::expand_headers;
use crate::sigv4::SigV4Signer;

pub use session::{CoordinatorEvent, Session, SessionHandle, ToCoordinator};

/// How the link behaves.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// `host:port` of the coordinator (or a full `http://` URL).
    pub coordinator: String,
    pub worker_id: String,
    pub host: String,
    pub token: Option<String>,
    /// Give up connecting after this long.
    pub connect_patience: Duration,
    /// The coordinator is lost after this long without any message from it, until the
    /// assignment gives the run's own (which then governs the session).
    pub heartbeat_timeout: Duration,
    /// Interval between reports (and heartbeats).
    pub report_interval: Duration,
    /// TLS to the coordinator (`https`), with a client certificate for mutual TLS.
    pub tls: Option<ClientTls>,
    /// What the health endpoint reports.
    pub health: Arc<HealthState>,
    /// Environment variables the coordinator's assignment may expand (`--allow-env`).
    pub allow_env: Vec<String>,
}

/// TLS settings of the link.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// PEM CA bundle that signed the coordinator's certificate.
    pub ca: PathBuf,
    /// PEM client certificate and key, for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// The worker's state as the health port shows it.
#[derive(Debug, Default)]
pub struct HealthState {
    /// 0 connecting, 1 joined (waiting for start), 2 running, 3 finished.
    pub phase: std::sync::atomic::AtomicU8,
}

impl HealthState {
    /// The phase as a word.
    pub fn phase_name(&self) -> &'static str {
        match self.phase.load(std::sync::atomic::Ordering::Relaxed) {
            0 => "connecting",
            1 => "joined",
            2 => "running",
            _ => "finished",
        }
    }

    fn set(&self, phase: u8) {
        self.phase
            .store(phase, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Why a run ended badly for this worker.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("could not reach the coordinator at {addr} within {patience:?}: {source}")]
    Connect {
        addr: String,
        patience: Duration,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("could not join the coordinator at {addr} within {patience:?}: {reason}")]
    Join {
        addr: String,
        patience: Duration,
        reason: String,
    },
    #[error("invalid coordinator address {0:?}")]
    Address(String),
    #[error("the coordinator refused this worker: {0}")]
    Refused(String),
    #[error("not trusted, nothing sent and nothing run: {0}")]
    Untrusted(String),
    #[error("the coordinator went away ({0}); stopped issuing requests")]
    CoordinatorLost(String),
    #[error("the coordinator aborted the run: {0}")]
    Aborted(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("protocol error: {0}")]
    Assignment(#[from] AssignmentError),
    #[error(transparent)]
    Header(#[from] crate::request::HeaderTemplateError),
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    #[error(transparent)]
    SigV4(#[from] crate::sigv4::SigV4Error),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokens::TokenizerLoadError),
    #[error("TLS: {path}: {source}")]
    TlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(#[source] tonic::transport::Error),
}

/// The coordinator is gone: say when it was noticed, so a log can show no request after it.
fn coordinator_lost(reason: &str) -> LinkError {
    LinkError::CoordinatorLost(format!(
        "{reason}; noticed at unix ms {}",
        unix_ns() / 1_000_000
    ))
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn endpoint_url(addr: &str, tls: bool) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, LinkError> {
    std::fs::read(path).map_err(|source| LinkError::TlsFile {
        path: path.to_path_buf(),
        source,
    })
}

async fn connect(
    options: &LinkOptions,
) -> Result<CoordinatorClient<tonic::transport::Channel>, LinkError> {
    let url = endpoint_url(&options.coordinator, options.tls.is_some());
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|_| LinkError::Address(options.coordinator.clone()))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        // HTTP/2 pings every second the link is quiet keep its path open (NAT, load
        // balancers) from this side too. Giving up on the coordinator is the heartbeat
        // timeout's call — the run's, from the assignment, which may be longer than this
        // worker's own — so an unanswered ping waits as long as any heartbeat timeout can.
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(KEEPALIVE_TIMEOUT.max(options.heartbeat_timeout))
        .keep_alive_while_idle(true);
    if let Some(tls) = &options.tls {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read_pem(&tls.ca)?));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(tonic::transport::Identity::from_pem(
                read_pem(cert)?,
                read_pem(key)?,
            ));
        }
        endpoint = endpoint.tls_config(config).map_err(LinkError::Tls)?;
    }
    let give_up = Instant::now() + options.connect_patience;
    let mut backoff = Duration::from_millis(50);
    loop {
        match endpoint.connect().await {
            Ok(channel) => {
                return Ok(
                    CoordinatorClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
                );
            }
            Err(source) if Instant::now() + backoff >= give_up => {
                return Err(LinkError::Connect {
                    addr: options.coordinator.clone(),
                    patience: options.connect_patience,
                    source,
                });
            }
            Err(error) => {
                tracing::debug!(%error, "coordinator not reachable yet; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Every environment variable the assignment would read (`${VAR}` in headers, the AWS
/// credentials for `--aws-sigv4`) must be allowed by this worker's `--allow-env`: a
/// coordinator cannot make a worker send its environment anywhere.
fn check_allowed_env(assignment: &Assignment, allowed: &[String]) -> Result<(), LinkError> {
    // Optional variables (AWS_SESSION_TOKEN) are read only when allowed.
    let wanted = assignment.env_reads().needed;
    match wanted.into_iter().find(|v| !allowed.iter().any(|a| a == v)) {
        None => Ok(()),
        Some(var) => Err(LinkError::Protocol(format!(
            "the run asks this worker to expand ${{{var}}}, which it does not allow: start it with --allow-env {var}"
        ))),
    }
}

/// The engine's configuration from the assignment: headers expanded from the worker's
/// environment (through `lookup`), `--set` values parsed, the SigV4 signer made.
fn replay_config(
    assignment: &Assignment,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ReplayConfig, LinkError> {
    let headers = expand_headers(&assignment.headers, lookup)?;
    let sets = assignment
        .sets
        .iter()
        .map(|(field, value)| {
            let value = serde_json::from_str(value)
                .unwrap_or_else(|_| serde_json::Value::String(value.clone()));
            (field.clone(), value)
        })
        .collect();
    let transport = &assignment.transport;
    Ok(ReplayConfig {
        target: assignment.target.clone(),
        load: assignment.load.clone(),
        headers,
        sets,
        tag_requests: assignment.tag_requests,
        options: assignment.options.clone(),
        tokenizer: match &assignment.options.tokenizer {
            None => None,
            Some(files) => Some(std::sync::Arc::new(crate::tokens::build(files)?)),
        },
        transport: TransportConfig {
            extra_ca_pem: transport.ca_pem.clone(),
            insecure: transport.insecure,
            h2c: transport.h2c,
            sigv4: match &transport.aws_sigv4_region {
                None => None,
                Some(region) => Some(SigV4Signer::from_env(region, lookup)?),
            },
        },
    })
}

/// One exchange of the slice, checked at the edge: its JSON, and a think time that is a
/// duration (finite, not negative, at most ten years).
fn work_item(exchange: v1::Exchange) -> Result<WorkItem, String> {
    let parsed = serde_json::from_slice(&exchange.json)
        .map_err(|error| format!("exchange {}: {error}", exchange.index))?;
    let think = match exchange.think_ms {
        None => None,
        Some(ms) if ms.is_finite() && (0.0..=10.0 * 365.0 * 86_400_000.0).contains(&ms) => {
            Some(Duration::from_secs_f64(ms / 1000.0))
        }
        Some(ms) => {
            return Err(format!(
                "exchange {}: think_ms = {ms}: expected a duration in ms",
                exchange.index
            ));
        }
    };
    let cancel_after = match exchange.cancel_after_ms {
        None => None,
        Some(ms) if ms.is_finite() && (0.0..=10.0 * 365.0 * 86_400_000.0).contains(&ms) => {
            Some(Duration::from_secs_f64(ms / 1000.0))
        }
        Some(ms) => {
            return Err(format!(
                "exchange {}: cancel_after_ms = {ms}: expected a duration in ms",
                exchange.index
            ));
        }
    };
    Ok(WorkItem {
        index: exchange.index,
        exchange: parsed,
        pin_output_tokens: exchange.pin_output_tokens,
        pin_in_frames: exchange.pin_in_frames,
        cancel_after,
        think,
        reassigned: exchange.reassigned,
    })
}

/// A message of the coordinator as the session sees it; `received_unix_ns` is when it was
/// read (the clock is taken at the edge, before anything else).
fn event_from_proto(message: v1::CoordinatorMessage, received_unix_ns: u64) -> CoordinatorEvent {
    use v1::coordinator_message::Msg;
    match message.msg {
        Some(Msg::Start(start)) => CoordinatorEvent::Start {
            start_unix_ns: start.start_unix_ns,
        },
        Some(Msg::ClockPing(ping)) => CoordinatorEvent::ClockPing {
            seq: ping.seq,
            coordinator_send_unix_ns: ping.coordinator_send_unix_ns,
            received_unix_ns,
        },
        Some(Msg::Abort(abort)) => CoordinatorEvent::Abort {
            reason: abort.reason,
        },
        Some(Msg::Finish(_)) => CoordinatorEvent::Finish,
        Some(Msg::Grant(grant)) => CoordinatorEvent::Grant {
            own_prefix: grant.own_prefix,
        },
        // A heartbeat, or anything this late in the run that means nothing but "alive".
        Some(
            Msg::Heartbeat(_)
            | Msg::Assignment(_)
            | Msg::Refused(_)
            | Msg::Challenge(_)
            | Msg::Done(_)
            | Msg::Sealed(_),
        )
        | None => CoordinatorEvent::Alive,
    }
}

/// The protocol message of a session's message. A clock pong's send time is stamped here,
/// as it goes to the wire.
/// `plain`: histograms in plain V2 (the assignment said the coordinator reads it).
fn message_to_proto(message: ToCoordinator, plain: bool) -> v1::WorkerMessage {
    use v1::worker_message::Msg;
    let msg = match message {
        ToCoordinator::ClockPong {
            seq,
            coordinator_send_unix_ns,
            worker_receive_unix_ns,
        } => Msg::ClockPong(v1::ClockPong {
            seq,
            coordinator_send_unix_ns,
            worker_receive_unix_ns,
            worker_send_unix_ns: unix_ns(),
        }),
        ToCoordinator::Started { unix_ns } => Msg::Started(v1::Started { unix_ns }),
        ToCoordinator::Records(records) => Msg::Records(v1::RequestRecords {
            records: records
                .into_iter()
                .map(proto::convert::record_to_proto)
                .collect(),
        }),
        ToCoordinator::Report(report) => Msg::Report(proto::convert::report_to_proto_as(
            &report,
            if plain {
                HistogramEncoding::Plain
            } else {
                HistogramEncoding::Deflate
            },
        )),
        ToCoordinator::Heartbeat { unix_ns } => Msg::Heartbeat(v1::Heartbeat { unix_ns }),
        ToCoordinator::Failed { reason } => Msg::Failed(v1::WorkerFailed { reason }),
        ToCoordinator::Claim { own_prefix } => Msg::Claim(v1::Claim { own_prefix }),
    };
    v1::WorkerMessage { msg: Some(msg) }
}

/// Tells the coordinator why this worker leaves, and lets the message reach the wire: the
/// outbound stream is ended (not dropped, which would lose what is queued) and the worker
/// waits, at most a second, for the coordinator's side to end.
async fn leave_saying(
    handshake_tx: mpsc::Sender<v1::WorkerMessage>,
    out_tx: mpsc::Sender<ToCoordinator>,
    inbound: &mut tonic::Streaming<v1::CoordinatorMessage>,
    reason: String,
) {
    let _ = handshake_tx
        .send(v1::WorkerMessage {
            msg: Some(v1::worker_message::Msg::Failed(v1::WorkerFailed { reason })),
        })
        .await;
    drop(handshake_tx);
    drop(out_tx);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
}

/// How long an HTTP/2 ping of the link may go unanswered: a day, the longest heartbeat
/// timeout a run may give (the session's heartbeat timeout closes the link long before).
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Messages of the join handshake waiting for the stream (hello, challenge answer, failure).
const HANDSHAKE_CAPACITY: usize = 4;

/// Messages of the session waiting for the stream: a report waits when it is full (gRPC's
/// flow control reaches the session), a pong or heartbeat is dropped.
const OUTBOUND_CAPACITY: usize = 64;

/// Join the coordinator once and take part in one run: every level of it (a sweep's levels,
/// a capacity search's probes), each an assignment on the same stream, until the coordinator
/// says the run is over (`Done`). `load` is the runtime that carries the load (the link
/// itself runs on the caller's runtime). `on_joined` is called with each level's run id once
/// the worker has taken that level's assignment.
pub async fn run_once(
    options: &LinkOptions,
    load: tokio::runtime::Handle,
    on_joined: &mut dyn FnMut(&str),
) -> Result<(), LinkError> {
    let mut link = join::join(options).await?;
    let mut next = link.first.take();
    loop {
        let assignment = match next.take() {
            Some(assignment) => assignment,
            None => match link.next_assignment().await? {
                Some(assignment) => assignment,
                None => return Ok(()),
            },
        };
        level::run_level(options, &load, &mut link, *assignment, on_joined).await?;
    }
}
