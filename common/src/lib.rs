//! Everything llm-replay's processes share: the recording format, the wire formats of the four
//! response families, per-stream measurement, the mergeable run metrics and the completion
//! timeline of the steady-state window.
//!
//! This crate knows nothing of gRPC, HTTP clients or servers, or the terminal: it is pure data
//! and parsing, so the worker, the coordinator and the mock all measure with the same code.

pub mod duration;
pub mod formats;
pub mod measure;
pub mod metrics;
pub mod recording;
pub mod timeline;
