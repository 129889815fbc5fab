//! The coordinator's gRPC service: workers dial in, join, receive their assignment and slice,
//! and stream reports. Every event is forwarded to the run orchestrator over one bounded
//! channel; the service itself decides only who may join. A worker's request records travel
//! with the report that follows them, so the supervisor writes them only when it counts that
//! report; once the supervisor fences a worker (lost), nothing it sends is forwarded and its
//! stream is told to stop and closed.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::assignment::Assignment;
use common::metrics::RequestRecord;
use common::worker_report::ReceivedReport;
use proto::auth::{CoordinatorHandshake, Opener, Sealer, SessionKeys};
use proto::convert::{assignment_to_proto, report_from_proto};
use proto::v1;
use proto::v1::coordinator_server::Coordinator;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

use crate::link_guard::{Admission, PeerGate, check_hello_fields, loggable};
use crate::shard::{SliceChunk, SliceSender};
use tonic::{Request, Response, Status, Streaming};

/// What the run supervisor hears from the service: domain events, decoded once here (no
/// protocol type goes further than this module).
#[derive(Debug)]
pub enum WorkerEvent {
    Joined {
        index: usize,
        id: String,
        host: String,
        control: WorkerControl,
        slice: SliceSender,
    },
    Report {
        index: usize,
        /// Boxed: a report is far larger than every other event.
        report: Box<ReceivedReport>,
        /// The request records (`--requests-out`) the worker sent since its previous report:
        /// the requests this one counts anew. Written only if the report is accepted.
        records: Vec<RequestRecord>,
    },
    /// A report that does not decode (corrupt histograms): the worker cannot be trusted.
    InvalidReport {
        index: usize,
        reason: String,
    },
    Heartbeat {
        index: usize,
    },
    ClockPong {
        index: usize,
        sample: ClockSample,
    },
    Started {
        index: usize,
        /// Worker clock.
        unix_ns: u64,
    },
    Failed {
        index: usize,
        reason: String,
    },
    /// It asks to start the first `own_prefix` exchanges of its own slice (protocol 5): the
    /// supervisor records the claim, then grants it.
    Claim {
        index: usize,
        own_prefix: u64,
    },
    Gone {
        index: usize,
        reason: String,
    },
}

/// One NTP-style clock sample: ping sent (t1, coordinator clock), received and answered by
/// the worker (t2, t3, worker clock), answer received (t4, coordinator clock). Unix ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    pub seq: u64,
    pub t1: u64,
    pub t2: u64,
    pub t3: u64,
    pub t4: u64,
}

/// What the supervisor tells one worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    ClockPing {
        seq: u64,
        sent_unix_ns: u64,
    },
    /// Start at this instant, in the worker's own clock (Unix ns).
    Start {
        unix_ns: u64,
    },
    Heartbeat {
        unix_ns: u64,
    },
    Abort {
        reason: String,
    },
    Finish,
    /// The worker may start the first `own_prefix` exchanges of its own slice.
    Grant {
        own_prefix: u64,
    },
}

/// The supervisor's handle on one worker's control stream (a bounded channel that this
/// module turns into protocol messages), and its fence.
#[derive(Debug, Clone)]
pub struct WorkerControl {
    tx: mpsc::Sender<Control>,
    /// Set once the worker is lost: nothing it sends is forwarded any more.
    fenced: Arc<AtomicBool>,
}

impl WorkerControl {
    /// A handle and the receiving end of its messages, `capacity` deep.
    pub fn channel(capacity: usize) -> (WorkerControl, mpsc::Receiver<Control>) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            WorkerControl {
                tx,
                fenced: Arc::new(AtomicBool::new(false)),
            },
            rx,
        )
    }

    /// Fence a worker the supervisor declared lost: from now on nothing it sends is
    /// forwarded (reports, request records), and it is sent `Abort { reason }` — the last
    /// message of its stream, which then closes — so that it stops if its link comes back.
    pub fn fence(&self, reason: String) {
        if !self.fenced.swap(true, Ordering::SeqCst) {
            self.send(Control::Abort { reason });
        }
    }

    /// Send without waiting. Heartbeats and pings are dropped when the worker's stream is
    /// this far behind (it will be found silent); a start, abort or finish waits for room
    /// in a task of its own, so the supervisor never blocks on one slow worker.
    pub fn send(&self, message: Control) {
        match self.tx.try_send(message) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(message)) => {
                if matches!(
                    message,
                    Control::Heartbeat { .. } | Control::ClockPing { .. }
                ) {
                    return;
                }
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(10), tx.send(message)).await;
                });
            }
        }
    }
}

