//! The run orchestrator: scan the recording, start the embedded mock when there is no target,
//! serve the gRPC link, start local workers, hand out assignments and slices, start everyone
//! at one instant, collect reports, and merge them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::metrics::RunMetrics;
use proto::convert::{SliceTotals, metrics_from_report};
use proto::v1;
use tokio::sync::mpsc;

use crate::config::{GlobalLoad, RunConfig, split_evenly};
use crate::server::{CoordinatorService, ServiceState, WorkerEvent};
use crate::shard::{SlicePlan, feed_slice};

/// Why a run could not complete (exit code 3), or bad input found late (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
}

/// One worker's part of a finished run.
#[derive(Debug, Clone)]
pub struct WorkerOutcome {
    pub id: String,
    pub host: String,
    /// Exchanges sent to it.
    pub assigned: u64,
    pub totals: SliceTotals,
    pub metrics: RunMetrics,
    pub lost: bool,
    pub loss_reason: Option<String>,
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
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
    pub load: serde_json::Value,
    pub assigned: u64,
    pub not_started: u64,
    pub lost: u64,
    pub warnings: Vec<String>,
    /// True when a worker was lost and the run was aborted.
    pub aborted: bool,
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
                duration_s: load.duration.map(|d| d.as_secs_f64()).unwrap_or(0.0),
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
            timeout_s: self.config.timeout.as_secs_f64(),
            tag_requests: self.tag_requests,
            worker_index: index as u32,
        }
    }
}

struct WorkerSlot {
    id: String,
    host: String,
    control: mpsc::Sender<Result<v1::CoordinatorMessage, tonic::Status>>,
    feeder: Option<tokio::task::JoinHandle<Result<u64, common::recording::RecordingError>>>,
    latest: Option<v1::Report>,
    done: bool,
    lost: Option<String>,
    last_heard: Instant,
}

/// Inputs of one replay that do not change between sweep levels.
pub struct ReplaySetup<'a> {
    pub config: &'a RunConfig,
    pub load: GlobalLoad,
    pub target: String,
    pub tag_requests: bool,
    pub exchanges: u64,
    pub pass_span_ms: f64,
}

