//! A worker's session in one run, once the coordinator has accepted it: wait for the start
//! (answering clock pings, watching the heartbeat timeout), run the engine, report every
//! interval, send `Started` once, stop the load on an abort, a lost coordinator or a broken
//! slice, send the final records and report, then wait for `Finish`.
//!
//! An actor over one event enum (`CoordinatorEvent`) that speaks domain messages
//! (`ToCoordinator`) on a bounded channel. The gRPC boundary (`super`) turns protocol
//! messages into events and messages into protocol messages, so this logic knows no protocol
//! type and its unit tests (`tests`) run it under `tokio::time::pause`, without gRPC.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::metrics::{RequestRecord, SliceTotals};
use common::worker_report::WorkerReport;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{HealthState, LinkError, coordinator_lost, unix_ns};
use crate::client::TargetClient;
use crate::config::{ReplayConfig, WorkItem};
use crate::engine::{self, StartAt};
use crate::metrics_actor::{Judging, MetricsHandle, Snapshot};

/// What the coordinator (or the worker's slice stream) told the session.
#[derive(Debug, Clone, PartialEq)]
pub enum CoordinatorEvent {
    /// Start the load at this instant of the worker's own wall clock (Unix ns).
    Start { start_unix_ns: u64 },
    /// A clock sample, to answer at once; `received_unix_ns` was stamped when it was read.
    ClockPing {
        seq: u64,
        coordinator_send_unix_ns: u64,
        received_unix_ns: u64,
    },
    /// Stop the load at once.
    Abort { reason: String },
    /// The coordinator has the final report: the session may end.
    Finish,
    /// The coordinator granted the first `own_prefix` exchanges of this worker's own slice.
    Grant { own_prefix: u64 },
    /// Any other message (a heartbeat): the coordinator is alive.
    Alive,
    /// The coordinator closed its stream.
    StreamEnded,
    /// The coordinator's stream broke.
    StreamBroke { reason: String },
    /// The slice stream failed: its transport broke (`transport`), or it sent an exchange
    /// that does not check out.
    SliceFailed { transport: bool, reason: String },
    /// A message of the coordinator failed its authentication check: nothing more it says
    /// is acted on, and the load stops.
    Untrusted { reason: String },
}

/// What the session tells the coordinator.
#[derive(Debug)]
pub enum ToCoordinator {
    /// The answer to a clock ping; the boundary stamps the send time as it writes it.
    ClockPong {
        seq: u64,
        coordinator_send_unix_ns: u64,
        worker_receive_unix_ns: u64,
    },
    /// The instant the load actually started, in the worker's clock (sent once).
    Started {
        unix_ns: u64,
    },
    /// Per-request records (`--requests-out`), at most `RECORDS_PER_MESSAGE` at a time.
    Records(Vec<RequestRecord>),
    /// A cumulative report; the last one is final.
    Report(Box<WorkerReport>),
    Heartbeat {
        unix_ns: u64,
    },
    /// This worker stops before its work is done, and why: sent before its final report, so
    /// the coordinator takes that report as a worker that quit, not one that finished.
    Failed {
        reason: String,
    },
    /// The engine asks to start the first `own_prefix` exchanges of its own slice.
    Claim {
        own_prefix: u64,
    },
}

/// Records per message: a batch stays far below gRPC's 4 MiB message limit.
pub const RECORDS_PER_MESSAGE: usize = 1024;

/// Events waiting for the session. When it is full the sender waits: the boundary then stops
/// reading the coordinator's stream, which back-pressures it through HTTP/2.
const EVENTS_CAPACITY: usize = 64;

/// Everything a session needs besides its channels.
pub struct Session {
    pub config: Arc<ReplayConfig>,
    pub client: TargetClient,
    /// The slice, as it arrives.
    pub items: mpsc::Receiver<WorkItem>,
    /// The slice loops until the duration ends.
    pub open_ended: bool,
    /// The runtime that carries the load (the session runs on the link's).
    pub load: tokio::runtime::Handle,
    /// The coordinator is lost after this long without any message from it.
    pub heartbeat_timeout: Duration,
    /// Interval between reports (and heartbeats).
    pub report_interval: Duration,
    pub health: Arc<HealthState>,
    /// Claims and grants of the own slice (`engine::claims`); `None` runs ungated.
    pub claims: Option<Arc<engine::claims::ClaimLink>>,
}

