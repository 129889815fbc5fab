//! The run orchestrator: serve the gRPC link, start local workers (or wait for remote ones),
//! measure each worker's clock, hand out assignments and slices, start everyone at one
//! instant, watch heartbeats, handle worker loss (fail or reassign), collect reports, and
//! merge them.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::metrics::{Metric, RunMetrics};
use proto::convert::{SliceTotals, metrics_from_report};
use proto::v1;
use tokio::sync::mpsc;

use crate::config::{GlobalLoad, RunConfig, WorkerSource, split_evenly};
use crate::server::{CoordinatorService, ServiceState, WorkerEvent};
use crate::shard::{SlicePlan, SliceSender, feed_reassigned, feed_slice};

/// Why a run could not complete (exit code 3), or bad input found late (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
}

/// A worker's clock against the coordinator's, from NTP-style samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClockEstimate {
    /// Worker clock − coordinator clock, nanoseconds.
    pub offset_ns: i64,
    /// Half the best round trip: the offset is known to ± this.
    pub uncertainty_ns: u64,
}

/// One worker's part of a finished run.
#[derive(Debug, Clone)]
pub struct WorkerOutcome {
    pub id: String,
    pub host: String,
    /// Exchanges this worker answered for (its slice, plus reassigned, minus re-routed).
    pub assigned: u64,
    pub totals: SliceTotals,
    pub metrics: RunMetrics,
    pub lost: bool,
    pub cpu_seconds: f64,
    pub cores: u32,
    pub peak_rss_bytes: u64,
    pub clock: ClockEstimate,
    /// When it actually started, in the coordinator's clock (Unix ns).
    pub started_unix_ns: Option<u64>,
}

/// The merged result of one replay.
#[derive(Debug, Clone)]
pub struct ReplayResult {
    pub run_id: String,
    pub started_at: SystemTime,
    pub duration: Duration,
    pub target: String,
    pub metrics: RunMetrics,
    pub workers: Vec<WorkerOutcome>,
    pub status_codes: BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count).
    pub tls_problems: BTreeMap<String, u64>,
    pub load: serde_json::Value,
    pub not_started: u64,
    pub lost: u64,
    /// Largest difference between workers' actual start instants (ms).
    pub start_skew_ms: Option<f64>,
    pub warnings: Vec<String>,
    /// True when a worker was lost and the run was aborted.
    pub aborted: bool,
    /// True when SIGINT or SIGTERM stopped the run (`aborted` is then true too).
    pub interrupted: bool,
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The load model description shown in reports.
pub fn describe_load(load: &GlobalLoad, workers: usize) -> serde_json::Value {
    serde_json::json!({
        "schedule": if load.recorded_schedule { "recorded" } else { "asap" },
        "speed": load.speed,
        "concurrency": load.concurrency,
        "rate": load.rate,
        "arrival": if load.rate.is_some() { Some(if load.poisson { "poisson" } else { "constant" }) } else { None },
        "requests": load.requests,
        "duration_s": load.duration.map(|d| d.as_secs_f64()),
        "warmup": load.warmup,
        "workers": workers,
    })
}

/// Everything a worker's assignment is made of; one per replay.
#[derive(Clone)]
struct AssignmentPlan {
    run_id: String,
    target: String,
    config: RunConfig,
    load: GlobalLoad,
    workers: usize,
    tag_requests: bool,
    open_ended: bool,
}

