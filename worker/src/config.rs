//! The replay configuration as the engine uses it: the worker's domain assignment
//! (`common::assignment`) with its headers expanded and its transport resolved (the link
//! builds it). The load model is `common::load`'s, re-exported here for the engine.

use std::time::Duration;

pub use common::load::{Arrival, LoadModel, Schedule};

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
    /// Send `x-llm-replay-exchange: <index>` so the embedded mock matches exactly.
    pub tag_requests: bool,
    /// How to reach the target: TLS trust, HTTP/2, request signing.
    pub transport: TransportConfig,
    /// The run's options as the assignment gave them (timeout, `--requests-out`, reorder
    /// window, faithful replay): a new option the worker needs arrives here unchanged.
    pub options: common::assignment::RequestOptions,
    /// `--tokenizer`: built once from the assignment's bytes (`options.tokenizer`).
    pub tokenizer: Option<std::sync::Arc<crate::tokens::Tokenizer>>,
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
    /// `pin_output_tokens` is a recorded content-frame count (no usage, no tokenizer): it is
    /// compared with the replayed content frames.
    pub pin_in_frames: bool,
    /// The recorded client abandoned the exchange this long after sending it: the request is
    /// cancelled at t0 + this.
    pub cancel_after: Option<Duration>,
    /// The recorded think time before this turn (closed sessions; not on a first turn).
    pub think: Option<Duration>,
    /// Handed over from a lost worker: on a recorded schedule it keeps its recorded pace
    /// (its offset plus the hand-over's delay, never before it arrived: `engine::hand_over`);
    /// its lateness on arrival and its order are not this worker's.
    pub reassigned: bool,
}
