//! Issue 18, items 1 and 2: the link between coordinator and workers against a peer on the
//! path. A relay (a gRPC server here, between a real worker process and a real coordinator
//! process) forwards the handshake unchanged and rewrites the assignment to send the load,
//! with the worker's API key, to its own server: the worker must send nothing anywhere and
//! both sides must say why. A guesser (a peer speaking the protocol to a real coordinator)
//! and the relay, as a passive listener, collect what the handshake shows and run a
//! dictionary that holds the real token against it: nothing they saw may confirm it.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixtures::peer::message;
use fixtures::{MockServer, TempDir, coordinator, worker, write_chat_recording};
use prost::Message;
use proto::auth::{HelloFields, WorkerHandshake};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

/// A token that passes the 16-character rule and sits in every dictionary.
const WEAK_TOKEN: &str = "password12345678";

/// What the relay saw of the handshake, for the offline dictionary.
#[derive(Default, Clone)]
struct Seen {
    hellos: Vec<v1::Hello>,
    challenges: Vec<v1::Challenge>,
    answers: Vec<v1::ChallengeAnswer>,
}

/// A relay between workers and the real coordinator at `upstream`: forwards everything, and
/// rewrites each assignment's target to `evil_target` (with `insecure`), sealed or not. It
/// cannot recompute a seal's tag (it does not know the session's keys), so it keeps the old
/// one, as any relay without the token must.
struct Relay {
    upstream: String,
    evil_target: String,
    seen: Arc<Mutex<Seen>>,
    rewrites: Arc<AtomicU64>,
}

async fn connect(
    addr: &str,
) -> Result<CoordinatorClient<tonic::transport::Channel>, tonic::transport::Error> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(CoordinatorClient::new(channel))
}

type Stream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send>>;

fn rewrite(assignment: &mut v1::Assignment, evil_target: &str) {
    assignment.target = evil_target.to_owned();
    assignment.insecure = true;
}

#[tonic::async_trait]
impl v1::coordinator_server::Coordinator for Relay {
    type JoinStream = Stream<v1::CoordinatorMessage>;
    type ExchangesStream = Stream<v1::ExchangeChunk>;

    async fn join(
        &self,
        request: tonic::Request<tonic::Streaming<v1::WorkerMessage>>,
    ) -> Result<tonic::Response<Self::JoinStream>, tonic::Status> {
        let mut from_worker = request.into_inner();
        let mut client = connect(&self.upstream)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let (to_upstream, upstream_rx) = mpsc::channel::<v1::WorkerMessage>(64);
        let seen = self.seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = from_worker.message().await {
                match &message.msg {
                    Some(v1::worker_message::Msg::Hello(hello)) => {
                        seen.lock().expect("lock").hellos.push(hello.clone())
                    }
                    Some(v1::worker_message::Msg::Answer(answer)) => {
                        seen.lock().expect("lock").answers.push(answer.clone())
                    }
                    _ => {}
                }
                if to_upstream.send(message).await.is_err() {
                    return;
                }
            }
        });
        let from_upstream = client
            .join(ReceiverStream::new(upstream_rx))
            .await?
            .into_inner();
        let evil_target = self.evil_target.clone();
        let seen = self.seen.clone();
        let rewrites = self.rewrites.clone();
        let relayed = from_upstream.map(move |message| {
            let mut message = message?;
            match &mut message.msg {
                Some(v1::coordinator_message::Msg::Challenge(challenge)) => {
                    seen.lock()
                        .expect("lock")
                        .challenges
                        .push(challenge.clone());
                }
                Some(v1::coordinator_message::Msg::Assignment(assignment)) => {
                    rewrite(assignment, &evil_target);
                    rewrites.fetch_add(1, Ordering::Relaxed);
                }
                Some(v1::coordinator_message::Msg::Sealed(sealed)) => {
                    if let Ok(mut inner) = v1::CoordinatorMessage::decode(sealed.body.as_slice())
                        && let Some(v1::coordinator_message::Msg::Assignment(assignment)) =
                            &mut inner.msg
                    {
                        rewrite(assignment, &evil_target);
                        sealed.body = inner.encode_to_vec();
                        rewrites.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => {}
            }
            Ok(message)
        });
        Ok(tonic::Response::new(Box::pin(relayed)))
    }

    async fn exchanges(
        &self,
        request: tonic::Request<v1::SliceRequest>,
    ) -> Result<tonic::Response<Self::ExchangesStream>, tonic::Status> {
        let mut client = connect(&self.upstream)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let chunks = client.exchanges(request.into_inner()).await?.into_inner();
        Ok(tonic::Response::new(Box::pin(chunks)))
    }
}