impl AssignmentPlan {
    /// The assignment of worker `index`: its share of the global concurrency, rate and
    /// warm-up (shares differ by at most one), and the run-wide target and request options.
    fn for_worker(&self, index: usize) -> v1::Assignment {
        let share = |total: u64| split_evenly(total, self.workers, index);
        let load = &self.load;
        v1::Assignment {
            run_id: self.run_id.clone(),
            target: self.target.clone(),
            load: Some(v1::LoadModel {
                schedule: if load.recorded_schedule {
                    "recorded"
                } else {
                    "asap"
                }
                .to_owned(),
                speed: load.speed,
                concurrency: load
                    .concurrency
                    .map(|c| share(c as u64).max(1) as u32)
                    .unwrap_or(0),
                rate: load.rate.map(|r| r / self.workers as f64).unwrap_or(0.0),
                arrival: if load.poisson { "poisson" } else { "constant" }.to_owned(),
                duration_s: load.duration.map(|d| d.as_secs_f64()),
                warmup: share(load.warmup),
                seed: 0x5eed_0000 + index as u64,
            }),
            headers: self
                .config
                .headers
                .iter()
                .map(|(name, value)| v1::Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            sets: self
                .config
                .sets
                .iter()
                .map(|(field, value)| v1::SetField {
                    field: field.clone(),
                    value: value.clone(),
                })
                .collect(),
            exchange_count: if self.open_ended { 0 } else { 1 },
            timeout_s: Some(self.config.timeout.as_secs_f64()),
            tag_requests: self.tag_requests,
            worker_index: index as u32,
            target_ca_pem: self.config.transport.ca_pem.clone(),
            insecure: self.config.transport.insecure,
            h2c: self.config.transport.h2c,
            aws_sigv4_region: self
                .config
                .transport
                .aws_sigv4_region
                .clone()
                .unwrap_or_default(),
            requests_out: self.config.requests_out.is_some(),
            reorder_window: self.config.reorder_window as u32,
            // Set per worker by the service, after the token challenge.
            slice_key: String::new(),
        }
    }
}

type Control = mpsc::Sender<Result<v1::CoordinatorMessage, tonic::Status>>;

fn control_message(
    msg: v1::coordinator_message::Msg,
) -> Result<v1::CoordinatorMessage, tonic::Status> {
    Ok(v1::CoordinatorMessage { msg: Some(msg) })
}

struct WorkerSlot {
    id: String,
    host: String,
    control: Control,
    slice: SliceSender,
    /// The initial feeder, until it finished.
    feeder: Option<tokio::task::JoinHandle<Result<u64, common::recording::RecordingError>>>,
    /// Exchanges handed to it so far (own slice + reassigned).
    sent: u64,
    /// Reassigned exchanges it received (their order within its stream is unknown).
    reassigned_in: u64,
    latest: Option<v1::Report>,
    done: bool,
    lost: Option<String>,
    last_heard: Instant,
    clock: ClockEstimate,
    started_unix_ns: Option<u64>,
    closed: bool,
    /// Accounting override for a lost worker: (assigned, lost).
    lost_accounting: Option<(u64, u64)>,
}

impl WorkerSlot {
    fn reported(&self) -> SliceTotals {
        self.latest
            .as_ref()
            .and_then(|r| r.counters)
            .map(|c| SliceTotals {
                issued: c.issued,
                not_started: c.not_started,
                lost: c.lost,
                sent_out_of_order: c.sent_out_of_order,
            })
            .unwrap_or_default()
    }

    fn answered(&self) -> u64 {
        self.latest
            .as_ref()
            .and_then(|r| r.counters)
            .map(|c| {
                c.succeeded
                    + c.ended_early
                    + c.failed_status
                    + c.failed_error_frame
                    + c.failed_transport
                    + c.failed_timeout
                    + c.failed_empty
                    + c.warmup
            })
            .unwrap_or(0)
    }

    fn alive(&self) -> bool {
        !self.done && self.lost.is_none()
    }

    /// Take a report from this worker's stream if it is newer than the last one. A report
    /// that does not decode, whose counters overflow, or that answers for more exchanges than
    /// the worker was sent makes the worker lost (named in the report); the last valid
    /// report stays, so the other workers' data and this one's earlier data are kept.
    fn accept_report(&mut self, report: v1::Report) {
        if self.latest.as_ref().is_some_and(|r| report.seq <= r.seq) {
            return;
        }
        match self.check_report(&report) {
            Ok(()) => {
                self.done = report.r#final;
                self.latest = Some(report);
            }
            Err(reason) => {
                if self.lost.is_none() {
                    self.lost = Some(format!(
                        "it sent an invalid report ({reason}); its data after its last valid report is dropped"
                    ));
                }
            }
        }
    }

    fn check_report(&self, report: &v1::Report) -> Result<(), String> {
        metrics_from_report(report).map_err(|e| e.to_string())?;
        let c = report.counters.unwrap_or_default();
        let accounted = [
            c.succeeded,
            c.ended_early,
            c.failed_status,
            c.failed_error_frame,
            c.failed_transport,
            c.failed_timeout,
            c.failed_empty,
            c.warmup,
            c.not_started,
            c.lost,
        ]
        .into_iter()
        .try_fold(0u64, u64::checked_add)
        .ok_or("its counters overflow")?;
        let answered = accounted - c.not_started - c.lost;
        if answered > c.issued {
            return Err(format!("{answered} answered of {} issued", c.issued));
        }
        // Once the slice is fully fed, nobody answers for more than it was sent.
        if self.feeder.is_none() && self.sent > 0 && accounted > self.sent {
            return Err(format!(
                "it accounts for {accounted} exchanges but was sent {}",
                self.sent
            ));
        }
        Ok(())
    }
}

/// Inputs of one replay that do not change between sweep levels.
pub struct ReplaySetup<'a> {
    pub config: &'a RunConfig,
    pub load: GlobalLoad,
    pub target: String,
    pub tag_requests: bool,
    pub exchanges: u64,
    pub pass_span_ms: f64,
    /// `--requests-out`, shared by every level of a sweep.
    pub requests_out: Option<Arc<crate::requests_out::RequestsOut>>,
    /// Turns true on SIGINT or SIGTERM: stop the load, collect what the workers have.
    pub interrupt: tokio::sync::watch::Receiver<bool>,
}

