//! Guards of the worker link against peers that do not hold the token: per-peer spacing of
//! failed token handshakes (`PeerGate`), bounds on what a peer may say before it is
//! authenticated (`check_hello_fields`, `loggable`), and a size limit on the messages that
//! arrive before the handshake, enforced on the HTTP body before tonic buffers them
//! (`PreAuthLimitLayer`).
//!
//! Everything here is for peers the coordinator knows nothing about yet: anyone who can reach
//! its port can say hello. What such a peer may cost is bounded — a slot in a bounded map,
//! at most `MAX_BOOKED_WAIT` of someone's waiting (its own), a few KiB of buffered message, one
//! thinned log line — and never delays a worker dialing from another address.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

/// After a failed handshake, a peer's next handshake starts at least this long after its
/// previous one (SPAKE2 gives an impostor nothing to test offline, so each guess costs it a
/// handshake, and this many of them per second at most).
pub const FAILED_HANDSHAKE_SPACING: Duration = Duration::from_millis(100);

/// The spacing doubles every this many failures of one peer ...
const FAILURES_PER_DOUBLING: u64 = 10;

/// ... up to 2^5 × 100 ms = 3.2 s: a peer that keeps failing tests one guess every few seconds.
const MAX_SPACING_DOUBLINGS: u32 = 5;

/// A peer's failures are forgotten this long after its last one.
pub const FAILED_HANDSHAKE_MEMORY: Duration = Duration::from_secs(30);

/// A peer that would have to wait longer than this for its turn is refused at once instead of
/// queued: its queue cannot grow however fast it dials, and a refusal costs nothing (no key
/// exchange, no task waiting). An honest worker refused this way retries later.
pub const MAX_BOOKED_WAIT: Duration = Duration::from_secs(1);

/// Peers whose failures are remembered at once. Past this, the stalest are forgotten first: a
/// flood of addresses cannot grow the coordinator's memory (about 60 bytes a peer).
pub const MAX_TRACKED_PEERS: usize = 4096;

/// When the map is full, this many of the stalest records go at once, so the cost of making
/// room (a pass over the map) is paid once per this many new peers.
const EVICTED_AT_ONCE: usize = MAX_TRACKED_PEERS / 8;

/// A peer's failures (or refusals) after which the coordinator warns, then again at every
/// power of two: a few lines however long the attack lasts. A peer's first failure is logged
/// too, with its reason: a worker started with a wrong token says so once.
const WARN_AFTER: u64 = 10;

/// The longest worker id or host name a Hello may carry. A worker's default id is its host
/// name (at most 64 bytes on Linux) and its process id, far under this.
pub const MAX_ID_BYTES: usize = 128;

/// At most this many characters of a peer's text reach a log line (`loggable`).
pub const LOGGABLE_CHARS: usize = 64;

/// A failure reason may hold peer text (a worker's own `Failed` message): logged this long.
const LOGGABLE_REASON_CHARS: usize = 256;

/// The gRPC method whose first messages come before authentication: the Hello and the answer
/// to the token challenge. Everything after them is sealed with the session's keys.
pub const JOIN_PATH: &str = "/llm_replay.v1.Coordinator/Join";

/// How many messages of a Join stream are limited: the Hello and the challenge's answer.
pub const JOIN_PRE_AUTH_MESSAGES: u32 = 2;

/// The slice request: its proof is checked only once tonic has decoded the whole request.
pub const EXCHANGES_PATH: &str = "/llm_replay.v1.Coordinator/Exchanges";

/// What a handshake about to start should do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Admission {
    /// Wait this long (zero for a peer without recent failures), then run the handshake.
    Proceed(Duration),
    /// Do not run it: answer `Refused` with this reason and close the stream. Already logged
    /// (thinned) by the gate.
    Refuse(String),
}

/// Spaces out token handshakes per peer while that peer's handshakes fail. Keyed by the
/// peer's address (an IPv6 peer by its /64, which one host usually holds whole; an IPv4
/// peer seen on a dual-stack socket as `::ffff:a.b.c.d` by its IPv4 address; an unknown
/// address is a bucket of its own), so a worker dialing from another address never queues
/// behind someone else's failures. A peer without a failure in the last
/// `FAILED_HANDSHAKE_MEMORY` never waits, and a successful handshake clears its record.
#[derive(Default)]
pub struct PeerGate {
    peers: Mutex<HashMap<PeerKey, PeerRecord>>,
}

/// Who a record belongs to: see `PeerGate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerKey(Option<IpAddr>);

/// One peer's recent failures.
#[derive(Debug, Clone, Copy)]
struct PeerRecord {
    /// Failed handshakes since the record was made (it is dropped when forgotten).
    failures: u64,
    /// Handshakes refused for a queue too long.
    refusals: u64,
    last_failure: Instant,
    /// When this peer's next handshake may start: each admitted one books the slot after it.
    next_slot: Instant,
}

