//! The link's security when the run has a token: a password-authenticated key exchange that
//! proves both sides know the token without handing anyone something to test guesses on, and
//! the session keys that authenticate every message after it.
//!
//! **Handshake (SPAKE2, RustCrypto's `spake2` over Ed25519).** The worker sends its SPAKE2
//! message in `Hello`; the coordinator answers with its own and a key confirmation; the worker
//! checks it and answers with its confirmation. Both confirmations are HMACs of the whole
//! transcript (protocol version, worker id, host, capacity, both SPAKE2 messages) under keys
//! derived from the exchange, so an altered `Hello` fails them too. What this gives, and why
//! the earlier challenge (HMAC of the token over known nonces) was replaced:
//! - a passive listener learns nothing it can test a token guess on;
//! - an active peer that does not know the token tests exactly one guess per connection (its
//!   own SPAKE2 message is bound to one password): no dictionary runs offline;
//! - both sides end with a fresh 256-bit session secret that nobody on the path knows.
//!
//! **Session.** From that secret, HKDF-SHA256 (salted with the transcript's hash) derives one
//! HMAC-SHA256 key per use: each side's confirmation, each direction of the `Join` stream, the
//! `Exchanges` stream, and the proof that opens it. Every message after the handshake is a
//! `Sealed` envelope (see the protocol file): its body, a sequence number that counts from 0
//! one by one on each stream and direction, and a tag over both. [`Sealer`] writes them,
//! [`Opener`] checks them: a relay that alters, drops, replays or reorders anything is
//! detected at the next message, and an assignment it rewrote is never acted on.
//!
//! The envelope authenticates; it does not encrypt. Prompts, targets and metrics are readable
//! on a plaintext link: `--tls-cert` on the coordinator adds confidentiality (and the
//! coordinator's identity by certificate).

use prost::Message;
use ring::{digest, hkdf, hmac};
use spake2::{Ed25519Group, Identity, Password, Spake2};

use crate::v1;

/// Side A's identity in SPAKE2 (the worker's role).
const WORKER_IDENTITY: &[u8] = b"llm-replay worker";
/// Side B's identity in SPAKE2 (the coordinator's role).
const COORDINATOR_IDENTITY: &[u8] = b"llm-replay coordinator";
/// Names this handshake's transcript and keys; changes with the protocol.
const TRANSCRIPT_LABEL: &[u8] = b"llm-replay link v3";

/// Why a handshake or a sealed message failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the peer's key-exchange message is malformed")]
    BadPakeMessage,
    #[error(
        "the peer's key confirmation does not match: it does not know this token, or the handshake was altered on the way"
    )]
    BadConfirmation,
    #[error("a sealed message failed its authentication check (altered on the way?)")]
    BadTag,
    #[error(
        "a sealed message came out of sequence (expected {expected}, got {got}): one was dropped, replayed or reordered on the way"
    )]
    OutOfSequence { expected: u64, got: u64 },
    #[error("a sealed message does not decode: {0}")]
    Decode(String),
    #[error("a message came without its seal on an authenticated link")]
    Unsealed,
}

/// What the handshake binds of the worker's `Hello`, besides its SPAKE2 message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloFields<'a> {
    pub protocol_version: u32,
    pub worker_id: &'a str,
    pub host: &'a str,
    pub capacity: u32,
}

impl<'a> HelloFields<'a> {
    /// The bound fields of a received or sent `Hello`.
    pub fn of(hello: &'a v1::Hello) -> HelloFields<'a> {
        HelloFields {
            protocol_version: hello.protocol_version,
            worker_id: &hello.worker_id,
            host: &hello.host,
            capacity: hello.capacity,
        }
    }
}

/// The keys of one authenticated session, the same on both sides.
pub struct SessionKeys {
    coordinator_confirm: hmac::Key,
    worker_confirm: hmac::Key,
    to_worker: hmac::Key,
    to_coordinator: hmac::Key,
    slice: hmac::Key,
    slice_request: hmac::Key,
    transcript_hash: Vec<u8>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

impl SessionKeys {
    /// Seals what the coordinator sends on `Join`.
    pub fn coordinator_sealer(&self) -> Sealer {
        Sealer::new(self.to_worker.clone())
    }

