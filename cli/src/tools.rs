//! The tool commands — `mock`, `record`, `import`, `export`, `recording stats` — as the user
//! sees them: each calls its library, prints what it did or why it failed, and picks the exit
//! code. The libraries return values and typed errors and print nothing.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use capture::{RecordArgs, RecordError};
use common::exit;
use mock::MockArgs;
use recordings::export::{ExportArgs, export};
use recordings::import::{ImportArgs, run_import_with_notes};
use recordings::stats::{RecordingArgs, RecordingCommand, StatsArgs, render_text};
use tokio::net::TcpListener;

use crate::output_paths::{Input, Output, check_outputs};
use crate::{fail, print};

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Print the one readiness line scripts wait for to learn the port.
fn ready_line(line: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()
}

/// The mock could not start or stopped with an error.
fn mock_failed(message: impl std::fmt::Display) -> ExitCode {
    print::stderr_line(&format!("llm-replay mock: {message}"));
    ExitCode::from(exit::RUN_FAILED)
}

/// `llm-replay mock`: bind, print the readiness line, serve until Ctrl-C/SIGTERM.
pub async fn mock_command(args: MockArgs) -> ExitCode {
    let listen = args.listen;
    let config = match args.into_config() {
        Ok(config) => config,
        Err(error) => return mock_failed(format_args!("{:#}", anyhow::Error::from(error))),
    };
    let listener = match TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => return mock_failed(format_args!("binding {listen}: {error}")),
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(error) => {
            return mock_failed(format_args!("reading the bound address: {error}"));
        }
    };
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    if let Err(error) = ready_line(&format!("llm-replay mock listening on {scheme}://{addr}")) {
        return mock_failed(format_args!("writing the readiness line: {error}"));
    }
    match mock::serve(listener, config, shutdown_signal()).await {
        Ok(()) => ExitCode::from(exit::OK),
        Err(error) => mock_failed(format_args!("{:#}", anyhow::Error::from(error))),
    }
}

/// `llm-replay record`.
pub async fn record_command(args: RecordArgs) -> ExitCode {
    let listen = args.listen.clone();
    let config = match args.into_config() {
        Ok(config) => config,
        Err(error) => return fail(exit::USAGE, error),
    };
    let listener = match TcpListener::bind(&listen).await {
        Ok(listener) => listener,
        Err(error) => return fail(exit::USAGE, format_args!("--listen {listen}: {error}")),
    };
    let address: SocketAddr = match listener.local_addr() {
        Ok(address) => address,
        Err(error) => return fail(exit::RUN_FAILED, RecordError::Listen(error)),
    };
    let out = config.out.clone();
    // Say at once when the recording cannot be written (the proxy answers 503 from then on).
    let health = config.health.clone();
    let reporter = tokio::spawn(async move {
        let cause = health.failed().await;
        print::stderr_line(&format!(
            "llm-replay record: {cause}; nothing more is recorded and new requests get 503 (--on-record-error refuse)"
        ));
    });
    let _ = ready_line(&format!("llm-replay record listening on http://{address}"));
    let result = capture::run(listener, config, shutdown_signal()).await;
    reporter.abort();
    match result {
        Ok(summary) => {
            print::stderr_line(&format!(
                "llm-replay record: wrote {} exchanges to {}{}",
                summary.written,
                out.display(),
                if summary.abandoned > 0 {
                    format!(
                        "; {} streams still open at exit were not written",
                        summary.abandoned
                    )
                } else {
                    String::new()
                }
            ));
            if summary.dropped > 0 {
                // The traffic went through; the recording misses some of it: exit 3.
                print::stderr_line(&format!(
                    "llm-replay record: {} exchanges were proxied but not recorded ({}); the gaps are marked in the recording",
                    summary.dropped, summary.dropped_by_reason
                ));
                return ExitCode::from(exit::RUN_FAILED);
            }
            ExitCode::from(exit::OK)
        }
        Err(error) if error.is_usage() => fail(exit::USAGE, error),
        Err(error) => fail(exit::RUN_FAILED, error),
    }
}

/// `llm-replay import`.
pub fn import_command(args: ImportArgs) -> ExitCode {
    let started = Instant::now();
    let mut inputs = vec![Input {
        what: "the source",
        path: &args.file,
    }];
    if let Some(corpus) = &args.corpus {
        inputs.push(Input {
            what: "the --corpus file",
            path: corpus,
        });
    }
    let output = Output {
        flag: "--output",
        path: &args.output,
    };
    if let Err(message) = check_outputs(&[output], &inputs) {
        return fail(exit::USAGE, message);
    }
    match run_import_with_notes(&args) {
        Ok((written, notes)) => {
            for note in notes {
                print::stderr_line(&note);
            }
            let said = print::stdout_text(&format!(
                "imported {written} exchanges from {} ({}) into {} in {:.2} s\n",
                args.file.display(),
                args.format.name(),
                args.output.display(),
                started.elapsed().as_secs_f64()
            ));
            stdout_written(said)
        }
        Err(error) if error.is_input() => fail(exit::USAGE, error),
        Err(error) => fail(exit::RUN_FAILED, error),
    }
}