impl PeerKey {
    fn of(peer: Option<IpAddr>) -> PeerKey {
        PeerKey(peer.map(|ip| match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !(u128::from(u64::MAX));
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        }))
    }
}

impl PeerRecord {
    fn new(now: Instant) -> PeerRecord {
        PeerRecord {
            failures: 0,
            refusals: 0,
            last_failure: now,
            next_slot: now,
        }
    }

    fn forgotten(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_failure) >= FAILED_HANDSHAKE_MEMORY
    }
}

/// How far apart a peer's handshakes start once it has failed `failures` times.
fn spacing(failures: u64) -> Duration {
    let doublings = (failures.saturating_sub(1) / FAILURES_PER_DOUBLING)
        .min(u64::from(MAX_SPACING_DOUBLINGS)) as u32;
    FAILED_HANDSHAKE_SPACING * (1u32 << doublings)
}

/// The 10th, then the 16th, 32nd, 64th...: one line per doubling, never one per event.
fn worth_a_warning(count: u64) -> bool {
    count == WARN_AFTER || (count > WARN_AFTER && count.is_power_of_two())
}

/// A peer's address as logs show it.
struct ShownPeer(Option<IpAddr>);

impl fmt::Display for ShownPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ip) => write!(f, "{}", ip.to_canonical()),
            None => f.write_str("an unknown address"),
        }
    }
}

impl PeerGate {
    /// Whether a handshake from `peer` may start, and after how long.
    pub fn admit(&self, peer: Option<IpAddr>) -> Admission {
        self.admit_at(peer, Instant::now())
    }

    /// A handshake from `peer` failed (wrong confirmation, none, or no key exchange at all).
    /// `worker_id` and `reason` may hold peer text: only a bounded, escaped part is logged.
    pub fn failed(&self, peer: Option<IpAddr>, worker_id: &str, reason: &str) {
        self.failed_at(peer, worker_id, reason, Instant::now());
    }

    /// A handshake from `peer` succeeded: it holds the token, its past failures are forgiven.
    pub fn succeeded(&self, peer: Option<IpAddr>) {
        self.lock().remove(&PeerKey::of(peer));
    }

