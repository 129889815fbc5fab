//! `llm-replay`: the user CLI. Argument dispatch, all printing to the user and every exit
//! code live in this crate; the libraries it calls (`coordinator`, `worker`, `mock`,
//! `capture`, `recordings`) return values and typed errors.

mod commands;
mod healthcheck;
mod output_paths;
mod print;
mod run_args;
mod run_bar;
mod tools;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use common::exit;

#[derive(Parser)]
#[command(
    name = "llm-replay",
    version,
    about = "Replay recorded LLM traffic against model servers and measure TTFT, ITL, latency and tokens/s"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a recording (with no --target, against an embedded mock at recorded timing).
    Run(Box<run_args::RunArgs>),
    /// Run a worker that dials a coordinator (same as llm-replay-worker).
    Worker(worker::cli::WorkerArgs),
    /// Mock LLM server speaking all four response families.
    Mock(mock::MockArgs),
    /// Re-render a saved JSON report, or compare it with another.
    Report(commands::ReportArgs),
    /// Recording reverse proxy: forwards to --upstream, streams back, records frame timing.
    Record(capture::RecordArgs),
    /// Import recordings and traces from other tools into a recording.
    Import(recordings::import::ImportArgs),
    /// Export a recording for another tool (AIPerf mooncake_trace).
    Export(recordings::export::ExportArgs),
    /// Inspect a recording (`recording stats FILE`).
    Recording(recordings::stats::RecordingArgs),
    /// print a fresh random token for --token / LLM_REPLAY_TOKEN (128 bits)
    Token,
    /// GET a cleartext health endpoint; exit 0 on a 2xx answer (for container health checks)
    Healthcheck(healthcheck::HealthcheckArgs),
}

/// Print `llm-replay: MESSAGE` on stderr (control characters escaped: messages quote files,
/// recordings and peers) and return `code`.
pub(crate) fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    print::stderr_line(&format!("llm-replay: {message}"));
    ExitCode::from(code)
}

/// The log on stderr: one line per event, every field's value with its control characters
/// escaped (log lines quote peers, servers and files), in colour only for a person at a
/// terminal who did not ask for none (`NO_COLOR`): a CI or container log gets plain text.
/// The same setup as `llm-replay-worker`'s (`worker/src/main.rs`).
fn init_tracing() {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LLM_REPLAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .fmt_fields(escaped_fields());
    if stderr_wants_colour() {
        // The fields are escaped already; the subscriber's own colours stay.
        builder.with_ansi(true).with_writer(std::io::stderr).init();
    } else {
        // Plain text, through the escaping writer of every other stderr line the CLI writes.
        builder
            .with_ansi(false)
            .with_writer(|| print::EscapedStderr)
            .init();
    }
}

/// Colour on stderr: a terminal, and `NO_COLOR` unset or empty (no-color.org).
fn stderr_wants_colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Fields as `name=value` (the message bare), each value's control characters escaped, line
/// feeds included: one line per event.
fn escaped_fields() -> impl for<'writer> tracing_subscriber::fmt::FormatFields<'writer> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let value = format!("{value:?}");
        let value = common::text::escape_controls(&value);
        if field.name() == "message" {
            write!(writer, "{value}")
        } else {
            write!(writer, "{}={value}", field.name())
        }
    })
    .delimited(" ")
}

/// The worker binary's name, which this binary answers to as well (see `main`).
const WORKER_BINARY_NAME: &str = "llm-replay-worker";

/// Whether this process was started under `name` (the file name of its argv[0]).
fn invoked_as(name: &str) -> bool {
    std::env::args_os()
        .next()
        .is_some_and(|argv0| std::path::Path::new(&argv0).file_name() == Some(name.as_ref()))
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| {
            fail(
                exit::RUN_FAILED,
                format_args!("cannot start the runtime: {error}"),
            )
        })
}

fn main() -> ExitCode {
    // One binary, two names (busybox style): run as `llm-replay-worker` (the container
    // image's link to this binary), it is that binary: the same parser, flags and help.
    if invoked_as(WORKER_BINARY_NAME) {
        let command = worker::cli::WorkerCommand::parse();
        init_tracing();
        return worker::cli::run(command.args);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    init_tracing();
    match cli.command {
        // The worker builds its own runtimes (load and link apart).
        Command::Worker(args) => worker::cli::run(args),
        Command::Report(args) => commands::report_command(args),
        Command::Import(args) => tools::import_command(args),
        Command::Export(args) => tools::export_command(args),
        Command::Recording(args) => tools::recording_command(args),
        Command::Token => tools::token_command(),
        Command::Healthcheck(args) => healthcheck::healthcheck_command(args),
        Command::Record(args) => match runtime() {
            Ok(runtime) => runtime.block_on(tools::record_command(args)),
            Err(code) => code,
        },
        Command::Run(args) => match runtime() {
            Ok(runtime) => runtime.block_on(commands::run_command(*args)),
            Err(code) => code,
        },
        Command::Mock(args) => match runtime() {
            Ok(runtime) => runtime.block_on(tools::mock_command(args)),
            Err(code) => code,
        },
    }
}