/// `llm-replay export`.
pub fn export_command(args: ExportArgs) -> ExitCode {
    let input = Input {
        what: "the recording",
        path: &args.recording,
    };
    let output = Output {
        flag: "--output",
        path: &args.output,
    };
    if let Err(message) = check_outputs(&[output], &[input]) {
        return fail(exit::USAGE, message);
    }
    match export(&args) {
        Ok(summary) => {
            let said = print::stdout_text(&format!(
                "exported {} exchanges to {} (AIPerf mooncake_trace){}\n",
                summary.written,
                args.output.display(),
                if summary.skipped > 0 {
                    format!(
                        "; skipped {} with no prompt AIPerf can send",
                        summary.skipped
                    )
                } else {
                    String::new()
                }
            ));
            if let Some(line) = summary.torn_last_line {
                print::stderr_line(&format!(
                    "llm-replay: {}:{line}: torn last line (the recorder stopped mid-line); it was not exported",
                    args.recording.display()
                ));
            }
            if summary.skipped_long_lines > 0 {
                print::stderr_line(&format!(
                    "llm-replay: {}: {} line(s) over the reader's length cap skipped, not exported",
                    args.recording.display(),
                    summary.skipped_long_lines
                ));
            }
            stdout_written(said)
        }
        Err(error) if error.is_write() => fail(exit::RUN_FAILED, error),
        Err(error) => fail(exit::USAGE, error),
    }
}

/// `llm-replay recording ...`.
pub fn recording_command(args: RecordingArgs) -> ExitCode {
    match args.command {
        RecordingCommand::Stats(args) => stats_command(args),
        RecordingCommand::Filter(args) => filter_command(&args),
    }
}

/// `llm-replay recording filter`.
fn filter_command(args: &recordings::filter::FilterArgs) -> ExitCode {
    match recordings::filter::filter_by_upstream(args) {
        Ok(summary) => {
            filter_warnings(args, &summary);
            stdout_written(print::stdout_text(&format!(
                "kept {} of {} exchanges (upstream {:?}) in {}\n",
                summary.kept,
                summary.read,
                args.upstream,
                args.output.display()
            )))
        }
        Err(error) if error.is_write() => fail(exit::RUN_FAILED, error),
        Err(error) => fail(exit::USAGE, error),
    }
}

/// What a filter could not judge or copied as a gap, on standard error.
fn filter_warnings(
    args: &recordings::filter::FilterArgs,
    summary: &recordings::filter::FilterSummary,
) {
    let input = args.recording.display();
    if let Some(line) = summary.torn_last_line {
        print::stderr_line(&format!(
            "llm-replay: {input}:{line}: torn last line (the recorder stopped mid-line); it was not filtered"
        ));
    }
    if summary.skipped_long_lines > 0 {
        print::stderr_line(&format!(
            "llm-replay: {input}: {} line(s) over the reader's length cap skipped, not filtered",
            summary.skipped_long_lines
        ));
    }
    if summary.gaps > 0 {
        print::stderr_line(&format!(
            "llm-replay: {input}: {} gap markers (exchanges proxied and never recorded, of any upstream) were copied to {}",
            summary.gaps,
            args.output.display()
        ));
    }
}

/// `llm-replay recording stats`.
fn stats_command(args: StatsArgs) -> ExitCode {
    let stats = match recordings::stats::stats_for_args(&args) {
        Ok(stats) => stats,
        Err(error) => return fail(exit::USAGE, error),
    };
    // Model names, paths and the like come from the recording: shown escaped.
    let said = if args.json {
        match serde_json::to_string_pretty(&stats) {
            Ok(text) => print::stdout_raw(&(print::json_for_terminal(&text) + "\n")),
            Err(error) => {
                return fail(
                    exit::RUN_FAILED,
                    format_args!("cannot render JSON: {error}"),
                );
            }
        }
    } else {
        print::stdout_text(&render_text(&stats))
    };
    if let Some(line) = stats.torn_last_line {
        print::stderr_line(&format!(
            "llm-replay: {}:{line}: torn last line (the recorder stopped mid-line); it was not counted",
            args.file.display()
        ));
    }
    stdout_written(said)
}

/// Exit 0 when stdout took what was printed (or its reader had gone), 3 when it could not.
fn stdout_written(said: std::io::Result<()>) -> ExitCode {
    match said {
        Ok(()) => ExitCode::from(exit::OK),
        Err(error) => fail(
            exit::RUN_FAILED,
            format_args!("stdout: cannot write: {error}"),
        ),
    }
}

/// `llm-replay token`: 128 bits from the operating system's CSPRNG, as 32 lowercase hex
/// digits, for `--token` / `LLM_REPLAY_TOKEN`.
pub fn token_command() -> ExitCode {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 16];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        return fail(
            exit::RUN_FAILED,
            "the operating system's random number generator failed",
        );
    }
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    stdout_written(print::stdout_raw(&format!("{token}\n")))
}
