//! The `run` and `report` commands: turn options into replays, a report, files and an exit
//! code. All user-facing output of these commands is written here.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::exit;
use coordinator::ReportFiles;

use crate::run_args::{ReportFileArgs, RunArgs};
use coordinator::RequestsOut;
use coordinator::RunError;
use coordinator::parse_goals;
use coordinator::report::{Report, compare_reports, render_html, render_junit, render_markdown};
use coordinator::{Notice, RunSnapshot};
use coordinator::{RunHooks, RunPlan, ScannedRecording, Verdict, read_saved_report};

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
/// During a `--find-max` search each probe's bar leads with where the search stands
/// (`search`, set as each probe starts).
fn show_progress(
    mut state: tokio::sync::watch::Receiver<RunSnapshot>,
    search: SearchStatus,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut bar: Option<(String, crate::run_bar::RunBar)> = None;
        while state.changed().await.is_ok() {
            let current = state.borrow_and_update().clone();
            if bar.as_ref().is_none_or(|(run, _)| *run != current.run_id) {
                bar = Some((
                    current.run_id.clone(),
                    crate::run_bar::RunBar::new(current.planned),
                ));
            }
            if let Some((_, bar)) = &bar {
                if let Some(progress) = search.lock().map(|s| s.clone()).unwrap_or_default() {
                    bar.set_search(&progress);
                }
                bar.update(&current);
                if current.finished {
                    bar.finish();
                }
            }
        }
    })
}

/// Where a search stands, shared between the run (which sets it as each probe starts) and
/// the progress line.
type SearchStatus = std::sync::Arc<std::sync::Mutex<Option<coordinator::SearchProgress>>>;

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
        state: tokio::sync::watch::Receiver<RunSnapshot>,
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

/// Live lines on stderr, one per event: a worker lost or quitting (always), and join
/// progress with the level it is for when the workers are remote (local ones join at once).
fn notice_printer(remote_workers: bool) -> coordinator::NoticeSink {
    std::sync::Arc::new(move |notice: Notice| {
        if remote_workers || !matches!(notice, Notice::Joined { .. }) {
            print::stderr_line(&format!("llm-replay: {notice}"));
        }
    })
}

/// Read the recording, merge the flags with `--config` into the typed configuration, and
/// check it: the library's plan.
async fn prepare(args: RunArgs) -> Result<RunPlan, RunError> {
    let recording = ScannedRecording::read(&args.recording).await?;
    let config = args
        .into_config(recording.has_arrival_times())
        .map_err(|error| RunError::flagged(format!("{error:#}")))?;
    RunPlan::prepare_scanned(recording, config).await
}

/// `--requests-out`, opened before any load is sent: a path that cannot be written is found
/// now.
fn open_requests_out(path: Option<&Path>) -> Result<Option<RequestsOut>, ExitCode> {
    let Some(path) = path else {
        return Ok(None);
    };
    RequestsOut::create(path).map(Some).map_err(|error| {
        fail(
            exit::USAGE,
            format!("--requests-out {}: cannot write: {error}", path.display()),
        )
    })
}

async fn replay_command(args: RunArgs, live: &mut Option<LiveServer>) -> ExitCode {
    let read_files = args.read_files();
    let plan = match prepare(args).await {
        Ok(plan) => plan,
        Err(error) => return run_error(error),
    };
    let config = plan.config();
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
    let files = config.files.clone();
    let requests_out = match open_requests_out(config.requests_out.as_deref()) {
        Ok(out) => out,
        Err(code) => return code,
    };
    let remote_workers = matches!(config.source, coordinator::WorkerSource::Remote { .. });
    let interrupt = interrupt_signal();

    // Live state for the terminal's progress line and the Prometheus endpoint, one channel
    // for every level of a sweep.
    let on_terminal = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let snapshots = (on_terminal || config.metrics_listen.is_some())
        .then(|| tokio::sync::watch::channel(RunSnapshot::default()).0);
    if let (Some(addr), Some(snapshots)) = (&config.metrics_listen, &snapshots) {
        match LiveServer::start(addr, config.metrics_linger, snapshots.subscribe()).await {
            Ok(server) => *live = Some(server),
            Err(message) => return fail(exit::USAGE, message),
        }
    }
    let search_status = SearchStatus::default();
    let progress_line_task = match (&snapshots, on_terminal) {
        (Some(snapshots), true) => {
            Some(show_progress(snapshots.subscribe(), search_status.clone()))
        }
        _ => None,
    };
    let launcher = match std::env::current_exe() {
        Ok(program) => std::sync::Arc::new(coordinator::ProcessLauncher::new(program)),
        Err(error) => {
            return fail(
                exit::RUN_FAILED,
                format!("cannot find this program to start workers: {error}"),
            );
        }
    };
    let outcome = plan
        .execute(RunHooks {
            launcher,
            listener: None,
            requests_out,
            interrupt,
            snapshots,
            waiting_for_workers: &|expect, addr| {
                print::stderr_line(&format!(
                    "llm-replay: waiting for {expect} workers on {addr} (llm-replay-worker --coordinator {addr})"
                ));
            },
            notices: Some(notice_printer(remote_workers)),
            search_lines: Some(std::sync::Arc::new(|line: &str| {
                print::stderr_line(&format!("llm-replay: {line}"));
            })),
            search_progress: on_terminal.then(|| {
                let status = search_status.clone();
                let sink: coordinator::SearchProgressSink =
                    std::sync::Arc::new(move |progress| {
                        if let Ok(mut slot) = status.lock() {
                            *slot = Some(progress.clone());
                        }
                    });
                sink
            }),
        })
        .await;
    // The progress line is complete before the report is printed: the line's task draws
    // the last state and ends once the run has dropped the sender.
    if let Some(task) = progress_line_task {
        let _ = task.await;
    }
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => return run_error(error),
    };
    let emitted = emit(&outcome.report, &files);
    if let Some(message) = outcome.requests_out_failed {
        return fail(exit::RUN_FAILED, message);
    }
    if let Err(code) = emitted {
        return code;
    }
    match outcome.verdict {
        Verdict::BadGoal(error) | Verdict::RunFailed(error) => run_error(error),
        Verdict::GoalFailed => ExitCode::from(exit::GOAL_FAILED),
        Verdict::Passed => ExitCode::from(exit::OK),
    }
}

/// A run that could not start or measured nothing: bad input is a usage error (exit 2),
/// anything else a failed run (exit 3).
fn run_error(error: RunError) -> ExitCode {
    let code = if error.is_input() {
        exit::USAGE
    } else {
        exit::RUN_FAILED
    };
    fail(code, error.to_string())
}

fn read_report(path: &Path) -> Result<Report, ExitCode> {
    read_saved_report(path).map_err(run_error)
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
    pub files: ReportFileArgs,
}

/// `llm-replay report FILE [--baseline FILE]`.
pub fn report_command(args: ReportArgs) -> ExitCode {
    let goals = match parse_goals(&args.fail_if) {
        Ok(goals) => goals,
        Err(error) => return fail(exit::USAGE, error),
    };
    let files = ReportFiles::from(args.files.clone());
    // A saved report may be rendered over itself (it is read first); two outputs on one
    // file, or a link to nothing, are refused.
    if let Err(message) = check_outputs(&report_outputs(&files), &[]) {
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
    if let Err(code) = emit(&report, &files) {
        return code;
    }
    if report.any_goal_failed() {
        ExitCode::from(exit::GOAL_FAILED)
    } else {
        ExitCode::from(exit::OK)
    }
}
