//! The run supervisor: an actor over typed events that owns every worker's slot for one
//! replay. It decides join, clock sync, start, supervision (reports, heartbeats, loss),
//! reassignment, abort and finish. Long work (feeding slices, re-feeding a lost worker's
//! exchanges) runs in tasks of its own and comes back as events, so heartbeats keep going
//! while it runs. It sees domain types only: the gRPC service (`server`) turns protocol
//! messages into [`WorkerEvent`]s and [`Control`]s into protocol messages.
//!
//! Time is `tokio::time`, so the unit tests drive join, start, loss, reassignment and abort
//! under `tokio::time::pause`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::metrics::SliceTotals;
use common::metrics::{Metric, RunMetrics};
use common::recording::RecordingError;
use proto::convert::ReceivedReport;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{RunConfig, WorkerSource};
use crate::run::{ClockEstimate, ReplayResult, RunError, WorkerOutcome};
use crate::server::{ClockSample, Control, WorkerControl, WorkerEvent};
use crate::shard::{FeedControl, SliceChunk, SlicePlan, SliceSender, feed_reassigned, feed_slices};
use crate::timeline::{LiveTotals, Timeline};

/// How the supervisor behaves; from the run's config, or set directly by tests.
#[derive(Debug, Clone)]
pub struct Settings {
    pub workers: usize,
    pub join_timeout: Duration,
    pub heartbeat_timeout: Duration,
    /// `--on-worker-loss reassign` (else `fail`: abort the run).
    pub reassign_on_loss: bool,
    /// Local worker processes: one that leaves before the start will not come back.
    pub local_workers: bool,
    pub max_skew: Duration,
    pub reorder_window: usize,
    /// How far ahead of the start instant the start message goes out.
    pub start_lead: Duration,
    /// Clock pings per worker; the one with the shortest round trip gives the offset.
    pub clock_samples: u64,
    /// How long a worker may take to answer one round of clock pings.
    pub clock_patience: Duration,
    /// After an abort, how long survivors have to send their partial final reports.
    pub abort_grace: Duration,
    /// Heartbeats, silence checks and progress.
    pub tick: Duration,
    /// How often each worker reports ([`report_interval_for`]).
    pub report_interval: Duration,
    /// `--metrics-listen`: publish the merged histograms with the live state on each tick
    /// (the progress line itself needs only the timeline's running totals).
    pub live_histograms: bool,
    /// `--duration`: no worker starts an exchange later than this after the start, so the
    /// feed stops then (plus [`FEED_MARGIN`]); what was never handed out is not started.
    pub load_duration: Option<Duration>,
}

/// How often each worker reports to a coordinator of `workers` workers: a worker's own
/// 0.5 s up to 100 workers, then 5 ms per worker (1 s for 200), so that the coordinator
/// decodes about 200 reports a second; but never more than a third of the heartbeat timeout,
/// since a worker's heartbeats go with its reports (1.67 s with the default 5 s).
pub fn report_interval_for(workers: usize, heartbeat_timeout: Duration) -> Duration {
    let scaled =
        Duration::from_millis(5).saturating_mul(u32::try_from(workers).unwrap_or(u32::MAX));
    scaled
        .max(Duration::from_millis(500))
        .min(heartbeat_timeout / 3)
        .max(Duration::from_millis(100))
}

/// The longest interval between the coordinator's heartbeats to a worker: with many workers
/// they go every second (a worker's own heartbeat timeout is 5 s by default), not every tick;
/// up to 100 workers (0.5 s reports) every tick, as a worker with a short `--heartbeat-timeout`
/// expects.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Schedule lag (ms) that, held by a tenth of a worker's requests or more, means it sent
/// late; a single outlier (p99 alone) does not.
const LATE_LAG_P90_MS: f64 = 10.0;
/// CPU share of its cores above which a worker that sends late is saturated.
const BUSY_CPU_SHARE: f64 = 0.5;
/// CPU share above which a worker is saturated whatever its lag.
const SATURATED_CPU_SHARE: f64 = 0.9;

/// What the report says of one worker's own load: saturated only when its lag stays high
/// (p90, not one outlier) and its CPU is busy, or its CPU is nearly all used; high lag on an
/// idle worker is the machine or the network stalling it, and said so.
fn load_warning(
    id: &str,
    lag: Option<&common::metrics::Stats>,
    cpu_share: f64,
    cores: u32,
) -> Option<String> {
    let (p50, p90) = lag.map_or((0.0, 0.0), |s| (s.p50, s.p90));
    let late = p90 > LATE_LAG_P90_MS;
    if cpu_share > SATURATED_CPU_SHARE || (late && cpu_share > BUSY_CPU_SHARE) {
        Some(format!(
            "worker {id} was saturated (schedule lag p50 {p50:.1} ms, p90 {p90:.1} ms, CPU {:.0} % of {cores} cores): a saturated client's numbers are not the server's",
            cpu_share * 100.0
        ))
    } else if late {
        Some(format!(
            "worker {id} sent late (schedule lag p50 {p50:.1} ms, p90 {p90:.1} ms) while its CPU was {:.0} % busy ({cores} cores): not saturated; the machine or the network stalled it",
            cpu_share * 100.0
        ))
    } else {
        None
    }
}

