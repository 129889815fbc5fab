//! What one replay returns: the merged result, each worker's part, and why a replay could
//! not complete. The supervisor produces them, `replay` hands them up, `run` builds the
//! report from them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use common::metrics::{RunMetrics, SliceTotals, SparseMetrics};

/// Why a run could not complete, or bad input found: an enum a caller matches. Each variant
/// carries the message the CLI prints (`Display` is that message, unchanged); the CLI maps
/// the variant to its exit code ([`RunError::is_input`]: 2, the rest: 3, PRODUCT.md).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Bad input (exit code 2): `at` names the option, or the file and line, at fault.
    #[error("{message}")]
    Input { at: InputAt, message: String },
    /// No request got a connection to the target (refused, no route, DNS): exit code 3.
    #[error("{message}")]
    Unreachable { target: String, message: String },
    /// No request got a response, for another cause than the connection (TLS, a stream
    /// lost after its head, a protocol mismatch): exit code 3.
    #[error("{message}")]
    NoResponse { target: String, message: String },
    /// Responses came, none a success: exit code 3.
    #[error("{message}")]
    NoneSucceeded { target: String, message: String },
    /// Fewer workers joined than the run waits for, within the join timeout.
    #[error("{message}")]
    WorkersDidNotJoin {
        joined: usize,
        expected: usize,
        message: String,
    },
    /// A worker could not start, left before the start, did not answer, or was lost (the run
    /// was aborted).
    #[error("{message}")]
    Worker { message: String },
    /// SIGINT or SIGTERM (the caller's interrupt) stopped the run.
    #[error("{message}")]
    Interrupted { message: String },
    /// The run did not do all its work: a sweep level or a probe could not run, or a
    /// worker's slice came back short.
    #[error("{message}")]
    Incomplete { message: String },
    /// Anything else that stopped the run: the worker link, the embedded mock, a task.
    #[error("{message}")]
    Failed { message: String },
}

/// Where bad input is: the option (flag or config field) or the file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputAt {
    /// An option: the flag as the CLI spells it (`--concurrency`), or `goal` for a goal
    /// expression.
    Option(String),
    /// A file (the recording, a baseline report, a TLS file), at a line and field when known.
    File {
        path: std::path::PathBuf,
        line: Option<u64>,
        field: Option<String>,
    },
    /// Nothing more precise than the message.
    Unknown,
}

impl RunError {
    /// Bad input at an option.
    pub fn option(option: impl Into<String>, message: impl Into<String>) -> RunError {
        RunError::Input {
            at: InputAt::Option(option.into()),
            message: message.into(),
        }
    }

    /// Bad input in a file (no line known).
    pub fn file(path: &std::path::Path, message: impl Into<String>) -> RunError {
        RunError::Input {
            at: InputAt::File {
                path: path.to_owned(),
                line: None,
                field: None,
            },
            message: message.into(),
        }
    }

    /// Bad input whose message starts with the flag at fault (`--workers must be ...`), as
    /// the option checks write them: the flag is read back from the message.
    pub fn flagged(message: impl Into<String>) -> RunError {
        let message = message.into();
        let at = message
            .split([' ', ':', '='])
            .next()
            .filter(|word| word.starts_with("--") && word.len() > 2)
            .map_or(InputAt::Unknown, |flag| InputAt::Option(flag.to_owned()));
        RunError::Input { at, message }
    }

    /// Anything else that stopped the run.
    pub fn failed(message: impl Into<String>) -> RunError {
        RunError::Failed {
            message: message.into(),
        }
    }

    /// A recording that could not be read, with its line and field.
    pub fn recording(error: &common::recording::RecordingError) -> RunError {
        use common::recording::RecordingError;
        let (path, line, field) = match error {
            RecordingError::Open { path, .. } => (path, None, None),
            RecordingError::Io { path, line, .. } => (path, Some(*line), None),
            RecordingError::Invalid {
                path, line, field, ..
            } => (path, Some(*line), Some(field.clone())),
        };
        RunError::Input {
            at: InputAt::File {
                path: path.clone(),
                line,
                field,
            },
            message: error.to_string(),
        }
    }

    /// Bad input (exit code 2), rather than a run that could not do its work (exit code 3).
    pub fn is_input(&self) -> bool {
        matches!(self, RunError::Input { .. })
    }
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
    pub load: crate::report::LoadSection,
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