/// The handle of a running session: a cheap clone of its events' sender.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    events: mpsc::Sender<CoordinatorEvent>,
}

impl SessionHandle {
    /// Spawn the session on the current runtime. Messages for the coordinator go to `out`
    /// (bounded: clock pongs, heartbeats and `Started` are dropped when it is full, a later
    /// one stands for them; records and reports wait for room). The task ends with the
    /// session's outcome.
    pub fn spawn(
        session: Session,
        out: mpsc::Sender<ToCoordinator>,
    ) -> (SessionHandle, JoinHandle<Result<(), LinkError>>) {
        let (events_tx, events_rx) = mpsc::channel(EVENTS_CAPACITY);
        let task = tokio::spawn(session.run(events_rx, out));
        (SessionHandle { events: events_tx }, task)
    }

    /// Hand an event to the session; false when the session is over.
    pub async fn send(&self, event: CoordinatorEvent) -> bool {
        self.events.send(event).await.is_ok()
    }
}

impl Session {
    /// The session, start to end: wait for the start, run the engine while reporting, then
    /// leave with the final report.
    async fn run(
        self,
        mut events: mpsc::Receiver<CoordinatorEvent>,
        out: mpsc::Sender<ToCoordinator>,
    ) -> Result<(), LinkError> {
        let Session {
            config,
            client,
            items,
            open_ended,
            load,
            heartbeat_timeout,
            report_interval,
            health,
            claims,
        } = self;
        let mut before = BeforeStart {
            last_heard: Instant::now(),
            slice_failure: None,
        };
        let start_unix_ns = before
            .until_start(&mut events, &out, heartbeat_timeout, claims.as_deref())
            .await?;
        let now_ns = unix_ns();
        let start = StartAt {
            instant: std::time::Instant::now()
                + Duration::from_nanos(start_unix_ns.saturating_sub(now_ns)),
        };

        let (abort_tx, abort_rx) = watch::channel(false);
        let metrics = {
            let _guard = load.enter();
            MetricsHandle::spawn(Judging::from_options(&config.options))
        };
        let counters = Arc::new(engine::LiveCounters::default());
        let engine_task = load.spawn(engine::replay(engine::EngineRun {
            config,
            client,
            items,
            start,
            metrics: metrics.clone(),
            abort: abort_rx,
            open_ended,
            counters: counters.clone(),
            claims: claims.clone(),
        }));
        health.set(2);
        let mut running = Running {
            out,
            abort: abort_tx,
            metrics,
            counters,
            claimer: claims.clone().map(engine::claims::Claimer::new),
            claims,
            failure: None,
            seq: 0,
            started_sent: false,
            last_heard: before.last_heard,
            heartbeat_timeout,
        };
        if let Some(slice_failure) = before.slice_failure {
            running.fail(slice_failure);
        }
        let totals = running
            .until_engine_ends(engine_task, &mut events, report_interval)
            .await;
        health.set(3);
        running.leave(totals, &mut events).await
    }
}

/// The session before the start: answers clock pings, takes grants, and gives up on a silent
/// coordinator. A slice failure is kept for the start (as the load cannot have begun, it only
/// stops it).
struct BeforeStart {
    last_heard: Instant,
    slice_failure: Option<LinkError>,
}

