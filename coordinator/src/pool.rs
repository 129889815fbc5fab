//! The run's workers, for the whole run: the listener and gRPC service they dial, the local
//! worker processes (`--workers N`), and the heartbeats that keep joined workers waiting
//! between levels. A run of many levels (a sweep, a `--find-max` search) is one run for its
//! workers: they join once and take every level's assignment on the same link (`replay`
//! asks for each level), until `close` tells them the run is over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::launch::{LaunchedWorker, LocalWorker, WorkerLauncher};

use crate::config::{RunConfig, WorkerSource};
use crate::outcome::RunError;
use crate::server::{CoordinatorService, LevelLink, ServiceState};

/// How long a worker's HTTP/2 connection may be silent before the coordinator pings it; an
/// unanswered ping closes it after the run's heartbeat timeout (never sooner: a stall
/// shorter than the heartbeat timeout loses nobody).
const LINK_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// How long the end of a run waits for the worker link to close.
const SERVER_SHUTDOWN_PATIENCE: Duration = Duration::from_secs(2);

/// The largest message read before a worker is authenticated (its Hello, its answer to the
/// token challenge, its slice request): a real one is a few hundred bytes.
const PRE_AUTH_MESSAGE_LIMIT: usize = 8 * 1024;

/// How often joined workers hear from the coordinator between levels (a probe being judged,
/// the next level being prepared).
const IDLE_HEARTBEAT: Duration = Duration::from_secs(1);

/// How the pool starts: where workers come from and what the caller is told.
pub struct PoolSetup<'a> {
    pub config: &'a RunConfig,
    /// Told how many remote workers the run waits for and where it listens, once it does
    /// (the CLI prints how to start them).
    pub waiting_for_workers: &'a (dyn Fn(usize, SocketAddr) + Send + Sync),
    /// Starts the local workers (`WorkerSource::Local`).
    pub launcher: &'a dyn WorkerLauncher,
    /// The caller's listener for the worker link; `None`: bound here (loopback for local
    /// workers, `--listen` for remote ones).
    pub listener: Option<tokio::net::TcpListener>,
}

/// The run's workers and the service they dial.
pub struct WorkerPool {
    state: Arc<ServiceState>,
    workers: usize,
    stop_server: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    idle: tokio::task::JoinHandle<()>,
    children: Vec<Box<dyn LaunchedWorker>>,
}

impl WorkerPool {
    /// Listen for workers, serve the link, and start the local workers (or say where remote
    /// ones are awaited).
    pub async fn open(setup: PoolSetup<'_>) -> Result<WorkerPool, RunError> {
        let config = setup.config;
        let workers = match &config.source {
            WorkerSource::Local(n) => *n,
            WorkerSource::Remote { expect, .. } => *expect,
        };
        // Local workers get a fresh random token, so nothing else on the machine can join.
        let token = match (&config.source, &config.token) {
            (_, Some(token)) => Some(token.clone()),
            (WorkerSource::Local(_), None) => Some(uuid::Uuid::new_v4().to_string()),
            (WorkerSource::Remote { .. }, None) => None,
        };
        let state = Arc::new(ServiceState::new(workers, token.clone()));
        let listener = match setup.listener {
            Some(listener) => listener,
            None => {
                let listen = match &config.source {
                    WorkerSource::Local(_) => "127.0.0.1:0".to_owned(),
                    WorkerSource::Remote { listen, .. } => listen.clone(),
                };
                tokio::net::TcpListener::bind(&listen).await.map_err(|e| {
                    RunError::failed(format!("cannot listen for workers on {listen}: {e}"))
                })?
            }
        };
        let addr: SocketAddr = listener
            .local_addr()
            .map_err(|e| RunError::failed(format!("cannot listen for workers: {e}")))?;
        let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve(config, Arc::clone(&state), listener, server_stopped)?;
        let idle = {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(IDLE_HEARTBEAT);
                loop {
                    ticks.tick().await;
                    state.heartbeat_idle();
                }
            })
        };
        let mut pool = WorkerPool {
            state,
            workers,
            stop_server: Some(stop_server),
            server: Some(server),
            idle,
            children: Vec::new(),
        };
        match &config.source {
            WorkerSource::Local(n) => {
                pool.children =
                    start_local_workers(setup.launcher, *n, addr, config, token.as_deref())?;
            }
            WorkerSource::Remote { expect, .. } => (setup.waiting_for_workers)(*expect, addr),
        }
        Ok(pool)
    }

    /// How many workers the run takes.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// A level begins: the joined workers are enlisted at once, later ones as they join.
    pub async fn begin_level(&self, level: Arc<LevelLink>) {
        self.state.begin_level(level).await;
    }

    /// The level is over: the workers stay joined for the next one.
    pub async fn end_level(&self) {
        self.state.end_level().await;
    }

    /// The run is over: every worker is told, the link closes, local workers exit.
    pub async fn close(mut self) {
        self.state.close().await;
        self.idle.abort();
        if let Some(stop) = self.stop_server.take() {
            let _ = stop.send(());
        }
        // A graceful shutdown waits for every stream to end, and a worker behind a stalled
        // link may hold one for as long as the stall lasts: the report does not wait for it.
        if let Some(server) = self.server.take()
            && tokio::time::timeout(SERVER_SHUTDOWN_PATIENCE, server)
                .await
                .is_err()
        {
            tracing::warn!(
                "the worker link did not close within {SERVER_SHUTDOWN_PATIENCE:?} (a stalled link?); the report goes on without it"
            );
        }
        for child in std::mem::take(&mut self.children) {
            child.finish(Duration::from_secs(5)).await;
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.idle.abort();
        if let Some(stop) = self.stop_server.take() {
            let _ = stop.send(());
        }
    }
}

