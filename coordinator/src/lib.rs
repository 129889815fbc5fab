//! The coordinator of llm-replay: `run` as a library (`run`: a recording and options in, a
//! report and its verdict out), its options (`config`), the pre-scan of a recording (`scan`),
//! the embedded mock, sharding, the gRPC service the workers dial and its guards against peers
//! without the token (`link_guard`), one replay (`replay`) and
//! its supervisor, the report and its renderers, goals, and the `--requests-out` file.
//!
//! Only this crate renders reports; the `llm-replay` CLI (`cli`) prints them and
//! picks the exit code.

mod builder;
pub mod capacity;
pub mod config;
pub mod embedded;
pub mod faithful;
pub mod goals;
pub mod launch;
pub mod link_guard;
pub mod live;
pub mod outcome;
pub mod pool;
pub mod replay;
pub mod report;
pub mod requests_out;
pub mod run;
pub mod scan;
pub mod server;
pub mod server_metrics;
pub mod sessions;
pub mod shard;
pub mod supervisor;
pub mod timeline;
