//! `llm-replay`: the coordinator and user CLI.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Run(Box<coordinator::config::RunArgs>),
    /// Run a worker that dials a coordinator (same as llm-replay-worker).
    Worker(worker::cli::WorkerArgs),
    /// Mock LLM server speaking all four response families.
    Mock(coordinator::mock::MockArgs),
    /// Re-render a saved JSON report, or compare it with another.
    Report(coordinator::commands::ReportArgs),
    /// Recording reverse proxy: forwards to --upstream, streams back, records frame timing.
    Record(coordinator::capture::RecordArgs),
    /// Import recordings and traces from other tools into a recording.
    Import(coordinator::import::ImportArgs),
    /// Export a recording for another tool (AIPerf mooncake_trace).
    Export(coordinator::export::ExportArgs),
    /// Inspect a recording (`recording stats FILE`).
    Recording(coordinator::stats::RecordingArgs),
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LLM_REPLAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| {
            eprintln!("llm-replay: cannot start the runtime: {error}");
            ExitCode::from(3)
        })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    init_tracing();
    match cli.command {
        // The worker builds its own runtimes (load and link apart).
        Command::Worker(args) => worker::cli::run(args),
        Command::Report(args) => coordinator::commands::report_command(args),
        Command::Import(args) => coordinator::import::import_command(args),
        Command::Export(args) => coordinator::export::export_command(args),
        Command::Recording(args) => coordinator::stats::recording_command(args),
        Command::Record(args) => match runtime() {
            Ok(runtime) => runtime.block_on(coordinator::capture::record_command(args)),
            Err(code) => code,
        },
        Command::Run(args) => match runtime() {
            Ok(runtime) => runtime.block_on(coordinator::commands::run_command(*args)),
            Err(code) => code,
        },
        Command::Mock(args) => match runtime() {
            Ok(runtime) => match runtime.block_on(coordinator::mock::run_cli(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("llm-replay mock: {error:#}");
                    ExitCode::from(3)
                }
            },
            Err(code) => code,
        },
    }
}