    /// How many peers the gate remembers (bounded by `MAX_TRACKED_PEERS`).
    #[cfg(test)]
    pub fn tracked_peers(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PeerKey, PeerRecord>> {
        // A panic under this lock would leave a map of plain numbers, still consistent.
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn admit_at(&self, peer: Option<IpAddr>, now: Instant) -> Admission {
        let key = PeerKey::of(peer);
        let mut peers = self.lock();
        let Some(record) = peers.get_mut(&key) else {
            return Admission::Proceed(Duration::ZERO);
        };
        if record.forgotten(now) {
            peers.remove(&key);
            return Admission::Proceed(Duration::ZERO);
        }
        let slot = record.next_slot.max(now);
        let wait = slot - now;
        if wait > MAX_BOOKED_WAIT {
            record.refusals += 1;
            let (failures, refusals) = (record.failures, record.refusals);
            drop(peers);
            if worth_a_warning(refusals) {
                tracing::warn!(
                    peer = %ShownPeer(peer),
                    failures,
                    refusals,
                    "refusing token handshakes from this address at once: it failed too many of them, and its next turn is more than {MAX_BOOKED_WAIT:?} away"
                );
            }
            return Admission::Refuse(format!(
                "too many failed token handshakes from this address (wrong or missing token?): try again in {:.1} s",
                wait.as_secs_f64()
            ));
        }
        record.next_slot = slot + spacing(record.failures);
        Admission::Proceed(wait)
    }

    fn failed_at(&self, peer: Option<IpAddr>, worker_id: &str, reason: &str, now: Instant) {
        let key = PeerKey::of(peer);
        let mut peers = self.lock();
        if !peers.contains_key(&key) {
            make_room(&mut peers, now);
        }
        let record = peers.entry(key).or_insert_with(|| PeerRecord::new(now));
        if record.forgotten(now) {
            *record = PeerRecord::new(now);
        }
        record.failures += 1;
        record.last_failure = now;
        record.next_slot = record.next_slot.max(now + spacing(record.failures));
        let failures = record.failures;
        drop(peers);
        if failures == 1 {
            tracing::warn!(
                peer = %ShownPeer(peer),
                worker = %loggable(worker_id),
                reason = %cut_and_escape(reason, LOGGABLE_REASON_CHARS),
                "refused a worker: its token handshake failed (this address's next failures are logged at the {WARN_AFTER}th and then at powers of two)"
            );
        } else if worth_a_warning(failures) {
            tracing::warn!(
                peer = %ShownPeer(peer),
                failures,
                worker = %loggable(worker_id),
                reason = %cut_and_escape(reason, LOGGABLE_REASON_CHARS),
                "token handshakes from this address keep failing: a worker with a wrong token, or someone guessing it (its handshakes now start {:?} apart; other addresses are not slowed)",
                spacing(failures)
            );
        }
    }
}

/// Room for one more record: forgotten records go first, then, if the map is still full, the
/// `EVICTED_AT_ONCE` stalest (their peers lose their spacing; only a flood of addresses gets
/// here, and each of those addresses still gets one guess per handshake).
fn make_room(peers: &mut HashMap<PeerKey, PeerRecord>, now: Instant) {
    if peers.len() < MAX_TRACKED_PEERS {
        return;
    }
    peers.retain(|_, record| !record.forgotten(now));
    if peers.len() < MAX_TRACKED_PEERS {
        return;
    }
    let mut by_age: Vec<(Instant, PeerKey)> = peers
        .iter()
        .map(|(key, record)| (record.last_failure, *key))
        .collect();
    let evicted = EVICTED_AT_ONCE.min(by_age.len());
    if evicted == 0 {
        return;
    }
    by_age.select_nth_unstable_by_key(evicted - 1, |(at, _)| *at);
    for (_, key) in &by_age[..evicted] {
        peers.remove(key);
    }
}

/// Checks the fields of a Hello before anything else reads them: the worker id is used as a
/// key, shown in the report and logged; the host is shown. Each must be 1 (the id; the host
/// may be empty) to `MAX_ID_BYTES` bytes (control characters are shown escaped wherever a
/// field is shown, never refused: an id is the worker's to choose). The error names the
/// field and its length and shows at most a `loggable` part of it.
pub fn check_hello_fields(worker_id: &str, host: &str) -> Result<(), String> {
    if worker_id.is_empty() {
        return Err("worker_id is empty".to_owned());
    }
    check_field("worker_id", worker_id)?;
    check_field("host", host)
}

fn check_field(field: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_ID_BYTES {
        return Err(format!(
            "{field} is {} bytes, more than the {MAX_ID_BYTES} allowed (it begins {})",
            value.len(),
            loggable(value)
        ));
    }
    // Control characters are allowed (an id is the worker's to choose): every place that
    // shows one escapes it (`common::text`, `loggable`).
    Ok(())
}

/// A peer's text as a log line may show it: at most `LOGGABLE_CHARS` characters, an ellipsis
/// included when the text was cut, every control character and bidirectional override shown
/// as an escape (`common::text`). Reads no further into `text` than it shows, so a 30 MB id
/// costs what a short one does.
pub fn loggable(text: &str) -> String {
    cut_and_escape(text, LOGGABLE_CHARS)
}

fn cut_and_escape(text: &str, max_chars: usize) -> String {
    const ELLIPSIS: char = '…';
    let mut out = String::with_capacity(max_chars.min(text.len()) + 4);
    let mut shown = 0usize;
    let mut buffer = [0u8; 4];
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let escaped = common::text::escape_controls(c.encode_utf8(&mut buffer));
        let width = escaped.chars().count();
        // Room for this character, and for the ellipsis if anything follows it.
        let room = if chars.as_str().is_empty() {
            max_chars
        } else {
            max_chars.saturating_sub(1)
        };
        if shown + width > room {
            out.push(ELLIPSIS);
            return out;
        }
        out.push_str(&escaped);
        shown += width;
    }
    out
}

/// A tower layer for the coordinator's gRPC server that bounds every message a peer sends
/// before it is authenticated, on the HTTP body itself: tonic reads a message's 5-byte header
/// (compressed flag, 4-byte big-endian length) and then buffers the whole message before its
/// own size check or any service code runs, so without this a peer without the token makes the
/// coordinator hold `max_decoding_message_size` per stream. The layer reads the same framing
/// as the bytes go by (counting, never copying) and fails the body as soon as a limited
/// message's header declares more than the limit; tonic then ends the call with that status.
///
/// Limited: the first `JOIN_PRE_AUTH_MESSAGES` messages of `JOIN_PATH` (the Hello and the
/// challenge's answer; later ones are sealed, under the service's own size limit), and every
/// message of `EXCHANGES_PATH` (a unary request: tonic decodes every message of that body,
/// to reach its trailers, before the service checks the slice proof). Other paths pass
/// untouched. The limit is on the wire length: the coordinator accepts no compressed message.
#[derive(Debug, Clone, Copy)]
pub struct PreAuthLimitLayer {
    limit: u32,
}

impl PreAuthLimitLayer {
    /// Messages sent before authentication may be at most `limit` bytes each.
    pub fn new(limit: usize) -> PreAuthLimitLayer {
        PreAuthLimitLayer {
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        }
    }
}

impl<S> tower_layer::Layer<S> for PreAuthLimitLayer {
    type Service = PreAuthLimit<S>;

