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
use common::worker_report::ReceivedReport;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{RunConfig, WorkerSource};
use crate::outcome::{
    ClientFlag, ClientLoad, ClockEstimate, ReplayResult, RunError, WorkerOutcome,
};
use crate::server::{ClockSample, Control, WorkerControl, WorkerEvent};
use crate::shard::{FeedControl, SliceChunk, SlicePlan, SliceSender, feed_reassigned, feed_slices};
use crate::timeline::{LiveTotals, RunTimeline};

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
    /// How far ahead of the start instant the start message goes out at most, and at least
    /// (see [`start_lead_for`]).
    pub start_lead: Duration,
    pub min_start_lead: Duration,
    /// Clock pings per worker (more on a long or jittery path: `sync_clocks`); the one with
    /// the shortest round trip gives the offset.
    pub clock_samples: u64,
    /// How long a worker may take to answer one round of clock pings.
    pub clock_patience: Duration,
    /// Added to the first clock round's patience: how long a worker may take to set up its
    /// assignment before it reads the first ping (building a `--tokenizer` takes seconds for
    /// a large one).
    pub setup_patience: Duration,
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
) -> Option<(ClientLoad, String)> {
    let (p50, p90) = lag.map_or((0.0, 0.0), |s| (s.p50, s.p90));
    let late = p90 > LATE_LAG_P90_MS;
    if cpu_share > SATURATED_CPU_SHARE || (late && cpu_share > BUSY_CPU_SHARE) {
        Some((
            ClientLoad::Saturated,
            format!(
                "worker {id} was saturated (schedule lag p50 {p50:.1} ms, p90 {p90:.1} ms, CPU {:.0} % of {cores} cores): a saturated client's numbers are not the server's",
                cpu_share * 100.0
            ),
        ))
    } else if late {
        Some((
            ClientLoad::Stalled,
            format!(
                "worker {id} sent late (schedule lag p50 {p50:.1} ms, p90 {p90:.1} ms) while its CPU was {:.0} % busy ({cores} cores): not saturated; the machine or the network stalled it",
                cpu_share * 100.0
            ),
        ))
    } else {
        None
    }
}

/// How far ahead of the start message the start instant is: `min_start_lead` (the first
/// slice chunks buffered, the first wave's connections opened) plus twice the longest clock
/// ping round trip (the message's way to the slowest worker, with room for one slower than
/// any ping), at most `start_lead`. On loopback or a LAN that is the minimum (250 ms, where
/// it was always 500 ms: each run and each search probe starts a quarter second sooner); a
/// link of 125 ms or more gets the whole 500 ms, as before.
pub fn start_lead_for(settings: &Settings, longest_round_trip: Duration) -> Duration {
    let floor = settings.min_start_lead;
    (floor + longest_round_trip * 2).clamp(floor, settings.start_lead.max(floor))
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
            min_start_lead: Duration::from_millis(250),
            clock_samples: 8,
            clock_patience: Duration::from_secs(2),
            setup_patience: if config.tokenizer.is_some() {
                TOKENIZER_SETUP_PATIENCE
            } else {
                Duration::ZERO
            },
            abort_grace: Duration::from_secs(3),
            tick: Duration::from_millis(500),
            report_interval: report_interval_for(workers, config.heartbeat_timeout),
            live_histograms: config.metrics_listen.is_some(),
            load_duration: None,
        }
    }
}

/// What a person watching the run is told as it happens, one line each (the CLI prints them
/// on stderr): join progress, a worker lost or quitting.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// `joined` of `expected` workers have joined the level `level` (empty for a run of one
    /// level).
    Joined {
        joined: usize,
        expected: usize,
        level: String,
    },
    /// A worker was declared lost (`quit`: it stopped on its own and said why), and what the
    /// run does about it.
    WorkerLost {
        id: String,
        host: String,
        reason: String,
        quit: bool,
        then: String,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::Joined {
                joined,
                expected,
                level,
            } => {
                write!(f, "{joined} of {expected} workers joined")?;
                if !level.is_empty() {
                    write!(f, " ({level})")?;
                }
                Ok(())
            }
            Notice::WorkerLost {
                id,
                host,
                reason,
                quit,
                then,
            } => write!(
                f,
                "worker {id} ({host}) {}: {reason}; {then}",
                if *quit { "quit" } else { "was lost" }
            ),
        }
    }
}

/// Where notices go: the caller's (the CLI prints them), or nowhere.
pub type NoticeSink = std::sync::Arc<dyn Fn(Notice) + Send + Sync>;

/// What the report says about the run that the supervisor does not decide.
#[derive(Debug, Clone)]
pub struct RunIdentity {
    pub run_id: String,
    pub target: String,
    /// The load model as shown in reports.
    pub load: crate::report::LoadSection,
    /// A recorded schedule or a rate: start skew matters.
    pub scheduled: bool,
    /// Which level of the run this replay is, in words (empty for a run of one level).
    pub level: String,
}