fn control_to_proto(control: Control) -> v1::coordinator_message::Msg {
    use v1::coordinator_message::Msg;
    match control {
        Control::ClockPing { seq, sent_unix_ns } => Msg::ClockPing(v1::ClockPing {
            seq,
            coordinator_send_unix_ns: sent_unix_ns,
        }),
        Control::Start { unix_ns } => Msg::Start(v1::Start {
            start_unix_ns: unix_ns,
        }),
        Control::Heartbeat { unix_ns } => Msg::Heartbeat(v1::Heartbeat { unix_ns }),
        Control::Abort { reason } => Msg::Abort(v1::Abort { reason }),
        Control::Finish => Msg::Finish(v1::Finish {}),
        Control::Grant { own_prefix } => Msg::Grant(v1::Grant { own_prefix }),
    }
}

fn chunk_to_proto(chunk: SliceChunk) -> Result<v1::ExchangeChunk, Status> {
    Ok(v1::ExchangeChunk {
        sealed: None,
        exchanges: chunk
            .exchanges
            .into_iter()
            .map(|e| v1::Exchange {
                index: e.index,
                json: e.json,
                pin_output_tokens: e.pin_output_tokens,
                pin_in_frames: e.pin_in_frames,
                think_ms: e.think_ms,
                cancel_after_ms: e.cancel_after_ms,
                reassigned: e.reassigned,
            })
            .collect(),
        last: chunk.last,
    })
}

type SliceReceiver = mpsc::Receiver<SliceChunk>;

/// A joined worker's slice, waiting for the worker to open its `Exchanges` stream.
struct PendingSlice {
    /// The random key its assignment carries (a run without a token).
    key: String,
    /// The session's keys (a run with a token): the worker proves the session, and every
    /// chunk is sealed.
    session: Option<Arc<SessionKeys>>,
    run_id: String,
    chunks: SliceReceiver,
    /// Exchanges handed to the worker so far (what its request records are bounded by).
    handed: Arc<AtomicU64>,
}

/// Who holds which of a level's join slots. Until every slot is taken at once, a worker that
/// leaves frees its slot (a restarted worker may take it again, under the same id); from
/// then on the level is running and nobody can join it.
#[derive(Default)]
struct JoinSlots {
    slots: Vec<Option<String>>,
    running: bool,
}

/// Builds each worker's (domain) assignment from its join index; the service sets its slice
/// key and converts it to the protocol's form.
pub type AssignmentFor = dyn Fn(usize) -> Assignment + Send + Sync;

/// One level of the run (the run itself, a sweep level or a capacity probe) as the service
/// sees it: how many workers it takes, what each is assigned, where their events go.
pub struct LevelLink {
    pub expected_workers: usize,
    pub assignment_for: Box<AssignmentFor>,
    pub events: mpsc::Sender<WorkerEvent>,
    /// `--requests-out`: request records are kept and handed to the supervisor with the
    /// report that counts them (it writes them there once it accepts that report).
    pub requests_out: Option<Arc<crate::requests_out::RequestsOut>>,
    joined: Mutex<JoinSlots>,
    /// Tells one level's routes from the next one's.
    generation: u64,
    /// The tasks that carry the supervisor's messages to each worker: the level ends once
    /// they have written everything (a Finish is never overtaken by the next assignment).
    forwarders: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl LevelLink {
    pub fn new(
        expected_workers: usize,
        assignment_for: Box<AssignmentFor>,
        events: mpsc::Sender<WorkerEvent>,
        requests_out: Option<Arc<crate::requests_out::RequestsOut>>,
    ) -> LevelLink {
        static GENERATIONS: AtomicU64 = AtomicU64::new(1);
        LevelLink {
            expected_workers,
            assignment_for,
            events,
            requests_out,
            joined: Mutex::new(JoinSlots {
                slots: vec![None; expected_workers],
                running: false,
            }),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            forwarders: Mutex::new(Vec::new()),
        }
    }

    /// A free slot for `worker`, or why there is none.
    fn take_slot(&self, worker: &str) -> Result<usize, String> {
        let mut joined = self.joined.lock().expect("join lock is never poisoned");
        let expected = self.expected_workers;
        if joined.running {
            Err(format!(
                "this run already has its {expected} workers and is running; a worker cannot join a running run"
            ))
        } else if joined.slots.iter().flatten().any(|id| id == worker) {
            Err(format!("worker id {worker:?} already joined"))
        } else if let Some(free) = joined.slots.iter().position(Option::is_none) {
            joined.slots[free] = Some(worker.to_owned());
            joined.running = joined.slots.iter().all(Option::is_some);
            Ok(free)
        } else {
            Err(format!("this run already has its {expected} workers"))
        }
    }

    fn running(&self) -> bool {
        self.joined
            .lock()
            .expect("join lock is never poisoned")
            .running
    }

    /// Before the level runs, a worker that leaves frees its slot.
    fn free_slot(&self, index: usize) -> bool {
        let mut joined = self.joined.lock().expect("join lock is never poisoned");
        if !joined.running && joined.slots.get(index).is_some_and(Option::is_some) {
            joined.slots[index] = None;
            return true;
        }
        false
    }
}

/// How long the end of a level waits for its last messages to each worker to be written.
const LEVEL_END_PATIENCE: Duration = Duration::from_secs(2);

/// The protocol messages going to one worker (its `Join` response stream).
type ToWorker = mpsc::Sender<Result<v1::CoordinatorMessage, Status>>;

/// A worker that joined the run: it stays joined through every level until the run is over,
/// it leaves, or it is lost.
struct Member {
    id: String,
    host: String,
    session: Option<Arc<SessionKeys>>,
    /// Its stream's sender; `None` once it left (the stream then ends).
    to_worker: Mutex<Option<ToWorker>>,
    /// The level it takes part in now, if any.
    route: Mutex<Option<Route>>,
}

impl Member {
    fn sender(&self) -> Option<ToWorker> {
        self.to_worker
            .lock()
            .expect("member lock is never poisoned")
            .clone()
    }

