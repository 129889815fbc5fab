//! The coordinator and user CLI of llm-replay: `run` (scan, shard, start workers, merge,
//! report, goals), the embedded and stand-alone mock server, and report rendering.
//!
//! Only this crate renders reports and talks to the user.

pub mod capture;
pub mod commands;
pub mod config;
pub mod duration;
pub mod embedded;
pub mod export;
pub mod faithful;
pub mod goals;
pub mod import;
pub mod live;
pub mod mock;
pub mod progress;
pub mod report;
pub mod requests_out;
pub mod run;
pub mod scan;
pub mod server;
pub mod shard;
pub mod stats;
pub mod supervisor;
pub mod timeline;

#[cfg(test)]
pub(crate) mod test_timing;