/// The attacker's server: counts every byte anybody sends it.
fn evil_server() -> (String, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 {
                        return;
                    }
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (format!("http://{addr}"), received)
}

/// The attack of the first review, as it was described: the old challenge's proof was an
/// HMAC of the token over data anyone on the path saw, so a dictionary ran against it
/// offline. Framing of protocol 2 (length-prefixed role, both nonces, the worker id).
fn old_proof(token: &str, role: &str, first: &[u8], second: &[u8], worker_id: &str) -> Vec<u8> {
    let mut text = Vec::new();
    for part in [role.as_bytes(), first, second, worker_id.as_bytes()] {
        text.extend_from_slice(&(part.len() as u32).to_be_bytes());
        text.extend_from_slice(part);
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes());
    ring::hmac::sign(&key, &text).as_ref().to_vec()
}

fn dictionary() -> Vec<String> {
    let mut words: Vec<String> = (12_344_000..12_346_000)
        .map(|i| format!("password{i:08}"))
        .collect();
    words.extend(
        [
            "letmein-letmein-1",
            "correct-horse-battery",
            "qwertyuiop123456",
        ]
        .map(String::from),
    );
    assert!(words.iter().any(|w| w == WEAK_TOKEN));
    words
}

/// Every offline test a peer without the token can run on what it saw: the old HMAC proofs,
/// and a fresh key exchange per candidate against the recorded challenge. Returns the
/// candidates that any of them confirmed.
fn offline_guesses(seen: &Seen) -> Vec<String> {
    let mut found = Vec::new();
    for candidate in dictionary() {
        for hello in &seen.hellos {
            for challenge in &seen.challenges {
                let by_old_proof = challenge.proof
                    == old_proof(
                        &candidate,
                        "coordinator",
                        &hello.nonce,
                        &challenge.nonce,
                        &hello.worker_id,
                    )
                    || seen.answers.iter().any(|answer| {
                        answer.proof
                            == old_proof(
                                &candidate,
                                "worker",
                                &challenge.nonce,
                                &hello.nonce,
                                &hello.worker_id,
                            )
                    });
                let by_exchange = WorkerHandshake::start(&candidate)
                    .finish(&HelloFields::of(hello), challenge)
                    .is_ok();
                if by_old_proof || by_exchange {
                    found.push(candidate.clone());
                }
            }
        }
    }
    found
}