    fn route(&self) -> Option<Route> {
        self.route
            .lock()
            .expect("member lock is never poisoned")
            .clone()
    }
}

/// Where a member's messages go during one level.
#[derive(Clone)]
struct Route {
    level: Arc<LevelLink>,
    index: usize,
    fenced: Arc<AtomicBool>,
    /// Exchanges handed to the worker in this level (what its request records are bounded by).
    handed: Arc<AtomicU64>,
    open_ended: bool,
}

/// Shared state of the service, for the whole run.
pub struct ServiceState {
    /// How many workers the run takes.
    pub capacity: usize,
    pub token: Option<String>,
    members: Mutex<Vec<Arc<Member>>>,
    /// The level being joined or run; `None` between levels.
    level: Mutex<Option<Arc<LevelLink>>>,
    /// Each enlisted worker's slice stream, behind the key its assignment carries or its
    /// session's proof for the level.
    slices: Mutex<HashMap<String, PendingSlice>>,
    /// Failed token handshakes spaced per peer (`link_guard`).
    handshakes: PeerGate,
}

impl ServiceState {
    pub fn new(capacity: usize, token: Option<String>) -> Self {
        ServiceState {
            capacity,
            token,
            members: Mutex::new(Vec::new()),
            level: Mutex::new(None),
            slices: Mutex::new(HashMap::new()),
            handshakes: PeerGate::default(),
        }
    }

    fn members(&self) -> Vec<Arc<Member>> {
        self.members
            .lock()
            .expect("member lock is never poisoned")
            .clone()
    }

    fn current_level(&self) -> Option<Arc<LevelLink>> {
        self.level
            .lock()
            .expect("level lock is never poisoned")
            .clone()
    }

    /// A level begins: every joined worker is enlisted in it (in join order), and workers
    /// that join from now on are too, until it runs.
    pub async fn begin_level(self: &Arc<Self>, level: Arc<LevelLink>) {
        *self.level.lock().expect("level lock is never poisoned") = Some(Arc::clone(&level));
        for member in self.members() {
            if let Err(reason) = self.enlist(&member, &level).await {
                tracing::debug!(worker = member.id, reason, "not enlisted in this level");
            }
        }
    }

    /// The level is over (its supervisor, and so every sender of its controls, is gone):
    /// what the supervisor said to each worker is written, then its routes and slices go;
    /// the members stay joined.
    pub async fn end_level(&self) {
        let level = self
            .level
            .lock()
            .expect("level lock is never poisoned")
            .take();
        if let Some(level) = level {
            let forwarders: Vec<_> = std::mem::take(
                &mut *level
                    .forwarders
                    .lock()
                    .expect("level lock is never poisoned"),
            );
            for mut forwarder in forwarders {
                if tokio::time::timeout(LEVEL_END_PATIENCE, &mut forwarder)
                    .await
                    .is_err()
                {
                    forwarder.abort();
                }
            }
        }
        for member in self.members() {
            *member.route.lock().expect("member lock is never poisoned") = None;
        }
        self.slices
            .lock()
            .expect("slice lock is never poisoned")
            .clear();
    }