    fn layer(&self, inner: S) -> PreAuthLimit<S> {
        PreAuthLimit {
            inner,
            limit: self.limit,
        }
    }
}

/// The service `PreAuthLimitLayer` makes: wraps the request body of the limited paths.
#[derive(Debug, Clone)]
pub struct PreAuthLimit<S> {
    inner: S,
    limit: u32,
}

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for PreAuthLimit<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let limited = match request.uri().path() {
            JOIN_PATH => Some((JOIN_PATH, Limited::First(JOIN_PRE_AUTH_MESSAGES))),
            EXCHANGES_PATH => Some((EXCHANGES_PATH, Limited::All)),
            _ => None,
        };
        let request = match limited {
            // One box per call (tonic's body type), none per frame.
            Some((path, messages)) => request.map(|body| {
                tonic::body::Body::new(PreAuthBody::new(body, path, self.limit, messages))
            }),
            None => request,
        };
        self.inner.call(request)
    }
}

/// Which messages of a body are limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// The first N.
    First(u32),
    /// Every one.
    All,
}

/// A request body whose limited gRPC messages are at most `limit` bytes: fails with
/// `RESOURCE_EXHAUSTED` at the header of the first one that declares more, before any of its
/// bytes are passed on. Generic over the inner body for its tests; tonic's is `Unpin`.
pub struct PreAuthBody<B> {
    inner: B,
    framing: Framing,
    path: &'static str,
    /// Set once the body failed: every later poll fails the same way.
    refused: Option<TooLarge>,
}

impl<B> PreAuthBody<B> {
    pub fn new(inner: B, path: &'static str, limit: u32, limited: Limited) -> PreAuthBody<B> {
        PreAuthBody {
            inner,
            framing: Framing::new(limit, limited),
            path,
            refused: None,
        }
    }

    fn status(&self, too_large: TooLarge) -> Status {
        Status::resource_exhausted(format!(
            "message {} of {} is {} bytes; before authentication a peer may send at most {} bytes a message",
            too_large.message, self.path, too_large.length, self.framing.limit
        ))
    }
}