/// How long after the end of `--duration` the feed goes on: the workers' clocks and start
/// instants differ by far less, and each worker holds thousands of exchanges anyway.
pub const FEED_MARGIN: Duration = Duration::from_secs(1);

impl Settings {
    pub fn from_config(config: &RunConfig, workers: usize) -> Settings {
        Settings {
            workers,
            join_timeout: config.join_timeout,
            heartbeat_timeout: config.heartbeat_timeout,
            reassign_on_loss: config.reassign_on_loss,
            local_workers: matches!(config.source, WorkerSource::Local(_)),
            max_skew: config.max_skew,
            reorder_window: config.reorder_window,
            start_lead: Duration::from_millis(500),
            clock_samples: 8,
            clock_patience: Duration::from_secs(2),
            abort_grace: Duration::from_secs(3),
            tick: Duration::from_millis(500),
            report_interval: report_interval_for(workers, config.heartbeat_timeout),
            live_histograms: config.metrics_listen.is_some(),
            load_duration: None,
        }
    }
}

/// What the report says about the run that the supervisor does not decide.
#[derive(Debug, Clone)]
pub struct RunIdentity {
    pub run_id: String,
    pub target: String,
    /// The load model as shown in reports.
    pub load: serde_json::Value,
    /// A recorded schedule or a rate: start skew matters.
    pub scheduled: bool,
}

/// The live state of a replay, published on every tick and once at the end: the CLI draws
/// the progress line from it and `live` serves it to Prometheus.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub run_id: String,
    /// Every worker's last report, merged.
    pub metrics: std::sync::Arc<RunMetrics>,
    /// Requests answered (measured, not warm-up).
    pub answered: u64,
    pub planned: Option<u64>,
    pub elapsed: Duration,
    /// TTFT p50 and p95 so far, ms.
    pub ttft_ms: Option<(f64, f64)>,
    pub errors: u64,
    /// Requests sent and not answered yet.
    pub in_flight: u64,
    pub not_started: u64,
    pub lost: u64,
    pub alive: usize,
    pub workers: usize,
    /// The replay is over: these are its final numbers.
    pub finished: bool,
}

/// The run supervisor. [`Supervisor::run`] consumes it and returns the merged result.
pub struct Supervisor {
    settings: Settings,
    plan: SlicePlan,
    identity: RunIdentity,
    events: mpsc::Receiver<WorkerEvent>,
    interrupt: watch::Receiver<bool>,
    progress: Option<watch::Sender<Progress>>,
    slots: Vec<Slot>,
    background: JoinSet<Background>,
    /// Reassignments being fed right now.
    reassigning: usize,
    warnings: Vec<String>,
    aborted: bool,
    interrupted: bool,
    /// The run over time, from the start on.
    timeline: Option<Timeline>,
    /// Stops the feed (or one worker's part of it).
    feed: std::sync::Arc<FeedControl>,
    /// When the feed stops: the end of `--duration` plus [`FEED_MARGIN`].
    feed_until: Option<Instant>,
    /// When the workers were last told the coordinator is alive.
    last_heartbeat: Option<Instant>,
}

/// One worker, from its join to the end of the run.
struct Slot {
    id: String,
    host: String,
    control: WorkerControl,
    slice: SliceSender,
    /// Its own slice is still being fed: until then `sent` is not final.
    feeding: bool,
    /// Reassigned exchanges being fed to it right now.
    incoming: usize,
    /// Exchanges handed to it so far (own slice + reassigned).
    sent: u64,
    /// Reassigned exchanges it received (their order within its stream is unknown).
    reassigned_in: u64,
    latest: Option<Box<ReceivedReport>>,
    done: bool,
    lost: Option<String>,
    last_heard: Instant,
    clock: ClockEstimate,
    /// When it actually started, in the coordinator's clock (Unix ns).
    started_unix_ns: Option<u64>,
    closed: bool,
    /// Accounting of a lost worker: (assigned, lost in flight).
    lost_accounting: Option<(u64, u64)>,
}

/// Long work that finished.
enum Background {
    /// The feed of every slice; what each worker was handed.
    Fed {
        result: Result<Vec<u64>, RecordingError>,
    },
    Reassigned {
        dead: usize,
        survivors: Vec<usize>,
        result: Result<Vec<u64>, RecordingError>,
    },
}