    /// Between levels, every joined worker hears that the coordinator is alive.
    pub fn heartbeat_idle(&self) {
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        for member in self.members() {
            if member.route().is_none()
                && let Some(tx) = member.sender()
            {
                let _ = tx.try_send(message_of(control_to_proto(Control::Heartbeat { unix_ns })));
            }
        }
    }

    /// The run is over: every worker is told (`Done`, sealed like every message) and its
    /// stream ends once that is written.
    pub async fn close(&self) {
        let members: Vec<Arc<Member>> =
            std::mem::take(&mut *self.members.lock().expect("member lock is never poisoned"));
        for member in members {
            let sender = member
                .to_worker
                .lock()
                .expect("member lock is never poisoned")
                .take();
            if let Some(tx) = sender {
                let done = message_of(v1::coordinator_message::Msg::Done(v1::Done {
                    reason: "the run is over".into(),
                }));
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(done)).await;
            }
        }
    }

    /// A worker leaves the run (its stream ended, it was lost, or it failed between levels):
    /// its stream's sender goes, so the stream ends.
    fn leave(&self, id: &str) {
        let mut members = self.members.lock().expect("member lock is never poisoned");
        if let Some(at) = members.iter().position(|m| m.id == id) {
            let member = members.remove(at);
            member
                .to_worker
                .lock()
                .expect("member lock is never poisoned")
                .take();
        }
    }

    /// Admit a worker whose handshake succeeded, or say why not.
    fn admit(&self, member: Arc<Member>) -> Result<(), String> {
        let mut members = self.members.lock().expect("member lock is never poisoned");
        let capacity = self.capacity;
        if members.iter().any(|m| m.id == member.id) {
            return Err(format!("worker id {:?} already joined", member.id));
        }
        if members.len() >= capacity {
            let running = self.current_level().is_some_and(|level| level.running());
            return Err(if running {
                format!(
                    "this run already has its {capacity} workers and is running; a worker cannot join a running run"
                )
            } else {
                format!("this run already has its {capacity} workers")
            });
        }
        members.push(member);
        Ok(())
    }

    /// Give `member` a slot of `level`: its assignment goes out on its stream, its slice
    /// waits for its `Exchanges` call, its messages go to the level's supervisor, and the
    /// supervisor hears that it joined.
    async fn enlist(
        self: &Arc<Self>,
        member: &Arc<Member>,
        level: &Arc<LevelLink>,
    ) -> Result<(), String> {
        let Some(to_worker) = member.sender() else {
            return Err("it left".into());
        };
        let index = level.take_slot(&member.id)?;
        let (slice_tx, slice_rx) = mpsc::channel(8);
        let mut assignment = (level.assignment_for)(index);
        // With a session the worker proves it instead: a key in the assignment would be
        // readable by anyone on a plaintext link.
        let slice_key = if member.session.is_some() {
            String::new()
        } else {
            uuid::Uuid::new_v4().to_string()
        };
        let handed = Arc::new(AtomicU64::new(0));
        self.slices
            .lock()
            .expect("slice lock is never poisoned")
            .insert(
                member.id.clone(),
                PendingSlice {
                    key: slice_key.clone(),
                    session: member.session.clone(),
                    run_id: assignment.run_id.clone(),
                    chunks: slice_rx,
                    handed: Arc::clone(&handed),
                },
            );
        assignment.slice_key = slice_key;
        let _ = to_worker
            .send(message_of(v1::coordinator_message::Msg::Assignment(
                assignment_to_proto(&assignment),
            )))
            .await;
        // The supervisor speaks domain messages; they become protocol messages here. Once
        // the worker is fenced, only its abort goes out, and then it leaves the run.
        let (control, control_rx) = WorkerControl::channel(64);
        let forwarder = tokio::spawn(forward_controls(
            Arc::clone(self),
            member.id.clone(),
            control_rx,
            Arc::clone(&control.fenced),
            to_worker,
        ));
        level
            .forwarders
            .lock()
            .expect("level lock is never poisoned")
            .push(forwarder);
        *member.route.lock().expect("member lock is never poisoned") = Some(Route {
            level: Arc::clone(level),
            index,
            fenced: Arc::clone(&control.fenced),
            handed,
            open_ended: assignment.open_ended,
        });
        let _ = level
            .events
            .send(WorkerEvent::Joined {
                index,
                id: member.id.clone(),
                host: member.host.clone(),
                control,
                slice: slice_tx,
            })
            .await;
        Ok(())
    }
}

