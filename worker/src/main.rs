//! `llm-replay-worker`: the worker binary. It dials the coordinator. The container image
//! carries `llm-replay` under this name instead (one binary: `cli/src/main.rs`), which
//! parses the same `worker::cli::WorkerCommand`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Parsed before the log is set up, as `llm-replay` does under this name.
    let command = worker::cli::WorkerCommand::parse();
    init_tracing();
    worker::cli::run(command.args)
}

/// The log on stderr: one line per event, every field's value with its control characters
/// escaped (an error quotes the target or the coordinator, which may send anything, line
/// feeds included), in colour only for a person at a terminal who did not ask for none
/// (`NO_COLOR`): a container's or CI's log file gets plain text. The same setup as
/// `llm-replay`'s (`cli/src/main.rs`), whose `worker` command runs this worker.
fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LLM_REPLAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(stderr_wants_colour())
        .fmt_fields(escaped_fields())
        .with_writer(std::io::stderr)
        .init();
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