/// The live state of a replay, published on every tick and once at the end: the CLI draws
/// the progress line from it and `live` serves it to Prometheus.
#[derive(Debug, Clone, Default)]
pub struct RunSnapshot {
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
    /// The workers' slice totals added up (not started, lost, ...).
    pub totals: SliceTotals,
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
    progress: Option<watch::Sender<RunSnapshot>>,
    slots: Vec<Slot>,
    background: JoinSet<Background>,
    /// Reassignments being fed right now.
    reassigning: usize,
    warnings: Vec<String>,
    aborted: bool,
    interrupted: bool,
    /// The run over time, from the start on.
    timeline: Option<RunTimeline>,
    /// Stops the feed (or one worker's part of it).
    feed: std::sync::Arc<FeedControl>,
    /// When the feed stops: the end of `--duration` plus [`FEED_MARGIN`].
    feed_until: Option<Instant>,
    /// When the workers were last told the coordinator is alive.
    last_heartbeat: Option<Instant>,
    /// The longest round trip of the clock pings (what the start message may take).
    longest_round_trip: Duration,
    /// `--requests-out`: each accepted report's request records are written here, so the
    /// file and the report count the same requests (a fenced worker's are never written).
    requests_out: Option<std::sync::Arc<crate::requests_out::RequestsOut>>,
    notices: Option<NoticeSink>,
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
    /// It said it stops on its own (and why), and when: its final report follows.
    quitting: Option<(String, Instant)>,
    /// It stopped on its own before its slice was done (a lost worker that said why).
    quit: bool,
    /// What it had not started went to the other workers.
    handed_over: bool,
    /// The prefix of its own slice it was granted (protocol 5): it started nothing beyond.
    claimed: u64,
    /// Lost by silence: own exchanges it was granted beyond its last report, which may have
    /// reached the server (counted lost, never handed over).
    maybe_sent: u64,
    /// A grant went out since the last heartbeat round.
    granted_since_heartbeat: bool,
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

/// A finished worker that did not account for every exchange it was handed (`accounted`:
/// answered, not started and lost by its final report), in words.
fn shortfall(id: &str, host: &str, handed: u64, accounted: u64) -> String {
    format!(
        "worker {id} ({host}) accounted for {accounted} exchanges but was handed {handed}: {} never reached it or were never counted",
        handed.abs_diff(accounted)
    )
}

/// What the report says of each hand-over: who sent it, how much, when, how late.
fn hand_over_warnings(
    hand_overs: &[crate::outcome::HandOverMark],
    started_at: SystemTime,
) -> Vec<String> {
    let run_start_us = unix_ns(started_at) / 1_000;
    hand_overs
        .iter()
        .map(|mark| {
            format!(
                "worker {} sent {} exchanges handed over from a lost worker between {:.1} s and {:.1} s of the run, {:.0} ms after their recorded times (their recorded pace kept): the timeline marks that stretch, whose numbers carry the lost worker's load too",
                mark.worker,
                mark.exchanges,
                mark.from_unix_us.saturating_sub(run_start_us) as f64 / 1e6,
                mark.to_unix_us.saturating_sub(run_start_us) as f64 / 1e6,
                mark.delay_ms
            )
        })
        .collect()
}

/// Mark the timeline's intervals in which a survivor sent handed-over exchanges.
fn mark_hand_overs(result: &mut ReplayResult, started_at: SystemTime) {
    let start_s = unix_ns(started_at) as f64 / 1e9;
    for mark in &result.hand_overs {
        let from = mark.from_unix_us as f64 / 1e6 - start_s;
        let to = mark.to_unix_us as f64 / 1e6 - start_s;
        for point in &mut result.timeline {
            if point.t_s >= from && point.t_s - point.dt_s <= to {
                point.hand_over = true;
            }
        }
    }
}

/// A survivor's hand-over span in the coordinator's clock.
fn hand_over_mark(
    worker: &str,
    span: common::worker_report::HandOverSpan,
    clock: ClockEstimate,
) -> crate::outcome::HandOverMark {
    let to_coordinator =
        |unix_us: u64| (unix_us as i128 - i128::from(clock.offset_ns) / 1_000).max(0) as u64;
    crate::outcome::HandOverMark {
        worker: worker.to_owned(),
        exchanges: span.exchanges,
        from_unix_us: to_coordinator(span.first_sent_unix_us),
        to_unix_us: to_coordinator(span.last_sent_unix_us),
        delay_ms: span.delay_us as f64 / 1_000.0,
    }
}

/// Unanswered clock rounds that are sent again before a worker is declared silent.
const CLOCK_ROUND_RETRIES: u32 = 2;

/// How long a worker that said it stops has for its final report to arrive.
const QUIT_REPORT_PATIENCE: Duration = Duration::from_secs(3);

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
            quitting: None,
            quit: false,
            handed_over: false,
            claimed: 0,
            maybe_sent: 0,
            granted_since_heartbeat: false,
        }
    }

    /// Account for the worker from its last accepted report: what it issued is assigned to
    /// it, and what it had not answered then was in flight and is lost. A worker lost by
    /// silence may also have started what it was granted after that report: those are
    /// assigned to it and lost too (they may have reached the server). A worker that quit
    /// said exactly what it did in its final report.
    /// Returns where the hand-over of its own slice begins: the first own exchange it can
    /// never have started.
    fn account_in_flight_as_lost(&mut self) -> u64 {
        let answered = self.answered();
        let issued = self.reported().issued.max(answered);
        let own_issued = issued.saturating_sub(self.reassigned_in);
        self.maybe_sent = if self.quit {
            0
        } else {
            self.claimed.saturating_sub(own_issued)
        };
        let assigned = issued + self.maybe_sent;
        self.lost_accounting = Some((assigned, assigned - answered));
        own_issued + self.maybe_sent
    }

    /// A claim of its own slice's first `own_prefix` exchanges: recorded, then granted. A
    /// lost, finished or quitting worker is granted nothing more.
    fn claim(&mut self, own_prefix: u64) {
        if !self.alive() || self.quitting.is_some() {
            return;
        }
        self.claimed = self.claimed.max(own_prefix);
        self.control.send(Control::Grant {
            own_prefix: self.claimed,
        });
        self.granted_since_heartbeat = true;
    }

    fn reported(&self) -> SliceTotals {
        self.latest.as_ref().map(|r| r.totals).unwrap_or_default()
    }

    fn answered(&self) -> u64 {
        self.latest.as_ref().map(|r| answered_by(r)).unwrap_or(0)
    }

    fn alive(&self) -> bool {
        !self.done && self.lost.is_none()
    }

    /// Declare the worker lost, and fence it: nothing it sends from now on is counted (its
    /// accounting is its last accepted report's), and it is told to stop should its link
    /// come back.
    fn lose(&mut self, reason: String) {
        if self.lost.is_none() {
            self.control.fence(format!(
                "this worker was declared lost ({reason}); nothing it sends from now on is counted"
            ));
            self.lost = Some(reason);
        }
    }

    /// A final report is in: a worker that said it stops on its own did not finish its
    /// work: it quit, and is a lost worker under the run's policy, its final report its exact
    /// account. (One that ends short without saying so is caught at the end: every finished
    /// worker must account for what it was handed, `finish`.)
    fn check_ended_early(&mut self) {
        if let Some((reason, _)) = self.quitting.take() {
            self.quit = true;
            self.lost = Some(reason);
        }
    }

    /// Take a report if it is newer than the last one. A report whose counters overflow or
    /// that answers for more exchanges than the worker was sent makes the worker lost (named
    /// in the report); the last valid report stays, so the other workers' data and this
    /// one's earlier data are kept.
    /// Returns whether it was taken.
    fn accept_report(&mut self, mut report: Box<ReceivedReport>) -> bool {
        // A lost worker is fenced, and nothing follows a final report.
        if self.lost.is_some()
            || self.done
            || self.latest.as_ref().is_some_and(|r| report.seq <= r.seq)
        {
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
                    report.timeline = common::timeline::CompletionTimeline {
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
        progress: Option<watch::Sender<RunSnapshot>>,
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
            longest_round_trip: Duration::ZERO,
            requests_out: None,
            notices: None,
        }
    }

    /// Tell `notices` what happens as it happens (join progress, lost workers).
    pub fn with_notices(mut self, notices: Option<NoticeSink>) -> Supervisor {
        self.notices = notices;
        self
    }

    fn notify(&self, notice: Notice) {
        if let Some(notices) = &self.notices {
            notices(notice);
        }
    }

    /// Write the request records of every report it accepts to `out` (`--requests-out`).
    pub fn with_requests_out(
        mut self,
        out: Option<std::sync::Arc<crate::requests_out::RequestsOut>>,
    ) -> Supervisor {
        self.requests_out = out;
        self
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
        mark_hand_overs(&mut result, started_at);
        if let Some(progress) = progress {
            // The final numbers are the report's, accounting of lost workers included.
            let metrics = &result.metrics;
            progress.send_replace(RunSnapshot {
                run_id: result.run_id.clone(),
                answered: metrics.counters.completed(),
                planned,
                elapsed: duration,
                ttft_ms: metrics.stats(Metric::Ttft).map(|s| (s.p50, s.p95)),
                errors: metrics.counters.failed(),
                in_flight: 0,
                totals: result.totals,
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
                    return Err(RunError::Interrupted {
                        message: "interrupted before the load started".into(),
                    });
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(RunError::WorkersDidNotJoin {
                        joined,
                        expected: workers,
                        message: format!(
                            "only {joined} of {workers} workers joined within {:?}",
                            self.settings.join_timeout
                        ),
                    });
                }
            };
            let Some(event) = event else {
                return Err(RunError::failed("worker link closed"));
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
                    self.notify(Notice::Joined {
                        joined,
                        expected: workers,
                        level: self.identity.level.clone(),
                    });
                }
                WorkerEvent::Failed { index, reason } => {
                    // A worker that cannot take its assignment (an altered one, an
                    // environment it does not allow) leaves a run that cannot complete.
                    let name = pending
                        .get(index)
                        .and_then(Option::as_ref)
                        .map_or("?", |slot| slot.id.as_str());
                    return Err(RunError::Worker {
                        message: format!("worker {name} could not start: {reason}"),
                    });
                }
                WorkerEvent::Gone { reason, .. } if self.settings.local_workers => {
                    // A local worker process that dies before the start will not come back.
                    return Err(RunError::Worker {
                        message: format!("a worker left before the start: {reason}"),
                    });
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
    ///
    /// Every worker answers `clock_samples` pings; one whose best round trip is long or whose
    /// round trips are jittery ([`ClockSamples::wants_more`]) gets more, up to
    /// [`EXTRA_CLOCK_SAMPLES_FACTOR`] times as many in all, as long as each extra round should
    /// end (by the longest round trip seen) within [`CLOCK_SYNC_BUDGET`] of the sync's start:
    /// the shortest round trip found bounds the offset's error (half of it), and on a jittery
    /// path more pings find a shorter one.
    async fn sync_clocks(&mut self) -> Result<(), RunError> {
        let workers = self.slots.len();
        let began = Instant::now();
        let base_rounds = self.settings.clock_samples;
        let max_rounds = base_rounds.saturating_mul(EXTRA_CLOCK_SAMPLES_FACTOR);
        let mut samples: Vec<ClockSamples> = vec![ClockSamples::default(); workers];
        let mut seq = 0;
        loop {
            // Who is pinged this round: everyone for the first `clock_samples` rounds, then
            // only the workers whose estimate more samples can still improve.
            let pinged: Vec<bool> = if seq < base_rounds {
                vec![true; workers]
            } else {
                samples.iter().map(ClockSamples::wants_more).collect()
            };
            if !pinged.contains(&true) || seq >= max_rounds {
                break;
            }
            if seq >= base_rounds {
                // An extra round is started only if it should end within the budget: by the
                // longest round trip its workers have taken so far.
                let longest = samples
                    .iter()
                    .zip(&pinged)
                    .filter(|(_, pinged)| **pinged)
                    .filter_map(|(s, _)| s.delays.iter().max())
                    .map(|&delay| Duration::from_nanos(delay))
                    .max()
                    .unwrap_or_default();
                if began.elapsed() + longest > CLOCK_SYNC_BUDGET {
                    break;
                }
            }
            for (slot, _) in self.slots.iter().zip(&pinged).filter(|(_, p)| **p) {
                slot.control.send(Control::ClockPing {
                    seq,
                    sent_unix_ns: unix_ns(SystemTime::now()),
                });
            }
            // Each worker answers each ping once: a second pong (or one for another round)
            // from the same stream does not stand in for a worker that has not answered.
            let mut waiting = pinged;
            let patience = if seq == 0 {
                self.settings.clock_patience + self.settings.setup_patience
            } else {
                self.settings.clock_patience
            };
            let mut deadline = Instant::now() + patience;
            let mut retries = 0;
            while waiting.contains(&true) {
                let event = tokio::select! {
                    event = self.events.recv() => event,
                    Ok(_) = self.interrupt.wait_for(|i| *i) => {
                        return Err(RunError::Interrupted {
                        message: "interrupted before the load started".into(),
                    });
                    }
                    () = tokio::time::sleep_until(deadline) => {
                        if retries < CLOCK_ROUND_RETRIES {
                            // One unanswered round on a slow or loaded path is not a dead
                            // worker: the silent ones are pinged again, with more patience
                            // each time.
                            retries += 1;
                            for (slot, _) in self.slots.iter().zip(&waiting).filter(|(_, w)| **w) {
                                tracing::debug!(worker = slot.id, retries, "clock ping unanswered; pinging again");
                                slot.control.send(Control::ClockPing {
                                    seq,
                                    sent_unix_ns: unix_ns(SystemTime::now()),
                                });
                            }
                            deadline = Instant::now() + patience * (retries + 1);
                            continue;
                        }
                        let silent: Vec<&str> = self
                            .slots
                            .iter()
                            .zip(&waiting)
                            .filter(|(_, waiting)| **waiting)
                            .map(|(slot, _)| slot.id.as_str())
                            .collect();
                        return Err(RunError::Worker { message: format!(
                            "a worker did not answer clock pings ({})",
                            silent.join(", ")
                        ) });
                    }
                };
                let Some(event) = event else {
                    return Err(RunError::failed("worker link closed"));
                };
                match event {
                    WorkerEvent::ClockPong { index, sample }
                        if sample.seq == seq && index < workers && waiting[index] =>
                    {
                        waiting[index] = false;
                        self.slots[index].last_heard = Instant::now();
                        samples[index].add(clock_offset(sample));
                    }
                    WorkerEvent::Gone { index, reason } => {
                        return Err(RunError::Worker {
                            message: format!(
                                "worker {} left before the start: {reason}",
                                self.worker_name(index)
                            ),
                        });
                    }
                    WorkerEvent::Failed { index, reason } => {
                        return Err(RunError::Worker {
                            message: format!(
                                "worker {} could not start: {reason}",
                                self.worker_name(index)
                            ),
                        });
                    }
                    _ => {}
                }
            }
            seq += 1;
        }
        self.longest_round_trip = samples
            .iter()
            .filter_map(|s| s.delays.iter().max())
            .map(|&delay| Duration::from_nanos(delay))
            .max()
            .unwrap_or_default();
        for (slot, samples) in self.slots.iter_mut().zip(samples) {
            if let Some((delay, offset)) = samples.best {
                slot.clock = ClockEstimate {
                    offset_ns: offset,
                    uncertainty_ns: delay / 2,
                };
                tracing::debug!(
                    worker = slot.id,
                    samples = samples.delays.len(),
                    best_round_trip_ms = delay as f64 / 1e6,
                    offset_ms = offset as f64 / 1e6,
                    "clock measured"
                );
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
        let lead = start_lead_for(&self.settings, self.longest_round_trip);
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
            RunTimeline::new(started_at, self.slots.len())
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
            | WorkerEvent::Claim { index, .. }
            | WorkerEvent::Gone { index, .. } => *index,
        };
        let Some(slot) = self.slots.get_mut(index) else {
            return false;
        };
        if slot.lost.is_some() {
            // Fenced: whatever a lost worker sends after its loss (a stalled link's backlog,
            // a worker that came back) is not counted; it was told to stop.
            return false;
        }
        match event {
            WorkerEvent::Report {
                report, records, ..
            } => {
                slot.last_heard = Instant::now();
                if slot.accept_report(report) {
                    if let Some(out) = &self.requests_out {
                        out.write(&slot.id, &records);
                    }
                    // Each report goes into the series as it arrives: the tick walks
                    // nobody's histograms.
                    if let (Some(timeline), Some(report)) = (&mut self.timeline, &slot.latest) {
                        timeline.add_report(index, report);
                    }
                    if slot.done {
                        slot.check_ended_early();
                    }
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
                // It stops on its own: its final report follows on the same stream, and is
                // taken before the loss, so that what it did is counted exactly.
                if slot.alive() && slot.quitting.is_none() {
                    slot.quitting = Some((reason, Instant::now()));
                }
                return false;
            }
            WorkerEvent::Claim { own_prefix, .. } => {
                slot.last_heard = Instant::now();
                slot.claim(own_prefix);
                return false;
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
            if slot.alive()
                && let Some((reason, since)) = &slot.quitting
                && now.duration_since(*since) > QUIT_REPORT_PATIENCE
            {
                let reason =
                    format!("it stopped on its own ({reason}), and its final report did not come");
                slot.lose(reason);
            }
            if slot.alive() && now.duration_since(slot.last_heard) > self.settings.heartbeat_timeout
            {
                slot.lose(format!(
                    "no heartbeat for {:?}",
                    self.settings.heartbeat_timeout
                ));
            }
            // A grant since the last heartbeat said the coordinator is alive: it takes the
            // heartbeat's place (claims and grants cost the link no extra messages).
            if heartbeat && !std::mem::take(&mut slot.granted_since_heartbeat) {
                slot.control.send(Control::Heartbeat { unix_ns: unix_now });
            }
        }
        let totals = self
            .timeline
            .as_mut()
            .map(RunTimeline::tick)
            .unwrap_or_default();
        self.publish_progress(started, totals);
    }

    fn on_background(
        &mut self,
        done: Result<Background, tokio::task::JoinError>,
    ) -> Result<(), RunError> {
        match done.map_err(|e| RunError::failed(format!("feeding a slice: {e}")))? {
            Background::Fed { result } => {
                let sent = result.map_err(|e| RunError::recording(&e))?;
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
                let counts = result.map_err(|e| RunError::recording(&e))?;
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
            let reassign = self.settings.reassign_on_loss;
            let slot = &mut self.slots[dead];
            let reason = slot.lost.clone().unwrap_or_default();
            let then = if reassign {
                "what it had not started goes to the other workers (--on-worker-loss reassign)"
            } else {
                "the run is aborted (--on-worker-loss fail)"
            };
            self.warnings.push(format!(
                "worker {} ({}) {}: {reason}; {then}",
                slot.id,
                slot.host,
                if slot.quit {
                    "quit before its slice was done"
                } else {
                    "was lost"
                }
            ));
            let notice = Notice::WorkerLost {
                id: slot.id.clone(),
                host: slot.host.clone(),
                reason,
                quit: slot.quit,
                then: then.to_owned(),
            };
            // Fenced since it was declared lost, it is accounted for by its last accepted
            // report (a worker that quit: its final one): what it issued by then is its own,
            // and what it had not answered then is lost (never replayed again); the rest goes
            // to the survivors, once.
            let from = slot.account_in_flight_as_lost();
            if slot.maybe_sent > 0 {
                self.warnings.push(format!(
                    "worker {} was lost without a final report: {} exchanges it was granted after its last report may have reached the server; they are counted lost, and not sent again",
                    slot.id, slot.maybe_sent
                ));
            }
            self.notify(notice);
            if !reassign {
                self.aborted = true;
                continue;
            }
            let slot = &self.slots[dead];
            if slot.reassigned_in > 0 {
                self.warnings.push(format!(
                    "worker {} had received reassigned exchanges; those it had not started are counted as not started",
                    slot.id
                ));
            }
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
            self.slots[dead].handed_over = true;
            self.reassigning += 1;
            let plan = self.plan.clone();
            // It re-reads the file and waits on the survivors' bounded channels at replay
            // pace, so it runs in a blocking task while this actor keeps heartbeats going.
            self.background
                .spawn_blocking(move || Background::Reassigned {
                    dead,
                    survivors,
                    result: feed_reassigned(&plan, dead, from, &senders),
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
                Some(WorkerEvent::Report {
                    index,
                    report,
                    records,
                }) => {
                    if let Some(slot) = self.slots.get_mut(index)
                        && slot.accept_report(report)
                    {
                        if let Some(out) = &self.requests_out {
                            out.write(&slot.id, &records);
                        }
                        if slot.done {
                            // Its final report is in: it may leave (and its link flush).
                            slot.control.send(Control::Finish);
                        }
                    }
                }
                Some(WorkerEvent::Gone { index, reason }) => {
                    if let Some(slot) = self.slots.get_mut(index)
                        && slot.alive()
                    {
                        slot.lose(reason);
                        slot.account_in_flight_as_lost();
                    }
                }
                Some(_) => {}
            }
        }
        // A survivor whose final report did not come within the grace (a slow link) is not
        // disconnected, but its last report is all there is: what it had in flight then is
        // lost.
        for slot in self.slots.iter_mut().filter(|s| s.alive()) {
            slot.account_in_flight_as_lost();
            let in_flight = slot.lost_accounting.map_or(0, |(_, lost)| lost);
            self.warnings.push(format!(
                "worker {} sent no final report within {:?} of the abort: its last report's numbers are used, and its {in_flight} requests in flight then are counted lost",
                slot.id, self.settings.abort_grace
            ));
        }
    }

    /// The live state: the counts from the series' running totals (each report was merged
    /// into them once, as it arrived), and the merged histograms only for `--metrics-listen`.
    fn publish_progress(&self, started: Instant, totals: LiveTotals) {
        let Some(progress) = &self.progress else {
            return;
        };
        let mut slice_totals = SliceTotals::default();
        let mut merged = self.settings.live_histograms.then(RunMetrics::new);
        for report in self.slots.iter().filter_map(|slot| slot.latest.as_deref()) {
            slice_totals.add(&report.totals);
            if let Some(merged) = &mut merged {
                merged.merge_sparse(&report.metrics);
            }
        }
        progress.send_replace(RunSnapshot {
            run_id: self.identity.run_id.clone(),
            answered: totals.answered,
            planned: self.plan.planned_total(),
            elapsed: Instant::now().saturating_duration_since(started),
            ttft_ms: totals.ttft.map(|s| (s.p50, s.p95)),
            errors: totals.failed,
            in_flight: totals.in_flight,
            totals: slice_totals,
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
        let mut steady_metrics: Option<RunMetrics> = None;
        let mut status_codes = BTreeMap::new();
        let mut tls_problems: BTreeMap<String, u64> = BTreeMap::new();
        let mut outcomes = Vec::new();
        let mut assigned_total = 0u64;
        let mut run_totals = SliceTotals::default();
        let mut shortfalls = Vec::new();
        let mut hand_overs = Vec::new();
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
            if let Some(span) = report.hand_over.filter(|span| span.exchanges > 0) {
                hand_overs.push(hand_over_mark(&slot.id, span, slot.clock));
            }
            merged.merge_sparse(&report.metrics);
            if let Some(steady) = &report.steady {
                steady_metrics
                    .get_or_insert_with(RunMetrics::new)
                    .merge_sparse(steady);
            }
            for (code, n) in &report.status_codes {
                *status_codes.entry(*code).or_default() += n;
            }
            for (problem, n) in &report.tls_problems {
                *tls_problems.entry(problem.clone()).or_default() += n;
            }
            let totals = report.totals;
            let answered = answered_by(&report);
            let (assigned, lost, not_started_here) = match slot.lost_accounting {
                // Lost without a final report, or its rest handed over: it answers for what
                // it issued.
                Some((issued, lost)) if !slot.done || slot.handed_over => (issued, lost, 0),
                _ => (
                    answered + totals.not_started + totals.lost,
                    totals.lost,
                    totals.not_started,
                ),
            };
            // A worker that finished (not lost, the run not aborted) accounts for every
            // exchange it was handed, its own and reassigned ones.
            if !plan.open_ended && !aborted {
                let accounted = answered + totals.not_started + totals.lost;
                if slot.done && slot.lost.is_none() && accounted != slot.sent {
                    shortfalls.push(shortfall(&slot.id, &slot.host, slot.sent, accounted));
                }
            }
            assigned_total += assigned;
            let worker_totals = SliceTotals {
                issued: totals.issued,
                not_started: not_started_here,
                lost,
                sent_out_of_order: totals.sent_out_of_order,
            };
            run_totals.add(&worker_totals);
            outcomes.push(WorkerOutcome {
                id: slot.id,
                host: slot.host,
                assigned,
                totals: worker_totals,
                metrics: report.metrics,
                lost: slot.lost.is_some(),
                quit: slot.quit.then(|| slot.lost.clone().unwrap_or_default()),
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
                run_totals.not_started += planned - assigned_total;
            } else if planned < assigned_total && !settings.reassign_on_loss {
                warnings.push(format!(
                    "accounting: workers answered for {assigned_total} exchanges but {planned} were planned"
                ));
            }
        }
        warnings.extend(
            shortfalls
                .iter()
                .map(|shortfall| format!("INCOMPLETE: {shortfall}")),
        );
        warnings.extend(hand_over_warnings(&hand_overs, started_at));
        let start_skew_ms = start_skew_ms(&outcomes);
        warnings.extend(start_skew_warning(
            start_skew_ms,
            &outcomes,
            settings.max_skew,
            identity.scheduled,
        ));
        let out_of_order = run_totals.sent_out_of_order;
        if out_of_order > 0 {
            warnings.push(format!(
                "{out_of_order} exchanges were further out of at_ms order in the recording than --reorder-window {} exchanges: they were sent late (none was dropped); raise --reorder-window to replay them on time",
                settings.reorder_window
            ));
        }
        let client_flags = client_load_flags(&outcomes, duration, &mut warnings);
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
            totals: run_totals,
            start_skew_ms,
            warnings,
            aborted,
            interrupted,
            timeline: Vec::new(),
            steady,
            steady_metrics,
            shortfalls,
            hand_overs,
            client_flags,
        })
    }
}

/// How far apart the workers started (their starts as each reported them), when every worker
/// reported one.
fn start_skew_ms(outcomes: &[WorkerOutcome]) -> Option<f64> {
    let starts: Vec<u64> = outcomes.iter().filter_map(|w| w.started_unix_ns).collect();
    (starts.len() == outcomes.len() && !starts.is_empty()).then(|| {
        let max = starts.iter().max().copied().unwrap_or(0);
        let min = starts.iter().min().copied().unwrap_or(0);
        (max - min) as f64 / 1e6
    })
}

/// On a recorded schedule, the warning when the workers' start skew, or its bound from the
/// clocks' uncertainty, exceeds `--max-skew`.
fn start_skew_warning(
    start_skew_ms: Option<f64>,
    outcomes: &[WorkerOutcome],
    max_skew: Duration,
    scheduled: bool,
) -> Option<String> {
    let max_skew_ms = max_skew.as_secs_f64() * 1000.0;
    let skew_bound_ms = start_skew_bound_ms(outcomes);
    if let Some(skew) = start_skew_ms
        && scheduled
        && skew > max_skew_ms
    {
        return Some(format!(
            "START SKEW {skew:.2} ms exceeds --max-skew {max_skew_ms:.2} ms: workers did not start together, so the recorded schedule was not replayed faithfully"
        ));
    }
    let (Some(skew), Some(bound)) = (start_skew_ms, skew_bound_ms) else {
        return None;
    };
    if !scheduled || bound <= max_skew_ms {
        return None;
    }
    // The measured skew is computed with the same offsets that set the start, so it cannot
    // see their error: only the bound can.
    let clocks: Vec<String> = outcomes
        .iter()
        .map(|w| {
            format!(
                "{} {:+.2} ± {:.2} ms",
                w.id,
                w.clock.offset_ns as f64 / 1e6,
                w.clock.uncertainty_ns as f64 / 1e6
            )
        })
        .collect();
    Some(format!(
        "START SKEW BOUND {bound:.2} ms exceeds --max-skew {max_skew_ms:.2} ms: the workers started {skew:.2} ms apart by their clocks as measured, but each clock offset is known only to ± half its best round trip ({}), so their true starts may be up to {bound:.2} ms apart. This is a bound from clock uncertainty, not a measured skew: an asymmetric path biases an offset invisibly. To tighten it, put the workers closer to the coordinator (a shorter, steadier link); on hosts synced by NTP or PTP, an offset far from 0 is this error itself",
        clocks.join(", ")
    ))
}

/// Each worker that was saturated or stalled: its warning (into `warnings`) and its typed
/// flag.
fn client_load_flags(
    outcomes: &[WorkerOutcome],
    duration: Duration,
    warnings: &mut Vec<String>,
) -> Vec<ClientFlag> {
    let mut client_flags = Vec::new();
    for worker in outcomes {
        let cpu_share = if duration.as_secs_f64() > 0.0 && worker.cores > 0 {
            worker.cpu_seconds / duration.as_secs_f64() / f64::from(worker.cores)
        } else {
            0.0
        };
        if let Some((load, warning)) = load_warning(
            &worker.id,
            worker.metrics.stats(Metric::ScheduleLag).as_ref(),
            cpu_share,
            worker.cores,
        ) {
            warnings.push(warning);
            client_flags.push(ClientFlag {
                worker: worker.id.clone(),
                load,
            });
        }
    }
    client_flags
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

/// A best round trip longer than this (10 ms: the offset known to ± 5 ms, the default
/// `--max-skew`) is worth more pings, in case the path has shorter moments.
const LONG_ROUND_TRIP_NS: u64 = 10_000_000;
/// Round trips whose median is above the best by more than this and by more than half the
/// best are jittery: more pings may find a shorter one. Loopback and a quiet LAN spread by
/// less.
const JITTER_FLOOR_NS: u64 = 1_000_000;
/// A worker whose round trips are long or jittery gets up to this many times
/// `clock_samples` pings.
const EXTRA_CLOCK_SAMPLES_FACTOR: u64 = 4;
/// Extra rounds of pings are started only while they end within this much time from the
/// start of the clock sync (the first `clock_samples` rounds always run): on a 300 ms link
/// the 8 usual rounds alone take 2.4 s, and the run must not wait much longer to start.
const CLOCK_SYNC_BUDGET: Duration = Duration::from_secs(2);

/// How long a worker may take to build the run's `--tokenizer` before it answers its first
/// clock ping (a 22 MB one took about 3 s on the CI VM).
const TOKENIZER_SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// One worker's clock samples so far: the best (shortest round trip) and every round trip.
#[derive(Debug, Clone, Default)]
struct ClockSamples {
    /// (round trip, offset) of the sample with the shortest round trip, ns.
    best: Option<(u64, i64)>,
    delays: Vec<u64>,
}

impl ClockSamples {
    fn add(&mut self, (delay, offset): (u64, i64)) {
        if self.best.is_none_or(|(d, _)| delay < d) {
            self.best = Some((delay, offset));
        }
        self.delays.push(delay);
    }

    /// Whether more pings can still shrink this worker's uncertainty: its best round trip is
    /// long, or its round trips spread well above the best (so a shorter one may come).
    fn wants_more(&self) -> bool {
        let Some((best, _)) = self.best else {
            return false;
        };
        let mut delays = self.delays.clone();
        delays.sort_unstable();
        let median = delays[delays.len() / 2];
        best > LONG_ROUND_TRIP_NS || median - best > JITTER_FLOOR_NS.max(best / 2)
    }
}

/// The most the workers' true start instants can differ (ms), given their clock
/// uncertainties; `None` unless every worker reported its start.
///
/// A worker's start in the coordinator's clock is estimated as its reported start minus its
/// estimated offset; the true offset is within ± its uncertainty `u` (half its best round
/// trip: clock sync measures round trips, never one-way delays, so an asymmetric path biases
/// the offset by up to that much, invisibly). So worker `i`'s true start is within
/// `ŝᵢ ± uᵢ`, and two workers' true starts differ by at most `ŝᵢ − ŝⱼ + uᵢ + uⱼ`. The bound
/// is the largest of that over every pair `i ≠ j` — at most the measured skew plus the two
/// largest uncertainties, and reached when the errors fall that way. One worker has nothing
/// to be skewed against: 0.
pub fn start_skew_bound_ms(workers: &[WorkerOutcome]) -> Option<f64> {
    // aᵢ = ŝᵢ + uᵢ (latest possible start), bⱼ = uⱼ − ŝⱼ (minus the earliest): the bound is
    // the largest aᵢ + bⱼ with i ≠ j, found from the two largest of each in one pass.
    let mut late: [Option<(usize, i128)>; 2] = [None; 2];
    let mut early: [Option<(usize, i128)>; 2] = [None; 2];
    let keep = |top: &mut [Option<(usize, i128)>; 2], i: usize, v: i128| {
        if top[0].is_none_or(|(_, best)| v > best) {
            top[1] = top[0];
            top[0] = Some((i, v));
        } else if top[1].is_none_or(|(_, second)| v > second) {
            top[1] = Some((i, v));
        }
    };
    for (i, worker) in workers.iter().enumerate() {
        let start = i128::from(worker.started_unix_ns?);
        let uncertainty = i128::from(worker.clock.uncertainty_ns);
        keep(&mut late, i, start + uncertainty);
        keep(&mut early, i, uncertainty - start);
    }
    let (Some((i, a)), Some((j, b))) = (late[0], early[0]) else {
        return None;
    };
    let bound = if i != j {
        Some(a + b)
    } else {
        // The same worker is both the latest and the earliest possible: pair it with the
        // runner-up on either side.
        let with_second_early = early[1].map(|(_, b2)| a + b2);
        let with_second_late = late[1].map(|(_, a2)| a2 + b);
        with_second_early.max(with_second_late)
    };
    Some(bound.unwrap_or(0).max(0) as f64 / 1e6)
}

/// Requests a report answers for: measured (cancelled ones included: a cancelled request
/// was answered, by the client hanging up), warm-up. Read from the report's accounting
/// identity (answered + not started + lost), so every outcome its counters know counts.
fn answered_by(report: &ReceivedReport) -> u64 {
    report
        .accounted()
        .map(|all| {
            all.saturating_sub(report.totals.not_started)
                .saturating_sub(report.totals.lost)
        })
        .unwrap_or_else(|| report.answered())
}

#[cfg(test)]
mod tests;