/// The supervisor's messages to one worker during one level, as protocol messages. A fenced
/// worker gets its abort, then leaves the run (its stream ends).
async fn forward_controls(
    state: Arc<ServiceState>,
    id: String,
    mut control_rx: mpsc::Receiver<Control>,
    fenced: Arc<AtomicBool>,
    to_worker: ToWorker,
) {
    while let Some(message) = control_rx.recv().await {
        let fencing = fenced.load(Ordering::SeqCst);
        let abort = matches!(message, Control::Abort { .. });
        if fencing && !abort {
            continue;
        }
        let sent = to_worker.send(message_of(control_to_proto(message))).await;
        if sent.is_err() || (fencing && abort) {
            drop(to_worker);
            state.leave(&id);
            return;
        }
    }
}

/// The tonic service.
#[derive(Clone)]
pub struct CoordinatorService {
    pub state: Arc<ServiceState>,
}

fn message_of(msg: v1::coordinator_message::Msg) -> Result<v1::CoordinatorMessage, Status> {
    Ok(v1::CoordinatorMessage { msg: Some(msg) })
}

/// A join stream that says why the worker is refused, and ends.
fn refused_stream(reason: String) -> Response<JoinStream> {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(message_of(v1::coordinator_message::Msg::Refused(
        v1::Refused { reason },
    )));
    Response::new(Box::pin(ReceiverStream::new(rx)))
}

type JoinStream = Pin<Box<dyn Stream<Item = Result<v1::CoordinatorMessage, Status>> + Send>>;
type SliceStream = Pin<Box<dyn Stream<Item = Result<v1::ExchangeChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    type JoinStream = JoinStream;
    type ExchangesStream = SliceStream;

    async fn join(
        &self,
        request: Request<Streaming<v1::WorkerMessage>>,
    ) -> Result<Response<Self::JoinStream>, Status> {
        let peer = request.remote_addr().map(|addr| addr.ip());
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
            Ok(Ok(Some(v1::WorkerMessage {
                msg: Some(v1::worker_message::Msg::Hello(hello)),
            }))) => hello,
            // Refused on the way (`link_guard::PreAuthLimitLayer`: a message too large to be
            // read before the handshake): the peer hears why.
            Ok(Err(status)) => return Err(status),
            _ => {
                return Err(Status::invalid_argument(
                    "expected Hello as the first message",
                ));
            }
        };
        if let Err(reason) = check_hello_fields(&hello.worker_id, &hello.host) {
            // A malformed Hello is a failed handshake: it spaces that peer, and the gate logs
            // it thinned; what the peer sent is never logged whole.
            if self.state.token.is_some() {
                self.state
                    .handshakes
                    .failed(peer, &hello.worker_id, &reason);
            }
            tracing::debug!(peer = ?peer, reason, "refused a worker");
            return Ok(refused_stream(reason));
        }
        if hello.protocol_version != proto::PROTOCOL_VERSION {
            let reason = format!(
                "protocol version {} is not supported (this coordinator speaks {})",
                hello.protocol_version,
                proto::PROTOCOL_VERSION
            );
            tracing::warn!(worker = %loggable(&hello.worker_id), reason, "refused a worker");
            return Ok(refused_stream(reason));
        }
        // The response stream goes back at once: the challenge is a round trip on it. Once
        // the handshake has set the session's keys, every message but the challenge is
        // sealed here, as it goes to the wire, so sequence numbers follow the wire's order.
        let (control_tx, control_rx) = mpsc::channel(64);
        let keys: Arc<OnceLock<Arc<SessionKeys>>> = Arc::new(OnceLock::new());
        let mut sealer: Option<Sealer> = None;
        let outbound = {
            let keys = Arc::clone(&keys);
            ReceiverStream::new(control_rx).map(move |message| {
                let message: v1::CoordinatorMessage = message?;
                if sealer.is_none()
                    && let Some(keys) = keys.get()
                {
                    sealer = Some(keys.coordinator_sealer());
                }
                Ok(proto::auth::seal_coordinator_message(
                    sealer.as_mut(),
                    message,
                ))
            })
        };
        tokio::spawn(serve_worker(
            self.state.clone(),
            peer,
            hello,
            inbound,
            control_tx,
            keys,
        ));
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn exchanges(
        &self,
        request: Request<v1::SliceRequest>,
    ) -> Result<Response<Self::ExchangesStream>, Status> {
        let request = request.into_inner();
        let mut slices = self
            .state
            .slices
            .lock()
            .expect("slice lock is never poisoned");
        let Some(pending) = slices.get(&request.worker_id) else {
            return Err(Status::not_found("no slice for this worker (join first)"));
        };
        if pending.run_id != request.run_id {
            return Err(Status::not_found(
                "no slice of this level for this worker (a proof of another level?)",
            ));
        }
        // With a token, only this worker's session can make the proof; without one, the
        // key came in this worker's assignment.
        let allowed = match &pending.session {
            Some(session) => {
                session.verify_slice_request(&pending.run_id, &request.worker_id, &request.token)
            }
            None => proto::auth::verify(pending.key.as_bytes(), request.token.as_bytes()),
        };
        if !allowed {
            return Err(Status::unauthenticated("wrong slice key"));
        }
        let pending = slices
            .remove(&request.worker_id)
            .expect("looked up just above");
        let mut sealer = pending
            .session
            .as_deref()
            .map(|session| session.slice_sealer(&pending.run_id));
        let handed = pending.handed;
        Ok(Response::new(Box::pin(
            ReceiverStream::new(pending.chunks).map(move |chunk| {
                handed.fetch_add(chunk.exchanges.len() as u64, Ordering::Relaxed);
                let chunk = chunk_to_proto(chunk)?;
                Ok(proto::auth::seal_chunk(sealer.as_mut(), chunk))
            }),
        )))
    }
}