fn tls_server_config(
    tls: &crate::config::LinkTls,
) -> Result<tonic::transport::ServerTlsConfig, RunError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| RunError::file(path, format!("{}: {e}", path.display())))
    };
    let mut config = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(read(&tls.cert)?, read(&tls.key)?),
    );
    if let Some(ca) = &tls.client_ca {
        config = config.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

/// Serve the link on `listener` until `stopped`.
fn serve(
    config: &RunConfig,
    state: Arc<ServiceState>,
    listener: tokio::net::TcpListener,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>, RunError> {
    // HTTP/2 keepalive from this side too: a link that stalls is found by both ends, not
    // only by the worker's pings.
    let mut builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(LINK_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(config.heartbeat_timeout))
        // Before the handshake nothing is authenticated: its messages are read only up to a
        // few KiB (`link_guard`); sealed messages after it have the service's own limit.
        .layer(crate::link_guard::PreAuthLimitLayer::new(
            PRE_AUTH_MESSAGE_LIMIT,
        ));
    if let Some(tls) = &config.tls {
        builder = builder
            .tls_config(tls_server_config(tls)?)
            .map_err(|e| RunError::option("--tls-cert", format!("TLS configuration: {e}")))?;
    }
    let service = CoordinatorService { state };
    Ok(tokio::spawn(async move {
        builder
            .add_service(
                proto::v1::coordinator_server::CoordinatorServer::new(service)
                    .max_decoding_message_size(64 * 1024 * 1024),
            )
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
    }))
}

/// Start `n` local workers through `launcher`, dialling the coordinator at `addr` over
/// loopback gRPC with the link token. They stay joined for the whole run (every level) and
/// end when it is over.
fn start_local_workers(
    launcher: &dyn WorkerLauncher,
    n: usize,
    addr: std::net::SocketAddr,
    config: &RunConfig,
    token: Option<&str>,
) -> Result<Vec<Box<dyn LaunchedWorker>>, RunError> {
    // Local workers run with the user's own environment: they may read what the user's own
    // options name, and nothing else.
    let allow_env: Vec<String> = common::assignment::EnvReads::of(
        &config.headers,
        config.transport.aws_sigv4_region.is_some(),
    )
    .all()
    .cloned()
    .collect();
    (0..n)
        .map(|i| {
            launcher
                .launch(LocalWorker {
                    id: format!("local-{i}"),
                    coordinator: addr,
                    token: token.map(str::to_owned),
                    heartbeat_timeout: config.heartbeat_timeout,
                    allow_env: allow_env.clone(),
                })
                .map_err(|error| RunError::Worker {
                    message: error.to_string(),
                })
        })
        .collect()
}
