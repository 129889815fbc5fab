//! The coordinator's gRPC service: workers dial in, join, receive their assignment and slice,
//! and stream reports. Every event is forwarded to the run orchestrator over one bounded
//! channel; the service itself decides only who may join.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::assignment::Assignment;
use proto::convert::{ReceivedReport, assignment_to_proto, report_from_proto};
use proto::v1;
use proto::v1::coordinator_server::Coordinator;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

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
}

/// The supervisor's handle on one worker's control stream (a bounded channel that this
/// module turns into protocol messages).
#[derive(Debug, Clone)]
pub struct WorkerControl {
    tx: mpsc::Sender<Control>,
}

impl WorkerControl {
    /// A handle and the receiving end of its messages, `capacity` deep.
    pub fn channel(capacity: usize) -> (WorkerControl, mpsc::Receiver<Control>) {
        let (tx, rx) = mpsc::channel(capacity);
        (WorkerControl { tx }, rx)
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
    }
}

fn chunk_to_proto(chunk: SliceChunk) -> Result<v1::ExchangeChunk, Status> {
    Ok(v1::ExchangeChunk {
        exchanges: chunk
            .exchanges
            .into_iter()
            .map(|e| v1::Exchange {
                index: e.index,
                json: e.json,
                pin_output_tokens: e.pin_output_tokens,
                think_ms: e.think_ms,
            })
            .collect(),
        last: chunk.last,
    })
}

type SliceReceiver = mpsc::Receiver<SliceChunk>;

/// Who holds which join slot. Until every slot is taken at once, a worker that leaves frees
/// its slot (a restarted worker may take it again, under the same id); from then on the run
/// is running and nobody can join.
#[derive(Default)]
struct JoinSlots {
    slots: Vec<Option<String>>,
    running: bool,
}

/// Builds each worker's (domain) assignment from its join index; the service sets its slice
/// key and converts it to the protocol's form.
pub type AssignmentFor = dyn Fn(usize) -> Assignment + Send + Sync;

/// Shared state of the service.
pub struct ServiceState {
    pub expected_workers: usize,
    pub token: Option<String>,
    pub assignment_for: Box<AssignmentFor>,
    pub events: mpsc::Sender<WorkerEvent>,
    /// Where per-request records go (`--requests-out`).
    pub requests_out: Option<Arc<crate::requests_out::RequestsOut>>,
    joined: Mutex<JoinSlots>,
    /// Each joined worker's slice stream, behind the random key its assignment carries.
    slices: Mutex<HashMap<String, (String, SliceReceiver)>>,
}

impl ServiceState {
    pub fn new(
        expected_workers: usize,
        token: Option<String>,
        assignment_for: Box<AssignmentFor>,
        events: mpsc::Sender<WorkerEvent>,
        requests_out: Option<Arc<crate::requests_out::RequestsOut>>,
    ) -> Self {
        ServiceState {
            expected_workers,
            token,
            assignment_for,
            events,
            requests_out,
            joined: Mutex::new(JoinSlots::default()),
            slices: Mutex::new(HashMap::new()),
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
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
            Ok(Ok(Some(v1::WorkerMessage {
                msg: Some(v1::worker_message::Msg::Hello(hello)),
            }))) => hello,
            _ => {
                return Err(Status::invalid_argument(
                    "expected Hello as the first message",
                ));
            }
        };
        if hello.protocol_version != proto::PROTOCOL_VERSION {
            let reason = format!(
                "protocol version {} is not supported (this coordinator speaks {})",
                hello.protocol_version,
                proto::PROTOCOL_VERSION
            );
            tracing::warn!(worker = hello.worker_id, reason, "refused a worker");
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(message_of(v1::coordinator_message::Msg::Refused(
                v1::Refused { reason },
            )));
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        // The response stream goes back at once: the challenge is a round trip on it.
        let (control_tx, control_rx) = mpsc::channel(64);
        tokio::spawn(serve_worker(self.state.clone(), hello, inbound, control_tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(control_rx))))
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
        let Some((key, _)) = slices.get(&request.worker_id) else {
            return Err(Status::not_found("no slice for this worker (join first)"));
        };
        // The key came in this worker's assignment, after the token challenge.
        if !proto::auth::verify(key.as_bytes(), request.token.as_bytes()) {
            return Err(Status::unauthenticated("wrong slice key"));
        }
        let (_, slice) = slices
            .remove(&request.worker_id)
            .expect("looked up just above");
        Ok(Response::new(Box::pin(
            ReceiverStream::new(slice).map(chunk_to_proto),
        )))
    }
}

