//! Joining the coordinator, once per run: connect, say hello, the token handshake, the first
//! assignment; then the link's inbound reader, which turns every message of the coordinator
//! into what the link acts on — a level's assignment, the end of the run, or an event of the
//! running level's session. A transport failure while joining (the coordinator's listener
//! not there yet, a connection reset, a stream that ends before the assignment) is retried
//! with back-off within the connect patience; only the coordinator's explicit refusal, or a
//! peer that fails the token's proof, is final.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use proto::auth::{HelloFields, Opener, SessionKeys, WorkerHandshake};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use super::{
    CoordinatorEvent, HANDSHAKE_CAPACITY, LinkError, LinkOptions, OUTBOUND_CAPACITY, ToCoordinator,
    coordinator_lost, event_from_proto, leave_saying, message_to_proto, unix_ns,
};

/// What the coordinator said, as the link acts on it.
#[derive(Debug)]
pub(super) enum Inbound {
    /// A level's assignment (the first one comes with the join).
    Assignment(Box<v1::Assignment>),
    /// The run is over: no assignment follows.
    Done,
    /// Anything else: an event of the running level's session.
    Event(CoordinatorEvent),
}

/// Messages of the coordinator waiting for the link. When it is full the reader waits, and
/// HTTP/2 flow control reaches the coordinator.
const INBOUND_CAPACITY: usize = 64;

/// A joined worker's link, for the whole run.
pub(super) struct Link {
    pub client: CoordinatorClient<tonic::transport::Channel>,
    /// The session's messages to the coordinator (sealed on the way, in wire order).
    pub out: mpsc::Sender<ToCoordinator>,
    pub inbound: mpsc::Receiver<Inbound>,
    /// The session's keys, with a token.
    pub keys: Option<Arc<SessionKeys>>,
    /// Reports encode plain V2 histograms (the assignment says so).
    pub plain: Arc<AtomicBool>,
    /// The assignment that came with the join.
    pub first: Option<Box<v1::Assignment>>,
    /// What came for the link while a level's session was ending: the next level's
    /// assignment, or the run's end.
    pub pending: Option<Inbound>,
    /// The run's heartbeat timeout (from the last assignment): how long the link waits for
    /// the coordinator between levels.
    pub heartbeat_timeout: Duration,
    reader: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Link {
    /// Between levels: the next level's assignment, or `None` when the coordinator says the
    /// run is over. The coordinator's heartbeats keep the wait alive; silence for the
    /// heartbeat timeout, a stream that ends without `Done`, or an abort end it.
    pub async fn next_assignment(&mut self) -> Result<Option<Box<v1::Assignment>>, LinkError> {
        let patience = self.heartbeat_timeout;
        loop {
            let item = match self.pending.take() {
                Some(item) => Some(item),
                None => tokio::time::timeout(patience, self.inbound.recv())
                    .await
                    .map_err(|_| {
                        coordinator_lost(&format!("no message for {patience:?} between levels"))
                    })?,
            };
            match item {
                Some(Inbound::Assignment(assignment)) => return Ok(Some(assignment)),
                Some(Inbound::Done) => return Ok(None),
                Some(Inbound::Event(CoordinatorEvent::Abort { reason })) => {
                    return Err(LinkError::Aborted(reason));
                }
                Some(Inbound::Event(CoordinatorEvent::Untrusted { reason })) => {
                    return Err(LinkError::Untrusted(reason));
                }
                Some(Inbound::Event(CoordinatorEvent::StreamBroke { reason })) => {
                    return Err(coordinator_lost(&reason));
                }
                Some(Inbound::Event(CoordinatorEvent::StreamEnded)) | None => {
                    return Err(coordinator_lost(
                        "its stream ended before it said the run was over",
                    ));
                }
                // Heartbeats, and what is left of the level that just ended.
                Some(Inbound::Event(_)) => {}
            }
        }
    }
}

/// Why one attempt to join did not succeed.
enum JoinFailure {
    /// The path or the coordinator's listener: try again.
    Retry(String),
    /// The coordinator said no, or the peer failed the token's proof.
    Final(LinkError),
}

/// Join the coordinator: attempts spaced by a growing back-off until one succeeds, one fails
/// for good, or the connect patience runs out.
pub(super) async fn join(options: &LinkOptions) -> Result<Link, LinkError> {
    let give_up = Instant::now() + options.connect_patience;
    let mut backoff = Duration::from_millis(100);
    loop {
        match join_once(options).await {
            Ok(link) => return Ok(link),
            Err(JoinFailure::Final(error)) => return Err(error),
            Err(JoinFailure::Retry(reason)) if Instant::now() + backoff < give_up => {
                tracing::info!(reason, "joining the coordinator failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            Err(JoinFailure::Retry(reason)) => {
                return Err(LinkError::Join {
                    addr: options.coordinator.clone(),
                    patience: options.connect_patience,
                    reason,
                });
            }
        }
    }
}

/// A gRPC status that a path or a listener going away gives (worth another attempt), not the
/// coordinator's own answer.
fn transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::Internal
            | tonic::Code::ResourceExhausted
            | tonic::Code::DeadlineExceeded
    )
}

