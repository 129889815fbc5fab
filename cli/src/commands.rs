//! The `run` and `report` commands: turn options into replays, a report, files and an exit
//! code. All user-facing output of these commands is written here.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::exit;
use coordinator::config::{BaselineSource, ReportFiles, RunArgs, RunConfig};
use coordinator::goals::{Goal, parse_goals};
use coordinator::report::{
    Baseline, Report, ReportInput, RequestTotals, RunInfo, SweepLevel, WorkerInfo, compare_reports,
    render_html, render_junit, render_markdown, rfc3339_utc,
};
use coordinator::run::{ReplayResult, ReplaySetup, RunError, replay};
use coordinator::scan::{RecordingScan, scan, scan_sampled};
use coordinator::supervisor::Progress;

use crate::output_paths::{Input, Output, check_outputs};
use crate::{fail, print};

/// Print the report on the terminal and write each requested file. A file that cannot be
/// written does not stop the others: every one is attempted, the first failure is returned.
fn emit(report: &Report, files: &ReportFiles) -> Result<(), ExitCode> {
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut first_failure = print::stdout_raw(&print::terminal_report(report, color))
        .map_err(|error| fail(exit::RUN_FAILED, format!("stdout: cannot write: {error}")));
    type Render = fn(&Report) -> String;
    let renderers: [(&Option<PathBuf>, Render); 4] = [
        (&files.report_json, Report::to_json_pretty),
        (&files.report_md, render_markdown),
        (&files.report_html, render_html),
        (&files.junit, render_junit),
    ];
    for (path, render) in renderers {
        if let Some(path) = path
            && let Err(code) = write_file(path, &render(report))
            && first_failure.is_ok()
        {
            first_failure = Err(code);
        }
    }
    first_failure
}

/// The report files of `files` as outputs, by flag.
fn report_outputs(files: &ReportFiles) -> Vec<Output<'_>> {
    [
        ("--report-json", &files.report_json),
        ("--report-md", &files.report_md),
        ("--report-html", &files.report_html),
        ("--junit", &files.junit),
    ]
    .into_iter()
    .filter_map(|(flag, path)| path.as_deref().map(|path| Output { flag, path }))
    .collect()
}

/// A watch that turns true on the first SIGINT or SIGTERM.
fn interrupt_signal() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate => {}
        }
        print::stderr_line(
            "llm-replay: interrupted: stopping the load and collecting what the workers measured",
        );
        let _ = tx.send(true);
    });
    rx
}

/// Live progress only for a person watching (stdout and stderr on a terminal): one bar per
/// replay (each level of a sweep), left on screen when it finishes.
fn show_progress(mut state: tokio::sync::watch::Receiver<Progress>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut bar: Option<(String, coordinator::progress::Progress)> = None;
        while state.changed().await.is_ok() {
            let current = state.borrow_and_update().clone();
            if bar.as_ref().is_none_or(|(run, _)| *run != current.run_id) {
                bar = Some((
                    current.run_id.clone(),
                    coordinator::progress::Progress::new(current.planned),
                ));
            }
            if let Some((_, bar)) = &bar {
                bar.update(&current);
                if current.finished {
                    bar.finish();
                }
            }
        }
    })
}

fn write_file(path: &Path, text: &str) -> Result<(), ExitCode> {
    std::fs::write(path, text).map_err(|e| {
        fail(
            exit::RUN_FAILED,
            format!("{}: cannot write: {e}", path.display()),
        )
    })
}

/// `llm-replay run`.
pub async fn run_command(args: RunArgs) -> ExitCode {
    let mut live = None;
    let code = replay_command(args, &mut live).await;
    if let Some(live) = live {
        live.linger_and_stop().await;
    }
    code
}