    /// Opens what the coordinator sent on `Join` (the worker's side).
    pub fn coordinator_opener(&self) -> Opener {
        Opener::new(self.to_worker.clone())
    }

    /// Seals what the worker sends on `Join`.
    pub fn worker_sealer(&self) -> Sealer {
        Sealer::new(self.to_coordinator.clone())
    }

    /// Opens what the worker sent on `Join` (the coordinator's side).
    pub fn worker_opener(&self) -> Opener {
        Opener::new(self.to_coordinator.clone())
    }

    /// Seals the chunks of the slice of run (level) `run_id` on `Exchanges` (the
    /// coordinator's side). Each level's slice has a key of its own, so a chunk of one
    /// level's stream never opens on another's, even at the same sequence number.
    pub fn slice_sealer(&self, run_id: &str) -> Sealer {
        Sealer::new(self.slice_key(run_id))
    }

    /// Opens the chunks of the slice of run (level) `run_id` (the worker's side).
    pub fn slice_opener(&self, run_id: &str) -> Opener {
        Opener::new(self.slice_key(run_id))
    }

    fn slice_key(&self, run_id: &str) -> hmac::Key {
        let derived = hmac::sign(&self.slice, &framed(&[b"slice of run", run_id.as_bytes()]));
        hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref())
    }

    /// What the worker presents to open its `Exchanges` stream, in hex: a proof only this
    /// session can make (the assignment, readable on a plaintext link, carries no key).
    pub fn slice_request_proof(&self, run_id: &str, worker_id: &str) -> String {
        let text = framed(&[b"slice request", run_id.as_bytes(), worker_id.as_bytes()]);
        hex(hmac::sign(&self.slice_request, &text).as_ref())
    }

    /// Whether `given` is this session's slice-request proof (constant time).
    pub fn verify_slice_request(&self, run_id: &str, worker_id: &str, given: &str) -> bool {
        verify(
            self.slice_request_proof(run_id, worker_id).as_bytes(),
            given.as_bytes(),
        )
    }

    fn confirmation(&self, key: &hmac::Key) -> Vec<u8> {
        hmac::sign(key, &self.transcript_hash).as_ref().to_vec()
    }
}

/// The worker's half of the handshake, from `Hello` to its answer.
pub struct WorkerHandshake {
    state: Spake2<Ed25519Group>,
    message: Vec<u8>,
}

impl std::fmt::Debug for WorkerHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerHandshake(..)")
    }
}

impl WorkerHandshake {
    /// Starts the exchange with this token (fresh randomness each time).
    pub fn start(token: &str) -> WorkerHandshake {
        let (state, message) = Spake2::<Ed25519Group>::start_a(
            &Password::new(token.as_bytes()),
            &Identity::new(WORKER_IDENTITY),
            &Identity::new(COORDINATOR_IDENTITY),
        );
        WorkerHandshake { state, message }
    }

    /// The SPAKE2 message for `Hello.pake`.
    pub fn pake_message(&self) -> &[u8] {
        &self.message
    }

    /// Checks the coordinator's challenge against the `Hello` this worker sent; on success,
    /// the session's keys and the worker's answer (`ChallengeAnswer.proof`).
    pub fn finish(
        self,
        hello: &HelloFields<'_>,
        challenge: &v1::Challenge,
    ) -> Result<(SessionKeys, Vec<u8>), AuthError> {
        let secret = self
            .state
            .finish(&challenge.pake)
            .map_err(|_| AuthError::BadPakeMessage)?;
        let keys = derive(&secret, hello, &self.message, &challenge.pake);
        if !verify(
            &keys.confirmation(&keys.coordinator_confirm),
            &challenge.proof,
        ) {
            return Err(AuthError::BadConfirmation);
        }
        let answer = keys.confirmation(&keys.worker_confirm);
        Ok((keys, answer))
    }
}