/// One attempt: connect, hello, the handshake, the first assignment.
async fn join_once(options: &LinkOptions) -> Result<Link, JoinFailure> {
    // `connect` retries within the connect patience itself.
    let mut client = super::connect(options).await.map_err(JoinFailure::Final)?;
    // One stream to the coordinator: the handshake's protocol messages, then the session's
    // domain messages, converted as they go out.
    let (handshake_tx, handshake_rx) = mpsc::channel::<v1::WorkerMessage>(HANDSHAKE_CAPACITY);
    let (out_tx, out_rx) = mpsc::channel::<ToCoordinator>(OUTBOUND_CAPACITY);
    let plain = Arc::new(AtomicBool::new(false));
    // With a token, the session's keys once the handshake set them: from then on every
    // message but the handshake's own is sealed as it goes to the wire, in the wire's order.
    let keys: Arc<OnceLock<Arc<SessionKeys>>> = Arc::new(OnceLock::new());
    let outbound = outbound_stream(handshake_rx, out_rx, Arc::clone(&plain), Arc::clone(&keys));
    let send = |msg: v1::worker_message::Msg| v1::WorkerMessage { msg: Some(msg) };
    let token = options
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let mut handshake = token.map(WorkerHandshake::start);
    let hello = v1::Hello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: options.worker_id.clone(),
        host: options.host.clone(),
        capacity: 0,
        // The token itself never crosses the link: see the key exchange below.
        token: String::new(),
        nonce: Vec::new(),
        pake: handshake
            .as_ref()
            .map(|h| h.pake_message().to_vec())
            .unwrap_or_default(),
    };
    let closed = || JoinFailure::Retry("the outbound stream closed".into());
    handshake_tx
        .send(send(v1::worker_message::Msg::Hello(hello.clone())))
        .await
        .map_err(|_| closed())?;
    // Every wait is bounded: a peer that accepts the connection and never answers is not a
    // coordinator (yet): another attempt may find it.
    let answer_within = options.heartbeat_timeout;
    let silent = |what: &str| JoinFailure::Retry(format!("no {what} within {answer_within:?}"));
    let mut inbound = tokio::time::timeout(answer_within, client.join(outbound))
        .await
        .map_err(|_| silent("answer to the join"))?
        .map_err(|status| refusal_or_retry(&status))?
        .into_inner();

    let mut opener: Option<Opener> = None;
    let assignment = loop {
        let message = tokio::time::timeout(answer_within, inbound.message())
            .await
            .map_err(|_| silent("assignment"))?;
        let message = match message {
            Ok(Some(message)) => {
                match proto::auth::open_coordinator_message(opener.as_mut(), message) {
                    Ok(message) => message,
                    Err(error) => {
                        let reason = format!(
                            "a message from the coordinator failed its authentication check ({error}): the link was altered on the way (a relay?); this worker sends nothing"
                        );
                        leave_saying(handshake_tx, out_tx, &mut inbound, reason.clone()).await;
                        return Err(JoinFailure::Final(LinkError::Untrusted(reason)));
                    }
                }
            }
            Ok(None) => {
                return Err(JoinFailure::Retry(
                    "the coordinator's stream ended before the assignment".into(),
                ));
            }
            Err(status) => return Err(refusal_or_retry(&status)),
        };
        match message.msg {
            Some(v1::coordinator_message::Msg::Challenge(challenge)) if opener.is_none() => {
                let Some(started) = handshake.take() else {
                    return Err(JoinFailure::Final(LinkError::Refused(
                        "the coordinator asks for a token: give this worker --token (or LLM_REPLAY_TOKEN)".into(),
                    )));
                };
                let (session, answer) = match started.finish(&HelloFields::of(&hello), &challenge) {
                    Ok(done) => done,
                    Err(error) => {
                        // Said to the peer without a seal (there is no shared key): it tells
                        // the coordinator's log why this worker leaves.
                        let reason = format!(
                            "the coordinator could not prove it knows this worker's token ({error}): this worker's --token is wrong, or the peer is not the coordinator the token belongs to"
                        );
                        leave_saying(handshake_tx, out_tx, &mut inbound, reason.clone()).await;
                        return Err(JoinFailure::Final(LinkError::Untrusted(reason)));
                    }
                };
                let session = Arc::new(session);
                opener = Some(session.coordinator_opener());
                let _ = keys.set(session);
                handshake_tx
                    .send(send(v1::worker_message::Msg::Answer(v1::ChallengeAnswer {
                        proof: answer,
                    })))
                    .await
                    .map_err(|_| closed())?;
            }
            Some(v1::coordinator_message::Msg::Assignment(a)) => {
                if token.is_some() && opener.is_none() {
                    // Nothing it says is trusted: not its target, not its ${VAR}s.
                    return Err(JoinFailure::Final(LinkError::Untrusted(
                        "the peer sent an assignment without proving it knows the token".into(),
                    )));
                }
                break a;
            }
            Some(v1::coordinator_message::Msg::Refused(r)) => {
                return Err(JoinFailure::Final(LinkError::Refused(r.reason)));
            }
            Some(v1::coordinator_message::Msg::Heartbeat(_)) => continue,
            other => {
                return Err(JoinFailure::Final(LinkError::Protocol(format!(
                    "expected an assignment, got {other:?}"
                ))));
            }
        }
    };
    // From here on the session speaks through `out_tx`; the handshake's sender goes.
    drop(handshake_tx);
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_CAPACITY);
    let reader = tokio::spawn(read_inbound(inbound, opener, inbound_tx));
    Ok(Link {
        client,
        out: out_tx,
        inbound: inbound_rx,
        keys: keys.get().cloned(),
        plain,
        first: Some(Box::new(assignment)),
        pending: None,
        heartbeat_timeout: options.heartbeat_timeout,
        reader,
    })
}

