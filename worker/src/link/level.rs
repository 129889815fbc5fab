//! One level of a run on a joined link: the assignment converted and checked
//! (`proto::convert::assignment_from_proto`, `--allow-env`, then `ReplayConfig`), the level's
//! slice stream opened and checked chunk by chunk (sealed under the level's own key with a
//! token; a stream that ends without its last chunk was cut on the way), the session run
//! with every coordinator message of the level forwarded to it as an event.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::assignment::Assignment;
use common::metrics::HistogramEncoding;
use proto::auth::SessionKeys;
use proto::v1;
use tokio::sync::mpsc;

use super::join::{Inbound, Link};
use super::{
    CoordinatorEvent, LinkError, LinkOptions, Session, SessionHandle, ToCoordinator,
    check_allowed_env, replay_config, work_item,
};
use crate::client::TargetClient;
use crate::config::{ReplayConfig, WorkItem};

/// Exchanges of the slice waiting for the engine: the forwarder blocks when the engine is
/// behind, which back-pressures the coordinator through HTTP/2.
const ITEMS_CAPACITY: usize = 2048;

/// Run one level: prepare its assignment, open its slice, run its session to the end.
pub(super) async fn run_level(
    options: &LinkOptions,
    load: &tokio::runtime::Handle,
    link: &mut Link,
    assignment: v1::Assignment,
    on_joined: &mut dyn FnMut(&str),
) -> Result<(), LinkError> {
    let (assignment, config, client) = match prepare(options, assignment).await {
        Ok(prepared) => prepared,
        Err(error) => {
            // The coordinator hears why this worker cannot take the level.
            let _ = link
                .out
                .send(ToCoordinator::Failed {
                    reason: error.to_string(),
                })
                .await;
            return Err(error);
        }
    };
    link.plain.store(
        assignment.histograms == HistogramEncoding::Plain,
        Ordering::Relaxed,
    );
    // The run's, so that both ends give up on each other after the same silence (an older
    // coordinator does not say: this worker's own).
    link.heartbeat_timeout = assignment
        .heartbeat_timeout
        .unwrap_or(options.heartbeat_timeout);
    on_joined(&assignment.run_id);
    options.health.set(1);

    let (slice, items) = match open_slice(options, link, &assignment).await {
        Ok(opened) => opened,
        Err(error) => {
            let _ = link
                .out
                .send(ToCoordinator::Failed {
                    reason: error.to_string(),
                })
                .await;
            return Err(error);
        }
    };
    // The coordinator may ask for a longer interval when it has many workers.
    let report_interval = assignment
        .report_interval
        .unwrap_or(options.report_interval);
    let claims = crate::engine::claims::ClaimLink::new(report_interval);
    let (session, mut session_task) = SessionHandle::spawn(
        Session {
            config,
            client,
            items,
            open_ended: assignment.open_ended,
            load: load.clone(),
            heartbeat_timeout: link.heartbeat_timeout,
            report_interval,
            health: options.health.clone(),
            claims: Some(claims.clone()),
        },
        link.out.clone(),
    );
    let slice_task = load.spawn(read_slice(slice, session.clone(), claims));
    let mut inbound_open = true;
    let outcome = loop {
        tokio::select! {
            // The session's end first: what arrives after it (the next level's assignment,
            // the run's end) is the link's, not this session's.
            biased;
            finished = &mut session_task => {
                break finished.unwrap_or_else(|error| {
                    Err(LinkError::Protocol(format!("the link's session failed: {error}")))
                });
            }
            // Once the next level's assignment (or the run's end) is in, what follows it is
            // the next level's: it stays queued for the next session.
            item = link.inbound.recv(), if inbound_open && link.pending.is_none() => {
                let event = match item {
                    Some(Inbound::Event(event)) => event,
                    // The coordinator wrote this level's Finish before it: the session has it
                    // and is ending; the next level's assignment (or the run's end) waits for
                    // the link.
                    Some(next @ (Inbound::Assignment(_) | Inbound::Done)) => {
                        link.pending = Some(next);
                        continue;
                    }
                    None => {
                        inbound_open = false;
                        CoordinatorEvent::StreamEnded
                    }
                };
                // False once the session is over: its outcome is about to be read.
                let _ = session.send(event).await;
            }
        }
    };
    slice_task.abort();
    outcome
}

