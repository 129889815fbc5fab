//! llm-replay binary (minimal: only the `mock` subcommand until the real CLI is merged).

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "llm-replay",
    version,
    about = "Replay recorded LLM traffic and measure it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mock LLM server speaking all four response families.
    Mock(coordinator::mock::MockArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.command {
        Command::Mock(args) => runtime.block_on(coordinator::mock::run_cli(args)),
    }
}
