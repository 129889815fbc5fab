//! The coordinator of llm-replay: `run`'s options (`config`), the pre-scan of a recording
//! (`scan`), sharding, the gRPC service the workers dial, the run supervisor, the report and
//! its renderers, goals, and the `--requests-out` file.
//!
//! Only this crate renders reports; the `llm-replay` CLI (`cli`) prints them and
//! picks the exit code.

pub mod config;
pub mod faithful;
pub mod goals;
pub mod live;
pub mod progress;
pub mod report;
pub mod requests_out;
pub mod run;
pub mod scan;
pub mod server;
pub mod shard;
pub mod supervisor;
pub mod timeline;