/// What woke the supervisor up.
enum Wake {
    Interrupt,
    Event(Option<WorkerEvent>),
    Tick,
    Background(Result<Background, tokio::task::JoinError>),
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Slot {
    fn new(id: String, host: String, control: WorkerControl, slice: SliceSender) -> Slot {
        Slot {
            id,
            host,
            control,
            slice,
            feeding: false,
            incoming: 0,
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
        }
    }

    fn reported(&self) -> SliceTotals {
        self.latest.as_ref().map(|r| r.totals).unwrap_or_default()
    }

    fn answered(&self) -> u64 {
        self.latest.as_ref().map(|r| r.answered()).unwrap_or(0)
    }

    fn alive(&self) -> bool {
        !self.done && self.lost.is_none()
    }

    fn lose(&mut self, reason: String) {
        if self.lost.is_none() {
            self.lost = Some(reason);
        }
    }

    /// Take a report if it is newer than the last one. A report whose counters overflow or
    /// that answers for more exchanges than the worker was sent makes the worker lost (named
    /// in the report); the last valid report stays, so the other workers' data and this
    /// one's earlier data are kept.
    /// Returns whether it was taken.
    fn accept_report(&mut self, mut report: Box<ReceivedReport>) -> bool {
        if self.latest.as_ref().is_some_and(|r| report.seq <= r.seq) {
            return false;
        }
        match self.check_report(&report) {
            Ok(()) => {
                // Most reports leave the timeline's buckets out
                // (`proto::convert::TIMELINE_EVERY_REPORTS`): keep the last ones sent.
                if report.timeline.completions.is_empty()
                    && let Some(previous) = &mut self.latest
                    && !previous.timeline.completions.is_empty()
                {
                    let kept = std::mem::take(&mut previous.timeline);
                    let edges = &report.timeline;
                    report.timeline = common::timeline::Timeline {
                        target_reached_unix_us: edges
                            .target_reached_unix_us
                            .or(kept.target_reached_unix_us),
                        last_issued_unix_us: edges.last_issued_unix_us.or(kept.last_issued_unix_us),
                        ..kept
                    };
                }
                self.done = report.is_final;
                self.latest = Some(report);
                true
            }
            Err(reason) => {
                self.lose(format!(
                    "it sent an invalid report ({reason}); its data after its last valid report is dropped"
                ));
                false
            }
        }
    }

    fn check_report(&self, report: &ReceivedReport) -> Result<(), String> {
        // Every counter against what the worker could have measured: nothing wraps when the
        // coordinator adds the workers up. While its slice is still being fed (or a
        // reassignment is on its way), what it was sent is not known yet.
        let settled = !self.feeding && self.incoming == 0 && self.sent > 0;
        report.check_counters(settled.then_some(self.sent))?;
        let accounted = report.accounted().ok_or("its counters overflow")?;
        // Once everything handed to it is counted, nobody answers for more than it was sent.
        if settled && accounted > self.sent {
            return Err(format!(
                "it accounts for {accounted} exchanges but was sent {}",
                self.sent
            ));
        }
        Ok(())
    }
}

impl Supervisor {
    pub fn new(
        settings: Settings,
        plan: SlicePlan,
        identity: RunIdentity,
        events: mpsc::Receiver<WorkerEvent>,
        interrupt: watch::Receiver<bool>,
        progress: Option<watch::Sender<Progress>>,
    ) -> Supervisor {
        Supervisor {
            settings,
            plan,
            identity,
            events,
            interrupt,
            progress,
            slots: Vec::new(),
            background: JoinSet::new(),
            reassigning: 0,
            warnings: Vec::new(),
            aborted: false,
            interrupted: false,
            timeline: None,
            feed: std::sync::Arc::new(FeedControl::new(0)),
            feed_until: None,
            last_heartbeat: None,
        }
    }

    /// Run the replay to its end: join, clock sync, start, supervise, stop, merge.
    pub async fn run(mut self) -> Result<ReplayResult, RunError> {
        self.join().await?;
        self.sync_clocks().await?;
        self.spawn_feeders();
        let (started_at, started) = self.start();
        let supervised = self.supervise(started).await;
        // Nothing more can be sent once the workers are done; a feed waiting on a full slice
        // ends now rather than when its worker's stream closes.
        self.feed.stop();
        supervised?;
        self.stop().await;
        self.background.abort_all();
        let duration = started.elapsed();
        let progress = self.progress.take();
        let planned = self.plan.planned_total();
        let timeline = self
            .timeline
            .take()
            .map(|timeline| timeline.finish(self.slots.iter().map(|s| s.latest.as_deref())));
        let mut result = self.finish(started_at, duration)?;
        result.timeline = timeline.unwrap_or_default();
        if let Some(progress) = progress {
            // The final numbers are the report's, accounting of lost workers included.
            let metrics = &result.metrics;
            progress.send_replace(Progress {
                run_id: result.run_id.clone(),
                answered: metrics.counters.completed(),
                planned,
                elapsed: duration,
                ttft_ms: metrics.stats(Metric::Ttft).map(|s| (s.p50, s.p95)),
                errors: metrics.counters.failed(),
                in_flight: 0,
                not_started: result.not_started,
                lost: result.lost,
                alive: result.workers.iter().filter(|w| !w.lost).count(),
                workers: result.workers.len(),
                finished: true,
                metrics: std::sync::Arc::new(metrics.clone()),
            });
        }
        Ok(result)
    }