impl BeforeStart {
    /// The start instant (the worker's wall clock, Unix ns), or why the session ends first.
    async fn until_start(
        &mut self,
        events: &mut mpsc::Receiver<CoordinatorEvent>,
        out: &mpsc::Sender<ToCoordinator>,
        heartbeat_timeout: Duration,
        claims: Option<&engine::claims::ClaimLink>,
    ) -> Result<u64, LinkError> {
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                _ = tokio::time::sleep_until(self.last_heard + heartbeat_timeout) => {
                    return Err(silence(heartbeat_timeout));
                }
            };
            match event {
                Some(CoordinatorEvent::Start { start_unix_ns }) => return Ok(start_unix_ns),
                Some(CoordinatorEvent::ClockPing {
                    seq,
                    coordinator_send_unix_ns,
                    received_unix_ns,
                }) => {
                    self.last_heard = Instant::now();
                    answer_ping(out, seq, coordinator_send_unix_ns, received_unix_ns);
                }
                Some(CoordinatorEvent::Abort { reason }) => return Err(LinkError::Aborted(reason)),
                Some(CoordinatorEvent::StreamEnded) | None => {
                    return Err(coordinator_lost("its stream ended before the start"));
                }
                Some(CoordinatorEvent::StreamBroke { reason }) => {
                    return Err(coordinator_lost(&reason));
                }
                Some(CoordinatorEvent::Untrusted { reason }) => {
                    return Err(LinkError::Untrusted(reason));
                }
                Some(CoordinatorEvent::SliceFailed { transport, reason }) => {
                    self.slice_failure
                        .get_or_insert(slice_error(transport, &reason));
                }
                Some(CoordinatorEvent::Grant { own_prefix }) => {
                    self.last_heard = Instant::now();
                    if let Some(claims) = claims {
                        claims.grant(own_prefix);
                    }
                }
                Some(CoordinatorEvent::Finish | CoordinatorEvent::Alive) => {
                    self.last_heard = Instant::now();
                }
            }
        }
    }
}

/// The session while the engine runs, and as it leaves.
struct Running {
    out: mpsc::Sender<ToCoordinator>,
    abort: watch::Sender<bool>,
    metrics: MetricsHandle,
    counters: Arc<engine::LiveCounters>,
    claims: Option<Arc<engine::claims::ClaimLink>>,
    claimer: Option<engine::claims::Claimer>,
    /// Why this worker stops early; the first reason wins, and the load is stopped.
    failure: Option<LinkError>,
    seq: u64,
    started_sent: bool,
    last_heard: Instant,
    heartbeat_timeout: Duration,
}

impl Running {
    /// Keep the first reason to stop, and stop the load.
    fn fail(&mut self, failure: LinkError) {
        self.failure.get_or_insert(failure);
        let _ = self.abort.send(true);
    }

    fn report_stream_closed(&mut self) {
        self.fail(coordinator_lost("its report stream closed"));
    }

    /// Report every interval and act on the coordinator's events until the engine ends;
    /// its totals (a failed engine is a failed worker, never silent zeros).
    async fn until_engine_ends(
        &mut self,
        mut engine_task: JoinHandle<SliceTotals>,
        events: &mut mpsc::Receiver<CoordinatorEvent>,
        report_interval: Duration,
    ) -> SliceTotals {
        let mut ticker = tokio::time::interval(report_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let listening = self.failure.is_none();
            tokio::select! {
                finished = &mut engine_task => match finished {
                    Ok(totals) => return totals,
                    Err(error) => {
                        self.fail(LinkError::Protocol(format!("the load engine failed: {error}")));
                        return SliceTotals::default();
                    }
                },
                _ = ticker.tick() => self.report_interval().await,
                own_prefix = urgent_claim(&mut self.claimer), if listening => {
                    self.send_claim(own_prefix).await;
                }
                event = events.recv(), if listening => self.on_event(event),
                _ = tokio::time::sleep_until(self.last_heard + self.heartbeat_timeout), if listening => {
                    self.fail(silence(self.heartbeat_timeout));
                }
            }
        }
    }

