//! A run configuration built in code: [`RunConfig`]'s `Default` (the CLI's defaults), a
//! builder with typed durations and counts, and the checks the library makes of any
//! configuration (`RunConfig::validate`, called by `RunPlan::prepare`), each naming the
//! option at fault. Flags and `--config` files are the CLI's (`cli::run_args`).

use std::path::PathBuf;
use std::time::Duration;

use common::load::{Arrival, Schedule};
use common::replay::{DEFAULT_REORDER_WINDOW, DEFAULT_REQUEST_TIMEOUT};

use crate::config::{
    BaselineSource, GlobalLoad, ReportFiles, RunConfig, ServerMetricsOptions, WorkerSource,
    max_local_workers,
};
use crate::outcome::RunError;

/// The longest heartbeat timeout: a longer silence is a typo.
const MAX_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(86_400);

impl Default for RunConfig {
    /// The CLI's defaults: one local worker, a closed loop of 1 as fast as the target
    /// answers, the embedded mock when no target is set, the recorded baseline.
    fn default() -> RunConfig {
        RunConfig {
            tag_requests: false,
            source: WorkerSource::Local(1),
            reassign_on_loss: false,
            token: None,
            tls: None,
            max_skew: Duration::from_millis(5),
            join_timeout: Duration::from_secs(60),
            recording: PathBuf::new(),
            target: None,
            load: GlobalLoad {
                schedule: Schedule::Asap,
                concurrency: Some(1),
                rate: None,
                arrival: Arrival::Constant,
                requests: None,
                duration: None,
                warmup: 0,
            },
            sweep: Vec::new(),
            workers: 1,
            headers: Vec::new(),
            sets: Vec::new(),
            timeout: DEFAULT_REQUEST_TIMEOUT,
            goals: Vec::new(),
            baseline: BaselineSource::Recorded,
            files: ReportFiles::default(),
            heartbeat_timeout: Duration::from_secs(5),
            requests_out: None,
            reorder_window: DEFAULT_REORDER_WINDOW,
            metrics_listen: None,
            metrics_linger: Duration::ZERO,
            transport: Default::default(),
            faithful: Default::default(),
            seed: None,
            slos: Default::default(),
            find_max: None,
            server_metrics: ServerMetricsOptions {
                target: true,
                extra: Vec::new(),
                extra_headers: Vec::new(),
                interval: Duration::from_secs(1),
            },
            tokenizer: None,
            cancel: Default::default(),
            request_usage: false,
            recorded_cancels: true,
        }
    }
}

impl RunConfig {
    /// A configuration for `recording`, built in code; `build` checks it.
    pub fn builder(recording: impl Into<PathBuf>) -> RunConfigBuilder {
        RunConfigBuilder {
            config: RunConfig {
                recording: recording.into(),
                ..RunConfig::default()
            },
        }
    }

