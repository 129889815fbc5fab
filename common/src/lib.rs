//! Everything llm-replay's processes share: the recording format, the wire formats of the four
//! response families, per-stream measurement and the mergeable run metrics.
//!
//! This crate knows nothing of gRPC, HTTP clients or servers, or the terminal: it is pure data
//! and parsing, so the worker, the coordinator and the mock all measure with the same code.

pub mod duration;
pub mod formats;
pub mod measure;
pub mod metrics;
pub mod recording;
