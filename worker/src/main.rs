//! `llm-replay-worker`: the worker binary for containers. It dials the coordinator.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "llm-replay-worker",
    version,
    about = "llm-replay worker: dials the coordinator and replays its slice"
)]
struct Cli {
    #[command(flatten)]
    args: worker::cli::WorkerArgs,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LLM_REPLAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    worker::cli::run(Cli::parse().args)
}