fn tls_server_config(
    tls: &crate::config::LinkTls,
) -> Result<tonic::transport::ServerTlsConfig, RunError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| RunError::Input(format!("{}: {e}", path.display())))
    };
    let mut config = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(read(&tls.cert)?, read(&tls.key)?),
    );
    if let Some(ca) = &tls.client_ca {
        config = config.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

/// Run one replay.
pub async fn replay(setup: ReplaySetup<'_>) -> Result<ReplayResult, RunError> {
    let config = setup.config;
    let load = setup.load.clone();
    let workers = match &config.source {
        WorkerSource::Local(n) => *n,
        WorkerSource::Remote { expect, .. } => *expect,
    };
    let run_id = uuid::Uuid::new_v4().to_string();
    let open_ended =
        common::replay::is_open_ended(load.requests, load.duration, load.recorded_schedule);
    let plan = SlicePlan {
        recording: config.recording.clone(),
        workers,
        exchanges: setup.exchanges,
        requests: load.requests,
        open_ended,
        pass_span_ms: setup.pass_span_ms,
    };

    let (events_tx, mut events) = mpsc::channel::<WorkerEvent>(1024);
    let assignment = AssignmentPlan {
        run_id: run_id.clone(),
        target: setup.target.clone(),
        config: config.clone(),
        load: load.clone(),
        workers,
        tag_requests: setup.tag_requests,
        open_ended,
    };
    // Local workers get a fresh random token, so nothing else on the machine can join.
    let token = match (&config.source, &config.token) {
        (_, Some(token)) => Some(token.clone()),
        (WorkerSource::Local(_), None) => Some(uuid::Uuid::new_v4().to_string()),
        (WorkerSource::Remote { .. }, None) => None,
    };
    let state = Arc::new(ServiceState::new(
        workers,
        token.clone(),
        Box::new(move |index| assignment.for_worker(index)),
        events_tx,
        setup.requests_out.clone(),
    ));
    let listen = match &config.source {
        WorkerSource::Local(_) => "127.0.0.1:0".to_owned(),
        WorkerSource::Remote { listen, .. } => listen.clone(),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| RunError::Failed(format!("cannot listen for workers on {listen}: {e}")))?;
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| RunError::Failed(format!("cannot listen for workers: {e}")))?;
    let mut builder = tonic::transport::Server::builder().tcp_nodelay(true);
    if let Some(tls) = &config.tls {
        builder = builder
            .tls_config(tls_server_config(tls)?)
            .map_err(|e| RunError::Input(format!("TLS configuration: {e}")))?;
    }
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let service = CoordinatorService {
        state: state.clone(),
    };
    let server = tokio::spawn(async move {
        builder
            .add_service(
                proto::v1::coordinator_server::CoordinatorServer::new(service)
                    .max_decoding_message_size(64 * 1024 * 1024),
            )
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = server_stopped.await;
                },
            )
            .await
    });

    let mut children = Vec::new();
    match &config.source {
        WorkerSource::Local(n) => {
            // Local worker processes: the same binary, dialing back over loopback gRPC.
            let exe = std::env::current_exe().map_err(|e| {
                RunError::Failed(format!("cannot find this program to start workers: {e}"))
            })?;
            // Local workers run with the user's own environment: they may read what the
            // user's own options name, and nothing else.
            let mut allow_env: Vec<String> = config
                .headers
                .iter()
                .flat_map(|(_, value)| worker::request::template_vars(value))
                .collect();
            if config.transport.aws_sigv4_region.is_some() {
                allow_env.extend(
                    [
                        "AWS_ACCESS_KEY_ID",
                        "AWS_SECRET_ACCESS_KEY",
                        "AWS_SESSION_TOKEN",
                    ]
                    .map(str::to_owned),
                );
            }
            for i in 0..*n {
                let child = tokio::process::Command::new(&exe)
                    .args([
                        "worker",
                        "--coordinator",
                        &addr.to_string(),
                        "--once",
                        "--worker-id",
                        &format!("local-{i}"),
                        "--heartbeat-timeout",
                        &config.heartbeat_timeout.as_secs_f64().to_string(),
                    ])
                    .args(allow_env.iter().flat_map(|v| ["--allow-env", v.as_str()]))
                    .env("LLM_REPLAY_TOKEN", token.clone().unwrap_or_default())
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::inherit())
                    // Their own process group: a Ctrl-C on the terminal reaches the
                    // coordinator alone, which stops them over the link and keeps their data.
                    .process_group(0)
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| RunError::Failed(format!("cannot start local worker {i}: {e}")))?;
                children.push(child);
            }
        }
        WorkerSource::Remote { expect, .. } => {
            eprintln!(
                "llm-replay: waiting for {expect} workers on {addr} (llm-replay-worker --coordinator {addr})"
            );
        }
    }

    let result = collect(
        config,
        &plan,
        &run_id,
        &setup.target,
        &load,
        workers,
        &mut events,
        setup.interrupt.clone(),
    )
    .await;

    let _ = stop_server.send(());
    let _ = server.await;
    for mut child in children {
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
    result
}