    /// Wait for every worker's join, within the join timeout.
    async fn join(&mut self) -> Result<(), RunError> {
        let workers = self.settings.workers;
        let deadline = Instant::now() + self.settings.join_timeout;
        let mut pending: Vec<Option<Slot>> = (0..workers).map(|_| None).collect();
        let mut joined = 0;
        // A worker that joined early hears from the coordinator while the others come: its
        // own heartbeat timeout runs from its join, and only --join-timeout bounds the wait.
        let mut heartbeats =
            tokio::time::interval(self.settings.report_interval.min(HEARTBEAT_EVERY));
        heartbeats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while joined < workers {
            let event = tokio::select! {
                event = self.events.recv() => event,
                _ = heartbeats.tick() => {
                    let unix_now = unix_ns(SystemTime::now());
                    for slot in pending.iter().flatten() {
                        slot.control.send(Control::Heartbeat { unix_ns: unix_now });
                    }
                    continue;
                }
                Ok(_) = self.interrupt.wait_for(|i| *i) => {
                    return Err(RunError::Failed("interrupted before the load started".into()));
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(RunError::Failed(format!(
                        "only {joined} of {workers} workers joined within {:?}",
                        self.settings.join_timeout
                    )));
                }
            };
            let Some(event) = event else {
                return Err(RunError::Failed("worker link closed".into()));
            };
            match event {
                WorkerEvent::Joined {
                    index,
                    id,
                    host,
                    control,
                    slice,
                } if index < workers => {
                    if pending[index].is_none() {
                        joined += 1;
                    }
                    pending[index] = Some(Slot::new(id, host, control, slice));
                }
                WorkerEvent::Failed { reason, .. } => {
                    return Err(RunError::Input(format!(
                        "a worker could not start: {reason}"
                    )));
                }
                WorkerEvent::Gone { reason, .. } if self.settings.local_workers => {
                    // A local worker process that dies before the start will not come back.
                    return Err(RunError::Failed(format!(
                        "a worker left before the start: {reason}"
                    )));
                }
                WorkerEvent::Gone { index, reason } => {
                    // A remote worker's slot is free again (the service released it): wait
                    // for another, e.g. the same worker restarted by its orchestrator.
                    if let Some(slot) = pending.get_mut(index).and_then(Option::take) {
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
        self.slots = pending.into_iter().flatten().collect();
        Ok(())
    }

    /// Exchange NTP-style pings with every worker and estimate its clock offset.
    async fn sync_clocks(&mut self) -> Result<(), RunError> {
        let workers = self.slots.len();
        let mut best: Vec<Option<(u64, i64)>> = vec![None; workers];
        for seq in 0..self.settings.clock_samples {
            for slot in &self.slots {
                slot.control.send(Control::ClockPing {
                    seq,
                    sent_unix_ns: unix_ns(SystemTime::now()),
                });
            }
            // Each worker answers each ping once: a second pong (or one for another round)
            // from the same stream does not stand in for a worker that has not answered.
            let mut answered_by = vec![false; workers];
            let mut answered = 0;
            let deadline = Instant::now() + self.settings.clock_patience;
            while answered < workers {
                let event = tokio::select! {
                    event = self.events.recv() => event,
                    Ok(_) = self.interrupt.wait_for(|i| *i) => {
                        return Err(RunError::Failed("interrupted before the load started".into()));
                    }
                    () = tokio::time::sleep_until(deadline) => {
                        let silent: Vec<&str> = self
                            .slots
                            .iter()
                            .zip(&answered_by)
                            .filter(|(_, answered)| !**answered)
                            .map(|(slot, _)| slot.id.as_str())
                            .collect();
                        return Err(RunError::Failed(format!(
                            "a worker did not answer clock pings ({})",
                            silent.join(", ")
                        )));
                    }
                };
                let Some(event) = event else {
                    return Err(RunError::Failed("worker link closed".into()));
                };
                match event {
                    WorkerEvent::ClockPong { index, sample }
                        if sample.seq == seq && index < workers && !answered_by[index] =>
                    {
                        answered_by[index] = true;
                        answered += 1;
                        self.slots[index].last_heard = Instant::now();
                        let (delay, offset) = clock_offset(sample);
                        if best[index].is_none_or(|(d, _)| delay < d) {
                            best[index] = Some((delay, offset));
                        }
                    }
                    WorkerEvent::Gone { index, reason } => {
                        return Err(RunError::Failed(format!(
                            "worker {} left before the start: {reason}",
                            self.worker_name(index)
                        )));
                    }
                    WorkerEvent::Failed { index, reason } => {
                        return Err(RunError::Input(format!(
                            "worker {} could not start: {reason}",
                            self.worker_name(index)
                        )));
                    }
                    _ => {}
                }
            }
        }
        for (slot, best) in self.slots.iter_mut().zip(best) {
            if let Some((delay, offset)) = best {
                slot.clock = ClockEstimate {
                    offset_ns: offset,
                    uncertainty_ns: delay / 2,
                };
            }
        }
        Ok(())
    }

    fn worker_name(&self, index: usize) -> &str {
        self.slots.get(index).map(|s| s.id.as_str()).unwrap_or("?")
    }

    /// Every worker's slice is read from the recording in one walk, in a blocking task.
    fn spawn_feeders(&mut self) {
        let feed = std::sync::Arc::new(FeedControl::new(self.slots.len()));
        self.feed = feed.clone();
        let slices: Vec<SliceSender> = self
            .slots
            .iter_mut()
            .map(|slot| {
                slot.feeding = true;
                slot.slice.clone()
            })
            .collect();
        let plan = self.plan.clone();
        self.background.spawn_blocking(move || Background::Fed {
            result: feed_slices(&plan, &slices, &feed),
        });
    }

    /// One start instant for everyone, far enough ahead for the message to arrive and the
    /// first slice chunks to be buffered; each worker gets it in its own clock.
    fn start(&mut self) -> (SystemTime, Instant) {
        let lead = self.settings.start_lead;
        let started_at = SystemTime::now() + lead;
        let started = Instant::now() + lead;
        let t0 = unix_ns(started_at) as i128;
        for slot in &mut self.slots {
            slot.control.send(Control::Start {
                unix_ns: (t0 + slot.clock.offset_ns as i128).max(0) as u64,
            });
            slot.last_heard = Instant::now();
        }
        self.timeline = Some(
            Timeline::new(started_at, self.slots.len())
                .with_report_interval(self.settings.report_interval),
        );
        self.feed_until = self
            .settings
            .load_duration
            .map(|duration| started + duration + FEED_MARGIN);
        (started_at, started)
    }

    /// Until every worker is done or lost: take reports, watch heartbeats, handle loss,
    /// close slices once nothing more can be handed to them.
    async fn supervise(&mut self, started: Instant) -> Result<(), RunError> {
        let mut ticker = tokio::time::interval(self.settings.tick);
        while self.slots.iter().any(Slot::alive) {
            let wake = tokio::select! {
                Ok(_) = self.interrupt.wait_for(|i| *i), if !self.interrupted => Wake::Interrupt,
                event = self.events.recv() => Wake::Event(event),
                _ = ticker.tick() => Wake::Tick,
                Some(done) = self.background.join_next(), if !self.background.is_empty() => {
                    Wake::Background(done)
                }
            };
            match wake {
                Wake::Interrupt => {
                    self.interrupted = true;
                    self.aborted = true;
                    self.warnings.push("interrupted (SIGINT or SIGTERM): the load was stopped; this report holds what the workers had measured".into());
                    return Ok(());
                }
                Wake::Event(None) => return Ok(()),
                // Heartbeats and pongs (half the events) change nothing below.
                Wake::Event(Some(event)) => {
                    if !self.on_event(event) {
                        continue;
                    }
                }
                Wake::Tick => self.on_tick(started),
                Wake::Background(done) => self.on_background(done)?,
            }
            self.handle_losses();
            if self.aborted {
                return Ok(());
            }
            self.close_finished_slices();
        }
        Ok(())
    }

    /// Returns false when the event cannot have lost a worker or changed what it reported
    /// (a heartbeat), so nothing needs to be looked at again.
    fn on_event(&mut self, event: WorkerEvent) -> bool {
        let index = match &event {
            WorkerEvent::Joined { .. } => return false,
            WorkerEvent::Report { index, .. }
            | WorkerEvent::InvalidReport { index, .. }
            | WorkerEvent::Heartbeat { index }
            | WorkerEvent::ClockPong { index, .. }
            | WorkerEvent::Started { index, .. }
            | WorkerEvent::Failed { index, .. }
            | WorkerEvent::Gone { index, .. } => *index,
        };
        let Some(slot) = self.slots.get_mut(index) else {
            return false;
        };
        match event {
            WorkerEvent::Report { report, .. } => {
                slot.last_heard = Instant::now();
                // Each report goes into the series as it arrives: the tick walks nobody's
                // histograms.
                if slot.accept_report(report)
                    && let (Some(timeline), Some(report)) = (&mut self.timeline, &slot.latest)
                {
                    timeline.add_report(index, report);
                }
            }
            WorkerEvent::InvalidReport { reason, .. } => slot.lose(format!(
                "it sent an invalid report ({reason}); its data after its last valid report is dropped"
            )),
            WorkerEvent::Heartbeat { .. } | WorkerEvent::ClockPong { .. } => {
                slot.last_heard = Instant::now();
                return false;
            }
            WorkerEvent::Started { unix_ns, .. } => {
                slot.last_heard = Instant::now();
                slot.started_unix_ns =
                    Some((unix_ns as i128 - slot.clock.offset_ns as i128).max(0) as u64);
                return false;
            }
            WorkerEvent::Failed { reason, .. } => {
                if slot.alive() {
                    slot.lose(format!("it failed: {reason}"));
                }
            }
            WorkerEvent::Gone { reason, .. } => {
                if !slot.done {
                    slot.lose(reason);
                }
            }
            WorkerEvent::Joined { .. } => {}
        }
        true
    }

    fn on_tick(&mut self, started: Instant) {
        let now = Instant::now();
        if self.feed_until.is_some_and(|until| now >= until) {
            // The duration is over: every exchange not handed out yet is not started, and
            // feeding it only for the workers to count it so would cost as much as the budget.
            self.feed.stop();
        }
        let every = self.settings.report_interval.min(HEARTBEAT_EVERY);
        let heartbeat = self
            .last_heartbeat
            // A tick may come a little early: a tenth of the period is slack enough.
            .is_none_or(|last| now.duration_since(last) >= every - every / 10);
        if heartbeat {
            self.last_heartbeat = Some(now);
        }
        let unix_now = unix_ns(SystemTime::now());
        for slot in &mut self.slots {
            if slot.alive() && now.duration_since(slot.last_heard) > self.settings.heartbeat_timeout
            {
                slot.lose(format!(
                    "no heartbeat for {:?}",
                    self.settings.heartbeat_timeout
                ));
            }
            if heartbeat {
                slot.control.send(Control::Heartbeat { unix_ns: unix_now });
            }
        }
        let totals = self
            .timeline
            .as_mut()
            .map(Timeline::tick)
            .unwrap_or_default();
        self.publish_progress(started, totals);
    }

    fn on_background(
        &mut self,
        done: Result<Background, tokio::task::JoinError>,
    ) -> Result<(), RunError> {
        match done.map_err(|e| RunError::Failed(format!("feeding a slice: {e}")))? {
            Background::Fed { result } => {
                let sent = result.map_err(|e| RunError::Input(e.to_string()))?;
                for (slot, sent) in self.slots.iter_mut().zip(sent) {
                    slot.sent += sent;
                    slot.feeding = false;
                    // A report that came before the slice's count was known is checked now.
                    if slot.alive()
                        && let Some(report) = &slot.latest
                        && let Err(reason) = slot.check_report(report)
                    {
                        slot.lose(format!("it sent an invalid report ({reason})"));
                        slot.latest = None;
                    }
                }
            }
            Background::Reassigned {
                dead,
                survivors,
                result,
            } => {
                self.reassigning -= 1;
                for &i in &survivors {
                    self.slots[i].incoming -= 1;
                }
                let counts = result.map_err(|e| RunError::Input(e.to_string()))?;
                let moved: u64 = counts.iter().sum();
                for (&i, n) in survivors.iter().zip(&counts) {
                    self.slots[i].sent += n;
                    self.slots[i].reassigned_in += n;
                }
                self.warnings.push(format!(
                    "{moved} exchanges of worker {} that it had not started were reassigned to {} other workers",
                    self.slots[dead].id,
                    survivors.len()
                ));
            }
        }
        Ok(())
    }

    /// A newly lost worker: account for it, then abort the run (`fail`) or hand what it had
    /// not started to the survivors (`reassign`), fed in the background.
    fn handle_losses(&mut self) {
        let newly_lost: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].lost.is_some() && self.slots[i].lost_accounting.is_none())
            .collect();
        for dead in newly_lost {
            // Its slice may be full and never read again: the feed must not wait on it.
            self.feed.drop_worker(dead);
            let slot = &mut self.slots[dead];
            let reason = slot.lost.clone().unwrap_or_default();
            let answered = slot.answered();
            let issued = slot.reported().issued.max(answered);
            self.warnings.push(format!(
                "worker {} ({}) was lost: {reason}",
                slot.id, slot.host
            ));
            // Its in-flight requests are lost.
            slot.lost_accounting = Some((issued, issued - answered));
            if !self.settings.reassign_on_loss {
                self.aborted = true;
                continue;
            }
            if slot.reassigned_in > 0 {
                self.warnings.push(format!(
                    "worker {} had received reassigned exchanges; those it had not started are counted as not started",
                    slot.id
                ));
            }
            let own_issued = issued.saturating_sub(slot.reassigned_in);
            // Everything it had not started goes to the survivors still taking exchanges.
            let survivors: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].alive() && !self.slots[i].closed)
                .collect();
            if survivors.is_empty() {
                self.warnings
                    .push("no worker left to take over the lost worker's exchanges".into());
                self.aborted = true;
                continue;
            }
            let senders: Vec<SliceSender> = survivors
                .iter()
                .map(|&i| self.slots[i].slice.clone())
                .collect();
            for &i in &survivors {
                self.slots[i].incoming += 1;
            }
            self.reassigning += 1;
            let plan = self.plan.clone();
            // It re-reads the file and waits on the survivors' bounded channels at replay
            // pace, so it runs in a blocking task while this actor keeps heartbeats going.
            self.background
                .spawn_blocking(move || Background::Reassigned {
                    dead,
                    survivors,
                    result: feed_reassigned(&plan, dead, own_issued, &senders),
                });
        }
    }