/// The assignment converted, checked and turned into the engine's configuration, on a
/// blocking thread: a `--tokenizer` is inflated and built here, which takes seconds for a
/// large one, and the link's runtime must go on driving the connection meanwhile (HTTP/2
/// keepalives, the coordinator's first clock ping). The client is made on this runtime (its
/// connection pool lives here).
async fn prepare(
    options: &LinkOptions,
    assignment: v1::Assignment,
) -> Result<(Assignment, Arc<ReplayConfig>, TargetClient), LinkError> {
    let allow_env = options.allow_env.clone();
    let (assignment, config) = tokio::task::spawn_blocking(move || {
        let allowed = |var: &str| {
            allow_env
                .iter()
                .any(|a| a == var)
                .then(|| std::env::var(var).ok())
                .flatten()
        };
        let assignment = proto::convert::assignment_from_proto(&assignment)?;
        check_allowed_env(&assignment, &allow_env)?;
        let config = replay_config(&assignment, &allowed)?;
        Ok::<_, LinkError>((assignment, Arc::new(config)))
    })
    .await
    .unwrap_or_else(|error| {
        Err(LinkError::Protocol(format!(
            "the assignment could not be prepared: {error}"
        )))
    })?;
    let client = TargetClient::new(&config.transport)?;
    Ok((assignment, config, client))
}

/// A level's opened slice stream, before its reader starts.
struct OpenSlice {
    tx: mpsc::Sender<WorkItem>,
    stream: tonic::Streaming<v1::ExchangeChunk>,
    opener: Option<proto::auth::Opener>,
}

/// Open the level's `Exchanges` stream: with a session, the worker proves it for this level
/// (the proof names the level's run id, and the chunks are sealed under the level's own
/// key); without a token, the assignment's key opens it.
async fn open_slice(
    options: &LinkOptions,
    link: &mut Link,
    assignment: &Assignment,
) -> Result<(OpenSlice, mpsc::Receiver<WorkItem>), LinkError> {
    let keys = link.keys.clone();
    let request = link.client.exchanges(v1::SliceRequest {
        run_id: assignment.run_id.clone(),
        worker_id: options.worker_id.clone(),
        token: match &keys {
            Some(keys) => keys.slice_request_proof(&assignment.run_id, &options.worker_id),
            None => assignment.slice_key.clone(),
        },
    });
    let patience = link.heartbeat_timeout;
    let stream = tokio::time::timeout(patience, request)
        .await
        .map_err(|_| super::coordinator_lost(&format!("no slice stream within {patience:?}")))?
        .map_err(|status| LinkError::Protocol(format!("slice stream: {}", status.message())))?
        .into_inner();
    let (tx, rx) = mpsc::channel::<WorkItem>(ITEMS_CAPACITY);
    let opener = keys
        .as_deref()
        .map(|keys: &SessionKeys| keys.slice_opener(&assignment.run_id));
    Ok((OpenSlice { tx, stream, opener }, rx))
}

/// Read the slice into the engine's items on the load runtime; a chunk that fails its check,
/// an exchange that does not check out, a broken stream, or a stream that ends before its
/// last chunk fails the slice (the session stops the load and says why).
async fn read_slice(
    slice: OpenSlice,
    session: SessionHandle,
    claims: Arc<crate::engine::claims::ClaimLink>,
) {
    let OpenSlice {
        tx,
        mut stream,
        mut opener,
    } = slice;
    let failed = |transport: bool, reason: String| {
        let session = session.clone();
        async move {
            session
                .send(CoordinatorEvent::SliceFailed { transport, reason })
                .await;
        }
    };
    loop {
        let chunk = match stream.message().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                return failed(
                    false,
                    "the slice stream ended before its last chunk: it was cut on the way (a relay?), and the exchanges after the cut never arrived".into(),
                )
                .await;
            }
            Err(status) => return failed(true, status.message().to_owned()).await,
        };
        let chunk = match proto::auth::open_chunk(opener.as_mut(), chunk) {
            Ok(chunk) => chunk,
            Err(error) => {
                return failed(
                    false,
                    format!(
                        "a slice chunk failed its authentication check ({error}): the link was altered on the way (a relay?)"
                    ),
                )
                .await;
            }
        };
        for exchange in chunk.exchanges {
            match work_item(exchange) {
                Ok(item) => {
                    let own = !item.reassigned;
                    if tx.send(item).await.is_err() {
                        return;
                    }
                    // Claims never name an own exchange the engine has not been handed.
                    if own {
                        claims.received_one();
                    }
                }
                Err(reason) => return failed(false, reason).await,
            }
        }
        if chunk.last {
            return;
        }
    }
}
