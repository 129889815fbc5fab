//! The `run` and `report` commands: turn options into a replay, a report and an exit code.

use std::process::ExitCode;

use crate::config::{BaselineSource, RunArgs};
use crate::run::{ReplaySetup, RunError, replay};
use crate::scan::scan;

/// Exit codes of the contract.
pub mod exit {
    pub const OK: u8 = 0;
    pub const GOAL_FAILED: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const RUN_FAILED: u8 = 3;
}

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("llm-replay: {message}");
    ExitCode::from(code)
}

/// `llm-replay run`.
pub async fn run_command(args: RunArgs) -> ExitCode {
    let recording = args.recording.clone();
    let scanned = {
        let path = recording.clone();
        match tokio::task::spawn_blocking(move || scan(&path)).await {
            Ok(Ok(scanned)) => scanned,
            Ok(Err(error)) => return fail(exit::USAGE, error),
            Err(error) => return fail(exit::RUN_FAILED, error),
        }
    };
    if scanned.exchanges == 0 {
        return fail(exit::USAGE, format!("{}: the recording has no exchanges", recording.display()));
    }
    let config = match args.into_config(scanned.with_arrival > 0) {
        Ok(config) => config,
        Err(error) => return fail(exit::USAGE, format!("{error:#}")),
    };
    let target = match &config.target {
        Some(target) => target.clone(),
        None => return fail(exit::USAGE, "no --target (embedded mock not wired yet)"),
    };
    let pass_span_ms = if scanned.exchanges > 1 {
        scanned.max_at_ms * scanned.exchanges as f64 / (scanned.exchanges - 1) as f64
    } else {
        scanned.max_at_ms + 1000.0
    };
    let setup = ReplaySetup {
        config: &config,
        load: config.load.clone(),
        target,
        tag_requests: config.target.is_none(),
        exchanges: scanned.exchanges,
        pass_span_ms,
    };
    let result = match replay(setup).await {
        Ok(result) => result,
        Err(RunError::Input(message)) => return fail(exit::USAGE, message),
        Err(RunError::Failed(message)) => return fail(exit::RUN_FAILED, message),
    };
    let _ = BaselineSource::None;
    let m = &result.metrics;
    for metric in common::metrics::Metric::ALL {
        if let Some(s) = m.stats(metric) {
            println!("{:<34} p50 {:>10.3} p95 {:>10.3} avg {:>10.3} n {}", metric.label(), s.p50, s.p95, s.avg, s.count);
        }
    }
    println!("counters {:?} assigned {} not_started {} lost {}", m.counters, result.assigned, result.not_started, result.lost);
    if result.aborted {
        return ExitCode::from(exit::RUN_FAILED);
    }
    ExitCode::from(exit::OK)
}
