//! Everything llm-replay's processes share: the recording format, the wire formats of the four
//! response families, per-stream measurement, the mergeable run metrics, the completion
//! timeline of the steady-state window, the load model, a worker's assignment and its reports, and the pieces that more than one tool uses (the
//! pacer, redaction, exit codes, replay defaults).
//!
//! This crate knows nothing of gRPC, HTTP clients or servers, or the terminal: it is pure data
//! and parsing (plus the pacer's thread), so the worker, the coordinator, the mock, the proxy
//! and the importers all measure with the same code. (`transport`, behind the feature
//! `transport-errors`, reads hyper's and rustls's error types to name a transport failure;
//! it builds no client; `tls`, behind the feature `tls`, is the one TLS module: the rustls
//! client configuration every client of the project builds; `accept`, behind the feature
//! `accept`, is the one accept loop of the project's servers.)

#[cfg(feature = "accept")]
pub mod accept;
pub mod assignment;
pub mod civil;
pub mod duration;
pub mod env_template;
pub mod error_text;
pub mod exit;
pub mod formats;
pub mod launch;
pub mod load;
pub mod measure;
pub mod metrics;
pub mod pacer;
pub mod process;
pub mod recording;
pub mod redact;
pub mod replay;
pub mod slo;
pub mod text;
pub mod timeline;
#[cfg(feature = "tls")]
pub mod tls;
pub mod tokenizer;
#[cfg(feature = "transport-errors")]
pub mod transport;
pub mod worker_report;

#[cfg(any(test, feature = "test-timing"))]
pub mod test_timing;
