//! The worker: replays its slice of a recording against a target and measures every frame.
//!
//! - [`client`]: the HTTP client: TLS trust, HTTP/2, one resend, transport-failure causes;
//! - [`h1`]: the own HTTP/1.1 client of cleartext targets;
//! - [`sigv4`]: AWS SigV4 signing of replayed Bedrock requests;
//! - [`config`]: the typed replay configuration (load model, target, headers, overrides);
//! - [`engine`]: the scheduler and one stream task per request;
//! - [`metrics_actor`]: the actor that owns the HDR histograms;
//! - [`request`]: builds the replayed HTTP request from a recorded one;
//! - [`link`]: the gRPC link to the coordinator (the only place that knows `proto`);
//! - [`InProcess`]: local workers in the caller's process (`common::launch`'s launcher).

pub mod cli;
pub mod client;
pub mod config;
pub mod engine;
pub mod h1;
pub mod health;
mod in_process;
pub mod link;
pub mod metrics_actor;
pub mod request;
pub mod sigv4;
pub mod tokens;

pub use in_process::InProcess;