/// The coordinator's half, after it answered a `Hello`: the keys, and the worker's answer it
/// expects.
pub struct CoordinatorHandshake {
    keys: SessionKeys,
}

impl std::fmt::Debug for CoordinatorHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoordinatorHandshake(..)")
    }
}

impl CoordinatorHandshake {
    /// Answers a worker's `Hello`: the challenge to send, and the state that checks the answer.
    pub fn respond(
        token: &str,
        hello: &v1::Hello,
    ) -> Result<(CoordinatorHandshake, v1::Challenge), AuthError> {
        let (state, message) = Spake2::<Ed25519Group>::start_b(
            &Password::new(token.as_bytes()),
            &Identity::new(WORKER_IDENTITY),
            &Identity::new(COORDINATOR_IDENTITY),
        );
        let secret = state
            .finish(&hello.pake)
            .map_err(|_| AuthError::BadPakeMessage)?;
        let keys = derive(&secret, &HelloFields::of(hello), &hello.pake, &message);
        let challenge = v1::Challenge {
            nonce: Vec::new(),
            proof: keys.confirmation(&keys.coordinator_confirm),
            pake: message,
        };
        Ok((CoordinatorHandshake { keys }, challenge))
    }

    /// Checks the worker's answer; on success, the session's keys.
    pub fn finish(self, answer: &v1::ChallengeAnswer) -> Result<SessionKeys, AuthError> {
        if verify(
            &self.keys.confirmation(&self.keys.worker_confirm),
            &answer.proof,
        ) {
            Ok(self.keys)
        } else {
            Err(AuthError::BadConfirmation)
        }
    }
}

/// Writes one stream's sealed envelopes, numbering them.
pub struct Sealer {
    key: hmac::Key,
    next: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer(next {})", self.next)
    }
}

impl Sealer {
    fn new(key: hmac::Key) -> Sealer {
        Sealer { key, next: 0 }
    }

    /// Seals a message: the next envelope of this stream.
    pub fn seal<M: Message>(&mut self, message: &M) -> v1::Sealed {
        let body = message.encode_to_vec();
        let seq = self.next;
        self.next += 1;
        let tag = tag(&self.key, seq, &body);
        v1::Sealed { seq, body, tag }
    }
}

/// Checks one stream's sealed envelopes, in order.
pub struct Opener {
    key: hmac::Key,
    next: u64,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Opener(next {})", self.next)
    }
}

impl Opener {
    fn new(key: hmac::Key) -> Opener {
        Opener { key, next: 0 }
    }

    /// Checks an envelope and decodes its message. The tag is checked before the sequence
    /// number (an attacker's number says nothing) and before anything is decoded.
    pub fn open<M: Message + Default>(&mut self, sealed: &v1::Sealed) -> Result<M, AuthError> {
        let mut text = Vec::with_capacity(8 + sealed.body.len());
        text.extend_from_slice(&sealed.seq.to_be_bytes());
        text.extend_from_slice(&sealed.body);
        hmac::verify(&self.key, &text, &sealed.tag).map_err(|_| AuthError::BadTag)?;
        if sealed.seq != self.next {
            return Err(AuthError::OutOfSequence {
                expected: self.next,
                got: sealed.seq,
            });
        }
        self.next += 1;
        M::decode(sealed.body.as_slice()).map_err(|error| AuthError::Decode(error.to_string()))
    }
}

