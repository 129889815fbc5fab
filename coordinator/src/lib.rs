//! The coordinator of llm-replay, as a library: a recording and a typed [`RunConfig`] in,
//! a [`Report`] and its [`Verdict`] out ([`RunPlan::prepare`], then [`RunPlan::execute`]).
//! It never sees a flag (the CLI parses its flags into a `RunConfig`), binds a listener only
//! when the caller hands none, and starts local workers through the [`WorkerLauncher`] the
//! caller passes: child processes of the `llm-replay` binary ([`ProcessLauncher`]) or
//! in-process workers (`worker::InProcess`), so embedding it needs no binary.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use coordinator::{InputAt, ProcessLauncher, RunConfig, RunError, RunHooks, RunPlan, Verdict};
//!
//! # async fn replay() -> Result<(), RunError> {
//! let config = RunConfig::builder("traffic.jsonl")
//!     .target("http://gpu-box:8000")
//!     .concurrency(8)
//!     .timeout(Duration::from_secs(60))
//!     .fail_if("llm.ttft-p95 > 800")
//!     .build()?;
//! let plan = match RunPlan::prepare(config).await {
//!     Ok(plan) => plan,
//!     // A bad recording line names its file, line and field.
//!     Err(RunError::Input { at: InputAt::File { path, line: Some(line), .. }, message }) => {
//!         panic!("{}:{line}: {message}", path.display())
//!     }
//!     Err(other) => return Err(other),
//! };
//! let launcher = Arc::new(ProcessLauncher::new("llm-replay"));
//! let outcome = match plan.execute(RunHooks::new(launcher)).await {
//!     Ok(outcome) => outcome,
//!     Err(RunError::Unreachable { target, .. }) => panic!("nothing answers at {target}"),
//!     Err(other) => return Err(other),
//! };
//! let ttft_p95 = outcome.report.llm.ttft_ms.as_ref().map(|ttft| ttft.p95);
//! assert!(ttft_p95.is_some());
//! assert_eq!(outcome.verdict, Verdict::Passed);
//! # Ok(())
//! # }
//! ```
//!
//! Inside: the pre-scan of a recording (`scan`), the embedded mock, sharding, the gRPC
//! service the workers dial and its guards against peers without the token (`link_guard`),
//! one replay (`replay`) and its supervisor, the capacity search, the report and its
//! renderers, goals, and the `--requests-out` file. Only the API below is public.

mod builder;
mod capacity;
mod config;
mod embedded;
mod faithful;
mod goals;
mod launch;
mod link_guard;
pub mod live;
mod outcome;
mod pool;
mod replay;
pub mod report;
mod requests_out;
mod run;
mod scan;
mod server;
mod server_metrics;
mod sessions;
mod shard;
mod supervisor;
mod timeline;

pub use builder::RunConfigBuilder;
pub use capacity::progress::SearchProgress;
pub use capacity::{Dimension, FindMax};
pub use common::launch::WorkerLauncher;
pub use config::{
    BaselineSource, GlobalLoad, LinkTls, MAX_TOKENIZER_FILE_BYTES, MIN_SERVER_METRICS_INTERVAL,
    MIN_TOKEN_CHARS, ReportFiles, RunConfig, RunTokenizer, ServerMetricsOptions, TargetTransport,
    WorkerSource, check_target, listen_is_loopback, load_tokenizer, max_local_workers,
};
pub use faithful::{FaithfulOptions, SessionSample};
pub use goals::{Goal, GoalError, GoalResult, parse_goal, parse_goals};
pub use launch::ProcessLauncher;
pub use outcome::{InputAt, RunError};
pub use report::Report;
pub use requests_out::RequestsOut;
pub use run::{
    RunHooks, RunOutcome, RunPlan, ScannedRecording, SearchLineSink, SearchProgressSink, Verdict,
    read_saved_report,
};
pub use supervisor::{Notice, NoticeSink, RunSnapshot};