impl<B> Body for PreAuthBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(too_large) = this.refused {
            return Poll::Ready(Some(Err(this.status(too_large))));
        }
        let frame = match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            // A tonic body's error is a Status already: `from_error` hands it back unchanged.
            Some(Err(error)) => return Poll::Ready(Some(Err(Status::from_error(error.into())))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(too_large) = this.framing.scan(data)
        {
            this.refused = Some(too_large);
            return Poll::Ready(Some(Err(this.status(too_large))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.refused.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A limited message that declared more than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    /// 1 for the body's first message.
    pub message: u32,
    /// Its declared length.
    pub length: u32,
}

/// Where the reader is in gRPC's length-prefixed framing, across any split of the body into
/// frames. Keeps five header bytes at most, never a message's.
#[derive(Debug, Clone)]
struct Framing {
    limit: u32,
    limited: Limited,
    /// Messages whose header was read.
    seen: u32,
    state: FramingState,
}

#[derive(Debug, Clone, Copy)]
enum FramingState {
    Header {
        have: usize,
        bytes: [u8; 5],
    },
    Message {
        left: u32,
    },
    /// Every limited message passed: the rest is not read.
    Unlimited,
}

impl Framing {
    fn new(limit: u32, limited: Limited) -> Framing {
        let state = if limited == Limited::First(0) {
            FramingState::Unlimited
        } else {
            FramingState::Header {
                have: 0,
                bytes: [0; 5],
            }
        };
        Framing {
            limit,
            limited,
            seen: 0,
            state,
        }
    }

    /// Reads past `data`, the body's next bytes.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), TooLarge> {
        while !data.is_empty() {
            let mut declared = None;
            match &mut self.state {
                FramingState::Unlimited => return Ok(()),
                FramingState::Message { left } => {
                    let skipped = (*left as usize).min(data.len());
                    data = &data[skipped..];
                    *left -= skipped as u32;
                    if *left == 0 {
                        self.state = FramingState::Header {
                            have: 0,
                            bytes: [0; 5],
                        };
                    }
                }
                FramingState::Header { have, bytes } => {
                    let taken = (5 - *have).min(data.len());
                    bytes[*have..*have + taken].copy_from_slice(&data[..taken]);
                    *have += taken;
                    data = &data[taken..];
                    if *have == 5 {
                        declared =
                            Some(u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]));
                    }
                }
            }
            if let Some(length) = declared {
                self.message_header(length)?;
            }
        }
        Ok(())
    }

    /// A whole header was read: the message's declared length.
    fn message_header(&mut self, length: u32) -> Result<(), TooLarge> {
        self.seen += 1;
        if length > self.limit {
            return Err(TooLarge {
                message: self.seen,
                length,
            });
        }
        self.state = match self.limited {
            Limited::First(n) if self.seen >= n => FramingState::Unlimited,
            _ if length == 0 => FramingState::Header {
                have: 0,
                bytes: [0; 5],
            },
            _ => FramingState::Message { left: length },
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
    }

    fn waited(admission: Admission) -> Duration {
        match admission {
            Admission::Proceed(wait) => wait,
            Admission::Refuse(reason) => panic!("refused: {reason}"),
        }
    }

    #[test]
    fn one_peers_failures_never_delay_another_peer() {
        let gate = PeerGate::default();
        let now = Instant::now();
        let bad = v4(127, 0, 0, 2);
        for i in 0..200 {
            gate.failed_at(
                bad,
                "guesser",
                "wrong token",
                now + Duration::from_millis(i),
            );
            let _ = gate.admit_at(bad, now + Duration::from_millis(i));
        }
        // Another address, and the unknown-address bucket, go at once, every time.
        for peer in [v4(127, 0, 0, 1), v4(10, 1, 2, 3), None] {
            for i in 0..5 {
                assert_eq!(
                    gate.admit_at(peer, now + Duration::from_millis(200 + i)),
                    Admission::Proceed(Duration::ZERO)
                );
            }
        }
        // An unknown address's failures are its own too.
        gate.failed_at(None, "x", "wrong token", now);
        assert_eq!(
            gate.admit_at(v4(127, 0, 0, 1), now),
            Admission::Proceed(Duration::ZERO)
        );
    }

    #[test]
    fn one_peers_handshakes_are_spaced_after_a_failure_and_refused_past_a_second() {
        let gate = PeerGate::default();
        let now = Instant::now();
        let peer = v4(192, 0, 2, 7);
        assert_eq!(gate.admit_at(peer, now), Admission::Proceed(Duration::ZERO));
        gate.failed_at(peer, "w", "wrong token", now);
        // Ten handshakes at once: each starts FAILED_HANDSHAKE_SPACING after the one before,
        // the first one spacing after the failure.
        let waits: Vec<Duration> = (0..10).map(|_| waited(gate.admit_at(peer, now))).collect();
        for (i, wait) in waits.iter().enumerate() {
            assert_eq!(
                *wait,
                FAILED_HANDSHAKE_SPACING * (i as u32 + 1),
                "{waits:?}"
            );
        }
        // The next one would wait 1.1 s: refused at once, and it books nothing.
        assert!(matches!(gate.admit_at(peer, now), Admission::Refuse(_)));
        assert!(matches!(gate.admit_at(peer, now), Admission::Refuse(_)));
        // Once the queue has drained, it waits its turn again.
        let later = now + Duration::from_millis(1_050);
        assert_eq!(
            gate.admit_at(peer, later),
            Admission::Proceed(Duration::from_millis(50))
        );
        // Forgotten FAILED_HANDSHAKE_MEMORY after its last failure.
        assert_eq!(
            gate.admit_at(peer, now + FAILED_HANDSHAKE_MEMORY),
            Admission::Proceed(Duration::ZERO)
        );
        assert_eq!(gate.tracked_peers(), 0);
    }

    #[test]
    fn spacing_grows_with_repeated_failures_up_to_a_cap() {
        assert_eq!(spacing(1), FAILED_HANDSHAKE_SPACING);
        assert_eq!(spacing(10), FAILED_HANDSHAKE_SPACING);
        assert_eq!(spacing(11), FAILED_HANDSHAKE_SPACING * 2);
        assert_eq!(spacing(1_000_000), Duration::from_millis(3_200));
        let gate = PeerGate::default();
        let now = Instant::now();
        let peer = v4(192, 0, 2, 8);
        for _ in 0..100 {
            gate.failed_at(peer, "w", "wrong token", now);
        }
        // Its next turn is 3.2 s away: refused without waiting.
        assert!(matches!(gate.admit_at(peer, now), Admission::Refuse(_)));
        assert_eq!(
            gate.admit_at(peer, now + Duration::from_millis(2_500)),
            Admission::Proceed(Duration::from_millis(700))
        );
    }

    #[test]
    fn warnings_thin_out_as_failures_repeat() {
        let warned: Vec<u64> = (1..=1_000).filter(|n| worth_a_warning(*n)).collect();
        assert_eq!(warned, [10, 16, 32, 64, 128, 256, 512]);
    }

    #[test]
    fn a_success_clears_the_peers_record() {
        let gate = PeerGate::default();
        let now = Instant::now();
        let peer = v4(198, 51, 100, 1);
        gate.failed_at(peer, "w", "wrong token", now);
        assert!(!waited(gate.admit_at(peer, now)).is_zero());
        gate.succeeded(peer);
        assert_eq!(gate.admit_at(peer, now), Admission::Proceed(Duration::ZERO));
    }

    #[test]
    fn ipv6_peers_are_keyed_by_their_64_and_mapped_ipv4_by_its_address() {
        let a: IpAddr = "2001:db8:1:2::a".parse().expect("address");
        let b: IpAddr = "2001:db8:1:2:ffff::b".parse().expect("address");
        let other: IpAddr = "2001:db8:1:3::a".parse().expect("address");
        assert_eq!(PeerKey::of(Some(a)), PeerKey::of(Some(b)));
        assert_ne!(PeerKey::of(Some(a)), PeerKey::of(Some(other)));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().expect("address");
        assert_eq!(PeerKey::of(Some(mapped)), PeerKey::of(v4(192, 0, 2, 1)));
        assert_ne!(PeerKey::of(Some(mapped)), PeerKey::of(v4(192, 0, 2, 2)));
    }

    #[test]
    fn the_map_stays_bounded_under_a_flood_of_addresses() {
        let gate = PeerGate::default();
        let now = Instant::now();
        for i in 0..100_000u32 {
            let peer = Some(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
            gate.failed_at(
                peer,
                "w",
                "wrong token",
                now + Duration::from_micros(u64::from(i)),
            );
            assert!(gate.tracked_peers() <= MAX_TRACKED_PEERS);
        }
        assert!(gate.tracked_peers() > MAX_TRACKED_PEERS / 2);
        // The stalest went first: the last peer is still remembered.
        let last = Some(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + 99_999)));
        assert!(!waited(gate.admit_at(last, now + Duration::from_millis(100))).is_zero());
    }

    #[test]
    fn hello_fields_are_bounded_and_errors_never_echo_them_whole() {
        assert!(check_hello_fields("worker-1", "host-a").is_ok());
        assert!(check_hello_fields("w", "").is_ok());
        assert!(check_hello_fields(&"x".repeat(MAX_ID_BYTES), &"h".repeat(MAX_ID_BYTES)).is_ok());
        let empty = check_hello_fields("", "host").expect_err("empty id");
        assert!(empty.contains("worker_id"), "{empty}");
        let huge = "y".repeat(30_000_000);
        let long = check_hello_fields(&huge, "host").expect_err("long id");
        assert!(
            long.contains("worker_id") && long.contains("30000000 bytes") && long.len() < 300,
            "{long}"
        );
        let long_host = check_hello_fields("w", &"h".repeat(129)).expect_err("long host");
        assert!(long_host.starts_with("host is 129 bytes"), "{long_host}");
        // Control characters are the worker's to choose: shown escaped wherever shown.
        assert!(check_hello_fields("w\u{1b}[2J", "a\u{202e}b").is_ok());
        let long_control = check_hello_fields(&"\u{1b}".repeat(200), "host").expect_err("long");
        assert!(!long_control.contains('\u{1b}'), "{long_control}");
    }

    #[test]
    fn loggable_cuts_on_char_boundaries_and_shows_controls() {
        assert_eq!(loggable("worker-1"), "worker-1");
        let exact = "a".repeat(LOGGABLE_CHARS);
        assert_eq!(loggable(&exact), exact);
        let cut = loggable(&"é".repeat(1_000));
        assert_eq!(cut.chars().count(), LOGGABLE_CHARS);
        assert!(cut.ends_with('…') && cut.starts_with("éé"), "{cut}");
        let cut = loggable(&"東".repeat(30_000_000 / 3));
        assert_eq!(cut.chars().count(), LOGGABLE_CHARS);
        let shown = loggable("a\u{1b}]0;x\u{7}\nb");
        assert_eq!(shown, "a\\x1b]0;x\\x07\\x0ab");
        // An escape is never split: the text is cut before it.
        let text = format!("{}\u{1b}zzz", "a".repeat(LOGGABLE_CHARS - 3));
        let shown = loggable(&text);
        assert_eq!(shown, format!("{}…", "a".repeat(LOGGABLE_CHARS - 3)));
        assert!(loggable(&"\u{7}".repeat(1_000)).chars().count() <= LOGGABLE_CHARS);
        assert_eq!(loggable(""), "");
    }

    /// gRPC framing of messages of these lengths (payload bytes = the message's index).
    fn framed(lengths: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, length) in lengths.iter().enumerate() {
            out.push(0);
            out.extend_from_slice(&length.to_be_bytes());
            out.extend(std::iter::repeat_n(i as u8, *length as usize));
        }
        out
    }

    /// Feeds `bytes` to a framing reader in pieces of `piece` bytes.
    fn scan_in_pieces(bytes: &[u8], piece: usize, limited: Limited) -> Result<(), TooLarge> {
        let mut framing = Framing::new(100, limited);
        for chunk in bytes.chunks(piece) {
            framing.scan(chunk)?;
        }
        Ok(())
    }

    #[test]
    fn framing_is_read_across_every_split() {
        let join_ok = framed(&[100, 0, 5_000, 7]);
        let join_big_second = framed(&[10, 101]);
        let all_ok = framed(&[100, 100, 3]);
        let all_big_third = framed(&[1, 2, 5_000]);
        for piece in 1..=join_ok.len() {
            assert_eq!(scan_in_pieces(&join_ok, piece, Limited::First(2)), Ok(()));
            assert_eq!(
                scan_in_pieces(&join_big_second, piece, Limited::First(2)),
                Err(TooLarge {
                    message: 2,
                    length: 101
                })
            );
            assert_eq!(scan_in_pieces(&all_ok, piece, Limited::All), Ok(()));
            assert_eq!(
                scan_in_pieces(&all_big_third, piece, Limited::All),
                Err(TooLarge {
                    message: 3,
                    length: 5_000
                })
            );
            // The third message of a Join stream is not limited; a unary body's is.
            assert_eq!(
                scan_in_pieces(&all_big_third, piece, Limited::First(2)),
                Ok(())
            );
        }
    }

    mod bodies {
        use super::*;
        use http_body_util::{BodyExt, StreamBody};
        use std::convert::Infallible;

        type Frames = Vec<Result<Frame<Bytes>, Infallible>>;

        fn frames_of(bytes: &[u8], piece: usize) -> Frames {
            bytes
                .chunks(piece)
                .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
                .collect()
        }

        async fn drain<B>(mut body: PreAuthBody<B>) -> Result<usize, Status>
        where
            B: Body<Data = Bytes> + Unpin,
            B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        {
            let mut passed = 0;
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    passed += data.len();
                }
            }
            Ok(passed)
        }

        #[tokio::test]
        async fn a_body_passes_every_byte_or_fails_at_the_oversized_header() {
            let good = framed(&[1_000, 60, 200_000]);
            let bad = framed(&[8_192, 8_193]);
            for piece in [1, 2, 3, 4, 5, 6, 7, 1_000, 1_005, 8_197, 1 << 20] {
                let body = StreamBody::new(tokio_stream::iter(frames_of(&good, piece)));
                let body = PreAuthBody::new(body, JOIN_PATH, 8_192, Limited::First(2));
                assert_eq!(drain(body).await.expect("passes"), good.len());
                let body = StreamBody::new(tokio_stream::iter(frames_of(&bad, piece)));
                let body = PreAuthBody::new(body, JOIN_PATH, 8_192, Limited::First(2));
                let status = drain(body).await.expect_err("refused");
                assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                assert!(
                    status.message().contains("message 2")
                        && status.message().contains("8193 bytes"),
                    "{}",
                    status.message()
                );
            }
        }

        #[tokio::test]
        async fn an_oversized_header_fails_at_once_without_waiting_for_the_message() {
            // A header declaring 30 MB, then a body that never sends its bytes: the error
            // comes on the frame holding the header, before anything of the message is read.
            let mut header = vec![0u8];
            header.extend_from_slice(&30_000_000u32.to_be_bytes());
            let frames = tokio_stream::StreamExt::chain(
                tokio_stream::iter(frames_of(&header, 2)),
                tokio_stream::pending::<Result<Frame<Bytes>, Infallible>>(),
            );
            let mut body = PreAuthBody::new(
                StreamBody::new(Box::pin(frames)),
                EXCHANGES_PATH,
                8_192,
                Limited::All,
            );
            let mut passed = 0;
            let status = loop {
                let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
                    .await
                    .expect("answers without more of the body")
                    .expect("a frame or the error");
                match frame {
                    Ok(frame) => passed += frame.data_ref().map_or(0, Bytes::len),
                    Err(status) => break status,
                }
            };
            // The first frames (4 bytes of the header) passed; the one completing it did not.
            assert_eq!(passed, 4);
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert!(status.message().contains(EXCHANGES_PATH));
            // And it stays failed.
            let again = body.frame().await.expect("still an item");
            assert!(again.is_err());
        }
    }

    /// A real tonic server on 127.0.0.1:0 behind the layer, with a service that reads its
    /// Join stream and says what it got.
    mod server {
        use super::*;
        use proto::v1;
        use proto::v1::coordinator_client::CoordinatorClient;
        use proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
        use tokio::sync::mpsc;
        use tokio_stream::wrappers::ReceiverStream;

        type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

        /// Reads up to three messages of a Join stream; answers with a Refused message whose
        /// reason lists the sizes read, or fails with the stream's error.
        struct Reader;

        #[tonic::async_trait]
        impl Coordinator for Reader {
            type JoinStream = Stream<v1::CoordinatorMessage>;
            type ExchangesStream = Stream<v1::ExchangeChunk>;

            async fn join(
                &self,
                request: tonic::Request<tonic::Streaming<v1::WorkerMessage>>,
            ) -> Result<tonic::Response<Self::JoinStream>, Status> {
                let mut inbound = request.into_inner();
                let mut sizes = Vec::new();
                while sizes.len() < 3 {
                    match inbound.message().await? {
                        Some(v1::WorkerMessage { msg }) => sizes.push(match msg {
                            Some(v1::worker_message::Msg::Hello(hello)) => hello.worker_id.len(),
                            Some(v1::worker_message::Msg::Failed(failed)) => failed.reason.len(),
                            _ => 0,
                        }),
                        None => break,
                    }
                }
                let (tx, rx) = mpsc::channel(1);
                let reason = format!("{sizes:?}");
                let _ = tx.try_send(Ok(v1::CoordinatorMessage {
                    msg: Some(v1::coordinator_message::Msg::Refused(v1::Refused {
                        reason,
                    })),
                }));
                Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
            }

            async fn exchanges(
                &self,
                _request: tonic::Request<v1::SliceRequest>,
            ) -> Result<tonic::Response<Self::ExchangesStream>, Status> {
                let (_tx, rx) = mpsc::channel(1);
                Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
            }
        }

        fn hello(id_bytes: usize) -> v1::WorkerMessage {
            v1::WorkerMessage {
                msg: Some(v1::worker_message::Msg::Hello(v1::Hello {
                    protocol_version: proto::PROTOCOL_VERSION,
                    worker_id: "w".repeat(id_bytes),
                    host: "h".into(),
                    ..Default::default()
                })),
            }
        }

        fn failed_padded(bytes: usize) -> v1::WorkerMessage {
            v1::WorkerMessage {
                msg: Some(v1::worker_message::Msg::Failed(v1::WorkerFailed {
                    reason: "r".repeat(bytes),
                })),
            }
        }

        async fn join(
            client: &mut CoordinatorClient<tonic::transport::Channel>,
            messages: Vec<v1::WorkerMessage>,
        ) -> Result<String, Status> {
            let mut inbound = client
                .join(tokio_stream::iter(messages))
                .await?
                .into_inner();
            match inbound.message().await? {
                Some(v1::CoordinatorMessage {
                    msg: Some(v1::coordinator_message::Msg::Refused(refused)),
                }) => Ok(refused.reason),
                other => panic!("unexpected answer {other:?}"),
            }
        }

        #[tokio::test]
        async fn a_real_server_refuses_oversized_pre_auth_messages_and_passes_the_rest() {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let server = tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(PreAuthLimitLayer::new(8 * 1024))
                    .add_service(CoordinatorServer::new(Reader).max_decoding_message_size(64 << 20))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
            );
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            let mut client = CoordinatorClient::new(channel);

            // A 1 KB Hello, a small second message and a 100 KB third one: all read.
            let sizes = join(
                &mut client,
                vec![hello(1_000), failed_padded(10), failed_padded(100_000)],
            )
            .await
            .expect("passes");
            assert_eq!(sizes, "[1000, 10, 100000]");

            // A 30 MB Hello: the call fails with the layer's status.
            let status = join(&mut client, vec![hello(30_000_000)])
                .await
                .expect_err("refused");
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
            assert!(status.message().contains("message 1"), "{status:?}");

            // A 100 KB second message (where the challenge's answer goes) fails too.
            let status = join(&mut client, vec![hello(10), failed_padded(100_000)])
                .await
                .expect_err("refused");
            assert!(status.message().contains("message 2"), "{status:?}");

            // A slice request over the limit never reaches the service.
            let status = client
                .exchanges(v1::SliceRequest {
                    run_id: "r".into(),
                    worker_id: "w".repeat(100_000),
                    token: String::new(),
                })
                .await
                .expect_err("refused");
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");

            // The connection is still good for an honest call.
            let sizes = join(&mut client, vec![hello(20)]).await.expect("passes");
            assert_eq!(sizes, "[20]");
            server.abort();
        }
    }
}
