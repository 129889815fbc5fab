//! Typed replay configuration, as the engine uses it (converted from the protocol at the link).

use std::time::Duration;

/// When requests are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// At the recorded arrival offsets, scaled by `speed` (2 = twice as fast).
    Recorded { speed: f64 },
    /// As soon as the load model allows (closed loop or open-loop rate).
    Asap,
}

/// Inter-arrival distribution for open-loop rate mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Constant,
    Poisson,
}

/// The load model of one worker.
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

/// Everything the engine needs to replay a slice.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Base URL of the target, e.g. `http://127.0.0.1:8080`; recorded paths are appended.
    pub target: String,
    pub load: LoadModel,
    /// Extra headers, already expanded from the worker's environment.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Top-level JSON body fields to override.
    pub sets: Vec<(String, serde_json::Value)>,
    /// Per-request time limit.
    pub timeout: Duration,
    /// Send `x-llm-replay-exchange: <index>` so the embedded mock matches exactly.
    pub tag_requests: bool,
    /// Keep one record per request for `--requests-out`.
    pub requests_out: bool,
    /// How many exchanges the recorded schedule reads ahead to send them in `at_ms` order.
    pub reorder_window: usize,
    /// How to reach the target: TLS trust, HTTP/2, request signing.
    pub transport: TransportConfig,
    /// Faithful replay: pinned output lengths and closed-loop sessions.
    pub faithful: FaithfulConfig,
}

/// How faithfully the recording's users are replayed (`--pin-output-length`,
/// `--session-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaithfulConfig {
    /// Ask each request for the output length the recording measured.
    pub pin: Option<common::formats::pin::PinMode>,
    /// A session's next turn goes out at the previous turn's replayed end plus the recorded
    /// think time (closed loop), not at its recorded offset (open loop).
    pub closed_sessions: bool,
}

/// How the worker talks to the target.
#[derive(Debug, Clone, Default)]
pub struct TransportConfig {
    /// PEM contents of extra CAs trusted besides the Mozilla roots.
    pub extra_ca_pem: Vec<String>,
    /// Skip certificate verification (`--insecure`).
    pub insecure: bool,
    /// Cleartext HTTP/2 with prior knowledge (`--target-h2c`).
    pub h2c: bool,
    /// Re-sign each request with AWS SigV4 (`--aws-sigv4 REGION`).
    pub sigv4: Option<crate::sigv4::SigV4Signer>,
}

/// One exchange to replay.
#[derive(Debug, Clone)]
pub struct WorkItem {
    /// The exchange's index in the recording (for tagging and accounting).
    pub index: u64,
    pub exchange: common::recording::Exchange,
    /// The output tokens the recording measured, when the run pins output lengths.
    pub pin_output_tokens: Option<u64>,
    /// The recorded think time before this turn (closed sessions; not on a first turn).
    pub think: Option<Duration>,
}