    /// Close each slice once every exchange handed to it has been started or skipped and
    /// nothing more can come: until then a lost worker's exchanges may still go to it.
    fn close_finished_slices(&mut self) {
        if self.plan.open_ended || self.reassigning > 0 || self.slots.iter().any(|s| s.feeding) {
            return;
        }
        let everyone_caught_up = self.slots.iter().filter(|s| s.alive()).all(|s| {
            let r = s.reported();
            r.issued + r.not_started >= s.sent
        });
        if !everyone_caught_up {
            return;
        }
        for slot in self.slots.iter_mut().filter(|s| !s.closed) {
            // A full channel (it cannot be: the worker took everything) is tried again on
            // the next wake-up.
            slot.closed = !matches!(
                slot.slice.try_send(SliceChunk {
                    exchanges: Vec::new(),
                    last: true,
                }),
                Err(mpsc::error::TrySendError::Full(_))
            );
        }
    }

    /// Abort (survivors get a grace period for their partial final reports) or finish.
    async fn stop(&mut self) {
        if !self.aborted {
            for slot in &self.slots {
                slot.control.send(Control::Finish);
            }
            return;
        }
        let reason = if self.interrupted {
            "the coordinator was interrupted"
        } else {
            "a worker was lost (--on-worker-loss fail)"
        };
        for slot in self.slots.iter().filter(|s| s.alive()) {
            slot.control.send(Control::Abort {
                reason: reason.into(),
            });
        }
        let grace = Instant::now() + self.settings.abort_grace;
        while self.slots.iter().any(Slot::alive) {
            let event = tokio::select! {
                event = self.events.recv() => event,
                () = tokio::time::sleep_until(grace) => None,
            };
            match event {
                None => break,
                Some(WorkerEvent::Report { index, report }) => {
                    if let Some(slot) = self.slots.get_mut(index) {
                        slot.accept_report(report);
                    }
                }
                Some(WorkerEvent::Gone { index, reason }) => {
                    if let Some(slot) = self.slots.get_mut(index)
                        && !slot.done
                    {
                        slot.lose(reason);
                        let answered = slot.answered();
                        let issued = slot.reported().issued.max(answered);
                        slot.lost_accounting = Some((issued, issued - answered));
                    }
                }
                Some(_) => {}
            }
        }
    }

