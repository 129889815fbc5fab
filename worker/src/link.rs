//! The worker's gRPC link to the coordinator: join, receive the assignment and the slice,
//! start at the coordinator's instant, stream reports, obey aborts, and stop loading the
//! target at once when the coordinator goes away.
//!
//! The link runs on its own runtime (see `cli`), apart from the load: heartbeats and aborts
//! are never starved by thousands of open streams.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proto::convert::{SliceTotals, report_from_metrics};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::client::TargetClient;
use common::formats::pin::PinMode;

use crate::config::{
    Arrival, FaithfulConfig, LoadModel, ReplayConfig, Schedule, TransportConfig, WorkItem,
};
use crate::engine::{self, StartAt};
use crate::metrics_actor::MetricsHandle;
use crate::request::expand_headers;
use crate::sigv4::SigV4Signer;

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
    /// The coordinator is lost after this long without any message from it.
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
    #[error(transparent)]
    Header(#[from] crate::request::HeaderTemplateError),
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    #[error(transparent)]
    SigV4(#[from] crate::sigv4::SigV4Error),
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
        // A peer that stops answering is noticed on the link itself, not only by silence.
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(options.heartbeat_timeout)
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
fn check_allowed_env(assignment: &v1::Assignment, allowed: &[String]) -> Result<(), LinkError> {
    let mut wanted: Vec<String> = assignment
        .headers
        .iter()
        .flat_map(|h| crate::request::template_vars(&h.value))
        .collect();
    if !assignment.aws_sigv4_region.is_empty() {
        wanted.extend([
            "AWS_ACCESS_KEY_ID".to_owned(),
            "AWS_SECRET_ACCESS_KEY".to_owned(),
        ]);
    }
    match wanted.into_iter().find(|v| !allowed.iter().any(|a| a == v)) {
        None => Ok(()),
        Some(var) => Err(LinkError::Protocol(format!(
            "the run asks this worker to expand ${{{var}}}, which it does not allow: start it with --allow-env {var}"
        ))),
    }
}

/// A duration from the wire: positive, finite and at most ten years, or a protocol error
/// naming the field (never a panic).
fn wire_seconds(field: &str, seconds: f64) -> Result<Duration, LinkError> {
    if seconds.is_finite() && seconds > 0.0 && seconds <= 10.0 * 365.0 * 86_400.0 {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(LinkError::Protocol(format!(
            "assignment {field} = {seconds}: expected a positive number of seconds"
        )))
    }
}

/// Convert the protocol's assignment into the engine's typed config.
fn replay_config(
    assignment: &v1::Assignment,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ReplayConfig, LinkError> {
    let load = assignment
        .load
        .clone()
        .ok_or_else(|| LinkError::Protocol("assignment without a load model".into()))?;
    let templates: Vec<(String, String)> = assignment
        .headers
        .iter()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let headers = expand_headers(&templates, lookup)?;
    let sets = assignment
        .sets
        .iter()
        .map(|s| {
            let value = serde_json::from_str(&s.value)
                .unwrap_or_else(|_| serde_json::Value::String(s.value.clone()));
            (s.field.clone(), value)
        })
        .collect();
    Ok(ReplayConfig {
        target: assignment.target.clone(),
        load: LoadModel {
            schedule: match load.schedule.as_str() {
                "recorded" => Schedule::Recorded {
                    speed: if load.speed > 0.0 { load.speed } else { 1.0 },
                },
                _ => Schedule::Asap,
            },
            concurrency: (load.concurrency > 0).then_some(load.concurrency as usize),
            rate: (load.rate > 0.0).then_some(load.rate),
            arrival: if load.arrival == "poisson" {
                Arrival::Poisson
            } else {
                Arrival::Constant
            },
            duration: match load.duration_s {
                None => None,
                Some(s) => Some(wire_seconds("load.duration_s", s)?),
            },
            warmup: load.warmup,
            seed: load.seed,
        },
        headers,
        sets,
        timeout: wire_seconds(
            "timeout_s",
            assignment
                .timeout_s
                .ok_or_else(|| LinkError::Protocol("assignment without timeout_s".into()))?,
        )?,
        tag_requests: assignment.tag_requests,
        requests_out: assignment.requests_out,
        faithful: FaithfulConfig {
            pin: match assignment.pin_output_length.as_str() {
                "" => None,
                name => Some(PinMode::from_name(name).ok_or_else(|| {
                    LinkError::Protocol(format!(
                        "assignment pin_output_length = {name:?}: expected \"max\" or \"strict\""
                    ))
                })?),
            },
            closed_sessions: assignment.closed_sessions,
        },
        reorder_window: match assignment.reorder_window {
            0 => common::replay::DEFAULT_REORDER_WINDOW,
            n => n as usize,
        },
        transport: TransportConfig {
            extra_ca_pem: assignment.target_ca_pem.clone(),
            insecure: assignment.insecure,
            h2c: assignment.h2c,
            sigv4: if assignment.aws_sigv4_region.is_empty() {
                None
            } else {
                Some(SigV4Signer::from_env(&assignment.aws_sigv4_region, lookup)?)
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
    Ok(WorkItem {
        index: exchange.index,
        exchange: parsed,
        pin_output_tokens: exchange.pin_output_tokens,
        think,
    })
}

/// The steady-state window's data: the completion timeline and when the load reached its
/// target.
fn add_timeline(
    report: &mut v1::Report,
    mut timeline: common::timeline::Timeline,
    progress: &engine::Progress,
) {
    let reached = progress
        .target_reached_unix_us
        .load(std::sync::atomic::Ordering::Relaxed);
    timeline.target_reached_unix_us = (reached > 0).then_some(reached);
    proto::convert::timeline_to_report(&timeline, report);
}

/// Records per message: a batch stays far below gRPC's 4 MiB message limit.
const RECORDS_PER_MESSAGE: usize = 1024;

/// Send per-request records in bounded batches.
async fn send_records(
    out_tx: &mpsc::Sender<v1::WorkerMessage>,
    records: Vec<crate::metrics_actor::RequestRecord>,
) -> Result<(), ()> {
    let mut records = records.into_iter().peekable();
    while records.peek().is_some() {
        let batch = records
            .by_ref()
            .take(RECORDS_PER_MESSAGE)
            .map(proto::convert::record_to_proto)
            .collect();
        let message = v1::WorkerMessage {
            msg: Some(v1::worker_message::Msg::Records(v1::RequestRecords {
                records: batch,
            })),
        };
        out_tx.send(message).await.map_err(|_| ())?;
    }
    Ok(())
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (USER_HZ is 100 on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Join the coordinator and take part in one run. `load` is the runtime that carries the
/// load (the link itself runs on the caller's runtime). `on_joined` is called once the
/// coordinator accepted the worker.
pub async fn run_once(
    options: &LinkOptions,
    load: tokio::runtime::Handle,
    on_joined: &mut dyn FnMut(&str),
) -> Result<(), LinkError> {
    let mut client = connect(options).await?;
    let (out_tx, out_rx) = mpsc::channel::<v1::WorkerMessage>(64);
    let send = |msg: v1::worker_message::Msg| v1::WorkerMessage { msg: Some(msg) };
    let worker_nonce = proto::auth::nonce();
    out_tx
        .send(send(v1::worker_message::Msg::Hello(v1::Hello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: options.worker_id.clone(),
            host: options.host.clone(),
            capacity: 0,
            // The token itself never crosses the link: see the challenge below.
            token: String::new(),
            nonce: worker_nonce.clone(),
        })))
        .await
        .map_err(|_| LinkError::Protocol("outbound stream closed".into()))?;
    // Every wait is bounded: a peer that accepts the connection and never answers is not a
    // coordinator.
    let answer_within = options.heartbeat_timeout;
    let silent = |what: &str| coordinator_lost(&format!("no {what} within {answer_within:?}"));
    let mut inbound = tokio::time::timeout(answer_within, client.join(ReceiverStream::new(out_rx)))
        .await
        .map_err(|_| silent("answer to the join"))?
        .map_err(|status| LinkError::Refused(status.message().to_owned()))?
        .into_inner();

    let token = options
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let mut authenticated = false;
    let assignment = loop {
        let message = tokio::time::timeout(answer_within, inbound.message())
            .await
            .map_err(|_| silent("assignment"))?;
        match message {
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Challenge(challenge)),
            })) => {
                let Some(token) = token else {
                    return Err(LinkError::Refused(
                        "the coordinator asks for a token: give this worker --token (or LLM_REPLAY_TOKEN)".into(),
                    ));
                };
                let expected = proto::auth::coordinator_proof(
                    token,
                    &worker_nonce,
                    &challenge.nonce,
                    &options.worker_id,
                );
                if !proto::auth::verify(&expected, &challenge.proof) {
                    return Err(LinkError::Untrusted(
                        "the coordinator could not prove it knows this worker's token: this worker's --token is wrong, or the peer is not the coordinator the token belongs to".into(),
                    ));
                }
                authenticated = true;
                let proof = proto::auth::worker_proof(
                    token,
                    &worker_nonce,
                    &challenge.nonce,
                    &options.worker_id,
                );
                out_tx
                    .send(send(v1::worker_message::Msg::Answer(v1::ChallengeAnswer {
                        proof,
                    })))
                    .await
                    .map_err(|_| LinkError::Protocol("outbound stream closed".into()))?;
            }
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Assignment(a)),
            })) => {
                if token.is_some() && !authenticated {
                    // Nothing it says is trusted: not its target, not its ${VAR}s.
                    return Err(LinkError::Untrusted(
                        "the peer sent an assignment without proving it knows the token".into(),
                    ));
                }
                break a;
            }
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Refused(r)),
            })) => return Err(LinkError::Refused(r.reason)),
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Heartbeat(_)),
            })) => continue,
            Ok(Some(other)) => {
                return Err(LinkError::Protocol(format!(
                    "expected an assignment, got {other:?}"
                )));
            }
            Ok(None) => return Err(coordinator_lost("its stream ended")),
            Err(status) => return Err(LinkError::Refused(status.message().to_owned())),
        }
    };
    let allowed = |var: &str| {
        options
            .allow_env
            .iter()
            .any(|a| a == var)
            .then(|| std::env::var(var).ok())
            .flatten()
    };
    let prepared = check_allowed_env(&assignment, &options.allow_env)
        .and_then(|()| replay_config(&assignment, &allowed))
        .and_then(|config| {
            let client = TargetClient::new(&config.transport)?;
            Ok((Arc::new(config), client))
        });
    let (config, client_http) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            let _ = out_tx
                .send(send(v1::worker_message::Msg::Failed(v1::WorkerFailed {
                    reason: error.to_string(),
                })))
                .await;
            return Err(error);
        }
    };
    on_joined(&assignment.run_id);
    options.health.set(1);

    // The slice arrives on its own stream; the forwarder blocks on the bounded items channel
    // when the engine is behind, which back-pressures the coordinator through HTTP/2.
    let slice_request = client.exchanges(v1::SliceRequest {
        run_id: assignment.run_id.clone(),
        worker_id: options.worker_id.clone(),
        token: assignment.slice_key.clone(),
    });
    let mut slice = tokio::time::timeout(answer_within, slice_request)
        .await
        .map_err(|_| silent("slice stream"))?
        .map_err(|status| LinkError::Protocol(format!("slice stream: {}", status.message())))?
        .into_inner();
    let (items_tx, items_rx) = mpsc::channel::<WorkItem>(2048);
    // (transport broke?, what happened)
    let (slice_error_tx, mut slice_error_rx) = mpsc::channel::<(bool, String)>(1);
    load.spawn(async move {
        loop {
            match slice.message().await {
                Ok(Some(chunk)) => {
                    for exchange in chunk.exchanges {
                        let item = match work_item(exchange) {
                            Ok(item) => item,
                            Err(message) => {
                                let _ = slice_error_tx.send((false, message)).await;
                                return;
                            }
                        };
                        if items_tx.send(item).await.is_err() {
                            return;
                        }
                    }
                    if chunk.last {
                        return;
                    }
                }
                Ok(None) => return,
                Err(status) => {
                    let _ = slice_error_tx
                        .send((true, status.message().to_owned()))
                        .await;
                    return;
                }
            }
        }
    });

    let mut last_heard = Instant::now();
    let start_unix_ns = loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(v1::CoordinatorMessage { msg: Some(v1::coordinator_message::Msg::Start(start)) })) => break start.start_unix_ns,
                Ok(Some(v1::CoordinatorMessage { msg: Some(v1::coordinator_message::Msg::ClockPing(ping)) })) => {
                    last_heard = Instant::now();
                    let received = unix_ns();
                    let _ = out_tx.try_send(send(v1::worker_message::Msg::ClockPong(v1::ClockPong {
                        seq: ping.seq,
                        coordinator_send_unix_ns: ping.coordinator_send_unix_ns,
                        worker_receive_unix_ns: received,
                        worker_send_unix_ns: unix_ns(),
                    })));
                }
                Ok(Some(v1::CoordinatorMessage { msg: Some(v1::coordinator_message::Msg::Abort(abort)) })) => return Err(LinkError::Aborted(abort.reason)),
                Ok(Some(_)) => last_heard = Instant::now(),
                Ok(None) => return Err(coordinator_lost("its stream ended before the start")),
                Err(status) => return Err(coordinator_lost(status.message())),
            },
            _ = tokio::time::sleep_until((last_heard + options.heartbeat_timeout).into()) => {
                return Err(coordinator_lost(&format!("no message for {:?}", options.heartbeat_timeout)));
            }
        }
    };
    let now_ns = unix_ns();
    let start = StartAt {
        instant: Instant::now() + Duration::from_nanos(start_unix_ns.saturating_sub(now_ns)),
    };

    let (abort_tx, abort_rx) = watch::channel(false);
    let open_ended = assignment.exchange_count == 0;
    let metrics = {
        let _guard = load.enter();
        MetricsHandle::spawn()
    };
    let engine_metrics = metrics.clone();
    let progress = Arc::new(engine::Progress::default());
    let mut engine_task = load.spawn(engine::replay(engine::EngineRun {
        config,
        client: client_http,
        items: items_rx,
        start,
        metrics: engine_metrics,
        abort: abort_rx,
        open_ended,
        progress: progress.clone(),
    }));
    options.health.set(2);
    let mut started_sent = false;
    let live_totals = |progress: &engine::Progress| SliceTotals {
        issued: progress.issued.load(std::sync::atomic::Ordering::Relaxed),
        not_started: progress
            .not_started
            .load(std::sync::atomic::Ordering::Relaxed),
        lost: 0,
        sent_out_of_order: progress
            .sent_out_of_order
            .load(std::sync::atomic::Ordering::Relaxed),
    };

    let mut seq = 0u64;
    let mut ticker = tokio::time::interval(options.report_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failure: Option<LinkError> = None;
    let totals = loop {
        tokio::select! {
            finished = &mut engine_task => match finished {
                Ok(totals) => break totals,
                Err(error) => {
                    // Never silent zeros: a failed engine is a failed worker.
                    failure.get_or_insert(LinkError::Protocol(format!("the load engine failed: {error}")));
                    break engine::EngineTotals::default();
                }
            },
            _ = ticker.tick() => {
                if !started_sent {
                    let started = progress.started_unix_ns.load(std::sync::atomic::Ordering::Relaxed);
                    if started > 0 {
                        started_sent = true;
                        let _ = out_tx.try_send(send(v1::worker_message::Msg::Started(v1::Started { unix_ns: started })));
                    }
                }
                let snapshot = metrics.snapshot().await;
                if send_records(&out_tx, snapshot.records).await.is_err() {
                    failure.get_or_insert(coordinator_lost("its report stream closed"));
                    let _ = abort_tx.send(true);
                }
                seq += 1;
                let mut report = report_from_metrics(seq, false, &snapshot.metrics, live_totals(&progress), &snapshot.status_codes, cpu_seconds());
                report.tls_problems = snapshot.tls_problems.clone().into_iter().collect();
                add_timeline(&mut report, snapshot.timeline, &progress);
                if out_tx.send(send(v1::worker_message::Msg::Report(report))).await.is_err() {
                    failure.get_or_insert(coordinator_lost("its report stream closed"));
                    let _ = abort_tx.send(true);
                }
                let _ = out_tx.try_send(send(v1::worker_message::Msg::Heartbeat(v1::Heartbeat { unix_ns: unix_ns() })));
            }
            Some((transport, reason)) = slice_error_rx.recv() => {
                failure.get_or_insert(if transport {
                    coordinator_lost(&format!("its slice stream broke: {reason}"))
                } else {
                    LinkError::Protocol(format!("slice: {reason}"))
                });
                let _ = abort_tx.send(true);
            }
            message = inbound.message(), if failure.is_none() => match message {
                Ok(Some(v1::CoordinatorMessage { msg: Some(v1::coordinator_message::Msg::Abort(abort)) })) => {
                    tracing::warn!(reason = abort.reason, "run aborted by the coordinator");
                    failure = Some(LinkError::Aborted(abort.reason));
                    let _ = abort_tx.send(true);
                }
                Ok(Some(v1::CoordinatorMessage { msg: Some(v1::coordinator_message::Msg::ClockPing(ping)) })) => {
                    last_heard = Instant::now();
                    let received = unix_ns();
                    let _ = out_tx.try_send(send(v1::worker_message::Msg::ClockPong(v1::ClockPong {
                        seq: ping.seq,
                        coordinator_send_unix_ns: ping.coordinator_send_unix_ns,
                        worker_receive_unix_ns: received,
                        worker_send_unix_ns: unix_ns(),
                    })));
                }
                Ok(Some(_)) => last_heard = Instant::now(),
                Ok(None) => {
                    failure = Some(coordinator_lost("its stream ended"));
                    let _ = abort_tx.send(true);
                }
                Err(status) => {
                    failure = Some(coordinator_lost(status.message()));
                    let _ = abort_tx.send(true);
                }
            },
            _ = tokio::time::sleep_until((last_heard + options.heartbeat_timeout).into()), if failure.is_none() => {
                failure = Some(coordinator_lost(&format!("no message for {:?}", options.heartbeat_timeout)));
                let _ = abort_tx.send(true);
            }
        }
    };

    options.health.set(3);
    let started = progress
        .started_unix_ns
        .load(std::sync::atomic::Ordering::Relaxed);
    if !started_sent && started > 0 {
        let _ = out_tx.try_send(send(v1::worker_message::Msg::Started(v1::Started {
            unix_ns: started,
        })));
    }
    let snapshot = metrics.snapshot().await;
    // The records go before the final report, on the same stream, so the coordinator has
    // every one of them when it reads the final counts.
    let records_sent = send_records(&out_tx, snapshot.records).await;
    seq += 1;
    let mut report = report_from_metrics(
        seq,
        true,
        &snapshot.metrics,
        SliceTotals {
            issued: totals.issued,
            not_started: totals.not_started,
            lost: totals.lost,
            sent_out_of_order: totals.sent_out_of_order,
        },
        &snapshot.status_codes,
        cpu_seconds(),
    );
    report.tls_problems = snapshot.tls_problems.clone().into_iter().collect();
    add_timeline(&mut report, snapshot.timeline, &progress);
    if records_sent.is_err() {
        failure.get_or_insert(coordinator_lost("its report stream closed"));
    }
    if let Some(failure) = failure {
        // Best effort: the coordinator may still be there (abort) and want the partial numbers.
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            out_tx.send(send(v1::worker_message::Msg::Report(report))),
        )
        .await;
        return Err(failure);
    }
    out_tx
        .send(send(v1::worker_message::Msg::Report(report)))
        .await
        .map_err(|_| coordinator_lost("its report stream closed"))?;
    // Wait for the coordinator's Finish (or the end of the stream) so the report is delivered.
    let wait = async {
        loop {
            match inbound.message().await {
                Ok(Some(v1::CoordinatorMessage {
                    msg: Some(v1::coordinator_message::Msg::Finish(_)),
                }))
                | Ok(None)
                | Err(_) => return,
                Ok(Some(_)) => {}
            }
        }
    };
    let _ = tokio::time::timeout(options.heartbeat_timeout, wait).await;
    Ok(())
}