    /// One coordinator event while the load runs.
    fn on_event(&mut self, event: Option<CoordinatorEvent>) {
        match event {
            Some(CoordinatorEvent::Grant { own_prefix }) => {
                self.last_heard = Instant::now();
                if let Some(claims) = &self.claims {
                    claims.grant(own_prefix);
                }
            }
            Some(CoordinatorEvent::Abort { reason }) => self.fail(LinkError::Aborted(reason)),
            Some(CoordinatorEvent::ClockPing {
                seq,
                coordinator_send_unix_ns,
                received_unix_ns,
            }) => {
                self.last_heard = Instant::now();
                answer_ping(&self.out, seq, coordinator_send_unix_ns, received_unix_ns);
            }
            Some(CoordinatorEvent::SliceFailed { transport, reason }) => {
                self.fail(slice_error(transport, &reason));
            }
            Some(CoordinatorEvent::StreamEnded) | None => {
                self.fail(coordinator_lost("its stream ended"));
            }
            Some(CoordinatorEvent::StreamBroke { reason }) => self.fail(coordinator_lost(&reason)),
            Some(CoordinatorEvent::Untrusted { reason }) => {
                self.fail(LinkError::Untrusted(reason));
            }
            Some(
                CoordinatorEvent::Start { .. } | CoordinatorEvent::Finish | CoordinatorEvent::Alive,
            ) => self.last_heard = Instant::now(),
        }
    }

    /// `Started` once the load has begun (sent once; a later report stands for a dropped one).
    fn send_started(&mut self) {
        let started = self.counters.started_unix_ns.load(Ordering::Relaxed);
        if !self.started_sent && started > 0 {
            self.started_sent = true;
            let _ = self
                .out
                .try_send(ToCoordinator::Started { unix_ns: started });
        }
    }

    /// The interval's records and report, then a claim in the heartbeat's place (never
    /// dropped), or the heartbeat.
    async fn report_interval(&mut self) {
        self.send_started();
        let mut snapshot = self.metrics.snapshot().await;
        if send_records(&self.out, std::mem::take(&mut snapshot.records))
            .await
            .is_err()
        {
            self.report_stream_closed();
        }
        let report = self.report(snapshot, live_totals(&self.counters), false);
        if self.out.send(report).await.is_err() {
            self.report_stream_closed();
        }
        match self
            .claimer
            .as_mut()
            .and_then(engine::claims::Claimer::on_report)
        {
            Some(own_prefix) => self.send_claim(own_prefix).await,
            None => {
                let _ = self
                    .out
                    .try_send(ToCoordinator::Heartbeat { unix_ns: unix_ns() });
            }
        }
    }

    async fn send_claim(&mut self, own_prefix: u64) {
        if self
            .out
            .send(ToCoordinator::Claim { own_prefix })
            .await
            .is_err()
        {
            self.report_stream_closed();
        }
    }

    /// The next report (cumulative; `is_final` for the last).
    fn report(&mut self, snapshot: Snapshot, totals: SliceTotals, is_final: bool) -> ToCoordinator {
        self.seq += 1;
        ToCoordinator::Report(Box::new(WorkerReport {
            seq: self.seq,
            is_final,
            metrics: snapshot.metrics,
            totals,
            status_codes: snapshot.status_codes,
            tls_problems: snapshot.tls_problems,
            cpu_seconds: common::process::cpu_seconds(),
            peak_rss_bytes: common::process::peak_rss_bytes(),
            cores: common::process::available_cores(),
            timeline: with_target_reached(snapshot.timeline, &self.counters),
            steady: snapshot.steady,
            hand_over: self.counters.hand_over.span(),
        }))
    }

