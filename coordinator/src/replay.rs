//! One replay (a run, or one level of a sweep): serve the gRPC link, start local workers
//! (or wait for remote ones), and hand the replay to the supervisor (`supervisor`), which
//! joins, starts, watches and merges into a `ReplayResult` (`outcome`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::assignment::Assignment;
use tokio::sync::mpsc;

use crate::config::{GlobalLoad, RunConfig, WorkerSource};
use crate::outcome::{ReplayResult, RunError};
use crate::server::{CoordinatorService, ServiceState, WorkerEvent};
use crate::shard::SlicePlan;
use crate::supervisor::{RunIdentity, RunSnapshot, Settings, Supervisor};

/// How long a worker's HTTP/2 connection may be silent before the coordinator pings it; an
/// unanswered ping closes it after the run's heartbeat timeout (never sooner: a stall
/// shorter than the heartbeat timeout loses nobody).
const LINK_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// How long the end of a run waits for the worker link to close.
const SERVER_SHUTDOWN_PATIENCE: Duration = Duration::from_secs(2);

/// The load model as the report shows it (`load` in the report JSON): derived from the run's
/// `GlobalLoad` here and nowhere else.
pub fn describe_load(load: &GlobalLoad, workers: usize) -> serde_json::Value {
    serde_json::json!({
        "schedule": load.schedule.name(),
        "speed": load.schedule.speed(),
        "concurrency": load.concurrency,
        "rate": load.rate,
        "arrival": load.rate.map(|_| load.arrival.name()),
        "requests": load.requests,
        "duration_s": load.duration.map(|d| d.as_secs_f64()),
        "warmup": load.warmup,
        "workers": workers,
    })
}

/// Everything a worker's assignment is made of; one per replay.
#[derive(Clone)]
struct AssignmentPlan {
    run_id: String,
    target: String,
    config: RunConfig,
    load: GlobalLoad,
    workers: usize,
    tag_requests: bool,
    open_ended: bool,
}

impl AssignmentPlan {
    /// The assignment of worker `index`: its share of the global concurrency, rate and
    /// warm-up (shares differ by at most one), and the run-wide target and request options.
    /// The slice key is set per worker by the service, after the token challenge.
    fn for_worker(&self, index: usize) -> Assignment {
        let config = &self.config;
        Assignment {
            run_id: self.run_id.clone(),
            target: self.target.clone(),
            load: self
                .load
                .worker_share(self.workers, index, config.seed.unwrap_or(DEFAULT_SEED)),
            headers: config.headers.clone(),
            sets: config.sets.clone(),
            open_ended: self.open_ended,
            options: config.request_options(),
            tag_requests: self.tag_requests,
            worker_index: u32::try_from(index).unwrap_or(u32::MAX),
            transport: config.transport.clone(),
            slice_key: String::new(),
            report_interval: Some(crate::supervisor::report_interval_for(
                self.workers,
                config.heartbeat_timeout,
            )),
            // This coordinator reads plain V2: no inflating per report (most of its CPU
            // with hundreds of workers).
            histograms: common::metrics::HistogramEncoding::Plain,
            // Both ends of the link give up on the other after the same silence.
            heartbeat_timeout: Some(config.heartbeat_timeout),
        }
    }
}

/// The seed of worker 0's Poisson arrivals without `--seed` (worker `i` adds `i`).
const DEFAULT_SEED: u64 = 0x5eed_0000;

/// Inputs of one replay that do not change between sweep levels.
pub struct ReplaySetup<'a> {
    pub config: &'a RunConfig,
    pub load: GlobalLoad,
    pub target: String,
    pub tag_requests: bool,
    pub exchanges: u64,
    pub pass_span_ms: f64,
    /// `--requests-out`, shared by every level of a sweep.
    pub requests_out: Option<Arc<crate::requests_out::RequestsOut>>,
    /// Turns true on SIGINT or SIGTERM: stop the load, collect what the workers have.
    pub interrupt: tokio::sync::watch::Receiver<bool>,
    /// Live progress for a person watching (the CLI renders it); `None` when nobody is.
    pub progress: Option<tokio::sync::watch::Sender<RunSnapshot>>,
    /// Told how many remote workers the run waits for and where it listens, once it does
    /// (the CLI prints how to start them).
    pub waiting_for_workers: &'a (dyn Fn(usize, SocketAddr) + Send + Sync),
    /// The program local workers run (`PROGRAM worker --once ...`): the `llm-replay` binary.
    pub worker_program: &'a std::path::Path,
}

