//! One replay (a run, one level of a sweep, or one capacity probe) on the run's workers
//! (`pool`): the level's assignments, and the replay handed to the supervisor
//! (`supervisor`), which joins, starts, watches and merges into a `ReplayResult`
//! (`outcome`).

use std::sync::Arc;

use common::assignment::Assignment;
use tokio::sync::mpsc;

use crate::config::{GlobalLoad, RunConfig};
use crate::outcome::{ReplayResult, RunError};
use crate::pool::WorkerPool;
use crate::report::{ArrivalKind, LoadSection, ScheduleKind};
use crate::server::{LevelLink, WorkerEvent};
use crate::shard::SlicePlan;
use crate::supervisor::{NoticeSink, RunIdentity, RunSnapshot, Settings, Supervisor};

/// The load as the report shows it (`run.load`): derived from the run's `GlobalLoad` here
/// and nowhere else.
fn load_section(load: &GlobalLoad, workers: usize) -> LoadSection {
    use common::load::{Arrival, Schedule};
    LoadSection {
        schedule: match load.schedule {
            Schedule::Recorded { .. } => ScheduleKind::Recorded,
            Schedule::Asap => ScheduleKind::Asap,
        },
        speed: load.schedule.speed(),
        concurrency: load.concurrency,
        rate: load.rate,
        arrival: load.rate.map(|_| match load.arrival {
            Arrival::Constant => ArrivalKind::Constant,
            Arrival::Poisson => ArrivalKind::Poisson,
        }),
        requests: load.requests,
        duration_s: load.duration.map(|d| d.as_secs_f64()),
        warmup: load.warmup,
        workers,
    }
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
    /// The slice key is set per worker by the service, after the token challenge.
    fn for_worker(&self, index: usize) -> Assignment {
        let config = &self.config;
        Assignment {
            run_id: self.run_id.clone(),
            target: self.target.clone(),
            load: self
                .load
                .worker_share(self.workers, index, config.seed.unwrap_or(DEFAULT_SEED)),
            headers: config.headers.clone(),
            sets: config.sets.clone(),
            open_ended: self.open_ended,
            options: config.request_options(),
            tag_requests: self.tag_requests,
            worker_index: u32::try_from(index).unwrap_or(u32::MAX),
            transport: config.transport.clone(),
            slice_key: String::new(),
            report_interval: Some(crate::supervisor::report_interval_for(
                self.workers,
                config.heartbeat_timeout,
            )),
            // This coordinator reads plain V2: no inflating per report (most of its CPU
            // with hundreds of workers).
            histograms: common::metrics::HistogramEncoding::Plain,
            // Both ends of the link give up on the other after the same silence.
            heartbeat_timeout: Some(config.heartbeat_timeout),
        }
    }
}

/// The seed of worker 0's Poisson arrivals without `--seed` (worker `i` adds `i`).
const DEFAULT_SEED: u64 = 0x5eed_0000;

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
    /// Live progress for a person watching (the CLI renders it); `None` when nobody is.
    pub progress: Option<tokio::sync::watch::Sender<RunSnapshot>>,
    /// The run's workers: joined once, they take every level.
    pub pool: &'a WorkerPool,
    /// Which level of the run this is, in words (empty for a run of one level).
    pub level: String,
    /// Told what happens as it happens (join progress, lost workers).
    pub notices: Option<NoticeSink>,
}

/// Run one replay: a level of the run, on the run's workers.
pub async fn replay(setup: ReplaySetup<'_>) -> Result<ReplayResult, RunError> {
    let config = setup.config;
    let load = setup.load.clone();
    let workers = setup.pool.workers();
    // Each level has a run id of its own: its slices' proofs and keys name it, so nothing of
    // one level opens in another.
    let run_id = uuid::Uuid::new_v4().to_string();
    let open_ended = load.is_open_ended();
    let plan = SlicePlan {
        recording: config.recording.clone(),
        workers,
        exchanges: setup.exchanges,
        requests: load.requests,
        open_ended,
        pass_span_ms: setup.pass_span_ms,
        faithful: config.faithful.slice(),
        tokenizer: config.tokenizer.clone(),
        recorded_cancels: config.recorded_cancels,
    };

    let (events_tx, events) = mpsc::channel::<WorkerEvent>(1024);
    let assignment = AssignmentPlan {
        run_id: run_id.clone(),
        target: setup.target.clone(),
        config: config.clone(),
        load: load.clone(),
        workers,
        tag_requests: setup.tag_requests,
        open_ended,
    };
    let level = Arc::new(LevelLink::new(
        workers,
        Box::new(move |index| assignment.for_worker(index)),
        events_tx,
        setup.requests_out.clone(),
    ));
    setup.pool.begin_level(level).await;

    let identity = RunIdentity {
        run_id: run_id.clone(),
        target: setup.target.clone(),
        load: load_section(&load, workers),
        scheduled: load.is_scheduled(),
        level: setup.level.clone(),
    };
    let mut settings = Settings::from_config(config, workers);
    settings.load_duration = load.duration;
    let result = Supervisor::new(
        settings,
        plan,
        identity,
        events,
        setup.interrupt.clone(),
        setup.progress.clone(),
    )
    .with_requests_out(setup.requests_out.clone())
    .with_notices(setup.notices.clone())
    .run()
    .await;
    setup.pool.end_level().await;
    result
}