/// One worker's join stream: the handshake, its admission to the run, its enlistment in the
/// level being joined (if any), then every message it sends, opened (with a token) and
/// forwarded as events of the level it takes part in.
async fn serve_worker(
    state: Arc<ServiceState>,
    peer: Option<std::net::IpAddr>,
    hello: v1::Hello,
    mut inbound: Streaming<v1::WorkerMessage>,
    control_tx: ToWorker,
    keys_slot: Arc<OnceLock<Arc<SessionKeys>>>,
) {
    let refuse = |control_tx: ToWorker, reason: String| {
        let worker = loggable(&hello.worker_id);
        async move {
            tracing::warn!(worker, reason, "refused a worker");
            let _ = control_tx
                .send(message_of(v1::coordinator_message::Msg::Refused(
                    v1::Refused { reason },
                )))
                .await;
        }
    };
    let session = match &state.token {
        Some(token) => {
            match state.handshakes.admit(peer) {
                Admission::Proceed(wait) => {
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                }
                Admission::Refuse(reason) => {
                    // Logged (thinned) by the gate.
                    let _ = control_tx
                        .send(message_of(v1::coordinator_message::Msg::Refused(
                            v1::Refused { reason },
                        )))
                        .await;
                    return;
                }
            }
            match handshake(token, &hello, &mut inbound, &control_tx).await {
                Ok(keys) => {
                    state.handshakes.succeeded(peer);
                    let keys = Arc::new(keys);
                    // From here on the response stream seals what it sends.
                    let _ = keys_slot.set(Arc::clone(&keys));
                    Some(keys)
                }
                Err(reason) => {
                    state.handshakes.failed(peer, &hello.worker_id, &reason);
                    // Logged (thinned) by the gate.
                    let _ = control_tx
                        .send(message_of(v1::coordinator_message::Msg::Refused(
                            v1::Refused { reason },
                        )))
                        .await;
                    return;
                }
            }
        }
        None => None,
    };
    let opener: Option<Opener> = session.as_deref().map(SessionKeys::worker_opener);
    let member = Arc::new(Member {
        id: hello.worker_id.clone(),
        host: hello.host.clone(),
        session,
        to_worker: Mutex::new(Some(control_tx)),
        route: Mutex::new(None),
    });
    if let Err(reason) = state.admit(Arc::clone(&member)) {
        if let Some(control_tx) = member.sender() {
            refuse(control_tx, reason).await;
        }
        return;
    }
    // A level being joined takes it now; otherwise it waits, joined, for the next level.
    if let Some(level) = state.current_level()
        && !level.running()
        && let Err(reason) = state.enlist(&member, &level).await
    {
        tracing::debug!(
            worker = member.id,
            reason,
            "joined; waits for the next level"
        );
    }
    read_worker(&state, &member, inbound, opener).await;
    state.leave(&member.id);
}