/// A worker's message as it goes on the wire: sealed once the session has keys, except the
/// handshake's own messages (`Hello`, `ChallengeAnswer`).
pub fn seal_worker_message(
    sealer: Option<&mut Sealer>,
    message: v1::WorkerMessage,
) -> v1::WorkerMessage {
    use v1::worker_message::Msg;
    match (sealer, &message.msg) {
        (Some(sealer), Some(msg)) if !matches!(msg, Msg::Hello(_) | Msg::Answer(_)) => {
            v1::WorkerMessage {
                msg: Some(Msg::Sealed(sealer.seal(&message))),
            }
        }
        _ => message,
    }
}

/// A coordinator's message as it goes on the wire: sealed once the session has keys, except
/// the handshake's own `Challenge`.
pub fn seal_coordinator_message(
    sealer: Option<&mut Sealer>,
    message: v1::CoordinatorMessage,
) -> v1::CoordinatorMessage {
    use v1::coordinator_message::Msg;
    match (sealer, &message.msg) {
        (Some(sealer), Some(msg)) if !matches!(msg, Msg::Challenge(_)) => v1::CoordinatorMessage {
            msg: Some(Msg::Sealed(sealer.seal(&message))),
        },
        _ => message,
    }
}

/// A slice chunk as it goes on the wire: sealed when the session has keys.
pub fn seal_chunk(sealer: Option<&mut Sealer>, chunk: v1::ExchangeChunk) -> v1::ExchangeChunk {
    match sealer {
        Some(sealer) => v1::ExchangeChunk {
            sealed: Some(sealer.seal(&chunk)),
            ..v1::ExchangeChunk::default()
        },
        None => chunk,
    }
}

/// A worker's message as received: opened when the session has keys (then it must be
/// sealed), taken as it is otherwise (then it must not be).
pub fn open_worker_message(
    opener: Option<&mut Opener>,
    message: v1::WorkerMessage,
) -> Result<v1::WorkerMessage, AuthError> {
    use v1::worker_message::Msg;
    match (opener, message.msg) {
        (Some(opener), Some(Msg::Sealed(sealed))) => {
            let inner: v1::WorkerMessage = opener.open(&sealed)?;
            match inner.msg {
                Some(Msg::Sealed(_)) => Err(AuthError::Decode("a seal inside a seal".into())),
                _ => Ok(inner),
            }
        }
        (Some(_), _) => Err(AuthError::Unsealed),
        (None, Some(Msg::Sealed(_))) => Err(AuthError::Decode(
            "a sealed message on a link without a token".into(),
        )),
        (None, msg) => Ok(v1::WorkerMessage { msg }),
    }
}

/// A coordinator's message as received: see [`open_worker_message`].
pub fn open_coordinator_message(
    opener: Option<&mut Opener>,
    message: v1::CoordinatorMessage,
) -> Result<v1::CoordinatorMessage, AuthError> {
    use v1::coordinator_message::Msg;
    match (opener, message.msg) {
        (Some(opener), Some(Msg::Sealed(sealed))) => {
            let inner: v1::CoordinatorMessage = opener.open(&sealed)?;
            match inner.msg {
                Some(Msg::Sealed(_)) => Err(AuthError::Decode("a seal inside a seal".into())),
                _ => Ok(inner),
            }
        }
        (Some(_), _) => Err(AuthError::Unsealed),
        (None, Some(Msg::Sealed(_))) => Err(AuthError::Decode(
            "a sealed message on a link without a token".into(),
        )),
        (None, msg) => Ok(v1::CoordinatorMessage { msg }),
    }
}

/// A slice chunk as received: see [`open_worker_message`].
pub fn open_chunk(
    opener: Option<&mut Opener>,
    mut chunk: v1::ExchangeChunk,
) -> Result<v1::ExchangeChunk, AuthError> {
    match (opener, chunk.sealed.take()) {
        (Some(opener), Some(sealed)) => {
            let inner: v1::ExchangeChunk = opener.open(&sealed)?;
            if inner.sealed.is_some() {
                return Err(AuthError::Decode("a seal inside a seal".into()));
            }
            Ok(inner)
        }
        (Some(_), None) => Err(AuthError::Unsealed),
        (None, Some(_)) => Err(AuthError::Decode(
            "a sealed chunk on a link without a token".into(),
        )),
        (None, None) => Ok(chunk),
    }
}

