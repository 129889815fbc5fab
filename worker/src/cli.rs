//! The worker command line, shared by `llm-replay-worker` and `llm-replay worker`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use common::exit;

use crate::link::{ClientTls, HealthState, LinkError, LinkOptions, run_once};

/// The `llm-replay-worker` command line: its name, version, help and flags. The
/// `llm-replay-worker` binary parses it, and so does `llm-replay` when it runs under that
/// name (the container image carries one binary and links the worker's name to it).
#[derive(Debug, clap::Parser)]
#[command(
    name = "llm-replay-worker",
    version,
    about = "llm-replay worker: dials the coordinator and replays its slice"
)]
pub struct WorkerCommand {
    #[command(flatten)]
    pub args: WorkerArgs,
}

/// `llm-replay-worker` options.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Coordinator address, HOST:PORT.
    #[arg(long)]
    pub coordinator: String,
    /// This worker's id (default: HOST-PID).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Shared secret the coordinator checks on join.
    #[arg(long, env = "LLM_REPLAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Exit after one run (for Jobs): every level of it (a sweep's levels, a capacity
    /// search's probes) — the worker stays joined until the coordinator says the run is over.
    /// Otherwise wait for the next run.
    #[arg(long)]
    pub once: bool,
    /// Coordinator silence after which the worker stops and exits non-zero (e.g. 5s, 500ms;
    /// a bare number is seconds).
    #[arg(long, default_value = "5s", value_parser = positive_duration)]
    pub heartbeat_timeout: Duration,
    /// How long to keep trying to reach the coordinator (e.g. 60s, 5m).
    #[arg(long, default_value = "60s", value_parser = positive_duration)]
    pub connect_patience: Duration,
    /// PEM CA that signed the coordinator's certificate: the link uses TLS.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for mutual TLS (with --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve a health check (HTTP 200 with the worker's phase) on ADDR:PORT (e.g.
    /// 127.0.0.1:9090), or on every interface with a bare PORT (0.0.0.0:PORT).
    #[arg(
        long,
        visible_alias = "health-listen",
        value_name = "[ADDR:]PORT",
        value_parser = health_address
    )]
    pub health_port: Option<SocketAddr>,
    /// An environment variable the coordinator's `--header '...${NAME}...'` (or
    /// `--aws-sigv4`: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) may read on
    /// this worker; repeatable. Nothing else in the environment is ever expanded or sent.
    #[arg(long = "allow-env")]
    pub allow_env: Vec<String>,
}

/// A duration flag that must be above zero (and at most a day: a longer wait is a typo).
fn positive_duration(text: &str) -> Result<Duration, String> {
    let duration = common::duration::parse_duration(text)?;
    if duration.is_zero() {
        return Err("must be above zero".to_owned());
    }
    if duration > Duration::from_secs(86_400) {
        return Err("must be at most a day".to_owned());
    }
    Ok(duration)
}

/// `--health-port`: a bare port is every interface (`0.0.0.0:PORT`, as before addresses were
/// accepted); otherwise `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT` (its first address).
fn health_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let mut resolved = text
        .to_socket_addrs()
        .map_err(|e| format!("expected PORT or ADDR:PORT (e.g. 127.0.0.1:9090): {e}"))?;
    resolved
        .next()
        .ok_or_else(|| "resolves to no address".to_owned())
}

fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Run the worker: builds its two runtimes (one for the load, one for the coordinator link)
/// and returns the process exit code.
pub fn run(args: WorkerArgs) -> ExitCode {
    let host = host_name();
    let options = LinkOptions {
        coordinator: args.coordinator.clone(),
        worker_id: args
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
        host,
        token: args.token.clone(),
        connect_patience: args.connect_patience,
        heartbeat_timeout: args.heartbeat_timeout,
        report_interval: Duration::from_millis(500),
        tls: args.tls_ca.clone().map(|ca| ClientTls {
            ca,
            identity: args.tls_cert.clone().zip(args.tls_key.clone()),
        }),
        health: Arc::new(HealthState::default()),
        allow_env: args.allow_env.clone(),
    };
    if args.tls_ca.is_none() && args.tls_cert.is_some() {
        eprintln!("llm-replay-worker: --tls-cert needs --tls-ca (the CA of the coordinator)");
        return ExitCode::from(exit::USAGE);
    }
    if args.tls_ca.is_some() && args.coordinator.starts_with("http://") {
        // The TLS options would be silently ignored and the token sent in plaintext.
        eprintln!(
            "llm-replay-worker: --coordinator {}: TLS options need a TLS link; write HOST:PORT or https://HOST:PORT",
            args.coordinator
        );
        return ExitCode::from(exit::USAGE);
    }
    let load = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("llm-replay-load")
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("llm-replay-worker: cannot start the load runtime: {error}");
            return ExitCode::from(exit::RUN_FAILED);
        }
    };
    let link = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("llm-replay-worker: cannot start the link runtime: {error}");
            return ExitCode::from(exit::RUN_FAILED);
        }
    };
    if let Some(addr) = args.health_port {
        let listener = match load.block_on(tokio::net::TcpListener::bind(addr)) {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("llm-replay-worker: --health-port {addr}: {error}");
                return ExitCode::from(exit::USAGE);
            }
        };
        load.spawn(crate::health::serve(listener, options.health.clone()));
    }
    loop {
        let mut on_joined = |run_id: &str| {
            println!(
                "llm-replay-worker ready: worker {} joined run {run_id} at {}",
                options.worker_id, options.coordinator
            );
        };
        let result = link.block_on(run_once(&options, load.handle().clone(), &mut on_joined));
        match result {
            Ok(()) if args.once => return ExitCode::from(exit::OK),
            Ok(()) => continue,
            Err(error @ (LinkError::Connect { .. } | LinkError::Join { .. })) if !args.once => {
                eprintln!("llm-replay-worker: {error}; retrying");
            }
            Err(error) => {
                eprintln!("llm-replay-worker: {error}");
                return ExitCode::from(exit::RUN_FAILED);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_address_takes_a_port_or_an_address() {
        let parsed = |text: &str| health_address(text).expect(text);
        assert_eq!(parsed("9090"), SocketAddr::from(([0, 0, 0, 0], 9090)));
        assert_eq!(
            parsed("127.0.0.1:9090"),
            SocketAddr::from(([127, 0, 0, 1], 9090))
        );
        assert_eq!(
            parsed("[::1]:9090"),
            "[::1]:9090".parse::<SocketAddr>().expect("an address")
        );
        assert!(parsed("localhost:9090").ip().is_loopback());
        for bad in [
            "",
            "70000",
            "127.0.0.1",
            "nowhere.invalid:9090",
            "1.2.3.4:x",
        ] {
            assert!(health_address(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