    /// The final records and report, then the coordinator's Finish; a worker that stops on
    /// its own says why first.
    async fn leave(
        mut self,
        totals: SliceTotals,
        events: &mut mpsc::Receiver<CoordinatorEvent>,
    ) -> Result<(), LinkError> {
        self.send_started();
        let mut snapshot = self.metrics.snapshot().await;
        // The records go before the final report, on the same stream, so the coordinator has
        // every one of them when it reads the final counts.
        if send_records(&self.out, std::mem::take(&mut snapshot.records))
            .await
            .is_err()
        {
            self.failure
                .get_or_insert(coordinator_lost("its report stream closed"));
        }
        let report = self.report(snapshot, totals, true);
        let heartbeat_timeout = self.heartbeat_timeout;
        let Some(failure) = self.failure.take() else {
            self.out
                .send(report)
                .await
                .map_err(|_| coordinator_lost("its report stream closed"))?;
            // Wait for the coordinator's Finish (or the end of its stream) so the report is
            // delivered.
            let _ = tokio::time::timeout(heartbeat_timeout, until_finished(events)).await;
            return Ok(());
        };
        // Said before the final report, on the same ordered stream: a worker that stops on
        // its own (not told to) is a lost worker under the run's policy, with this reason,
        // and its report is not a finished slice.
        if !matches!(failure, LinkError::Aborted(_)) {
            let said = ToCoordinator::Failed {
                reason: failure.to_string(),
            };
            let _ = tokio::time::timeout(LEAVE_PATIENCE, self.out.send(said)).await;
        }
        // Best effort: the coordinator may still be there (an abort) and want the partial
        // numbers. The report only reaches the wire while the link runs: wait for the
        // coordinator's Finish or the end of its stream — within the heartbeat timeout after
        // an abort (the coordinator is there and answers), a second otherwise (it may never
        // answer; a second is plenty to write the report).
        let _ = tokio::time::timeout(LEAVE_PATIENCE, self.out.send(report)).await;
        let patience = match failure {
            LinkError::Aborted(_) => heartbeat_timeout,
            _ => LEAVE_PATIENCE,
        };
        let _ = tokio::time::timeout(patience, until_finished(events)).await;
        Err(failure)
    }
}

/// The coordinator said nothing for the heartbeat timeout.
fn silence(heartbeat_timeout: Duration) -> LinkError {
    coordinator_lost(&format!("no message for {heartbeat_timeout:?}"))
}

/// Answer a clock ping at once (dropped when the channel is full: a later one stands for it).
fn answer_ping(
    out: &mpsc::Sender<ToCoordinator>,
    seq: u64,
    coordinator_send_unix_ns: u64,
    worker_receive_unix_ns: u64,
) {
    let _ = out.try_send(ToCoordinator::ClockPong {
        seq,
        coordinator_send_unix_ns,
        worker_receive_unix_ns,
    });
}

/// How long a worker that stops because of a failure gives its final report to reach the
/// wire when the coordinator may not answer.
const LEAVE_PATIENCE: Duration = Duration::from_secs(1);

/// A claim that cannot wait for the next report; never, without claims.
async fn urgent_claim(claimer: &mut Option<engine::claims::Claimer>) -> u64 {
    match claimer {
        Some(claimer) => claimer.urgent().await,
        None => std::future::pending().await,
    }
}

/// Until the coordinator's Finish, or the end of its stream.
async fn until_finished(events: &mut mpsc::Receiver<CoordinatorEvent>) {
    loop {
        match events.recv().await {
            Some(
                CoordinatorEvent::Finish
                | CoordinatorEvent::StreamEnded
                | CoordinatorEvent::StreamBroke { .. }
                | CoordinatorEvent::Untrusted { .. },
            )
            | None => return,
            Some(_) => {}
        }
    }
}

/// A failed slice stream: the coordinator is gone when its transport broke, else it sent
/// something this worker will not replay.
fn slice_error(transport: bool, reason: &str) -> LinkError {
    if transport {
        coordinator_lost(&format!("its slice stream broke: {reason}"))
    } else {
        LinkError::Protocol(format!("slice: {reason}"))
    }
}

/// The engine's counts so far, from its one book.
fn live_totals(counters: &engine::LiveCounters) -> SliceTotals {
    counters.totals()
}

/// The steady-state window's data: the completion timeline and when the load reached its
/// target.
fn with_target_reached(
    mut timeline: common::timeline::CompletionTimeline,
    counters: &engine::LiveCounters,
) -> common::timeline::CompletionTimeline {
    let reached = counters.target_reached_unix_us.load(Ordering::Relaxed);
    timeline.target_reached_unix_us = (reached > 0).then_some(reached);
    timeline
}

/// Send per-request records in bounded batches; an error when the coordinator's side is gone.
async fn send_records(
    out: &mpsc::Sender<ToCoordinator>,
    records: Vec<RequestRecord>,
) -> Result<(), ()> {
    let mut records = records.into_iter().peekable();
    while records.peek().is_some() {
        let batch = records.by_ref().take(RECORDS_PER_MESSAGE).collect();
        out.send(ToCoordinator::Records(batch))
            .await
            .map_err(|_| ())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