/// Constant-time comparison (for the unauthenticated slice key of a run without a token).
pub fn verify(expected: &[u8], given: &[u8]) -> bool {
    expected.len() == given.len()
        && expected
            .iter()
            .zip(given)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn tag(key: &hmac::Key, seq: u64, body: &[u8]) -> Vec<u8> {
    let mut context = hmac::Context::with_key(key);
    context.update(&seq.to_be_bytes());
    context.update(body);
    context.sign().as_ref().to_vec()
}

/// Length-prefixed parts: no two different part lists give the same bytes.
fn framed(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An HKDF output length that is an HMAC-SHA256 key.
struct HmacKeyLength;

impl hkdf::KeyType for HmacKeyLength {
    fn len(&self) -> usize {
        digest::SHA256_OUTPUT_LEN
    }
}

fn derive(
    secret: &[u8],
    hello: &HelloFields<'_>,
    worker_pake: &[u8],
    coordinator_pake: &[u8],
) -> SessionKeys {
    let transcript = framed(&[
        TRANSCRIPT_LABEL,
        &hello.protocol_version.to_be_bytes(),
        hello.worker_id.as_bytes(),
        hello.host.as_bytes(),
        &hello.capacity.to_be_bytes(),
        worker_pake,
        coordinator_pake,
    ]);
    let transcript_hash = digest::digest(&digest::SHA256, &transcript)
        .as_ref()
        .to_vec();
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &transcript_hash).extract(secret);
    let key = |label: &[u8]| {
        let info = [TRANSCRIPT_LABEL, label];
        let okm = prk
            .expand(&info, HmacKeyLength)
            .expect("32 bytes is within HKDF-SHA256's output limit");
        let mut bytes = [0u8; digest::SHA256_OUTPUT_LEN];
        okm.fill(&mut bytes)
            .expect("the buffer is the length asked for");
        hmac::Key::new(hmac::HMAC_SHA256, &bytes)
    };
    SessionKeys {
        coordinator_confirm: key(b"confirm coordinator"),
        worker_confirm: key(b"confirm worker"),
        to_worker: key(b"coordinator to worker"),
        to_coordinator: key(b"worker to coordinator"),
        slice: key(b"slice"),
        slice_request: key(b"slice request"),
        transcript_hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "7f3a9c1e5b2d8f4a6c0e1b3d5f7a9c2e";

    fn hello(pake: Vec<u8>) -> v1::Hello {
        v1::Hello {
            protocol_version: crate::PROTOCOL_VERSION,
            worker_id: "w1".into(),
            host: "h".into(),
            capacity: 0,
            token: String::new(),
            nonce: Vec::new(),
            pake,
        }
    }

    fn handshake(
        worker_token: &str,
        coordinator_token: &str,
    ) -> Result<(SessionKeys, SessionKeys), AuthError> {
        let worker = WorkerHandshake::start(worker_token);
        let sent = hello(worker.pake_message().to_vec());
        let (coordinator, challenge) = CoordinatorHandshake::respond(coordinator_token, &sent)?;
        let (worker_keys, answer) = worker.finish(&HelloFields::of(&sent), &challenge)?;
        let coordinator_keys = coordinator.finish(&v1::ChallengeAnswer { proof: answer })?;
        Ok((worker_keys, coordinator_keys))
    }

    #[test]
    fn both_sides_agree_only_with_the_same_token() {
        let (worker, coordinator) = handshake(TOKEN, TOKEN).expect("same token");
        let mut sealer = coordinator.coordinator_sealer();
        let mut opener = worker.coordinator_opener();
        let message = v1::Abort {
            reason: "stop".into(),
        };
        let opened: v1::Abort = opener.open(&sealer.seal(&message)).expect("opens");
        assert_eq!(opened, message);
        assert_eq!(
            handshake(TOKEN, "another-token-another-token").expect_err("must fail"),
            AuthError::BadConfirmation
        );
    }

    #[test]
    fn an_altered_hello_fails_the_confirmation() {
        let worker = WorkerHandshake::start(TOKEN);
        let sent = hello(worker.pake_message().to_vec());
        let mut altered = sent.clone();
        altered.worker_id = "w2".into();
        let (_, challenge) = CoordinatorHandshake::respond(TOKEN, &altered).expect("responds");
        assert_eq!(
            worker
                .finish(&HelloFields::of(&sent), &challenge)
                .expect_err("must fail"),
            AuthError::BadConfirmation
        );
    }

    #[test]
    fn sealed_messages_detect_alteration_replay_and_reordering() {
        let (worker, coordinator) = handshake(TOKEN, TOKEN).expect("same token");
        let mut sealer = worker.worker_sealer();
        let mut opener = coordinator.worker_opener();
        let first = sealer.seal(&v1::Heartbeat { unix_ns: 1 });
        let second = sealer.seal(&v1::Heartbeat { unix_ns: 2 });
        let mut altered = first.clone();
        altered.body[1] ^= 1;
        assert_eq!(
            opener
                .open::<v1::Heartbeat>(&altered)
                .expect_err("must fail"),
            AuthError::BadTag
        );
        assert_eq!(
            opener
                .open::<v1::Heartbeat>(&second)
                .expect_err("must fail"),
            AuthError::OutOfSequence {
                expected: 0,
                got: 1
            }
        );
        assert!(opener.open::<v1::Heartbeat>(&first).is_ok());
        assert!(matches!(
            opener.open::<v1::Heartbeat>(&first),
            Err(AuthError::OutOfSequence { .. })
        ));
        // A message of one direction does not open as the other's.
        let mut other = worker.coordinator_opener();
        let again = coordinator
            .coordinator_sealer()
            .seal(&v1::Heartbeat { unix_ns: 3 });
        assert!(other.open::<v1::Heartbeat>(&again).is_ok());
        let mut wrong_direction = coordinator.worker_opener();
        assert_eq!(
            wrong_direction
                .open::<v1::Heartbeat>(&again)
                .expect_err("must fail"),
            AuthError::BadTag
        );
    }

    #[test]
    fn the_slice_request_proof_is_the_sessions_own() {
        let (worker, coordinator) = handshake(TOKEN, TOKEN).expect("same token");
        let proof = worker.slice_request_proof("run", "w1");
        assert!(coordinator.verify_slice_request("run", "w1", &proof));
        assert!(!coordinator.verify_slice_request("run", "w2", &proof));
        let (other, _) = handshake(TOKEN, TOKEN).expect("same token");
        assert!(!coordinator.verify_slice_request(
            "run",
            "w1",
            &other.slice_request_proof("run", "w1")
        ));
    }

    #[test]
    fn a_guess_can_only_be_tested_by_the_one_who_made_the_exchange_with_it() {
        // What an impostor worker gets for its one guess: a challenge that confirms (or not)
        // that guess alone. With the right token in its dictionary but a wrong first guess,
        // no other candidate can be checked against the same challenge.
        let impostor = WorkerHandshake::start("wrong-guess-wrong-guess");
        let sent = hello(impostor.pake_message().to_vec());
        let (_, challenge) = CoordinatorHandshake::respond(TOKEN, &sent).expect("responds");
        for candidate in ["wrong-guess-wrong-guess", TOKEN, "password12345678"] {
            // A fresh exchange with a candidate is a different SPAKE2 message: the
            // coordinator's answer was bound to the first.
            let retry = WorkerHandshake::start(candidate);
            assert!(retry.finish(&HelloFields::of(&sent), &challenge).is_err());
        }
        assert!(
            impostor
                .finish(&HelloFields::of(&sent), &challenge)
                .is_err()
        );
    }
}