    /// The checks of any configuration, however it was made: each error names the option.
    pub fn validate(&self) -> Result<(), RunError> {
        let bad = |option: &str, message: String| Err(RunError::option(option, message));
        if self.recording.as_os_str().is_empty() {
            return bad("recording", "no recording given".into());
        }
        if let Some(target) = &self.target {
            crate::config::check_target(target, self.transport.h2c)
                .map_err(|e| RunError::option("--target", format!("{e:#}")))?;
        }
        if self.workers == 0 {
            return bad("--workers", "--workers must be at least 1".into());
        }
        if let WorkerSource::Local(n) = self.source
            && n > max_local_workers()
        {
            return bad(
                "--workers",
                format!(
                    "--workers {n}: at most {} local workers on this machine",
                    max_local_workers()
                ),
            );
        }
        if self.load.concurrency == Some(0) {
            return bad("--concurrency", "--concurrency must be at least 1".into());
        }
        if let Some(rate) = self.load.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            return bad("--rate", format!("--rate {rate}: must be above zero"));
        }
        if let Schedule::Recorded { speed } = self.load.schedule
            && !(speed.is_finite() && speed > 0.0)
        {
            return bad("--speed", format!("--speed {speed}: must be above zero"));
        }
        self.validate_durations()?;
        if self.sweep.contains(&0) {
            return bad(
                "--sweep-concurrency",
                "--sweep-concurrency levels must be at least 1".into(),
            );
        }
        self.validate_streams_per_worker()?;
        if self.reorder_window == 0 || self.reorder_window > u32::MAX as usize {
            return bad(
                "--reorder-window",
                format!("--reorder-window must be between 1 and {}", u32::MAX),
            );
        }
        if self.find_max.is_some() && self.goals.is_empty() {
            return bad(
                "--find-max",
                "--find-max: needs at least one --fail-if goal".into(),
            );
        }
        Ok(())
    }

    /// Every worker runs at least one stream of a closed loop or of a concurrency cap: a
    /// concurrency below the worker count would run at the worker count and be reported as
    /// less. (A concurrency search starts at the worker count: `FindMax::fitted_to`.)
    fn validate_streams_per_worker(&self) -> Result<(), RunError> {
        let workers = self.workers;
        let searched = self
            .find_max
            .as_ref()
            .is_some_and(|f| f.dimension == crate::capacity::Dimension::Concurrency);
        if let Some(level) = self.sweep.iter().find(|level| **level < workers) {
            return Err(RunError::option(
                "--sweep-concurrency",
                format!(
                    "--sweep-concurrency level {level} is below the {workers} workers: each worker runs at least one stream, so that level would hold {workers}; sweep from {workers}, or use fewer workers"
                ),
            ));
        }
        // A sweep's levels and a concurrency search's probes set their own concurrency.
        if let Some(c) = self.load.concurrency
            && c < workers
            && !searched
            && self.sweep.is_empty()
        {
            return Err(RunError::option(
                "--concurrency",
                format!(
                    "--concurrency {c} is below the {workers} workers: each worker runs at least one stream, so the run would hold {workers}; give --concurrency {workers} or more, or fewer workers"
                ),
            ));
        }
        if let Some(find_max) = &self.find_max
            && searched
            && find_max.high < workers as f64
        {
            return Err(RunError::option(
                "--find-max-range",
                format!(
                    "--find-max-range ends at {} below the {workers} workers: each worker runs at least one stream",
                    find_max.high
                ),
            ));
        }
        Ok(())
    }

    fn validate_durations(&self) -> Result<(), RunError> {
        for (option, value) in [
            ("--timeout", Some(self.timeout)),
            ("--duration", self.load.duration),
            ("--join-timeout", Some(self.join_timeout)),
            ("--heartbeat-timeout", Some(self.heartbeat_timeout)),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(RunError::option(
                    option,
                    format!("{option}: must be above zero"),
                ));
            }
        }
        if self.heartbeat_timeout > MAX_HEARTBEAT_TIMEOUT {
            return Err(RunError::option(
                "--heartbeat-timeout",
                "--heartbeat-timeout must be at most a day",
            ));
        }
        Ok(())
    }
}

/// Builds a [`RunConfig`] in code: typed values, the CLI's defaults for the rest.
#[derive(Debug, Clone)]
#[must_use]
pub struct RunConfigBuilder {
    config: RunConfig,
}

impl RunConfigBuilder {
    /// The server to replay against (`http://` or `https://`); unset: the embedded mock.
    pub fn target(mut self, url: impl Into<String>) -> Self {
        self.config.target = Some(url.into());
        self
    }

    /// A closed loop of `n` requests in flight, sent as fast as the target answers.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.load.schedule = Schedule::Asap;
        self.config.load.rate = None;
        self.config.load.concurrency = Some(n);
        self
    }

    /// An open loop of `per_second` requests a second, spaced by `arrival`.
    pub fn rate(mut self, per_second: f64, arrival: Arrival) -> Self {
        self.config.load.schedule = Schedule::Asap;
        self.config.load.concurrency = None;
        self.config.load.rate = Some(per_second);
        self.config.load.arrival = arrival;
        self
    }

    /// The recorded arrival times, `speed` times faster.
    pub fn recorded_schedule(mut self, speed: f64) -> Self {
        self.config.load.schedule = Schedule::Recorded { speed };
        self.config.load.concurrency = None;
        self.config.load.rate = None;
        self
    }

    /// Send `n` requests (cycling through the recording), not the recording once.
    pub fn requests(mut self, n: u64) -> Self {
        self.config.load.requests = Some(n);
        self
    }

    /// Send for this long.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.config.load.duration = Some(duration);
        self
    }

    /// `n` local workers, started by the run's launcher.
    pub fn workers(mut self, n: usize) -> Self {
        self.config.source = WorkerSource::Local(n);
        self.config.workers = n;
        self
    }

    /// Each request's time limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// A header added to every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.headers.push((name.into(), value.into()));
        self
    }

    /// A goal (`llm.ttft-p95 > 800`): the run's verdict fails when it holds.
    pub fn fail_if(mut self, goal: impl Into<String>) -> Self {
        self.config.goals.push(goal.into());
        self
    }

    /// The seed of sampling, Poisson arrivals and cancellations.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// No scrape of the target's own `/metrics`.
    pub fn no_server_metrics(mut self) -> Self {
        self.config.server_metrics.target = false;
        self
    }

    /// The configuration, checked.
    pub fn build(self) -> Result<RunConfig, RunError> {
        self.config.validate()?;
        Ok(self.config)
    }
}
