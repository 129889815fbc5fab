//! The worker: replays its slice of a recording against a target and measures every frame.
//!
//! - [`config`]: the typed replay configuration (load model, target, headers, overrides);
//! - [`engine`]: the scheduler and one stream task per request;
//! - [`metrics_actor`]: the actor that owns the HDR histograms;
//! - [`request`]: builds the replayed HTTP request from a recorded one;
//! - [`link`]: the gRPC link to the coordinator (the only place that knows `proto`).

pub mod cli;
pub mod config;
pub mod engine;
pub mod health;
pub mod link;
pub mod metrics_actor;
pub mod request;