/// `--metrics-listen`: the Prometheus endpoint, served until the run's reports are written
/// and the linger time has passed.
struct LiveServer {
    linger: std::time::Duration,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl LiveServer {
    async fn start(
        addr: &str,
        linger: std::time::Duration,
        state: tokio::sync::watch::Receiver<Progress>,
    ) -> Result<LiveServer, String> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("--metrics-listen {addr}: cannot listen: {e}"))?;
        if let Ok(local) = listener.local_addr() {
            print::stderr_line(&format!(
                "llm-replay: live metrics on http://{local}/metrics"
            ));
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(coordinator::live::serve(listener, state, stopped));
        Ok(LiveServer { linger, stop, task })
    }

    async fn linger_and_stop(self) {
        tokio::time::sleep(self.linger).await;
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn replay_command(args: RunArgs, live: &mut Option<LiveServer>) -> ExitCode {
    let recording = args.recording.clone();
    // Files the run reads that no output may overwrite (the config keeps some of them as
    // contents only, so they are taken from the arguments).
    let mut read_files: Vec<(&'static str, PathBuf)> = vec![("the recording", recording.clone())];
    for (what, path) in [
        ("the --config file", &args.config),
        ("the --tls-cert file", &args.tls_cert),
        ("the --tls-key file", &args.tls_key),
        ("the --tls-ca file", &args.tls_ca),
    ] {
        read_files.extend(path.clone().map(|path| (what, path)));
    }
    read_files.extend(
        args.target_ca
            .iter()
            .map(|path| ("a --target-ca file", path.clone())),
    );
    let scanned = {
        let path = recording.clone();
        match tokio::task::spawn_blocking(move || scan(&path)).await {
            Ok(Ok(scanned)) => scanned,
            Ok(Err(error)) => return fail(exit::USAGE, error),
            Err(error) => return fail(exit::RUN_FAILED, error),
        }
    };
    if scanned.exchanges == 0 {
        return fail(
            exit::USAGE,
            format!("{}: the recording has no exchanges", recording.display()),
        );
    }
    let mut config = match args.into_config(scanned.with_arrival > 0) {
        Ok(config) => config,
        Err(error) => return fail(exit::USAGE, format!("{error:#}")),
    };
    // A sampled run counts, measures and paces only the sessions it keeps.
    let (scanned, unsampled) = match config.faithful.sample {
        None => (scanned, None),
        Some(sample) => {
            let path = recording.clone();
            let sampled =
                match tokio::task::spawn_blocking(move || scan_sampled(&path, Some(&sample))).await
                {
                    Ok(Ok(sampled)) => sampled,
                    Ok(Err(error)) => return fail(exit::USAGE, error),
                    Err(error) => return fail(exit::RUN_FAILED, error),
                };
            if sampled.exchanges == 0 {
                return fail(
                    exit::USAGE,
                    format!(
                        "--sample-sessions {} --seed {}: keeps none of the {} exchanges of {}; raise the fraction or try another seed",
                        sample.fraction,
                        sample.seed,
                        scanned.exchanges,
                        recording.display()
                    ),
                );
            }
            let unsampled = (scanned.exchanges, scanned.sessions);
            (sampled, Some(unsampled))
        }
    };
    let goals = match parse_goals(&config.goals) {
        Ok(goals) => goals,
        Err(error) => return fail(exit::USAGE, error),
    };
    let saved_baseline = match &config.baseline {
        BaselineSource::Report(path) => match read_report(path) {
            Ok(report) => Some((path.clone(), report)),
            Err(code) => return code,
        },
        _ => None,
    };
    let mut warnings = Vec::new();
    if config.transport.insecure {
        warnings.push(
            "INSECURE: the target's TLS certificate was not verified (--insecure); anyone on the path could have answered"
                .to_string(),
        );
    }
    if let Some(line) = scanned.torn_last_line {
        warnings.push(format!(
            "{}:{line}: torn last line (the recorder stopped mid-line); it was not replayed",
            recording.display()
        ));
    }
    if scanned.skipped_long_lines > 0 {
        let lines: Vec<String> = scanned
            .skipped_long_line_numbers
            .iter()
            .map(u64::to_string)
            .collect();
        warnings.push(format!(
            "{}: {} line(s) over the reader's length cap skipped, not replayed (lines {}{})",
            recording.display(),
            scanned.skipped_long_lines,
            lines.join(", "),
            if scanned.skipped_long_lines > lines.len() as u64 {
                ", ..."
            } else {
                ""
            }
        ));
    }
    // Never more local workers than the run has exchanges to give.
    if let Some(asked) = config.fit_workers_to(scanned.exchanges) {
        warnings.push(format!(
            "--workers {asked}: the run has {} exchanges to give, so {} workers start",
            config.load.requests.unwrap_or(scanned.exchanges),
            config.workers
        ));
    }

    // Every output, checked before any load is sent: a path that cannot be written, a
    // link to nothing, or one that names an input or another output is a usage error.
    let mut outputs = report_outputs(&config.files);
    if let Some(path) = &config.requests_out {
        outputs.push(Output {
            flag: "--requests-out",
            path,
        });
    }
    let inputs: Vec<Input<'_>> = read_files
        .iter()
        .map(|(what, path)| Input { what, path })
        .collect();
    if let Err(message) = check_outputs(&outputs, &inputs) {
        return fail(exit::USAGE, message);
    }
    let interrupt = interrupt_signal();
    // Opened before any load is sent: a path that cannot be written is found now.
    let requests_out = match &config.requests_out {
        Some(path) => match coordinator::requests_out::RequestsOut::create(path) {
            Ok(out) => Some(std::sync::Arc::new(out)),
            Err(error) => {
                return fail(
                    exit::USAGE,
                    format!("--requests-out {}: cannot write: {error}", path.display()),
                );
            }
        },
        None => None,
    };

    // Live state for the terminal's progress line and the Prometheus endpoint, one channel
    // for every level of a sweep.
    let on_terminal = {
        use std::io::IsTerminal;
        std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
    };
    let progress = (on_terminal || config.metrics_listen.is_some())
        .then(|| tokio::sync::watch::channel(Progress::default()).0);
    if let (Some(addr), Some(progress)) = (&config.metrics_listen, &progress) {
        match LiveServer::start(addr, config.metrics_linger, progress.subscribe()).await {
            Ok(server) => *live = Some(server),
            Err(message) => return fail(exit::USAGE, message),
        }
    }
    let progress_line_task = match (&progress, on_terminal) {
        (Some(progress), true) => Some(show_progress(progress.subscribe())),
        _ => None,
    };

    // With no target, an embedded mock serves the recorded streams at their recorded timing.
    let (target, embedded) = match &config.target {
        Some(target) => (target.clone(), None),
        None => match crate::embedded::start_embedded(&config.recording) {
            Ok(mock) => (mock.url.clone(), Some(mock)),
            Err(error) => return fail(exit::RUN_FAILED, format!("embedded mock: {error:#}")),
        },
    };
    let pass_span_ms = if scanned.exchanges > 1 {
        scanned.max_at_ms * scanned.exchanges as f64 / (scanned.exchanges - 1) as f64
    } else {
        scanned.max_at_ms + 1000.0
    };
    let levels: Vec<Option<usize>> = if config.sweep.is_empty() {
        vec![None]
    } else {
        config.sweep.iter().copied().map(Some).collect()
    };
    let mut results = Vec::new();
    let mut level_failed: Option<RunError> = None;
    for level in &levels {
        let mut load = config.load.clone();
        let mut level_config = config.clone();
        if let Some(concurrency) = level {
            load.concurrency = Some(*concurrency);
            load.schedule = common::load::Schedule::Asap;
            load.rate = None;
            if let coordinator::config::WorkerSource::Local(n) = config.source {
                level_config.source = coordinator::config::WorkerSource::Local(n.min(*concurrency));
            }
        }
        let setup = ReplaySetup {
            config: &level_config,
            load,
            target: target.clone(),
            tag_requests: embedded.is_some() || config.tag_requests,
            exchanges: scanned.exchanges,
            pass_span_ms,
            requests_out: requests_out.clone(),
            interrupt: interrupt.clone(),
            progress: progress.clone(),
            waiting_for_workers: &|expect, addr| {
                print::stderr_line(&format!(
                    "llm-replay: waiting for {expect} workers on {addr} (llm-replay-worker --coordinator {addr})"
                ));
            },
        };
        match replay(setup).await {
            Ok(result) => {
                let aborted = result.aborted;
                results.push((*level, result));
                if aborted {
                    break;
                }
            }
            // A later sweep level that fails keeps the levels already measured.
            Err(error) if !results.is_empty() => {
                let level = level.map_or_else(String::new, |c| format!(" (concurrency {c})"));
                warnings.push(format!(
                    "the sweep stopped: a level{level} could not run: {error}; the levels before it are reported"
                ));
                level_failed = Some(error);
                break;
            }
            Err(RunError::Input(message)) => return fail(exit::USAGE, message),
            Err(RunError::Failed(message)) => return fail(exit::RUN_FAILED, message),
        }
    }
    // The progress line is complete before the report is printed: the line's task draws
    // the last state and ends once the sender is gone (the live server keeps its receiver).
    drop(progress);
    if let Some(task) = progress_line_task {
        let _ = task.await;
    }
    if let Some(mock) = embedded {
        mock.stop().await;
    }
    // A failure writing --requests-out is a failed run like a report that cannot be
    // written (exit 3): said in the report, and at the end, after the other outputs.
    let mut requests_out_failed = None;
    if let Some(out) = &requests_out
        && let Err(error) = out.finish()
    {
        let message = format!(
            "--requests-out {}: cannot write: {error}",
            out.path().display()
        );
        warnings.push(message.clone());
        requests_out_failed = Some(message);
    }

    let (_, main) = results.last().expect("at least one level ran");
    let sweep: Vec<SweepLevel> = if config.sweep.is_empty() {
        Vec::new()
    } else {
        results
            .iter()
            .map(|(level, result)| SweepLevel {
                concurrency: level.unwrap_or(0) as u32,
                metrics: result.metrics.clone(),
                requests: request_totals(result),
            })
            .collect()
    };
    let timeline = coordinator::timeline::join_levels(results.iter().map(|(level, result)| {
        let level = level.map(|c| c as u32);
        (level, result.started_at, &result.timeline[..])
    }));
    let report = build_report(
        &config,
        &scanned,
        main,
        sweep,
        warnings,
        &goals,
        saved_baseline,
        timeline,
        unsampled,
    );
    let emitted = emit(&report, &config.files);
    if let Some(message) = requests_out_failed {
        return fail(exit::RUN_FAILED, message);
    }
    if let Err(code) = emitted {
        return code;
    }

    if main.interrupted {
        return fail(
            exit::RUN_FAILED,
            "the run was interrupted (partial report above)",
        );
    }
    if main.aborted {
        return fail(
            exit::RUN_FAILED,
            "the run was aborted: a worker was lost (partial report above)",
        );
    }
    if let Some(error) = level_failed {
        return fail(
            exit::RUN_FAILED,
            format!("a sweep level could not run: {error} (the levels before it are above)"),
        );
    }
    if let Some(message) = no_response(&common::recording::redact_url(&target), main) {
        return fail(exit::RUN_FAILED, message);
    }
    if let Some(message) = none_succeeded(&common::recording::redact_url(&target), main) {
        return fail(exit::RUN_FAILED, message);
    }
    if report.any_goal_failed() {
        return ExitCode::from(exit::GOAL_FAILED);
    }
    ExitCode::from(exit::OK)
}

/// When every request failed before any response arrived, why: "unreachable" only when no
/// connection could be made at all (refused, DNS); a TLS failure names its problem.
fn no_response(target: &str, result: &ReplayResult) -> Option<String> {
    let c = &result.metrics.counters;
    if !(c.failed_transport > 0 && c.completed() == c.failed_transport && c.warmup == 0) {
        return None;
    }
    let causes = c
        .transport
        .by_name()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{} {n}", name.replace('_', " ")))
        .collect::<Vec<_>>()
        .join(", ");
    if c.transport.no_connection() == c.failed_transport {
        return Some(format!(
            "the target {target} was unreachable: no connection could be made ({causes})"
        ));
    }
    if c.transport.tls > 0 {
        let problems = result
            .tls_problems
            .iter()
            .map(|(problem, n)| format!("{problem} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Some(format!(
            "TLS with the target {target} failed: {problems} ({causes}); --target-ca FILE trusts a private CA, --insecure skips verification"
        ));
    }
    if c.transport.http2_only > 0 {
        return Some(format!(
            "the target {target} answered in HTTP/2 ({causes}): it speaks only cleartext HTTP/2 (h2c); run with --target-h2c"
        ));
    }
    Some(format!(
        "no request to {target} got a response: every one failed in transport ({causes}){}",
        most_said(result)
    ))
}

/// A run in which requests got answers but none succeeded could not do what it was for
/// (PRODUCT.md: "no request succeeded" is exit 3): say what the answers were.
fn none_succeeded(target: &str, result: &ReplayResult) -> Option<String> {
    let c = &result.metrics.counters;
    if c.succeeded > 0 || c.completed() == 0 {
        return None;
    }
    let mut what: Vec<String> = Vec::new();
    if !result.status_codes.is_empty() {
        let codes = result
            .status_codes
            .iter()
            .map(|(code, n)| format!("{code} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        what.push(format!("status {codes}"));
    }
    for (name, n) in [
        ("ended early", c.ended_early),
        ("error frame", c.failed_error_frame),
        ("in transport", c.failed_transport),
        ("timed out", c.failed_timeout),
        ("empty", c.failed_empty),
    ] {
        if n > 0 {
            what.push(format!("{name} {n}"));
        }
    }
    Some(format!(
        "no request to {target} succeeded: {} answered, none successfully ({}){}; the report above says more",
        c.completed(),
        what.join(", "),
        most_said(result)
    ))
}

/// `; most often the server said "…" (×N)`, from the run's error summary, or nothing.
fn most_said(result: &ReplayResult) -> String {
    result
        .metrics
        .errors
        .most_frequent_message()
        .and_then(|sample| {
            let message = sample.message.as_deref()?;
            let status = sample.status.map(|s| format!("{s} ")).unwrap_or_default();
            Some(format!(
                "; most often the server said {status}\"{message}\" (×{})",
                sample.count
            ))
        })
        .unwrap_or_default()
}

fn request_totals(result: &ReplayResult) -> RequestTotals {
    RequestTotals {
        lost: result.lost,
        not_started: result.not_started,
        status_codes: result.status_codes.clone(),
        tls_problems: result.tls_problems.clone(),
    }
}

#[allow(clippy::too_many_arguments)]
fn build_report(
    config: &RunConfig,
    scanned: &RecordingScan,
    result: &ReplayResult,
    sweep: Vec<SweepLevel>,
    warnings: Vec<String>,
    goals: &[Goal],
    saved_baseline: Option<(PathBuf, Report)>,
    timeline: Vec<coordinator::report::TimelinePoint>,
    unsampled: Option<(u64, u64)>,
) -> Report {
    let started_us = result
        .started_at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let workers = result
        .workers
        .iter()
        .map(|w| WorkerInfo {
            id: w.id.clone(),
            host: w.host.clone(),
            assigned: w.assigned,
            completed: w.metrics.counters.completed(),
            lost: w.totals.lost,
            clock_offset_ms: Some(w.clock.offset_ns as f64 / 1e6),
            disconnected: w.lost,
            version: None,
            peak_rss_mb: (w.peak_rss_bytes > 0).then(|| w.peak_rss_bytes as f64 / 1_048_576.0),
            cpu_seconds: Some(w.cpu_seconds),
            clock_uncertainty_ms: Some(w.clock.uncertainty_ns as f64 / 1e6),
            schedule_lag_p99_ms: w
                .metrics
                .stats(common::metrics::Metric::ScheduleLag)
                .map(|s| s.p99),
            cpu_pct: (w.cores > 0 && result.duration.as_secs_f64() > 0.0).then(|| {
                100.0 * w.cpu_seconds / result.duration.as_secs_f64() / f64::from(w.cores)
            }),
        })
        .collect();
    let mut all_warnings = result.warnings.clone();
    all_warnings.extend(warnings);
    let recorded_baseline = match (&config.baseline, &scanned.baseline) {
        (BaselineSource::Recorded, Some(metrics)) => Some(Baseline {
            source: if scanned.with_source_timing > 0 {
                format!(
                    "recording {} ({} of {} exchanges timed by their source, e.g. a span)",
                    config.recording.display(),
                    scanned.with_source_timing,
                    scanned.with_frame_timing + scanned.with_source_timing
                )
            } else {
                format!("recording {}", config.recording.display())
            },
            metrics,
        }),
        _ => None,
    };
    let report = Report::build(ReportInput {
        run: RunInfo {
            id: result.run_id.clone(),
            started_at: rfc3339_utc(started_us),
            duration_s: result.duration.as_secs_f64(),
            target: if config.target.is_some() {
                common::recording::redact_url(&result.target)
            } else {
                format!("embedded mock ({}) at recorded timing", result.target)
            },
            load: result.load.clone(),
            start_skew_ms: result.start_skew_ms,
            start_skew_bound_ms: coordinator::supervisor::start_skew_bound_ms(&result.workers),
            workers,
            insecure: config.transport.insecure,
        },
        metrics: &result.metrics,
        requests: request_totals(result),
        baseline: recorded_baseline,
        sweep,
        warnings: all_warnings,
        timeline,
    });
    let mut report = match saved_baseline {
        Some((path, saved)) => compare_reports(&report, &saved, &path.display().to_string()),
        None => report,
    };
    coordinator::faithful::apply_to_report(
        &mut report,
        coordinator::faithful::FaithfulInput {
            options: &config.faithful,
            recorded_speed: match config.load.schedule {
                common::load::Schedule::Recorded { speed } if config.sweep.is_empty() => {
                    Some(speed)
                }
                _ => None,
            },
            scan: scanned,
            unsampled,
            steady: result.steady,
        },
    );
    report.with_goals(goals)
}

fn read_report(path: &Path) -> Result<Report, ExitCode> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(exit::USAGE, format!("{}: {e}", path.display())))?;
    Report::from_json(&text).map_err(|e| fail(exit::USAGE, format!("{}: {e}", path.display())))
}

/// `llm-replay report` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// A saved report (`--report-json` output).
    pub file: PathBuf,
    /// Another saved report to compare against (shown as the baseline).
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Goals to evaluate again on the saved report.
    #[arg(long = "fail-if")]
    pub fail_if: Vec<String>,
    #[command(flatten)]
    pub files: ReportFiles,
}

/// `llm-replay report FILE [--baseline FILE]`.
pub fn report_command(args: ReportArgs) -> ExitCode {
    let goals = match parse_goals(&args.fail_if) {
        Ok(goals) => goals,
        Err(error) => return fail(exit::USAGE, error),
    };
    // A saved report may be rendered over itself (it is read first); two outputs on one
    // file, or a link to nothing, are refused.
    if let Err(message) = check_outputs(&report_outputs(&args.files), &[]) {
        return fail(exit::USAGE, message);
    }
    let current = match read_report(&args.file) {
        Ok(report) => report,
        Err(code) => return code,
    };
    let mut report = match &args.baseline {
        Some(path) => match read_report(path) {
            Ok(baseline) => compare_reports(&current, &baseline, &path.display().to_string()),
            Err(code) => return code,
        },
        None => current,
    };
    if !goals.is_empty() {
        let mut evaluated = report.clone().with_goals(&goals);
        let mut kept = report.goals.clone();
        kept.append(&mut evaluated.goals);
        report.goals = kept;
    }
    if let Err(code) = emit(&report, &args.files) {
        return code;
    }
    if report.any_goal_failed() {
        ExitCode::from(exit::GOAL_FAILED)
    } else {
        ExitCode::from(exit::OK)
    }
}