    /// The live state: the counts from the series' running totals (each report was merged
    /// into them once, as it arrived), and the merged histograms only for `--metrics-listen`.
    fn publish_progress(&self, started: Instant, totals: LiveTotals) {
        let Some(progress) = &self.progress else {
            return;
        };
        let (mut not_started, mut lost) = (0, 0);
        let mut merged = self.settings.live_histograms.then(RunMetrics::new);
        for report in self.slots.iter().filter_map(|slot| slot.latest.as_deref()) {
            not_started += report.totals.not_started;
            lost += report.totals.lost;
            if let Some(merged) = &mut merged {
                merged.merge_sparse(&report.metrics);
            }
        }
        progress.send_replace(Progress {
            run_id: self.identity.run_id.clone(),
            answered: totals.answered,
            planned: self.plan.planned_total(),
            elapsed: Instant::now().saturating_duration_since(started),
            ttft_ms: totals.ttft.map(|s| (s.p50, s.p95)),
            errors: totals.failed,
            in_flight: totals.in_flight,
            not_started,
            lost,
            alive: self.slots.iter().filter(|s| s.lost.is_none()).count(),
            workers: self.slots.len(),
            finished: false,
            metrics: std::sync::Arc::new(merged.unwrap_or_default()),
        });
    }

    /// Merge the workers' last reports into the run's result, with its accounting and
    /// warnings.
    fn finish(self, started_at: SystemTime, duration: Duration) -> Result<ReplayResult, RunError> {
        let Supervisor {
            settings,
            plan,
            identity,
            slots,
            mut warnings,
            aborted,
            interrupted,
            ..
        } = self;
        let mut merged = RunMetrics::new();
        let mut status_codes = BTreeMap::new();
        let mut tls_problems: BTreeMap<String, u64> = BTreeMap::new();
        let mut outcomes = Vec::new();
        let (mut assigned_total, mut not_started, mut lost_total) = (0u64, 0u64, 0u64);
        let steady = crate::faithful::steady_window(
            &slots
                .iter()
                .filter_map(|slot| {
                    let report = slot.latest.as_ref()?;
                    Some((report.timeline.clone(), slot.clock.offset_ns))
                })
                .collect::<Vec<_>>(),
        );
        for slot in slots {
            let report = slot.latest.map(|r| *r).unwrap_or_default();
            merged.merge_sparse(&report.metrics);
            for (code, n) in &report.status_codes {
                *status_codes.entry(*code).or_default() += n;
            }
            for (problem, n) in &report.tls_problems {
                *tls_problems.entry(problem.clone()).or_default() += n;
            }
            let totals = report.totals;
            let answered = report.answered();
            let (assigned, lost, not_started_here) = match slot.lost_accounting {
                Some((issued, lost)) if !slot.done => (issued, lost, 0),
                _ => (
                    answered + totals.not_started + totals.lost,
                    totals.lost,
                    totals.not_started,
                ),
            };
            assigned_total += assigned;
            not_started += not_started_here;
            lost_total += lost;
            outcomes.push(WorkerOutcome {
                id: slot.id,
                host: slot.host,
                assigned,
                totals: SliceTotals {
                    issued: totals.issued,
                    not_started: not_started_here,
                    lost,
                    sent_out_of_order: totals.sent_out_of_order,
                },
                metrics: report.metrics,
                lost: slot.lost.is_some(),
                cpu_seconds: report.cpu_seconds,
                cores: report.cores,
                peak_rss_bytes: report.peak_rss_bytes,
                clock: slot.clock,
                started_unix_ns: slot.started_unix_ns,
            });
        }
        // Exchanges the run planned but no worker ever got to (an aborted run): not started.
        if let Some(planned) = plan.planned_total() {
            if planned > assigned_total {
                not_started += planned - assigned_total;
            } else if planned < assigned_total && !settings.reassign_on_loss {
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
        if let Some(skew) = start_skew_ms
            && identity.scheduled
            && skew > settings.max_skew.as_secs_f64() * 1000.0
        {
            warnings.push(format!(
                "START SKEW {skew:.2} ms exceeds --max-skew {:.2} ms: workers did not start together, so the recorded schedule was not replayed faithfully",
                settings.max_skew.as_secs_f64() * 1000.0
            ));
        }
        let out_of_order: u64 = outcomes.iter().map(|w| w.totals.sent_out_of_order).sum();
        if out_of_order > 0 {
            warnings.push(format!(
                "{out_of_order} exchanges were further out of at_ms order in the recording than --reorder-window {} exchanges: they were sent late (none was dropped); raise --reorder-window to replay them on time",
                settings.reorder_window
            ));
        }
        for worker in &outcomes {
            let cpu_share = if duration.as_secs_f64() > 0.0 && worker.cores > 0 {
                worker.cpu_seconds / duration.as_secs_f64() / f64::from(worker.cores)
            } else {
                0.0
            };
            if let Some(warning) = load_warning(
                &worker.id,
                worker.metrics.stats(Metric::ScheduleLag).as_ref(),
                cpu_share,
                worker.cores,
            ) {
                warnings.push(warning);
            }
        }
        Ok(ReplayResult {
            run_id: identity.run_id,
            started_at,
            duration,
            target: identity.target,
            metrics: merged,
            workers: outcomes,
            status_codes,
            tls_problems,
            load: identity.load,
            not_started,
            lost: lost_total,
            start_skew_ms,
            warnings,
            aborted,
            interrupted,
            timeline: Vec::new(),
            steady,
        })
    }
}

/// Round-trip delay and offset (worker − coordinator) of one clock sample, ns.
fn clock_offset(sample: ClockSample) -> (u64, i64) {
    let (t1, t2, t3, t4) = (
        sample.t1 as i128,
        sample.t2 as i128,
        sample.t3 as i128,
        sample.t4 as i128,
    );
    let delay = ((t4 - t1) - (t3 - t2)).max(0) as u64;
    let offset = (((t2 - t1) + (t3 - t4)) / 2) as i64;
    (delay, offset)
}

#[cfg(test)]
mod tests;