/// The one stream to the coordinator: the handshake's protocol messages, then the session's
/// domain messages converted as they go out, each sealed once the session has keys.
fn outbound_stream(
    handshake_rx: mpsc::Receiver<v1::WorkerMessage>,
    out_rx: mpsc::Receiver<ToCoordinator>,
    plain: Arc<AtomicBool>,
    keys: Arc<OnceLock<Arc<SessionKeys>>>,
) -> impl tokio_stream::Stream<Item = v1::WorkerMessage> + Send + 'static {
    let mut sealer = None;
    ReceiverStream::new(handshake_rx)
        .merge(ReceiverStream::new(out_rx).map(move |message| {
            message_to_proto(message, plain.load(std::sync::atomic::Ordering::Relaxed))
        }))
        .map(move |message| {
            if sealer.is_none()
                && let Some(keys) = keys.get()
            {
                sealer = Some(keys.worker_sealer());
            }
            proto::auth::seal_worker_message(sealer.as_mut(), message)
        })
}

/// A failed `Join` call: the coordinator's own refusal is final, a transport failure is not.
fn refusal_or_retry(status: &tonic::Status) -> JoinFailure {
    if transient(status) {
        JoinFailure::Retry(format!(
            "the join failed on the way ({:?}: {})",
            status.code(),
            status.message()
        ))
    } else {
        JoinFailure::Final(LinkError::Refused(status.message().to_owned()))
    }
}

/// Every message of the coordinator, opened and stamped as it is read, becomes what the link
/// acts on. The reader stops after the stream's end or a message that fails its check.
async fn read_inbound(
    mut inbound: tonic::Streaming<v1::CoordinatorMessage>,
    mut opener: Option<Opener>,
    tx: mpsc::Sender<Inbound>,
) {
    loop {
        let item = match inbound.message().await {
            Ok(Some(message)) => {
                let received = unix_ns();
                match proto::auth::open_coordinator_message(opener.as_mut(), message) {
                    Ok(message) => inbound_of(message, received),
                    Err(error) => Inbound::Event(CoordinatorEvent::Untrusted {
                        reason: format!(
                            "a message from the coordinator failed its authentication check ({error}): the link was altered on the way (a relay?)"
                        ),
                    }),
                }
            }
            Ok(None) => Inbound::Event(CoordinatorEvent::StreamEnded),
            Err(status) => Inbound::Event(CoordinatorEvent::StreamBroke {
                reason: status.message().to_owned(),
            }),
        };
        let last = matches!(
            item,
            Inbound::Event(
                CoordinatorEvent::StreamEnded
                    | CoordinatorEvent::StreamBroke { .. }
                    | CoordinatorEvent::Untrusted { .. }
            )
        );
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}

fn inbound_of(message: v1::CoordinatorMessage, received_unix_ns: u64) -> Inbound {
    use v1::coordinator_message::Msg;
    match message.msg {
        Some(Msg::Assignment(assignment)) => Inbound::Assignment(Box::new(assignment)),
        Some(Msg::Done(_)) => Inbound::Done,
        msg => Inbound::Event(event_from_proto(
            v1::CoordinatorMessage { msg },
            received_unix_ns,
        )),
    }
}
