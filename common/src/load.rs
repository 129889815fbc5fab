//! The load model: when a worker sends its requests and how many at once. One type for the
//! coordinator's options, the assignment each worker gets and the worker's engine.

use std::time::Duration;

/// When requests are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// At the recorded arrival offsets, scaled by `speed` (2 = twice as fast).
    Recorded { speed: f64 },
    /// As soon as the load model allows (closed loop or open-loop rate).
    Asap,
}

impl Schedule {
    /// The schedule's name in flags, reports and the protocol: `recorded` or `asap`.
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::Recorded { .. } => "recorded",
            Schedule::Asap => "asap",
        }
    }

    /// The time scale of the recording: `speed` on a recorded schedule, 1 otherwise.
    pub fn speed(&self) -> f64 {
        match self {
            Schedule::Recorded { speed } => *speed,
            Schedule::Asap => 1.0,
        }
    }

    /// Whether requests follow the recording's own arrival offsets.
    pub fn is_recorded(&self) -> bool {
        matches!(self, Schedule::Recorded { .. })
    }
}

/// Inter-arrival distribution of the open-loop rate mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Constant,
    Poisson,
}

impl Arrival {
    /// The distribution's name in flags, reports and the protocol.
    pub fn name(&self) -> &'static str {
        match self {
            Arrival::Constant => "constant",
            Arrival::Poisson => "poisson",
        }
    }
}

/// The load model of one worker: its share of the run's load.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadModel {
    pub schedule: Schedule,
    /// Closed-loop concurrency, or a cap on in-flight requests in scheduled/rate modes.
    pub concurrency: Option<usize>,
    /// Open-loop requests per second.
    pub rate: Option<f64>,
    pub arrival: Arrival,
    /// Stop issuing new requests after this long.
    pub duration: Option<Duration>,
    /// Leading requests measured as warm-up and left out of every number.
    pub warmup: u64,
    /// Seed for Poisson arrivals.
    pub seed: u64,
}