/// Every message of a joined worker, for the rest of the run: opened, checked, and forwarded
/// to the supervisor of the level it takes part in; between levels only its liveness counts.
/// Returns when its stream ends, or once it is fenced and its stream has ended.
async fn read_worker(
    state: &ServiceState,
    member: &Member,
    mut inbound: Streaming<v1::WorkerMessage>,
    mut opener: Option<Opener>,
) {
    // Request records: bounded per level; held until the report that counts them (none are
    // kept without --requests-out).
    let mut records: Option<(u64, RecordBound)> = None;
    let mut pending_records: Vec<RequestRecord> = Vec::new();
    loop {
        let message = inbound.message().await;
        let route = member.route();
        if route
            .as_ref()
            .is_some_and(|route| route.fenced.load(Ordering::SeqCst))
        {
            // Lost: nothing it says is counted; read on until its stream ends, so what it
            // sends does not pile up in the connection.
            match message {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
        let received = match message {
            Ok(Some(message)) => proto::auth::open_worker_message(opener.as_mut(), message)
                .map_err(|error| {
                    format!("its link failed authentication ({error}); nothing it sends from now on is counted")
                }),
            Ok(None) => Err("its stream ended".to_owned()),
            Err(status) => Err(format!("its stream broke: {}", status.message())),
        };
        let Some(route) = route else {
            // Between levels: a worker that fails or goes away leaves the run.
            match received {
                Ok(v1::WorkerMessage {
                    msg: Some(v1::worker_message::Msg::Failed(failed)),
                }) => {
                    tracing::warn!(
                        worker = member.id,
                        reason = failed.reason,
                        "a worker stopped between levels"
                    );
                }
                Ok(_) => continue,
                Err(reason) => {
                    tracing::info!(worker = member.id, reason, "a worker left between levels");
                    return;
                }
            }
            continue;
        };
        let generation = route.level.generation;
        if records.as_ref().is_none_or(|(g, _)| *g != generation) {
            records = Some((
                generation,
                RecordBound::new(Arc::clone(&route.handed), route.open_ended),
            ));
            pending_records.clear();
        }
        let (_, bound) = records.as_mut().expect("set just above");
        let event = match received {
            Ok(v1::WorkerMessage { msg: Some(msg) }) => {
                match event_of(msg, &route, bound, &mut pending_records) {
                    Some(event) => event,
                    None => continue,
                }
            }
            Ok(_) => continue,
            // An altered message is a peer that cannot be trusted: like a failure, it ends the
            // run's trust in this worker (named, with the reason), not a mere departure.
            Err(reason) if reason.contains("authentication") => WorkerEvent::Failed {
                index: route.index,
                reason,
            },
            Err(reason) => WorkerEvent::Gone {
                index: route.index,
                reason,
            },
        };
        let gone = matches!(event, WorkerEvent::Gone { .. });
        if gone && route.level.free_slot(route.index) {
            // Before the level runs, a worker that leaves frees its slot.
            state
                .slices
                .lock()
                .expect("slice lock is never poisoned")
                .remove(&member.id);
        }
        // A level that is over no longer listens: nothing to do then.
        let _ = route.level.events.send(event).await;
        if gone {
            return;
        }
    }
}

/// A worker's message during a level as the supervisor's event; `None` for what needs no
/// event (records held for their report, the handshake's messages).
fn event_of(
    msg: v1::worker_message::Msg,
    route: &Route,
    records: &mut RecordBound,
    pending_records: &mut Vec<RequestRecord>,
) -> Option<WorkerEvent> {
    let index = route.index;
    Some(match msg {
        // Decoded once, here, as it arrives.
        v1::worker_message::Msg::Report(report) => match report_from_proto(&report) {
            Ok(report) => match records.check_report(report.totals.issued) {
                Ok(()) => WorkerEvent::Report {
                    index,
                    report: Box::new(report),
                    records: std::mem::take(pending_records),
                },
                Err(reason) => WorkerEvent::InvalidReport { index, reason },
            },
            Err(error) => WorkerEvent::InvalidReport {
                index,
                reason: error.to_string(),
            },
        },
        v1::worker_message::Msg::Heartbeat(_) => WorkerEvent::Heartbeat { index },
        v1::worker_message::Msg::ClockPong(pong) => WorkerEvent::ClockPong {
            index,
            sample: ClockSample {
                seq: pong.seq,
                t1: pong.coordinator_send_unix_ns,
                t2: pong.worker_receive_unix_ns,
                t3: pong.worker_send_unix_ns,
                t4: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0),
            },
        },
        v1::worker_message::Msg::Started(started) => WorkerEvent::Started {
            index,
            unix_ns: started.unix_ns,
        },
        v1::worker_message::Msg::Failed(failed) => WorkerEvent::Failed {
            index,
            reason: failed.reason,
        },
        v1::worker_message::Msg::Claim(claim) => WorkerEvent::Claim {
            index,
            own_prefix: claim.own_prefix,
        },
        v1::worker_message::Msg::Records(batch) => {
            // A peer may not write more lines than it could have measured requests: checked
            // before anything is written.
            match records.take(batch.records.len()) {
                Ok(()) => {
                    // Held for the report that follows them on this stream: written only if
                    // the supervisor counts it.
                    if route.level.requests_out.is_some() {
                        pending_records.extend(
                            batch
                                .records
                                .iter()
                                .filter_map(proto::convert::record_from_proto),
                        );
                    }
                    return None;
                }
                Err(reason) => WorkerEvent::InvalidReport { index, reason },
            }
        }
        v1::worker_message::Msg::Hello(_)
        | v1::worker_message::Msg::Answer(_)
        | v1::worker_message::Msg::Sealed(_) => return None,
    })
}

/// How many request records (`--requests-out` lines) a worker may send: one per request it
/// measured, so never more than the exchanges handed to it (a slice that ends) and never
/// more than it reports issued once a report counts them (records go out before the report
/// that counts them). An open-ended slice loops, so before a report counts them its records
/// may run ahead of its last report by at most `OPEN_ENDED_RECORDS_AHEAD` or one pass over
/// what it was handed, whichever is more.
struct RecordBound {
    handed: Arc<AtomicU64>,
    open_ended: bool,
    received: u64,
    last_issued: u64,
}

const OPEN_ENDED_RECORDS_AHEAD: u64 = 65_536;

impl RecordBound {
    fn new(handed: Arc<AtomicU64>, open_ended: bool) -> RecordBound {
        RecordBound {
            handed,
            open_ended,
            received: 0,
            last_issued: 0,
        }
    }

    fn limit(&self) -> u64 {
        let handed = self.handed.load(Ordering::Relaxed);
        if self.open_ended {
            self.last_issued
                .saturating_add(handed.max(OPEN_ENDED_RECORDS_AHEAD))
        } else {
            handed
        }
    }

    /// A batch of `count` records arrived.
    fn take(&mut self, count: usize) -> Result<(), String> {
        let received = self.received.saturating_add(count as u64);
        let limit = self.limit();
        if received > limit {
            return Err(format!(
                "it sent {received} request records, more than the {limit} requests it could have measured (handed {} exchanges); none past its last valid batch is written",
                self.handed.load(Ordering::Relaxed)
            ));
        }
        self.received = received;
        Ok(())
    }

    /// A report arrived that says `issued` requests went out.
    fn check_report(&mut self, issued: u64) -> Result<(), String> {
        if self.received > issued {
            return Err(format!(
                "it sent {} request records but reports {issued} requests issued",
                self.received
            ));
        }
        self.last_issued = self.last_issued.max(issued);
        Ok(())
    }
}

/// The token handshake (proto::auth): the coordinator's SPAKE2 message and confirmation,
/// then the worker's confirmation. On success, the session's keys.
async fn handshake(
    token: &str,
    hello: &v1::Hello,
    inbound: &mut Streaming<v1::WorkerMessage>,
    control_tx: &mpsc::Sender<Result<v1::CoordinatorMessage, Status>>,
) -> Result<SessionKeys, String> {
    const MISSING: &str = "wrong or missing token (--token / LLM_REPLAY_TOKEN)";
    if hello.pake.is_empty() {
        return Err(format!(
            "{MISSING}: this worker sent no key exchange, so it has no token"
        ));
    }
    let (pending, challenge) = CoordinatorHandshake::respond(token, hello)
        .map_err(|error| format!("{MISSING}: {error}"))?;
    control_tx
        .send(message_of(v1::coordinator_message::Msg::Challenge(
            challenge,
        )))
        .await
        .map_err(|_| "the worker left during the token handshake".to_owned())?;
    let answer = match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
        Ok(Ok(Some(v1::WorkerMessage {
            msg: Some(v1::worker_message::Msg::Answer(answer)),
        }))) => answer,
        Ok(Ok(Some(v1::WorkerMessage {
            msg: Some(v1::worker_message::Msg::Failed(failed)),
        }))) => {
            return Err(format!(
                "the worker did not accept this coordinator's key confirmation: {}",
                failed.reason
            ));
        }
        _ => return Err("no answer to the token handshake".to_owned()),
    };
    pending
        .finish(&answer)
        .map_err(|_| format!("{MISSING}: the worker's key confirmation does not match"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_records_are_bounded_by_what_the_worker_was_handed_and_reports() {
        let handed = Arc::new(AtomicU64::new(20));
        let mut bound = RecordBound::new(Arc::clone(&handed), false);
        assert!(bound.take(20).is_ok());
        assert!(bound.take(1).is_err());
        let mut bound = RecordBound::new(Arc::clone(&handed), false);
        assert!(bound.take(10).is_ok());
        assert!(bound.check_report(9).is_err());
        let mut bound = RecordBound::new(Arc::clone(&handed), false);
        assert!(bound.take(10).is_ok());
        assert!(bound.check_report(10).is_ok());
        // An open-ended slice loops: bounded by its last report plus one pass.
        let mut looping = RecordBound::new(handed, true);
        assert!(looping.take(OPEN_ENDED_RECORDS_AHEAD as usize).is_ok());
        assert!(looping.take(1).is_err());
    }
}
