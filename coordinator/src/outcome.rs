//! What one replay returns: the merged result, each worker's part, and why a replay could
//! not complete. The supervisor produces them, `replay` hands them up, `run` builds the
//! report from them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use common::metrics::{RunMetrics, SliceTotals, SparseMetrics};

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
    /// Its last report's metrics, as received (the run's are merged from them).
    pub metrics: SparseMetrics,
    pub lost: bool,
    /// It stopped on its own before its work was done, and why (it is `lost` too).
    pub quit: Option<String>,
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
    /// What happened to the run's exchanges beyond the outcomes in `metrics`: the workers'
    /// totals added up, with lost workers' accounting and the exchanges no worker got to.
    pub totals: SliceTotals,
    /// Largest difference between workers' actual start instants (ms).
    pub start_skew_ms: Option<f64>,
    pub warnings: Vec<String>,
    /// True when a worker was lost and the run was aborted.
    pub aborted: bool,
    /// True when SIGINT or SIGTERM stopped the run (`aborted` is then true too).
    pub interrupted: bool,
    /// The run over time (`crate::timeline`).
    pub timeline: Vec<crate::report::TimelinePoint>,
    /// The steady-state window and what completed in it, when the load reached its target.
    pub steady: Option<crate::faithful::SteadyWindow>,
    /// The workers' steady metrics merged (each worker's latest report's, a lost worker's
    /// last one included): the requests each worker sent once its load reached its target,
    /// a closed loop's first wave left out. `Some` when any worker sent them (the assignment
    /// asked: `RequestOptions::steady_metrics`).
    pub steady_metrics: Option<RunMetrics>,
    /// Workers that finished without accounting for everything they were handed (each
    /// named, with the counts): the replay did not do all its work.
    pub shortfalls: Vec<String>,
    /// When workers sent exchanges handed over from a lost one (coordinator clock, Unix µs).
    pub hand_overs: Vec<HandOverMark>,
    /// Workers whose own sending set the pace (the supervisor's judgement of schedule lag
    /// and CPU): a failure then says nothing of the server.
    pub client_flags: Vec<ClientFlag>,
}

/// What the supervisor made of a worker's own sending during a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientLoad {
    /// It sent late while its CPU was mostly idle: the machine or the network stalled it.
    Stalled,
    /// It sent late with a busy CPU, or its CPU was nearly all used.
    Saturated,
}

/// One worker the supervisor flagged, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFlag {
    pub worker: String,
    pub load: ClientLoad,
}

/// Exchanges handed over from a lost worker that one survivor sent, and when.
#[derive(Debug, Clone, PartialEq)]
pub struct HandOverMark {
    pub worker: String,
    pub exchanges: u64,
    /// First and last sent, in the coordinator's clock (Unix µs).
    pub from_unix_us: u64,
    pub to_unix_us: u64,
    /// How far behind their recorded time they went out (to keep the recorded pace), ms.
    pub delay_ms: f64,
}