/// Item 1 (and item 2's passive listener): a relay without the token rewrites the
/// authenticated assignment; the worker sends nothing to anybody, and both sides say why.
#[test]
fn a_relay_that_rewrites_the_assignment_gets_nothing() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("relay");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 40, 5, None);
    let (evil_target, evil_bytes) = evil_server();
    let (mut coordinator, addr) = coordinator(
        &[
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--header",
            "Authorization: Bearer ${OPENAI_API_KEY}",
            "--token",
            WEAK_TOKEN,
            "--join-timeout",
            "20s",
        ],
        1,
        &[],
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let rewrites = Arc::new(AtomicU64::new(0));
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let relay_addr = listener.local_addr().expect("addr").to_string();
    let relay = runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(v1::coordinator_server::CoordinatorServer::new(Relay {
                upstream: addr.clone(),
                evil_target,
                seen: seen.clone(),
                rewrites: rewrites.clone(),
            }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut victim = worker(
        &relay_addr,
        "victim",
        &["--token", WEAK_TOKEN, "--allow-env", "OPENAI_API_KEY"],
        &[("OPENAI_API_KEY", "sk-the-workers-own-key")],
    );
    let worker_code = victim.wait_timeout(Duration::from_secs(30));
    let code = coordinator.wait_timeout(Duration::from_secs(40));
    relay.abort();
    let worker_err = victim.stderr();
    let coordinator_out = format!("{}\n{}", coordinator.stdout(), coordinator.stderr());
    println!("worker: {worker_err}\ncoordinator: {coordinator_out}");
    assert!(
        rewrites.load(Ordering::Relaxed) >= 1,
        "the relay never saw an assignment to rewrite"
    );
    assert_eq!(
        evil_bytes.load(Ordering::Relaxed),
        0,
        "the worker sent requests (and its API key) to the relay's server"
    );
    assert!(
        matches!(worker_code, Some(c) if c != 0),
        "{worker_code:?}: {worker_err}"
    );
    assert!(
        worker_err.contains("authentication check") && worker_err.contains("not trusted"),
        "the worker did not say why: {worker_err}"
    );
    // The run could not complete: exit 3, not a usage error (issue 31 item 5).
    assert_eq!(
        code,
        Some(3),
        "the coordinator's exit: {code:?}: {coordinator_out}"
    );
    assert!(
        coordinator_out.contains("authentication check"),
        "the coordinator did not say why: {coordinator_out}"
    );
    // What a passive listener on the path collected tests no guess.
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.hellos.len(), 1);
    assert_eq!(seen.challenges.len(), 1);
    let found = offline_guesses(&seen);
    assert!(
        found.is_empty(),
        "the handshake on the wire confirmed a dictionary word offline: {found:?}"
    );
}

/// Item 2: anyone who can reach the coordinator says hello with a guess of its choice and
/// keeps what comes back; a dictionary holding the real token then confirms nothing offline,
/// and the guesser gets no assignment.
#[test]
fn a_guesser_gets_nothing_to_test_a_dictionary_on() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("guesser");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, None);
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "5"]);
    let (mut coordinator, addr) = coordinator(
        &[
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--token",
            WEAK_TOKEN,
            "--join-timeout",
            "8s",
        ],
        1,
        &[],
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (seen, got_assignment) = runtime.block_on(async {
        let mut client = connect(&addr).await.expect("connect");
        let guess = WorkerHandshake::start("not-the-token-at-all");
        let hello = v1::Hello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: "guesser".into(),
            host: "guesser".into(),
            capacity: 0,
            token: String::new(),
            // A nonce of its choice, as the first review's guesser sent.
            nonce: vec![0u8; 32],
            pake: guess.pake_message().to_vec(),
        };
        let (tx, rx) = mpsc::channel(4);
        tx.send(message(v1::worker_message::Msg::Hello(hello.clone())))
            .await
            .expect("hello");
        let mut inbound = client
            .join(ReceiverStream::new(rx))
            .await
            .expect("join")
            .into_inner();
        let mut seen = Seen {
            hellos: vec![hello],
            ..Seen::default()
        };
        let mut got_assignment = false;
        // Everything the coordinator says to it, until it gives up on the guesser.
        while let Ok(Ok(Some(received))) =
            tokio::time::timeout(Duration::from_secs(15), inbound.message()).await
        {
            match received.msg {
                Some(v1::coordinator_message::Msg::Challenge(challenge)) => {
                    seen.challenges.push(challenge);
                    // A wrong confirmation, as a guesser that failed its own guess would.
                    let _ = tx
                        .send(message(v1::worker_message::Msg::Answer(
                            v1::ChallengeAnswer {
                                proof: vec![0u8; 32],
                            },
                        )))
                        .await;
                }
                Some(
                    v1::coordinator_message::Msg::Assignment(_)
                    | v1::coordinator_message::Msg::Sealed(_),
                ) => {
                    got_assignment = true;
                }
                _ => {}
            }
        }
        (seen, got_assignment)
    });
    let _ = coordinator.wait_timeout(Duration::from_secs(20));
    assert_eq!(seen.challenges.len(), 1, "no challenge came back");
    assert!(!got_assignment, "the guesser was given an assignment");
    let found = offline_guesses(&seen);
    assert!(
        found.is_empty(),
        "what the coordinator handed an unauthenticated peer confirmed {found:?} offline"
    );
    let stderr = coordinator.stderr();
    assert!(stderr.contains("wrong or missing token"), "{stderr}");
}

/// The protocol version went up with the key exchange: a worker of the previous protocol is
/// refused with a message that says so.
#[test]
fn a_worker_of_the_previous_protocol_is_refused_and_told_why() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("old-worker");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 2, 5, None);
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "5"]);
    let (mut coordinator, addr) = coordinator(
        &[
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--join-timeout",
            "5s",
        ],
        1,
        &[],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let reason = runtime.block_on(async {
        let mut client = connect(&addr).await.expect("connect");
        let (tx, rx) = mpsc::channel(4);
        tx.send(message(v1::worker_message::Msg::Hello(v1::Hello {
            protocol_version: proto::PROTOCOL_VERSION - 1,
            worker_id: "old".into(),
            host: "old".into(),
            ..Default::default()
        })))
        .await
        .expect("hello");
        let mut inbound = client
            .join(ReceiverStream::new(rx))
            .await
            .expect("join")
            .into_inner();
        match inbound.message().await {
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Refused(refused)),
            })) => refused.reason,
            other => panic!("not refused: {other:?}"),
        }
    });
    let _ = coordinator.wait_timeout(Duration::from_secs(20));
    assert!(
        reason.contains(&format!("protocol version {}", proto::PROTOCOL_VERSION - 1))
            && reason.contains(&proto::PROTOCOL_VERSION.to_string()),
        "{reason}"
    );
}