/// One worker's join stream: the challenge, a join slot, the assignment, then every message
/// it sends, forwarded as events.
async fn serve_worker(
    state: Arc<ServiceState>,
    hello: v1::Hello,
    mut inbound: Streaming<v1::WorkerMessage>,
    control_tx: mpsc::Sender<Result<v1::CoordinatorMessage, Status>>,
) {
    let refuse = |reason: String| {
        let control_tx = control_tx.clone();
        let worker = hello.worker_id.clone();
        async move {
            tracing::warn!(worker, reason, "refused a worker");
            let _ = control_tx
                .send(message_of(v1::coordinator_message::Msg::Refused(
                    v1::Refused { reason },
                )))
                .await;
        }
    };
    if let Some(token) = &state.token
        && let Err(reason) = challenge(token, &hello, &mut inbound, &control_tx).await
    {
        return refuse(reason).await;
    }
    // Decided under the lock, refused after it (no guard held across an await).
    let slot: Result<usize, String> = {
        let mut joined = state.joined.lock().expect("join lock is never poisoned");
        let expected = state.expected_workers;
        if joined.slots.len() < expected {
            joined.slots.resize(expected, None);
        }
        if joined.running {
            Err(format!(
                "this run already has its {expected} workers and is running; a worker cannot join a running run"
            ))
        } else if joined
            .slots
            .iter()
            .flatten()
            .any(|id| *id == hello.worker_id)
        {
            Err(format!("worker id {:?} already joined", hello.worker_id))
        } else if let Some(free) = joined.slots.iter().position(Option::is_none) {
            joined.slots[free] = Some(hello.worker_id.clone());
            joined.running = joined.slots.iter().all(Option::is_some);
            Ok(free)
        } else {
            Err(format!("this run already has its {expected} workers"))
        }
    };
    let index = match slot {
        Ok(index) => index,
        Err(reason) => return refuse(reason).await,
    };
    let (slice_tx, slice_rx) = mpsc::channel(8);
    let slice_key = uuid::Uuid::new_v4().to_string();
    state
        .slices
        .lock()
        .expect("slice lock is never poisoned")
        .insert(hello.worker_id.clone(), (slice_key.clone(), slice_rx));
    let mut assignment = (state.assignment_for)(index);
    assignment.slice_key = slice_key;
    let _ = control_tx
        .send(message_of(v1::coordinator_message::Msg::Assignment(
            assignment_to_proto(&assignment),
        )))
        .await;
    let events = state.events.clone();
    let requests_out = state.requests_out.clone();
    let worker_id = hello.worker_id.clone();
    // The supervisor speaks domain messages; they become protocol messages here.
    let (control, mut control_rx) = WorkerControl::channel(64);
    tokio::spawn(async move {
        while let Some(message) = control_rx.recv().await {
            if control_tx
                .send(message_of(control_to_proto(message)))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let _ = events
        .send(WorkerEvent::Joined {
            index,
            id: hello.worker_id.clone(),
            host: hello.host.clone(),
            control,
            slice: slice_tx,
        })
        .await;
    {
        loop {
            let event = match inbound.message().await {
                Ok(Some(v1::WorkerMessage { msg: Some(msg) })) => match msg {
                    // Decoded once, here, as it arrives.
                    v1::worker_message::Msg::Report(report) => match report_from_proto(&report) {
                        Ok(report) => WorkerEvent::Report {
                            index,
                            report: Box::new(report),
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
                    v1::worker_message::Msg::Records(batch) => {
                        // Written here, before the report that follows them on this
                        // stream reaches the orchestrator.
                        if let Some(out) = &requests_out {
                            let records: Vec<_> = batch
                                .records
                                .iter()
                                .filter_map(proto::convert::record_from_proto)
                                .collect();
                            out.write(&worker_id, &records);
                        }
                        continue;
                    }
                    v1::worker_message::Msg::Hello(_) | v1::worker_message::Msg::Answer(_) => {
                        continue;
                    }
                },
                Ok(Some(_)) => continue,
                Ok(None) => WorkerEvent::Gone {
                    index,
                    reason: "its stream ended".to_owned(),
                },
                Err(status) => WorkerEvent::Gone {
                    index,
                    reason: format!("its stream broke: {}", status.message()),
                },
            };
            let gone = matches!(event, WorkerEvent::Gone { .. });
            if gone {
                // Before the run is running, a worker that leaves frees its slot.
                let mut joined = state.joined.lock().expect("join lock is never poisoned");
                if !joined.running && joined.slots.get(index).is_some_and(Option::is_some) {
                    joined.slots[index] = None;
                    drop(joined);
                    state
                        .slices
                        .lock()
                        .expect("slice lock is never poisoned")
                        .remove(&worker_id);
                }
            }
            if events.send(event).await.is_err() || gone {
                return;
            }
        }
    }
}

/// Prove to the worker that this coordinator knows the token, then check its proof.
async fn challenge(
    token: &str,
    hello: &v1::Hello,
    inbound: &mut Streaming<v1::WorkerMessage>,
    control_tx: &mpsc::Sender<Result<v1::CoordinatorMessage, Status>>,
) -> Result<(), String> {
    let nonce = proto::auth::nonce();
    let proof = proto::auth::coordinator_proof(token, &hello.nonce, &nonce, &hello.worker_id);
    control_tx
        .send(message_of(v1::coordinator_message::Msg::Challenge(
            v1::Challenge {
                nonce: nonce.clone(),
                proof,
            },
        )))
        .await
        .map_err(|_| "the worker left".to_owned())?;
    let answer = match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
        Ok(Ok(Some(v1::WorkerMessage {
            msg: Some(v1::worker_message::Msg::Answer(answer)),
        }))) => answer,
        _ => return Err("no answer to the token challenge".to_owned()),
    };
    let expected = proto::auth::worker_proof(token, &hello.nonce, &nonce, &hello.worker_id);
    if proto::auth::verify(&expected, &answer.proof) {
        Ok(())
    } else {
        Err("wrong or missing token (--token / LLM_REPLAY_TOKEN)".to_owned())
    }
}