/// Exchange NTP-style pings with every worker and estimate its clock offset.
async fn sync_clocks(
    slots: &mut [WorkerSlot],
    events: &mut mpsc::Receiver<WorkerEvent>,
) -> Result<(), RunError> {
    const SAMPLES: u64 = 8;
    let mut best: Vec<Option<(u64, i64)>> = vec![None; slots.len()];
    for seq in 0..SAMPLES {
        for slot in slots.iter() {
            let _ = slot
                .control
                .send(control_message(v1::coordinator_message::Msg::ClockPing(
                    v1::ClockPing {
                        seq,
                        coordinator_send_unix_ns: unix_ns(SystemTime::now()),
                    },
                )))
                .await;
        }
        // Each worker answers each ping once: a second pong (or one for another round) from
        // the same stream does not stand in for a worker that has not answered.
        let mut answered_by = vec![false; slots.len()];
        let mut answered = 0;
        let deadline = Instant::now() + Duration::from_secs(2);
        while answered < slots.len() {
            let event = tokio::time::timeout_at(deadline.into(), events.recv())
                .await
                .map_err(|_| RunError::Failed("a worker did not answer clock pings".into()))?
                .ok_or_else(|| RunError::Failed("worker link closed".into()))?;
            match event {
                WorkerEvent::ClockPong {
                    index,
                    pong,
                    received_unix_ns: t4,
                } if pong.seq == seq && !answered_by[index] => {
                    answered_by[index] = true;
                    answered += 1;
                    let (t1, t2, t3) = (
                        pong.coordinator_send_unix_ns as i128,
                        pong.worker_receive_unix_ns as i128,
                        pong.worker_send_unix_ns as i128,
                    );
                    let t4 = t4 as i128;
                    let delay = ((t4 - t1) - (t3 - t2)).max(0) as u64;
                    let offset = (((t2 - t1) + (t3 - t4)) / 2) as i64;
                    if best[index].is_none_or(|(d, _)| delay < d) {
                        best[index] = Some((delay, offset));
                    }
                }
                WorkerEvent::Gone { index, reason } => {
                    return Err(RunError::Failed(format!(
                        "worker {} left before the start: {reason}",
                        slots[index].id
                    )));
                }
                WorkerEvent::Failed { index, reason } => {
                    return Err(RunError::Input(format!(
                        "worker {} could not start: {reason}",
                        slots[index].id
                    )));
                }
                _ => {}
            }
        }
    }
    for (slot, best) in slots.iter_mut().zip(best) {
        if let Some((delay, offset)) = best {
            slot.clock = ClockEstimate {
                offset_ns: offset,
                uncertainty_ns: delay / 2,
            };
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // issue 8 turns this supervisor into an actor over typed events
async fn collect(
    config: &RunConfig,
    plan: &SlicePlan,
    run_id: &str,
    target: &str,
    load: &GlobalLoad,
    workers: usize,
    events: &mut mpsc::Receiver<WorkerEvent>,
    mut interrupt: tokio::sync::watch::Receiver<bool>,
) -> Result<ReplayResult, RunError> {
    let mut pending: Vec<Option<WorkerSlot>> = (0..workers).map(|_| None).collect();
    let join_deadline = Instant::now() + config.join_timeout;
    let mut joined = 0;
    while joined < workers {
        let event = tokio::select! {
            event = tokio::time::timeout_at(join_deadline.into(), events.recv()) => event,
            _ = interrupt.wait_for(|i| *i) => {
                return Err(RunError::Failed("interrupted before the load started".into()));
            }
        };
        let event = event
            .map_err(|_| {
                RunError::Failed(format!(
                    "only {joined} of {workers} workers joined within {:?}",
                    config.join_timeout
                ))
            })?
            .ok_or_else(|| RunError::Failed("worker link closed".into()))?;
        match event {
            WorkerEvent::Joined {
                index,
                id,
                host,
                control,
                slice,
            } => {
                pending[index] = Some(WorkerSlot {
                    id,
                    host,
                    control,
                    slice,
                    feeder: None,
                    sent: 0,
                    reassigned_in: 0,
                    latest: None,
                    done: false,
                    lost: None,
                    last_heard: Instant::now(),
                    clock: ClockEstimate::default(),
                    started_unix_ns: None,
                    closed: false,
                    lost_accounting: None,
                });
                joined += 1;
            }
            WorkerEvent::Failed { reason, .. } => {
                return Err(RunError::Input(format!(
                    "a worker could not start: {reason}"
                )));
            }
            WorkerEvent::Gone { reason, .. } if matches!(config.source, WorkerSource::Local(_)) => {
                // A local worker process that dies before the start will not come back.
                return Err(RunError::Failed(format!(
                    "a worker left before the start: {reason}"
                )));
            }
            WorkerEvent::Gone { index, reason } => {
                // A remote worker's slot is free again (the service released it): wait for
                // another, e.g. the same worker restarted by its orchestrator.
                if let Some(slot) = pending[index].take() {
                    joined -= 1;
                    tracing::warn!(
                        worker = slot.id,
                        reason,
                        "a worker left before the start; its place is open again"
                    );
                }
            }
            _ => {}
        }
    }
    let mut slots: Vec<WorkerSlot> = pending.into_iter().flatten().collect();
    tokio::select! {
        synced = sync_clocks(&mut slots, events) => synced?,
        _ = interrupt.wait_for(|i| *i) => {
            return Err(RunError::Failed("interrupted before the load started".into()));
        }
    }
    for (index, slot) in slots.iter_mut().enumerate() {
        let plan = plan.clone();
        let slice = slot.slice.clone();
        slot.feeder = Some(tokio::task::spawn_blocking(move || {
            feed_slice(&plan, index, slice)
        }));
    }

    // One start instant for everyone, far enough ahead for the message to arrive and the
    // first slice chunks to be buffered; each worker gets it in its own clock.
    let started_at = SystemTime::now() + Duration::from_millis(500);
    let started_instant = Instant::now() + Duration::from_millis(500);
    let t0 = unix_ns(started_at) as i128;
    for slot in &slots {
        let _ = slot
            .control
            .send(control_message(v1::coordinator_message::Msg::Start(
                v1::Start {
                    start_unix_ns: (t0 + slot.clock.offset_ns as i128).max(0) as u64,
                },
            )))
            .await;
    }

    let planned = plan.planned_total();
    // Live progress only for a person watching: quiet when output goes to a file or CI.
    let progress_on = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let mut aborted = false;
    let mut interrupted = false;
    let mut warnings = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(500));
    let mut feeders_done = false;
    // Lost workers' exchanges being fed to the survivors: (lost, survivors, feeder).
    type Reassignment = (
        usize,
        Vec<usize>,
        tokio::task::JoinHandle<Result<Vec<u64>, common::recording::RecordingError>>,
    );
    let mut reassigning: Vec<Reassignment> = Vec::new();
    while slots.iter().any(WorkerSlot::alive) {
        tokio::select! {
            _ = interrupt.wait_for(|i| *i), if !interrupted => {
                interrupted = true;
                aborted = true;
                warnings.push("interrupted (SIGINT or SIGTERM): the load was stopped; this report holds what the workers had measured".into());
                break;
            }
            event = events.recv() => {
                let Some(event) = event else { break };
                match event {
                    WorkerEvent::Report { index, report } => {
                        let slot = &mut slots[index];
                        slot.last_heard = Instant::now();
                        slot.accept_report(*report);
                    }
                    WorkerEvent::Heartbeat { index } | WorkerEvent::ClockPong { index, .. } => {
                        slots[index].last_heard = Instant::now();
                    }
                    WorkerEvent::Started { index, unix_ns } => {
                        let slot = &mut slots[index];
                        slot.last_heard = Instant::now();
                        slot.started_unix_ns = Some((unix_ns as i128 - slot.clock.offset_ns as i128).max(0) as u64);
                    }
                    WorkerEvent::Failed { index, reason } => {
                        if slots[index].alive() {
                            slots[index].lost = Some(format!("it failed: {reason}"));
                        }
                    }
                    WorkerEvent::Gone { index, reason } => {
                        if !slots[index].done && slots[index].lost.is_none() {
                            slots[index].lost = Some(reason);
                        }
                    }
                    WorkerEvent::Joined { .. } => {}
                }
            }
            _ = ticker.tick() => {
                for slot in &mut slots {
                    if slot.alive() && slot.last_heard.elapsed() > config.heartbeat_timeout {
                        slot.lost = Some(format!("no heartbeat for {:?}", config.heartbeat_timeout));
                    }
                    let _ = slot.control.try_send(control_message(v1::coordinator_message::Msg::Heartbeat(
                        v1::Heartbeat { unix_ns: unix_ns(SystemTime::now()) },
                    )));
                }
                if progress_on {
                    eprint!("\r{}", progress_line(&slots, planned, started_instant));
                }
            }
        }

        // Feeders: once all finished, their counts are known.
        if !feeders_done {
            let mut all = true;
            for slot in &mut slots {
                if let Some(feeder) = &slot.feeder {
                    if feeder.is_finished() {
                        let feeder = slot.feeder.take().expect("checked above");
                        match feeder.await {
                            Ok(Ok(n)) => slot.sent += n,
                            Ok(Err(error)) => return Err(RunError::Input(error.to_string())),
                            Err(error) => return Err(RunError::Failed(format!("feeder: {error}"))),
                        }
                    } else {
                        all = false;
                    }
                }
            }
            feeders_done = all;
            if feeders_done {
                // Reports that came before the slice counts were known are checked now.
                for slot in slots.iter_mut().filter(|s| s.alive()) {
                    if let Some(report) = &slot.latest
                        && let Err(reason) = slot.check_report(report)
                    {
                        slot.lost = Some(format!("it sent an invalid report ({reason})"));
                        slot.latest = None;
                    }
                }
            }
        }

        // Worker loss.
        let newly_lost: Vec<usize> = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.lost.is_some() && s.lost_accounting.is_none())
            .map(|(i, _)| i)
            .collect();
        for dead in newly_lost {
            let reason = slots[dead].lost.clone().unwrap_or_default();
            let reported = slots[dead].reported();
            let answered = slots[dead].answered();
            let issued = reported.issued.max(answered);
            warnings.push(format!(
                "worker {} ({}) was lost: {reason}",
                slots[dead].id, slots[dead].host
            ));
            if let Some(feeder) = slots[dead].feeder.take() {
                feeder.abort();
            }
            if !config.reassign_on_loss {
                slots[dead].lost_accounting = Some((issued, issued - answered));
                aborted = true;
                continue;
            }
            // Its in-flight requests are lost; everything it had not started goes to the
            // survivors that are still running.
            slots[dead].lost_accounting = Some((issued, issued - answered));
            if slots[dead].reassigned_in > 0 {
                warnings.push(format!(
                    "worker {} had received reassigned exchanges; those it had not started are counted as not started",
                    slots[dead].id
                ));
            }
            let survivors: Vec<usize> = (0..slots.len())
                .filter(|&i| slots[i].alive() && !slots[i].closed)
                .collect();
            if survivors.is_empty() {
                warnings.push("no worker left to take over the lost worker's exchanges".into());
                aborted = true;
                continue;
            }
            let senders: Vec<SliceSender> =
                survivors.iter().map(|&i| slots[i].slice.clone()).collect();
            let plan = plan.clone();
            let own_issued = issued.saturating_sub(slots[dead].reassigned_in);
            // Fed in the background: it re-reads the file and waits on the survivors'
            // bounded channels at replay pace, while this loop keeps heartbeats going.
            let handle = tokio::task::spawn_blocking(move || {
                feed_reassigned(&plan, dead, own_issued, &senders)
            });
            reassigning.push((dead, survivors, handle));
        }
        if aborted {
            break;
        }
        let mut pending = 0;
        while pending < reassigning.len() {
            if !reassigning[pending].2.is_finished() {
                pending += 1;
                continue;
            }
            let (dead, survivors, handle) = reassigning.swap_remove(pending);
            let counts = handle
                .await
                .map_err(|e| RunError::Failed(format!("reassignment: {e}")))?
                .map_err(|e| RunError::Input(e.to_string()))?;
            let moved: u64 = counts.iter().sum();
            for (&i, n) in survivors.iter().zip(&counts) {
                slots[i].sent += n;
                slots[i].reassigned_in += n;
            }
            warnings.push(format!(
                "{moved} exchanges of worker {} that it had not started were reassigned to {} other workers",
                slots[dead].id,
                survivors.len()
            ));
        }

        // Close each slice once every exchange handed to it has been started or skipped:
        // until then a lost worker's exchanges may still be reassigned to it.
        if feeders_done && !plan.open_ended && reassigning.is_empty() {
            let everyone_caught_up = slots.iter().filter(|s| s.alive()).all(|s| {
                let r = s.reported();
                r.issued + r.not_started >= s.sent
            });
            if everyone_caught_up {
                for slot in slots.iter_mut().filter(|s| !s.closed) {
                    slot.closed = true;
                    let _ = slot.slice.try_send(Ok(v1::ExchangeChunk {
                        exchanges: Vec::new(),
                        last: true,
                    }));
                }
            }
        }
    }
    if progress_on {
        eprintln!("\r{}", progress_line(&slots, planned, started_instant));
    }

    if aborted {
        for slot in slots.iter().filter(|s| s.alive()) {
            let _ = slot
                .control
                .send(control_message(v1::coordinator_message::Msg::Abort(
                    v1::Abort {
                        reason: if interrupted {
                            "the coordinator was interrupted".into()
                        } else {
                            "a worker was lost (--on-worker-loss fail)".into()
                        },
                    },
                )))
                .await;
        }
        // Give survivors a moment to send their partial final reports.
        let grace = Instant::now() + Duration::from_secs(3);
        while slots.iter().any(WorkerSlot::alive) {
            match tokio::time::timeout_at(grace.into(), events.recv()).await {
                Ok(Some(WorkerEvent::Report { index, report })) => {
                    slots[index].accept_report(*report);
                }
                Ok(Some(WorkerEvent::Gone { index, reason })) if !slots[index].done => {
                    slots[index].lost = Some(reason);
                    let issued = slots[index].reported().issued.max(slots[index].answered());
                    let answered = slots[index].answered();
                    slots[index].lost_accounting = Some((issued, issued - answered));
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    } else {
        for slot in &slots {
            let _ = slot
                .control
                .send(control_message(v1::coordinator_message::Msg::Finish(
                    v1::Finish {},
                )))
                .await;
        }
    }
    for slot in &mut slots {
        if let Some(feeder) = slot.feeder.take() {
            feeder.abort();
        }
    }
    let duration = started_instant.elapsed();
    let mut result = finish(
        config, plan, run_id, target, load, workers, slots, warnings, aborted, started_at, duration,
    )?;
    result.interrupted = interrupted;
    Ok(result)
}

fn progress_line(slots: &[WorkerSlot], planned: Option<u64>, started: Instant) -> String {
    let mut merged = RunMetrics::new();
    let mut answered = 0u64;
    for slot in slots {
        if let Some(report) = &slot.latest
            && let Ok((metrics, _, _)) = metrics_from_report(report)
        {
            answered += metrics.counters.completed();
            merged.merge(&metrics);
        }
    }
    let alive = slots.iter().filter(|s| s.lost.is_none()).count();
    let ttft = merged
        .stats(Metric::Ttft)
        .map(|s| format!("{:.1}/{:.1} ms", s.p50, s.p95))
        .unwrap_or_else(|| "-".into());
    let total = planned.map(|n| n.to_string()).unwrap_or_else(|| "?".into());
    format!(
        "[{answered}/{total}] {:>6.1} s  TTFT p50/p95 {ttft}  errors {}  workers {alive}/{}   ",
        started.elapsed().as_secs_f64(),
        merged.counters.failed(),
        slots.len()
    )
}

#[allow(clippy::too_many_arguments)]
fn finish(
    config: &RunConfig,
    plan: &SlicePlan,
    run_id: &str,
    target: &str,
    load: &GlobalLoad,
    workers: usize,
    slots: Vec<WorkerSlot>,
    mut warnings: Vec<String>,
    aborted: bool,
    started_at: SystemTime,
    duration: Duration,
) -> Result<ReplayResult, RunError> {
    let mut merged = RunMetrics::new();
    let mut status_codes = BTreeMap::new();
    let mut tls_problems: BTreeMap<String, u64> = BTreeMap::new();
    let mut outcomes = Vec::new();
    let (mut assigned_total, mut not_started, mut lost_total) = (0u64, 0u64, 0u64);
    for slot in &slots {
        let (metrics, totals, codes) = match &slot.latest {
            Some(report) => metrics_from_report(report).map_err(|e| {
                RunError::Failed(format!("worker {} sent a corrupt report: {e}", slot.id))
            })?,
            None => Default::default(),
        };
        merged.merge(&metrics);
        for (code, n) in codes {
            *status_codes.entry(code).or_default() += n;
        }
        if let Some(report) = &slot.latest {
            for (problem, n) in &report.tls_problems {
                *tls_problems.entry(problem.clone()).or_default() += n;
            }
        }
        let answered = metrics.counters.completed();
        let warmup = metrics.counters.warmup;
        let (assigned, lost, not_started_here) = match slot.lost_accounting {
            Some((issued, lost)) if !slot.done => (issued, lost, 0),
            _ => (
                answered + warmup + totals.not_started + totals.lost,
                totals.lost,
                totals.not_started,
            ),
        };
        assigned_total += assigned;
        not_started += not_started_here;
        lost_total += lost;
        outcomes.push(WorkerOutcome {
            id: slot.id.clone(),
            host: slot.host.clone(),
            assigned,
            totals: SliceTotals {
                issued: totals.issued,
                not_started: not_started_here,
                lost,
                sent_out_of_order: totals.sent_out_of_order,
            },
            metrics,
            lost: slot.lost.is_some(),
            cpu_seconds: slot.latest.as_ref().map(|r| r.cpu_seconds).unwrap_or(0.0),
            cores: slot.latest.as_ref().map(|r| r.cores).unwrap_or(0),
            peak_rss_bytes: slot.latest.as_ref().map(|r| r.peak_rss_bytes).unwrap_or(0),
            clock: slot.clock,
            started_unix_ns: slot.started_unix_ns,
        });
    }
    // Exchanges the run planned but no worker ever got to (an aborted run): not started.
    if let Some(planned) = plan.planned_total() {
        if planned > assigned_total {
            not_started += planned - assigned_total;
        } else if planned < assigned_total && !config.reassign_on_loss {
            warnings.push(format!(
                "accounting: workers answered for {assigned_total} exchanges but {planned} were planned"
            ));
        }
    }

    let starts: Vec<u64> = outcomes.iter().filter_map(|w| w.started_unix_ns).collect();
    let start_skew_ms = (starts.len() == outcomes.len() && !starts.is_empty()).then(|| {
        let max = starts.iter().max().copied().unwrap_or(0);
        let min = starts.iter().min().copied().unwrap_or(0);
        (max - min) as f64 / 1e6
    });
    let scheduled = load.recorded_schedule || load.rate.is_some();
    if let Some(skew) = start_skew_ms
        && scheduled
        && skew > config.max_skew.as_secs_f64() * 1000.0
    {
        warnings.push(format!(
            "START SKEW {skew:.2} ms exceeds --max-skew {:.2} ms: workers did not start together, so the recorded schedule was not replayed faithfully",
            config.max_skew.as_secs_f64() * 1000.0
        ));
    }
    let out_of_order: u64 = outcomes.iter().map(|w| w.totals.sent_out_of_order).sum();
    if out_of_order > 0 {
        warnings.push(format!(
            "{out_of_order} exchanges were further out of at_ms order in the recording than --reorder-window {} exchanges: they were sent late (none was dropped); raise --reorder-window to replay them on time",
            config.reorder_window
        ));
    }
    for worker in &outcomes {
        let lag_p99 = worker
            .metrics
            .stats(Metric::ScheduleLag)
            .map(|s| s.p99)
            .unwrap_or(0.0);
        let cpu_share = if duration.as_secs_f64() > 0.0 && worker.cores > 0 {
            worker.cpu_seconds / duration.as_secs_f64() / f64::from(worker.cores)
        } else {
            0.0
        };
        if lag_p99 > 10.0 || cpu_share > 0.9 {
            warnings.push(format!(
                "worker {} was saturated (schedule lag p99 {lag_p99:.1} ms, CPU {:.0} % of {} cores): a saturated client's numbers are not the server's",
                worker.id,
                cpu_share * 100.0,
                worker.cores
            ));
        }
    }
    Ok(ReplayResult {
        run_id: run_id.to_owned(),
        started_at,
        duration,
        target: target.to_owned(),
        metrics: merged,
        workers: outcomes,
        status_codes,
        tls_problems,
        load: describe_load(load, workers),
        not_started,
        lost: lost_total,
        start_skew_ms,
        warnings,
        aborted,
        interrupted: false,
    })
}