fn tls_server_config(
    tls: &crate::config::LinkTls,
) -> Result<tonic::transport::ServerTlsConfig, RunError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| RunError::Input(format!("{}: {e}", path.display())))
    };
    let mut config = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(read(&tls.cert)?, read(&tls.key)?),
    );
    if let Some(ca) = &tls.client_ca {
        config = config.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

/// Run one replay.
pub async fn replay(setup: ReplaySetup<'_>) -> Result<ReplayResult, RunError> {
    let config = setup.config;
    let load = setup.load.clone();
    let workers = match &config.source {
        WorkerSource::Local(n) => *n,
        WorkerSource::Remote { expect, .. } => *expect,
    };
    let run_id = uuid::Uuid::new_v4().to_string();
    let open_ended = load.is_open_ended();
    let plan = SlicePlan {
        recording: config.recording.clone(),
        workers,
        exchanges: setup.exchanges,
        requests: load.requests,
        open_ended,
        pass_span_ms: setup.pass_span_ms,
        faithful: config.faithful.slice(),
        tokenizer: config.tokenizer.clone(),
        recorded_cancels: config.recorded_cancels,
    };

    let (events_tx, events) = mpsc::channel::<WorkerEvent>(1024);
    let assignment = AssignmentPlan {
        run_id: run_id.clone(),
        target: setup.target.clone(),
        config: config.clone(),
        load: load.clone(),
        workers,
        tag_requests: setup.tag_requests,
        open_ended,
    };
    // Local workers get a fresh random token, so nothing else on the machine can join.
    let token = match (&config.source, &config.token) {
        (_, Some(token)) => Some(token.clone()),
        (WorkerSource::Local(_), None) => Some(uuid::Uuid::new_v4().to_string()),
        (WorkerSource::Remote { .. }, None) => None,
    };
    let state = Arc::new(ServiceState::new(
        workers,
        token.clone(),
        Box::new(move |index| assignment.for_worker(index)),
        events_tx,
        setup.requests_out.clone(),
    ));
    let listen = match &config.source {
        WorkerSource::Local(_) => "127.0.0.1:0".to_owned(),
        WorkerSource::Remote { listen, .. } => listen.clone(),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| RunError::Failed(format!("cannot listen for workers on {listen}: {e}")))?;
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| RunError::Failed(format!("cannot listen for workers: {e}")))?;
    // HTTP/2 keepalive from this side too: a link that stalls is found by both ends, not
    // only by the worker's pings.
    let mut builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(LINK_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(config.heartbeat_timeout));
    if let Some(tls) = &config.tls {
        builder = builder
            .tls_config(tls_server_config(tls)?)
            .map_err(|e| RunError::Input(format!("TLS configuration: {e}")))?;
    }
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let service = CoordinatorService {
        state: state.clone(),
    };
    let server = tokio::spawn(async move {
        builder
            .add_service(
                proto::v1::coordinator_server::CoordinatorServer::new(service)
                    .max_decoding_message_size(64 * 1024 * 1024),
            )
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = server_stopped.await;
                },
            )
            .await
    });

    let children = match &config.source {
        WorkerSource::Local(n) => {
            start_local_workers(setup.worker_program, *n, addr, config, token.as_deref())?
        }
        WorkerSource::Remote { expect, .. } => {
            (setup.waiting_for_workers)(*expect, addr);
            Vec::new()
        }
    };

    let identity = RunIdentity {
        run_id: run_id.clone(),
        target: setup.target.clone(),
        load: describe_load(&load, workers),
        scheduled: load.is_scheduled(),
    };
    let mut settings = Settings::from_config(config, workers);
    settings.load_duration = load.duration;
    let result = Supervisor::new(
        settings,
        plan,
        identity,
        events,
        setup.interrupt.clone(),
        setup.progress.clone(),
    )
    .with_requests_out(setup.requests_out.clone())
    .run()
    .await;

    let _ = stop_server.send(());
    // A graceful shutdown waits for every stream to end, and a worker behind a stalled link
    // may hold one for as long as the stall lasts: the report does not wait for it.
    if tokio::time::timeout(SERVER_SHUTDOWN_PATIENCE, server)
        .await
        .is_err()
    {
        tracing::warn!(
            "the worker link did not close within {SERVER_SHUTDOWN_PATIENCE:?} (a stalled link?); the report goes on without it"
        );
    }
    for mut child in children {
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
    result
}

/// Start `n` local worker processes: `program`'s `worker` command, dialling the coordinator
/// at `addr` over loopback gRPC with the link token. The one place their command line is
/// written.
fn start_local_workers(
    program: &std::path::Path,
    n: usize,
    addr: std::net::SocketAddr,
    config: &RunConfig,
    token: Option<&str>,
) -> Result<Vec<tokio::process::Child>, RunError> {
    // Local workers run with the user's own environment: they may read what the user's own
    // options name, and nothing else.
    let allow_env: Vec<String> = common::assignment::EnvReads::of(
        &config.headers,
        config.transport.aws_sigv4_region.is_some(),
    )
    .all()
    .cloned()
    .collect();
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let child = tokio::process::Command::new(program)
            .args([
                "worker",
                "--coordinator",
                &addr.to_string(),
                "--once",
                "--worker-id",
                &format!("local-{i}"),
                "--heartbeat-timeout",
                &config.heartbeat_timeout.as_secs_f64().to_string(),
            ])
            .args(allow_env.iter().flat_map(|v| ["--allow-env", v.as_str()]))
            .env("LLM_REPLAY_TOKEN", token.unwrap_or_default())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            // Their own process group: a Ctrl-C on the terminal reaches the coordinator
            // alone, which stops them over the link and keeps their data.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RunError::Failed(format!("cannot start local worker {i}: {e}")))?;
        children.push(child);
    }
    Ok(children)
}
