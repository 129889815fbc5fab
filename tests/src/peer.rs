//! A worker peer written with the protocol crate alone, for tests whose other side must be a
//! real coordinator process but whose worker behaves as no honest worker would: it joins
//! (with the token handshake when given one), seals what it sends and opens what it receives
//! as a real worker does, and leaves every decision to the test.

use std::sync::{Arc, OnceLock};

use proto::auth::{HelloFields, Opener, SessionKeys, WorkerHandshake};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// One joined peer.
pub struct Peer {
    /// What the peer sends (sealed on the way out once the session has keys).
    pub out: mpsc::Sender<v1::WorkerMessage>,
    inbound: tonic::Streaming<v1::CoordinatorMessage>,
    opener: Option<Opener>,
    /// The session's keys, with a token.
    pub keys: Option<Arc<SessionKeys>>,
    client: CoordinatorClient<Channel>,
    /// The assignment the coordinator sent.
    pub assignment: v1::Assignment,
    pub worker_id: String,
}

/// A message of the protocol's worker side.
pub fn message(msg: v1::worker_message::Msg) -> v1::WorkerMessage {
    v1::WorkerMessage { msg: Some(msg) }
}

/// Now, Unix ns.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Peer {
    /// Connects to `addr`, says hello as `id`, runs the handshake with `token` if the
    /// coordinator asks for it, and waits for the assignment.
    pub async fn join(addr: &str, id: &str, token: Option<&str>) -> Result<Peer, String> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut client = CoordinatorClient::new(channel);
        let (out, out_rx) = mpsc::channel::<v1::WorkerMessage>(256);
        let keys_slot: Arc<OnceLock<Arc<SessionKeys>>> = Arc::new(OnceLock::new());
        let outbound = {
            let keys = Arc::clone(&keys_slot);
            let mut sealer = None;
            ReceiverStream::new(out_rx).map(move |m| {
                if sealer.is_none() {
                    sealer = keys.get().map(|k| k.worker_sealer());
                }
                proto::auth::seal_worker_message(sealer.as_mut(), m)
            })
        };
        let mut handshake = token.map(WorkerHandshake::start);
        let hello = v1::Hello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: id.to_owned(),
            host: "test-peer".into(),
            capacity: 0,
            token: String::new(),
            nonce: Vec::new(),
            pake: handshake
                .as_ref()
                .map(|h| h.pake_message().to_vec())
                .unwrap_or_default(),
        };
        out.send(message(v1::worker_message::Msg::Hello(hello.clone())))
            .await
            .map_err(|_| "outbound closed".to_owned())?;
        let mut inbound = client
            .join(outbound)
            .await
            .map_err(|s| format!("join: {}", s.message()))?
            .into_inner();
        let mut opener: Option<Opener> = None;
        let assignment = loop {
            let received = inbound
                .message()
                .await
                .map_err(|s| format!("stream: {}", s.message()))?
                .ok_or("the coordinator closed the stream")?;
            let received = proto::auth::open_coordinator_message(opener.as_mut(), received)
                .map_err(|e| e.to_string())?;
            match received.msg {
                Some(v1::coordinator_message::Msg::Challenge(challenge)) => {
                    let started = handshake.take().ok_or("challenged without a token")?;
                    let (keys, proof) = started
                        .finish(&HelloFields::of(&hello), &challenge)
                        .map_err(|e| e.to_string())?;
                    let keys = Arc::new(keys);
                    opener = Some(keys.coordinator_opener());
                    let _ = keys_slot.set(keys);
                    out.send(message(v1::worker_message::Msg::Answer(
                        v1::ChallengeAnswer { proof },
                    )))
                    .await
                    .map_err(|_| "outbound closed".to_owned())?;
                }
                Some(v1::coordinator_message::Msg::Assignment(a)) => break a,
                Some(v1::coordinator_message::Msg::Refused(r)) => {
                    return Err(format!("refused: {}", r.reason));
                }
                _ => {}
            }
        };
        Ok(Peer {
            out,
            inbound,
            opener,
            keys: keys_slot.get().cloned(),
            client,
            assignment,
            worker_id: id.to_owned(),
        })
    }

    /// The next message of the coordinator, opened; `None` when the stream ended or a
    /// message failed its check.
    pub async fn recv(&mut self) -> Option<v1::coordinator_message::Msg> {
        loop {
            let received = self.inbound.message().await.ok()??;
            let opened =
                proto::auth::open_coordinator_message(self.opener.as_mut(), received).ok()?;
            if let Some(msg) = opened.msg {
                return Some(msg);
            }
        }
    }

    /// Sends one message; false when the stream is closed.
    pub async fn send(&self, msg: v1::worker_message::Msg) -> bool {
        self.out.send(message(msg)).await.is_ok()
    }

    /// Opens the slice stream and drains it in the background (so the coordinator's feeder
    /// is not held up); the returned receiver gets each opened chunk's exchange count.
    pub async fn drain_slice(&mut self) -> Result<mpsc::UnboundedReceiver<usize>, String> {
        let token = match &self.keys {
            Some(keys) => keys.slice_request_proof(&self.assignment.run_id, &self.worker_id),
            None => self.assignment.slice_key.clone(),
        };
        let mut slice = self
            .client
            .exchanges(v1::SliceRequest {
                run_id: self.assignment.run_id.clone(),
                worker_id: self.worker_id.clone(),
                token,
            })
            .await
            .map_err(|s| format!("slice: {}", s.message()))?
            .into_inner();
        let mut opener = self
            .keys
            .as_deref()
            .map(|keys| keys.slice_opener(&self.assignment.run_id));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(chunk)) = slice.message().await {
                let Ok(chunk) = proto::auth::open_chunk(opener.as_mut(), chunk) else {
                    return;
                };
                let _ = tx.send(chunk.exchanges.len());
                if chunk.last {
                    return;
                }
            }
        });
        Ok(rx)
    }
}