/// Run one replay with `setup.config.workers` local worker processes.
pub async fn replay(setup: ReplaySetup<'_>) -> Result<ReplayResult, RunError> {
    let config = setup.config;
    let workers = config.workers;
    let load = setup.load.clone();
    let run_id = uuid::Uuid::new_v4().to_string();
    let open_ended = load.requests.is_none() && load.duration.is_some() && !load.recorded_schedule;
    let plan = SlicePlan {
        recording: config.recording.clone(),
        workers,
        exchanges: setup.exchanges,
        requests: load.requests,
        loop_forever: open_ended,
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
    let state = Arc::new(ServiceState::new(
        workers,
        None,
        Box::new(move |index| assignment.for_worker(index)),
        events_tx,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| RunError::Failed(format!("cannot listen for workers: {e}")))?;
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| RunError::Failed(format!("cannot listen for workers: {e}")))?;
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let service = CoordinatorService {
        state: state.clone(),
    };
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
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

    // Local worker processes: the same binary, dialing back over loopback gRPC.
    let exe = std::env::current_exe()
        .map_err(|e| RunError::Failed(format!("cannot find this program to start workers: {e}")))?;
    let mut children = Vec::new();
    for i in 0..workers {
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
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RunError::Failed(format!("cannot start local worker {i}: {e}")))?;
        children.push(child);
    }

    let result = collect(
        config,
        &plan,
        &run_id,
        &setup.target,
        &load,
        workers,
        &mut events,
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

async fn collect(
    config: &RunConfig,
    plan: &SlicePlan,
    run_id: &str,
    target: &str,
    load: &GlobalLoad,
    workers: usize,
    events: &mut mpsc::Receiver<WorkerEvent>,
) -> Result<ReplayResult, RunError> {
    let mut slots: Vec<Option<WorkerSlot>> = (0..workers).map(|_| None).collect();
    let join_deadline = Instant::now() + Duration::from_secs(30);
    let mut joined = 0;
    while joined < workers {
        let event = tokio::time::timeout_at(join_deadline.into(), events.recv())
            .await
            .map_err(|_| {
                RunError::Failed(format!(
                    "only {joined} of {workers} workers joined within 30 s"
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
                let plan = plan.clone();
                let feeder = tokio::task::spawn_blocking(move || feed_slice(&plan, index, slice));
                slots[index] = Some(WorkerSlot {
                    id,
                    host,
                    control,
                    feeder: Some(feeder),
                    latest: None,
                    done: false,
                    lost: None,
                    last_heard: Instant::now(),
                });
                joined += 1;
            }
            WorkerEvent::Failed { reason, .. } => {
                return Err(RunError::Input(format!(
                    "a worker could not start: {reason}"
                )));
            }
            WorkerEvent::Gone { reason, .. } => {
                return Err(RunError::Failed(format!(
                    "a worker left before the start: {reason}"
                )));
            }
            _ => {}
        }
    }
    let mut slots: Vec<WorkerSlot> = slots.into_iter().flatten().collect();

    // One start instant for everyone, far enough ahead for the message to arrive and the
    // first slice chunks to be buffered.
    let started_at = SystemTime::now() + Duration::from_millis(300);
    let started_instant = Instant::now() + Duration::from_millis(300);
    for slot in &slots {
        let _ = slot
            .control
            .send(Ok(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Start(v1::Start {
                    start_unix_ns: unix_ns(started_at),
                })),
            }))
            .await;
    }

    let mut aborted = false;
    let mut warnings = Vec::new();
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    while slots.iter().any(|s| !s.done && s.lost.is_none()) {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                match event {
                    WorkerEvent::Report { index, report } => {
                        let slot = &mut slots[index];
                        slot.last_heard = Instant::now();
                        let newer = slot.latest.as_ref().is_none_or(|r| report.seq > r.seq);
                        if newer {
                            slot.done = report.r#final;
                            slot.latest = Some(report);
                        }
                    }
                    WorkerEvent::Heartbeat { index } => slots[index].last_heard = Instant::now(),
                    WorkerEvent::Failed { index, reason } => {
                        slots[index].lost = Some(format!("it failed: {reason}"));
                    }
                    WorkerEvent::Gone { index, reason } => {
                        if !slots[index].done {
                            slots[index].lost = Some(reason);
                        }
                    }
                    WorkerEvent::Joined { .. } => {}
                }
            }
            _ = heartbeat.tick() => {
                for slot in &mut slots {
                    if !slot.done && slot.lost.is_none() && slot.last_heard.elapsed() > config.heartbeat_timeout {
                        slot.lost = Some(format!("no heartbeat for {:?}", config.heartbeat_timeout));
                    }
                    let _ = slot.control.try_send(Ok(v1::CoordinatorMessage {
                        msg: Some(v1::coordinator_message::Msg::Heartbeat(v1::Heartbeat { unix_ns: unix_ns(SystemTime::now()) })),
                    }));
                }
            }
        }
        if let Some(lost) = slots.iter().find(|s| s.lost.is_some()) {
            warnings.push(format!(
                "worker {} ({}) was lost: {}",
                lost.id,
                lost.host,
                lost.lost.as_deref().unwrap_or("")
            ));
            aborted = true;
            break;
        }
    }

    if aborted {
        for slot in &slots {
            let _ = slot
                .control
                .send(Ok(v1::CoordinatorMessage {
                    msg: Some(v1::coordinator_message::Msg::Abort(v1::Abort {
                        reason: "a worker was lost (--on-worker-loss fail)".into(),
                    })),
                }))
                .await;
        }
        // Give survivors a moment to send their partial final reports.
        let grace = Instant::now() + Duration::from_secs(3);
        while slots.iter().any(|s| !s.done && s.lost.is_none()) {
            match tokio::time::timeout_at(grace.into(), events.recv()).await {
                Ok(Some(WorkerEvent::Report { index, report })) => {
                    let slot = &mut slots[index];
                    if slot.latest.as_ref().is_none_or(|r| report.seq > r.seq) {
                        slot.done = report.r#final;
                        slot.latest = Some(report);
                    }
                }
                Ok(Some(WorkerEvent::Gone { index, reason })) if !slots[index].done => {
                    slots[index].lost = Some(reason);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    } else {
        for slot in &slots {
            let _ = slot
                .control
                .send(Ok(v1::CoordinatorMessage {
                    msg: Some(v1::coordinator_message::Msg::Finish(v1::Finish {})),
                }))
                .await;
        }
    }
    let duration = started_instant.elapsed();

    let mut merged = RunMetrics::new();
    let mut status_codes = BTreeMap::new();
    let mut outcomes = Vec::new();
    let (mut assigned_total, mut not_started, mut lost_total) = (0u64, 0u64, 0u64);
    for slot in &mut slots {
        let assigned = match slot.feeder.take() {
            Some(feeder) if slot.done => match feeder.await {
                Ok(Ok(n)) => n,
                Ok(Err(error)) => return Err(RunError::Input(error.to_string())),
                Err(_) => 0,
            },
            Some(feeder) => {
                feeder.abort();
                0
            }
            None => 0,
        };
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
        let answered = metrics.counters.completed() + metrics.counters.warmup;
        let assigned = if plan.loop_forever {
            // Open-ended slices loop until the duration: what was buffered but never read is
            // not part of the run.
            answered + totals.not_started + totals.lost
        } else {
            assigned.max(answered + totals.not_started + totals.lost)
        };
        // A lost worker's exchanges that it never reported on are lost (in flight, or unknown).
        let lost = if slot.lost.is_some() {
            assigned.saturating_sub(answered + totals.not_started)
        } else {
            totals.lost
        };
        let not_started_here = assigned.saturating_sub(answered + lost);
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
            },
            metrics,
            lost: slot.lost.is_some(),
            loss_reason: slot.lost.clone(),
            cpu_seconds: slot.latest.as_ref().map(|r| r.cpu_seconds).unwrap_or(0.0),
            peak_rss_bytes: slot.latest.as_ref().map(|r| r.peak_rss_bytes).unwrap_or(0),
        });
    }
    Ok(ReplayResult {
        run_id: run_id.to_owned(),
        started_at,
        duration,
        target: target.to_owned(),
        metrics: merged,
        workers: outcomes,
        status_codes,
        load: describe_load(load, workers),
        assigned: assigned_total,
        not_started,
        lost: lost_total,
        warnings,
        aborted,
    })
}
