//! The replay engine: a scheduler that decides when each exchange is sent, and one stream task
//! per request that stamps every network read with a monotonic clock before parsing it.
//!
//! The scheduler pulls work items from a bounded channel (the worker's slice arrives while the
//! run goes on, so memory stays bounded whatever the recording's size), waits for the item's
//! intended send time (recorded schedule or open-loop rate) and/or a concurrency permit
//! (closed loop), and spawns the stream task. Exchanges of one session are chained: a turn
//! starts only after the previous turn of its session has finished. With closed sessions
//! (`--session-mode closed`) a turn goes out at the previous turn's replayed end plus its
//! recorded think time: every turn of a session is handed to its task when the session starts,
//! and the task waits for the previous turn's end.
//!
//! Nothing the client can do ahead sits between an intended send time and the write: the
//! connections the first wave needs are opened before the start instant
//! ([`connections_needed`], [`TargetClient::preconnect`]) and timed apart, each request is
//! built when its item arrives ([`prepare`]), and send times come from the pacer thread
//! ([`common::pacer`], sub-millisecond) rather than tokio's millisecond timer.
//!
//! Exchanges handed over from a lost worker keep their recorded pace on a recorded schedule:
//! late ones are delayed together rather than sent at once ([`hand_over`]).
//!
//! Asked for steady metrics, it marks each request *steady* ([`is_steady`]) for the metrics
//! actor: sent at or after the instant the load reached its target, and, in an unpaced
//! closed loop, not one of the first `concurrency` requests (the first wave, sent together
//! at the start).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::formats::{self, Family};
use common::measure::{
    CancelCause, FailureKind, OutcomeKind, RequestOutcome, StreamMeter, measure_unstreamed,
};
use common::metrics::{HttpProtocol, MAX_ERROR_BODY_KEPT, SliceTotals, error_message};
use common::pacer::{Pacer, PacerThread};
use rand::{Rng, SeedableRng};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::client::{SendFailure, TargetClient};
use crate::config::{Arrival, ReplayConfig, Schedule, WorkItem};
use crate::metrics_actor::{Finished, MetricsHandle, RecordMeta};
use crate::request::{PreparedRequest, prepare};

pub mod claims;
mod hand_over;

pub use hand_over::{HandOverCounters, HandOverSpan};
use hand_over::{HandOverMark, HandOvers};

/// The instant the run starts, in both clocks.
#[derive(Debug, Clone, Copy)]
pub struct StartAt {
    pub instant: Instant,
}

/// The engine's one book of its slice's counts: atomics it updates as it sends, which the
/// link reads for each interval report and [`replay`] returns as its final [`SliceTotals`]
/// ([`LiveCounters::totals`]).
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Requests sent so far (warm-up included), in slice order.
    pub issued: AtomicU64,
    /// Exchanges received but not sent (duration reached, abort), so far.
    pub not_started: AtomicU64,
    /// Requests in flight when an abort cancelled them.
    pub lost: AtomicU64,
    /// Wall-clock instant the load actually started (Unix ns), 0 before.
    pub started_unix_ns: AtomicU64,
    /// Exchanges sent late because they arrived outside the reorder window, so far.
    pub sent_out_of_order: AtomicU64,
    /// Wall-clock instant the load reached its target (Unix µs), 0 before: the start on a
    /// schedule or rate, the moment every concurrency slot was first taken in a closed loop.
    pub target_reached_unix_us: AtomicU64,
    /// What was sent of the exchanges handed over from lost workers: read
    /// [`HandOverCounters::span`].
    pub hand_over: HandOverCounters,
}

impl LiveCounters {
    /// The slice's counts so far; final once [`replay`] returned.
    pub fn totals(&self) -> SliceTotals {
        SliceTotals {
            issued: self.issued.load(Ordering::Relaxed),
            not_started: self.not_started.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            sent_out_of_order: self.sent_out_of_order.load(Ordering::Relaxed),
        }
    }

    fn not_started(&self, count: u64) {
        self.not_started.fetch_add(count, Ordering::Relaxed);
    }
}

/// What the load model alone says goes out at once: a closed loop's concurrency, an open
/// loop's rate over a quarter second.
fn first_claim(load: &crate::config::LoadModel) -> u64 {
    let by_rate = load.rate.map_or(0, |rate| (rate * 0.25).ceil() as u64);
    (load.concurrency.unwrap_or(0) as u64).max(by_rate)
}

/// Wait until `at` precisely: the pacer thread sleeps on a futex with a nanosecond timeout
/// (tokio's timer rounds up to the next millisecond) and wakes this task [`WAKE_MARGIN`]
/// early; the task then yields to the runtime until `at`. Waking a parked runtime thread
/// takes the OS 0.1–0.3 ms on a VM, which the margin absorbs; yielding (not spinning on the
/// thread) lets the streams in flight keep their timestamps, and bounds the busy time to
/// the margin per send rather than a spinning core, which would steal the cores other
/// workers on the same host need to send on time. Should the pacer be gone, tokio's timer
/// stands in.
async fn pace_until(pacer: Option<&Pacer>, at: Instant) {
    let early = at.checked_sub(WAKE_MARGIN).unwrap_or(at);
    if Instant::now() < early {
        let paced = match pacer {
            Some(pacer) => pacer.sleep_until(early).await,
            None => false,
        };
        if !paced {
            tokio::time::sleep_until(at.into()).await;
            return;
        }
    }
    while Instant::now() < at {
        tokio::task::yield_now().await;
    }
}

/// How early the pacer wakes a send (see [`pace_until`]).
const WAKE_MARGIN: Duration = Duration::from_micros(250);

/// On a recorded schedule, the first wave's connections open at the latest this long before
/// the start (earlier when the read-ahead is full or the slice is all there).
const PRECONNECT_LEAD: Duration = Duration::from_millis(200);

/// Items read ahead (each request built) between two looks at the start instant.
const READ_AHEAD_BATCH: usize = 64;

/// How far ahead of the start the first wave is counted on a schedule or a rate.
const FIRST_WAVE: Duration = Duration::from_secs(1);

/// At most this many connections are opened before the start when the number is an
/// estimate (a schedule or a rate); a closed loop opens its concurrency, up to the pool's
/// idle limit.
pub const MAX_ESTIMATED_CONNECTIONS: usize = 256;

/// Most connections opened before the start in any mode (the pool keeps 4,096 idle).
pub const MAX_PRECONNECT: usize = 4096;

/// How many connections to open before the start: a closed loop's concurrency; on a rate,
/// the requests of the first second; on a recorded schedule, the exchanges (read so far)
/// due in the first second of sending (`offsets_s`: their send offsets, seconds) — each
/// bounded by a concurrency cap when there is one. The estimate assumes a first answer
/// within a second; later connections open on demand and are still measured apart from
/// TTFT.
pub fn connections_needed(load: &crate::config::LoadModel, offsets_s: &[f64]) -> usize {
    let estimate = match (load.schedule, load.rate, load.concurrency) {
        (_, Some(rate), _) => (rate * FIRST_WAVE.as_secs_f64()).ceil().max(1.0) as usize,
        (Schedule::Recorded { .. }, None, _) => {
            let first = offsets_s.iter().copied().fold(f64::INFINITY, f64::min);
            offsets_s
                .iter()
                .filter(|s| **s - first <= FIRST_WAVE.as_secs_f64())
                .count()
                .max(1)
        }
        (Schedule::Asap, None, Some(concurrency)) => return concurrency.clamp(1, MAX_PRECONNECT),
        (Schedule::Asap, None, None) => 1,
    };
    let estimate = estimate.min(MAX_ESTIMATED_CONNECTIONS);
    match load.concurrency {
        Some(cap) => estimate.min(cap.max(1)),
        None => estimate,
    }
}

/// Most of an error body read (to reuse the connection); a longer one is cut off.
pub const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// Most of a one-body (non-streamed) answer kept to read its usage (16 MiB).
pub const MAX_UNSTREAMED_BODY_BYTES: usize = 16 << 20;

/// Everything one replay of a slice needs.
pub struct EngineRun {
    pub config: Arc<ReplayConfig>,
    pub client: TargetClient,
    /// The slice, as it arrives.
    pub items: mpsc::Receiver<WorkItem>,
    pub start: StartAt,
    pub metrics: MetricsHandle,
    /// Turns true to stop at once.
    pub abort: watch::Receiver<bool>,
    /// The items loop until the duration ends.
    pub open_ended: bool,
    pub counters: Arc<LiveCounters>,
    /// Linked to a coordinator (protocol 5): an own exchange starts only once granted
    /// ([`claims`]); `None` runs ungated.
    pub claims: Option<Arc<claims::ClaimLink>>,
}

/// Where the scheduler takes its next item from.
///
/// On a recorded schedule the items go out in `at_ms` order whatever their order in the file
/// (the recording proxy writes an exchange when it *completes*, so a long stream started
/// early comes after short ones started later): up to `window` items are read ahead into a
/// min-heap and the earliest is sent when its time comes. An item that arrives after a
/// later-scheduled one was already sent (it was further out of order than the window) is sent
/// at once, late, and counted; nothing is dropped. An item handed over from a lost worker is
/// placed by [`HandOvers::place`] (its recorded offset plus the hand-over's delay) and is
/// never out of order. In the other modes items go out in order.
struct Feed {
    items: mpsc::Receiver<WorkItem>,
    /// Read-ahead on a recorded schedule: `Reverse((due, arrival seq))` orders earliest first,
    /// ties in file order.
    pending: BinaryHeap<Reverse<Pending>>,
    window: usize,
    closed: bool,
    arrivals: u64,
    /// Latest recorded offset of this worker's own exchanges sent so far (ms).
    latest_sent_ms: f64,
    /// Items sent after a later-scheduled one.
    sent_out_of_order: u64,
    /// Closed sessions: each session's first recorded offset, so its later turns are handed
    /// out with it (their tasks then wait for the previous turn's end and the think time).
    session_starts: Option<HashMap<String, f64>>,
    /// Builds each item's request as it arrives.
    config: Arc<ReplayConfig>,
    /// The replay's start and speed: the recorded clock handed-over items are placed on.
    start: Instant,
    speed: f64,
    /// The delay of handed-over items, and what was sent of each hand-over.
    hand_overs: HandOvers,
    /// Own exchanges arrived so far: the next one's ordinal (what claims count).
    own_arrivals: u64,
    /// Claims and grants, when linked to a coordinator.
    gate: Option<claims::Gate>,
}

struct Pending {
    /// When it is due on the recorded clock (ms after the start × speed): its recorded
    /// offset, a closed session's start, or a handed-over item's place.
    due_ms: f64,
    arrival: u64,
    item: Arrived,
}

/// An item as the scheduler holds it: with its request already built.
struct Arrived {
    item: Sendable,
    request: PreparedRequest,
    /// Handed over from a lost worker: its lateness and order are not this worker's, and its
    /// send is counted with its hand-over.
    hand_over: Option<HandOverMark>,
    /// Its ordinal among this worker's own exchanges (claims count them); `None` for a
    /// handed-over one.
    own: Option<u64>,
}

/// What a request's task keeps of its work item once the request is built: the recorded
/// exchange itself (headers, unknown fields) is dropped, so an open stream holds only this.
struct Sendable {
    index: u64,
    id: Option<String>,
    session: Option<String>,
    /// The recorded path, which with the response decides the family.
    path: String,
    think: Option<Duration>,
    pin_output_tokens: Option<u64>,
    pin_in_frames: bool,
    /// Cancel the request this long after its t0: recorded (the production client left), or
    /// drawn by `--cancel-rate`.
    cancel: Option<Cancel>,
}

/// A cancellation planned for a request: when (after its t0) and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cancel {
    pub after: Duration,
    pub cause: CancelCause,
}

impl Cancel {
    /// The cancellation of exchange `index`: the recorded one (`recorded`, the production
    /// client's hang-up) wins over one drawn by `--cancel-rate`.
    pub fn plan(config: &ReplayConfig, index: u64, recorded: Option<Duration>) -> Option<Cancel> {
        match recorded {
            Some(after) => Some(Cancel {
                after,
                cause: CancelCause::AsRecorded,
            }),
            None => {
                let cancel = &config.options.cancel;
                cancel.draws(index).then_some(Cancel {
                    after: cancel.after,
                    cause: CancelCause::ByRate,
                })
            }
        }
    }
}

impl Arrived {
    /// Build `item`'s request under `config` and keep of the item what its task needs.
    fn new(mut item: WorkItem, config: &ReplayConfig, own: Option<u64>) -> Arrived {
        let request = prepare(&mut item, config);
        let WorkItem {
            index,
            exchange,
            pin_output_tokens,
            pin_in_frames,
            cancel_after,
            think,
            reassigned,
        } = item;
        Arrived {
            item: Sendable {
                index,
                id: exchange.id,
                session: exchange.session,
                path: exchange.request.path,
                think,
                pin_output_tokens,
                pin_in_frames,
                cancel: Cancel::plan(config, index, cancel_after),
            },
            request,
            hand_over: reassigned.then_some(HandOverMark::OWN_TIME),
            own,
        }
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.due_ms
            .total_cmp(&other.due_ms)
            .then(self.arrival.cmp(&other.arrival))
    }
}

/// What [`Pacing::next`] produced. Returned once per request and moved at once, so the item
/// is not boxed.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// An item, at its intended send time (`None`: unpaced).
    Item(Arrived, Option<Instant>),
    /// The slice ended and every item was handed out.
    Done,
    /// The next item was due at or after the end of `--duration`: it is not started, and
    /// neither is anything after it.
    PastDeadline,
    /// The run was aborted while waiting; `holding` an item taken from the slice (counted
    /// as not started: the feed no longer has it).
    Aborted { holding: bool },
}

impl Feed {
    /// An item as it arrives: its own ordinal given, its request built.
    fn arrive(&mut self, item: WorkItem) -> Arrived {
        let own = (!item.reassigned).then(|| {
            self.own_arrivals += 1;
            self.own_arrivals - 1
        });
        Arrived::new(item, &self.config, own)
    }

    /// Claim `item` (and what follows it at the current pace) as it is taken or waited for.
    fn cover(&mut self, item: &Arrived) {
        if let (Some(gate), Some(own)) = (&mut self.gate, item.own) {
            gate.cover(own);
        }
    }

    fn push(&mut self, item: WorkItem) {
        // An item without an offset goes out at once, in file order among its kind.
        let mut due_ms = item.exchange.at_ms.unwrap_or(f64::NEG_INFINITY);
        let mut item = self.arrive(item);
        // Due within the look-ahead (it may be out of order): claimed as it arrives.
        if let (Some(gate), Some(own)) = (&self.gate, item.own) {
            let soon_ms =
                self.recorded_now_ms() + gate.lookahead().as_secs_f64() * 1000.0 * self.speed;
            if due_ms <= soon_ms
                && let Some(gate) = &mut self.gate
            {
                gate.cover_only(own);
            }
        }
        if item.hand_over.is_some() {
            let placed = self.hand_overs.place(due_ms, self.recorded_now_ms());
            due_ms = placed.due_ms;
            item.hand_over = Some(placed.mark);
        }
        if let (Some(starts), Some(session)) = (&mut self.session_starts, &item.item.session) {
            match starts.get(session) {
                Some(start) => due_ms = due_ms.min(*start),
                None => {
                    if starts.len() >= 4 * self.window.max(1024) {
                        // Sessions that started before everything sent so far: a later turn
                        // of theirs then goes out at its own offset, still after its session
                        // started.
                        let sent = self.latest_sent_ms;
                        starts.retain(|_, start| *start >= sent);
                    }
                    starts.insert(session.clone(), due_ms);
                }
            }
        }
        self.arrivals += 1;
        self.pending.push(Reverse(Pending {
            due_ms,
            arrival: self.arrivals,
            item,
        }));
    }

    /// Now on the recorded clock: ms since the start × speed (negative before it).
    fn recorded_now_ms(&self) -> f64 {
        let now = Instant::now();
        let since_start_s = match now.checked_duration_since(self.start) {
            Some(after) => after.as_secs_f64(),
            None => -self.start.duration_since(now).as_secs_f64(),
        };
        since_start_s * 1000.0 * self.speed
    }

    /// Read ahead whatever has already arrived, up to the window.
    fn fill(&mut self) {
        self.fill_up_to(usize::MAX);
    }

    /// [`Feed::fill`], reading at most `batch` items.
    fn fill_up_to(&mut self, batch: usize) {
        let mut read = 0;
        while !self.closed && self.pending.len() < self.window && read < batch {
            read += 1;
            match self.items.try_recv() {
                Ok(item) => self.push(item),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.closed = true,
            }
        }
    }

    fn pop(&mut self) -> Option<Arrived> {
        let Reverse(pending) = self.pending.pop()?;
        self.cover(&pending.item);
        // A handed-over item comes after later ones were sent because its worker was lost,
        // not because the recording is out of order; and its place is not this worker's
        // schedule, which later items of its own are judged against.
        if pending.due_ms.is_finite() && pending.item.hand_over.is_none() {
            if pending.due_ms < self.latest_sent_ms {
                self.sent_out_of_order += 1;
            }
            self.latest_sent_ms = self.latest_sent_ms.max(pending.due_ms);
        }
        Some(pending.item)
    }

    /// The next item of a recorded schedule, at its intended time (`start` + offset / speed),
    /// reading ahead while it waits; never waiting past `deadline` (an item due after it is
    /// [`Next::PastDeadline`] once the deadline comes, unless an earlier one arrived by then).
    async fn next_recorded(
        &mut self,
        start: Instant,
        speed: f64,
        deadline: Option<Instant>,
        pacer: Option<&Pacer>,
        abort: &mut watch::Receiver<bool>,
    ) -> Next {
        loop {
            self.fill();
            let Some(Reverse(head)) = self.pending.peek() else {
                if self.closed {
                    return Next::Done;
                }
                tokio::select! {
                    biased;
                    _ = abort.wait_for(|a| *a) => return Next::Aborted { holding: false },
                    item = self.items.recv() => match item {
                        Some(item) => self.push(item),
                        None => self.closed = true,
                    },
                }
                continue;
            };
            // A handed-over item is placed no earlier than it arrived: its lateness before
            // that is the lost worker's, not this one's schedule lag.
            let intended = head
                .due_ms
                .is_finite()
                .then(|| start + offset(head.due_ms / 1000.0 / speed));
            let now = Instant::now();
            if let (Some(deadline), Some(due)) = (deadline, intended)
                && due >= deadline
                && now >= deadline
            {
                self.pop();
                return Next::PastDeadline;
            }
            let Some(when) = intended.filter(|t| *t > now) else {
                let item = self.pop().expect("the heap has a head");
                return Next::Item(item, intended);
            };
            // Waited for: claimed before the wait, so its grant is in by its time.
            if let (Some(gate), Some(own)) = (&mut self.gate, head.item.own) {
                gate.cover(own);
            }
            let room = !self.closed && self.pending.len() < self.window;
            // At the deadline at the latest: what is due after it is not started.
            let wake = deadline.map_or(when, |deadline| when.min(deadline));
            tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => return Next::Aborted { holding: false },
                _ = pace_until(pacer, wake) => {
                    if wake < when {
                        continue;
                    }
                    let item = self.pop().expect("the heap has a head");
                    return Next::Item(item, intended);
                }
                // Something earlier may still arrive: keep reading while waiting.
                item = self.items.recv(), if room => match item {
                    Some(item) => self.push(item),
                    None => self.closed = true,
                },
            }
        }
    }

    /// The send offsets (seconds after the start) of the items read ahead, for the first
    /// wave's size ([`connections_needed`]); an item without an offset goes out at once.
    fn offsets_s(&self, speed: f64) -> Vec<f64> {
        self.pending
            .iter()
            .map(|Reverse(p)| {
                if p.due_ms.is_finite() {
                    p.due_ms / 1000.0 / speed
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Items left unsent (read ahead or still in the channel), counted as not started.
    fn drain_count(&mut self) -> u64 {
        let mut n = self.pending.len() as u64;
        self.pending.clear();
        while self.items.try_recv().is_ok() {
            n += 1;
        }
        n
    }
}

/// When each item goes out: one pacing per load mode. Every mode hands out the next item
/// with its intended send time, having waited for it, and none waits past the end of
/// `--duration` (an item due at or after it is [`Next::PastDeadline`]).
enum Pacing {
    /// `--schedule recorded` without a rate: each item at the start + its recorded offset ÷
    /// `speed`, in `at_ms` order whatever the file's ([`Feed::next_recorded`]).
    Recorded { speed: f64 },
    /// `--rate`: from the start, gaps of 1/rate (constant) or drawn from an exponential
    /// (Poisson arrivals, seeded).
    Rate {
        rate: f64,
        arrival: Arrival,
        rng: rand::rngs::SmallRng,
        /// The next item's offset from the start, seconds.
        next_offset_s: f64,
    },
    /// No send time: each item as soon as it is there (a closed loop's permits, taken
    /// apart, bound how many are in flight).
    Unpaced,
}

impl Pacing {
    fn new(load: &crate::config::LoadModel) -> Pacing {
        match (load.rate, load.schedule) {
            (Some(rate), _) => Pacing::Rate {
                rate,
                arrival: load.arrival,
                rng: rand::rngs::SmallRng::seed_from_u64(load.seed),
                next_offset_s: 0.0,
            },
            (None, Schedule::Recorded { speed }) => Pacing::Recorded { speed },
            (None, Schedule::Asap) => Pacing::Unpaced,
        }
    }

    /// The speed of a recorded schedule; `None` in the other modes.
    fn recorded_speed(&self) -> Option<f64> {
        match self {
            Pacing::Recorded { speed } => Some(*speed),
            Pacing::Rate { .. } | Pacing::Unpaced => None,
        }
    }

    /// The next item from `feed`, at its send time.
    async fn next(
        &mut self,
        feed: &mut Feed,
        start: Instant,
        deadline: Option<Instant>,
        pacer: Option<&Pacer>,
        abort: &mut watch::Receiver<bool>,
    ) -> Next {
        if let Pacing::Recorded { speed } = *self {
            return feed
                .next_recorded(start, speed, deadline, pacer, abort)
                .await;
        }
        let item = tokio::select! {
            biased;
            _ = abort.wait_for(|a| *a) => return Next::Aborted { holding: false },
            item = feed.items.recv() => item,
        };
        let Some(item) = item else {
            return Next::Done;
        };
        let item = feed.arrive(item);
        feed.cover(&item);
        let Pacing::Rate {
            rate,
            arrival,
            rng,
            next_offset_s,
        } = self
        else {
            return Next::Item(item, None);
        };
        let at = start + offset(*next_offset_s);
        *next_offset_s += match arrival {
            Arrival::Constant => 1.0 / *rate,
            Arrival::Poisson => {
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                -u.ln() / *rate
            }
        };
        if deadline.is_some_and(|deadline| at >= deadline) {
            return Next::PastDeadline;
        }
        tokio::select! {
            biased;
            _ = abort.wait_for(|a| *a) => Next::Aborted { holding: true },
            _ = pace_until(pacer, at) => Next::Item(item, Some(at)),
        }
    }
}

/// Replay every item from `items` under `config`, recording outcomes into `metrics`.
///
/// Returns when `items` is closed and every request has finished, or at once when `abort`
/// turns true (in-flight requests are then cancelled and counted as lost). `open_ended` means
/// the items loop until the duration ends, so items left unread are not counted as not
/// started.
pub async fn replay(run: EngineRun) -> SliceTotals {
    let EngineRun {
        config,
        client,
        items,
        start,
        metrics,
        mut abort,
        open_ended,
        counters,
        claims,
    } = run;
    let load = &config.load;
    let permits = load.concurrency.map(|c| Arc::new(Semaphore::new(c.max(1))));
    let deadline = load.duration.map(|d| start.instant + d);
    let mut pacing = Pacing::new(load);
    let recorded_speed = pacing.recorded_speed();
    let mut feed = Feed::new(items, &config, start.instant, recorded_speed, claims);

    // Connection timings go to the run's metrics; the first wave's connections open before
    // the start, so none of them is set up inside a measured TTFT.
    client.attach_metrics(metrics.clone());
    // Send times (and the start) from the pacer thread; without it, tokio's timer.
    let mut pacer_thread = PacerThread::start()
        .inspect_err(
            |error| tracing::warn!(%error, "no pacer thread: sends paced to the millisecond"),
        )
        .ok();
    let pacer = pacer_thread.as_ref().map(PacerThread::pacer);
    let pacer = pacer.as_ref();
    let lead = StartLead {
        client: &client,
        config: &config,
        recorded_speed,
        counters: &counters,
        at_target_from_start: permits.is_none() || recorded_speed.is_some() || load.rate.is_some(),
    };
    let (mut aborted, preconnect) = lead.until_start(&mut feed, start, pacer, &mut abort).await;

    let mut sending = Sending::new(&config, client, metrics, counters, recorded_speed);
    'items: while !aborted {
        // The next item, at its send time.
        let (item, intended) = match pacing
            .next(&mut feed, start.instant, deadline, pacer, &mut abort)
            .await
        {
            Next::Item(item, intended) => (item, intended),
            Next::Done => break 'items,
            Next::PastDeadline => {
                sending.counters.not_started(1);
                break 'items;
            }
            Next::Aborted { holding } => {
                aborted = true;
                sending.counters.not_started(u64::from(holding));
                break 'items;
            }
        };
        let permit = match &permits {
            Some(semaphore) => tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => { aborted = true; sending.counters.not_started(1); break 'items; }
                permit = semaphore.clone().acquire_owned() => Some(permit.expect("the semaphore is never closed")),
            },
            None => None,
        };
        if let Some(semaphore) = &permits
            && semaphore.available_permits() == 0
        {
            // Every slot of the closed loop is taken: the load reached its target.
            sending.target_reached();
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            sending.counters.not_started(1);
            break;
        }
        // An own exchange starts once the coordinator granted it.
        if let (Some(gate), Some(own)) = (&mut feed.gate, item.own)
            && !gate.admit(own, &mut abort).await
        {
            aborted = true;
            sending.counters.not_started(1);
            break 'items;
        }
        sending.send(item, permit, intended, pacer, &mut feed).await;
    }
    let totals = sending.settle(feed, aborted, open_ended, &mut abort).await;
    if let Some(preconnect) = preconnect {
        preconnect.abort();
    }
    if let Some(thread) = &mut pacer_thread {
        thread.stop();
    }
    totals
}

impl Feed {
    /// The feed of a slice: a read-ahead window on a recorded schedule, sessions' starts
    /// when they are closed loops, and the claims' gate (with its first wave claimed).
    fn new(
        items: mpsc::Receiver<WorkItem>,
        config: &Arc<ReplayConfig>,
        start: Instant,
        recorded_speed: Option<f64>,
        claims: Option<Arc<claims::ClaimLink>>,
    ) -> Feed {
        let mut feed = Feed {
            items,
            pending: BinaryHeap::new(),
            window: if recorded_speed.is_some() {
                config.options.reorder_window.max(1)
            } else {
                1
            },
            closed: false,
            arrivals: 0,
            latest_sent_ms: f64::NEG_INFINITY,
            sent_out_of_order: 0,
            session_starts: config.options.faithful.closed_sessions.then(HashMap::new),
            config: Arc::clone(config),
            start,
            speed: recorded_speed.unwrap_or(1.0),
            hand_overs: HandOvers::new(recorded_speed.unwrap_or(1.0)),
            own_arrivals: 0,
            gate: claims.map(|link| claims::Gate::new(link, first_claim(&config.load))),
        };
        if let Some(gate) = &mut feed.gate {
            gate.claim_first_wave();
        }
        feed
    }
}

/// The wait for the coordinator's start instant, which every worker shares whatever the load
/// model: the slice is read ahead meanwhile on a recorded schedule, and the first wave's
/// connections are opened.
struct StartLead<'a> {
    client: &'a TargetClient,
    config: &'a Arc<ReplayConfig>,
    recorded_speed: Option<f64>,
    counters: &'a LiveCounters,
    /// On a schedule or a rate, the load is at its target once it runs.
    at_target_from_start: bool,
}

impl StartLead<'_> {
    /// Open `connections` to the target in the background.
    fn preconnect(&self, connections: usize) -> tokio::task::JoinHandle<()> {
        let client = self.client.clone();
        let target = self.config.target.clone();
        let patience = self.config.options.timeout;
        tokio::spawn(async move {
            let opened = client.preconnect(&target, connections, patience).await;
            tracing::debug!(
                wanted = connections,
                opened,
                "connections opened before the start"
            );
        })
    }

    /// Until the start (or an abort: the first value is then true), with the preconnection.
    ///
    /// On a recorded schedule the slice is read ahead while the start is awaited (up to the
    /// reorder window, each request built as it arrives), so the first exchanges are ready at
    /// the start: built at the start instead, a window of 4,096 sent the first exchange
    /// milliseconds late. The first wave's connections open once the read-ahead is full or
    /// closed, or `PRECONNECT_LEAD` before the start, whichever comes first. A closed loop or
    /// a rate knows its first wave at once.
    async fn until_start(
        &self,
        feed: &mut Feed,
        start: StartAt,
        pacer: Option<&Pacer>,
        abort: &mut watch::Receiver<bool>,
    ) -> (bool, Option<tokio::task::JoinHandle<()>>) {
        let load = &self.config.load;
        let recorded_speed = self.recorded_speed;
        let mut preconnect = match recorded_speed {
            Some(_) => None,
            None => Some(self.preconnect(connections_needed(load, &[]))),
        };
        let preconnect_by = start
            .instant
            .checked_sub(PRECONNECT_LEAD)
            .unwrap_or(start.instant);
        let start_wait = pace_until(pacer, start.instant);
        tokio::pin!(start_wait);
        let aborted = loop {
            if let Some(speed) = recorded_speed
                && preconnect.is_none()
                && (feed.closed
                    || feed.pending.len() >= feed.window
                    || Instant::now() >= preconnect_by)
            {
                preconnect =
                    Some(self.preconnect(connections_needed(load, &feed.offsets_s(speed))));
            }
            let read_ahead =
                recorded_speed.is_some() && !feed.closed && feed.pending.len() < feed.window;
            tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => break true,
                _ = &mut start_wait => {
                    let now = unix_nanos(SystemTime::now());
                    self.counters.started_unix_ns.store(now, Ordering::Relaxed);
                    if self.at_target_from_start {
                        self.counters.target_reached_unix_us.store(now / 1000, Ordering::Relaxed);
                    }
                    break false;
                }
                item = feed.items.recv(), if read_ahead => match item {
                    Some(item) => {
                        feed.push(item);
                        // In small batches, so the start is looked at between them.
                        feed.fill_up_to(READ_AHEAD_BATCH);
                    }
                    None => feed.closed = true,
                },
                _ = tokio::time::sleep_until(preconnect_by.into()),
                    if recorded_speed.is_some() && preconnect.is_none() => {}
            }
        };
        if preconnect.is_none()
            && !aborted
            && let Some(speed) = recorded_speed
        {
            // The start came first (a lead shorter than `PRECONNECT_LEAD`).
            preconnect = Some(self.preconnect(connections_needed(load, &feed.offsets_s(speed))));
        }
        (aborted, preconnect)
    }
}

/// What the engine keeps while it sends: the request tasks, the sessions' latest turns and
/// the slice's book of counts.
struct Sending {
    config: Arc<ReplayConfig>,
    client: TargetClient,
    metrics: MetricsHandle,
    counters: Arc<LiveCounters>,
    sessions: HashMap<String, PreviousTurn>,
    tasks: JoinSet<()>,
    seq: u64,
    /// An unpaced closed loop sends its first `concurrency` requests together at the start:
    /// that first wave is left out of the steady metrics (it queues at the target at once).
    first_wave: u64,
}

impl Sending {
    fn new(
        config: &Arc<ReplayConfig>,
        client: TargetClient,
        metrics: MetricsHandle,
        counters: Arc<LiveCounters>,
        recorded_speed: Option<f64>,
    ) -> Sending {
        let load = &config.load;
        let first_wave = match (load.concurrency, recorded_speed, load.rate) {
            (Some(concurrency), None, None) => concurrency.max(1) as u64,
            _ => 0,
        };
        Sending {
            config: Arc::clone(config),
            client,
            metrics,
            counters,
            sessions: HashMap::new(),
            tasks: JoinSet::new(),
            seq: 0,
            first_wave,
        }
    }

    /// The load reached its target now, unless it already had.
    fn target_reached(&self) {
        if self.counters.target_reached_unix_us.load(Ordering::Relaxed) == 0 {
            let now_us = unix_nanos(SystemTime::now()) / 1000;
            self.counters
                .target_reached_unix_us
                .store(now_us, Ordering::Relaxed);
        }
    }

    /// Start one exchange's task (it holds its slot, `permit`, to its end).
    async fn send(
        &mut self,
        arrived: Arrived,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        intended: Option<Instant>,
        pacer: Option<&Pacer>,
        feed: &mut Feed,
    ) {
        let Arrived {
            item,
            request,
            hand_over,
            ..
        } = arrived;
        if let Some(mark) = hand_over {
            let now_us = unix_nanos(SystemTime::now()) / 1000;
            feed.hand_overs.sent(mark, now_us, &self.counters.hand_over);
        }
        let previous_turn = item.session.as_ref().map(|session| {
            let (done_tx, done_rx) = oneshot::channel::<Instant>();
            let previous = self
                .sessions
                .insert(session.clone(), PreviousTurn::Running(done_rx));
            (previous, done_tx)
        });
        let load = &self.config.load;
        let warmup = self.seq < load.warmup;
        // Whether it can be steady is known once it is sent: see `is_steady`.
        let steady_after = (self.config.options.steady_metrics && self.seq >= self.first_wave)
            .then(|| self.counters.clone());
        self.seq += 1;
        let counters = &self.counters;
        counters.issued.fetch_add(1, Ordering::Relaxed);
        counters
            .sent_out_of_order
            .store(feed.sent_out_of_order, Ordering::Relaxed);
        let paced = intended.is_some();
        self.tasks.spawn(
            ExchangeTask {
                config: self.config.clone(),
                client: self.client.clone(),
                metrics: self.metrics.clone(),
                pacer: pacer.cloned(),
                permit,
                intended,
                previous_turn,
                item,
                request,
                warmup,
                steady_after,
            }
            .run(),
        );

        // Unpaced (a closed loop): let the new request run now, and its connection write
        // it, before the next one is spawned. A burst of spawns (the first wave: c requests
        // at the start) would otherwise stamp every t0 first and write every request after
        // all of them, and the first requests would carry the whole burst's send work inside
        // their TTFT (measured against server truth at c=128: +7 ms for the first, the p99).
        // A paced send waits for the pacer next anyway; a yield there measurably raised the
        // schedule lag's p99 (0.3 -> 1.0 ms), so it is left out.
        if !paced {
            tokio::task::yield_now().await;
        }
        // Reap finished tasks and forget finished sessions so both stay small.
        while self.tasks.try_join_next().is_some() {}
        if self.seq.is_multiple_of(4096) {
            let closed_sessions = self.config.options.faithful.closed_sessions;
            self.sessions
                .retain(|_, previous| previous.keep(closed_sessions));
        }
    }

    /// After the last send: count what was never sent, wait for the requests in flight (or
    /// cancel them on an abort, counting them lost), and give the slice's totals.
    async fn settle(
        mut self,
        mut feed: Feed,
        mut aborted: bool,
        open_ended: bool,
        abort: &mut watch::Receiver<bool>,
    ) -> SliceTotals {
        let counters = self.counters.clone();
        feed.hand_overs.log_sent();
        if let Some(gate) = &feed.gate {
            gate.log_waits();
        }
        counters
            .sent_out_of_order
            .store(feed.sent_out_of_order, Ordering::Relaxed);
        // Items read ahead but not sent (duration reached) are not started.
        if !open_ended {
            counters.not_started(feed.pending.len() as u64);
            feed.pending.clear();
        }
        if !aborted && !open_ended {
            // Whatever was not sent (duration reached) is not started.
            loop {
                tokio::select! {
                    biased;
                    _ = abort.wait_for(|a| *a) => { aborted = true; break; }
                    item = feed.items.recv() => match item {
                        Some(_) => counters.not_started(1),
                        None => break,
                    },
                }
            }
        }
        if !aborted {
            loop {
                tokio::select! {
                    biased;
                    _ = abort.wait_for(|a| *a) => { aborted = true; break; }
                    next = self.tasks.join_next() => if next.is_none() { break },
                }
            }
        }
        if aborted {
            self.tasks.abort_all();
            // Only the requests the abort cancelled were in flight: a task that had finished
            // (its outcome recorded) but was not reaped yet is answered, not also lost.
            while let Some(joined) = self.tasks.join_next().await {
                if joined.is_err() {
                    counters.lost.fetch_add(1, Ordering::Relaxed);
                }
            }
            if !open_ended {
                counters.not_started(feed.drain_count());
            }
        }
        counters.totals()
    }
}

/// One exchange's task: wait for its session's previous turn, send it, free its slot and
/// turn, count what remains to count, and record it.
struct ExchangeTask {
    config: Arc<ReplayConfig>,
    client: TargetClient,
    metrics: MetricsHandle,
    pacer: Option<Pacer>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    intended: Option<Instant>,
    /// The session's previous turn (when it has one) and the sender of this turn's end.
    previous_turn: Option<(Option<PreviousTurn>, oneshot::Sender<Instant>)>,
    item: Sendable,
    request: PreparedRequest,
    warmup: bool,
    /// The counters that tell whether it was sent in the steady window (`None`: never steady).
    steady_after: Option<Arc<LiveCounters>>,
}

impl ExchangeTask {
    async fn run(self) {
        let ExchangeTask {
            config,
            client,
            metrics,
            pacer,
            permit,
            mut intended,
            previous_turn,
            item,
            request,
            warmup,
            steady_after,
        } = self;
        let done = match previous_turn {
            Some((previous, done_tx)) => {
                if let Some(previous) = previous {
                    let ended = previous.ended().await;
                    if config.options.faithful.closed_sessions {
                        // Closed loop: the user reads the answer, thinks, sends.
                        let at = ended + item.think.unwrap_or_default();
                        intended = Some(at);
                        pace_until(pacer.as_ref(), at).await;
                    } else {
                        intended = intended.map(|t| t.max(Instant::now()));
                    }
                }
                Some(done_tx)
            }
            None => None,
        };
        let body = request.body.clone();
        let Measured {
            outcome,
            status,
            message,
            text,
        } = send_one(
            &config,
            &client,
            &item.path,
            request,
            intended,
            item.cancel,
            pacer.as_ref(),
        )
        .await;
        // The request is over: its slot and its session's turn go first, then what remains
        // to count is counted (off this runtime, with a tokenizer).
        drop(permit);
        if let Some(done) = done {
            let _ = done.send(Instant::now());
        }
        let outcome = crate::tokens::count_missing(
            config.tokenizer.as_ref(),
            outcome,
            crate::tokens::ToCount {
                text,
                path: item.path,
                body,
            },
        )
        .await;
        let meta = config.options.requests_out.then_some(RecordMeta {
            index: item.index,
            id: item.id,
            session: item.session,
        });
        let pinned = config.options.faithful.pin.and(item.pin_output_tokens);
        let steady = steady_after.is_some_and(|counters| {
            is_steady(
                counters.target_reached_unix_us.load(Ordering::Relaxed),
                outcome.sent_unix_us,
            )
        });
        metrics
            .record(Finished {
                outcome,
                warmup,
                status,
                message,
                meta,
                pinned,
                pin_in_frames: item.pin_in_frames,
                steady,
            })
            .await;
    }
}

/// The latest turn of a session, as the next turn waits for it.
enum PreviousTurn {
    /// Sends the instant it ended (dropped unsent when it was cancelled).
    Running(oneshot::Receiver<Instant>),
    /// It ended at this instant (kept for closed sessions: the next turn's think time
    /// counts from it).
    Ended(Instant),
}

/// How long a closed session's ended turn is remembered for its next turn.
const ENDED_TURN_MEMORY: Duration = Duration::from_secs(3600);

impl PreviousTurn {
    /// Wait for the turn to end; when it was cancelled, now.
    async fn ended(self) -> Instant {
        match self {
            PreviousTurn::Running(rx) => rx.await.unwrap_or_else(|_| Instant::now()),
            PreviousTurn::Ended(at) => at,
        }
    }

    /// False when the entry can be forgotten: an ended turn, unless closed sessions still
    /// need its end instant (for at most [`ENDED_TURN_MEMORY`]).
    fn keep(&mut self, closed_sessions: bool) -> bool {
        if let PreviousTurn::Running(rx) = self {
            match rx.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => return true,
                Ok(at) => *self = PreviousTurn::Ended(at),
                Err(oneshot::error::TryRecvError::Closed) => return false,
            }
        }
        match self {
            PreviousTurn::Ended(at) => closed_sessions && at.elapsed() < ENDED_TURN_MEMORY,
            PreviousTurn::Running(_) => true,
        }
    }
}

/// An offset from the start instant, clamped to ten years: the coordinator validates every
/// input, and no value that slipped through can make the clock arithmetic panic.
fn offset(seconds: f64) -> Duration {
    const TEN_YEARS_S: f64 = 10.0 * 365.0 * 86_400.0;
    if seconds.is_nan() {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(seconds.clamp(0.0, TEN_YEARS_S))
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Whether a request past the closed loop's first wave belongs to the steady window: it was
/// sent (`sent_unix_us`, the worker's clock) at or after the instant this worker's load
/// reached its target (`LiveCounters::target_reached_unix_us`, 0 = not yet, read once the
/// request is answered: a closed loop may reach it while the request is in flight).
pub fn is_steady(target_reached_unix_us: u64, sent_unix_us: Option<u64>) -> bool {
    target_reached_unix_us > 0 && sent_unix_us.is_some_and(|sent| sent >= target_reached_unix_us)
}

/// Send one request and measure its response ([`Measured`]): the outcome, the response's
/// HTTP status when one came, what a failed one was told (the error body's or error frame's
/// message, cleaned; `None` for a success), and, with a tokenizer, the streamed text of a
/// stream that ended without a usage output count (counted after the request released its
/// slot). A failed
/// outcome's `latency_us` is its time to failure. With `cancel`, the request is cancelled at
/// t0 + `cancel.after` whatever stage it is in (see [`measure_one`]).
async fn send_one(
    config: &ReplayConfig,
    client: &TargetClient,
    path: &str,
    prepared: PreparedRequest,
    intended: Option<Instant>,
    cancel: Option<Cancel>,
    pacer: Option<&Pacer>,
) -> Measured {
    let mut measured = measure_one(config, client, path, prepared, intended, cancel, pacer).await;
    if !outcome_failed(&measured.outcome) {
        measured.message = None;
    }
    if measured.outcome.usage_output_tokens.is_some() {
        measured.text = None;
    }
    measured
}

fn outcome_failed(outcome: &RequestOutcome) -> bool {
    matches!(outcome.kind, OutcomeKind::Failed(_))
}

/// What [`measure_one`] found, and [`send_one`] returns.
struct Measured {
    outcome: RequestOutcome,
    status: Option<u16>,
    message: Option<String>,
    /// The streamed text, kept only with a tokenizer.
    text: Option<String>,
}

impl Measured {
    fn of(outcome: RequestOutcome, status: Option<u16>, message: Option<String>) -> Measured {
        Measured {
            outcome,
            status,
            message,
            text: None,
        }
    }
}

/// A cancelled request's outcome from what was measured until the cancel: its TTFT when
/// the first content frame came before it, its content frames so far; no latency (a
/// cancelled request enters no latency, ITL or token rate).
fn cancelled(mut outcome: RequestOutcome, cause: CancelCause) -> RequestOutcome {
    outcome.kind = OutcomeKind::Cancelled(cause);
    outcome.latency_us = None;
    outcome.transport_cause = None;
    outcome
}

/// Wait for the cancel point `at` (precisely: the pacer, as for sends), or forever without
/// one.
async fn cancel_point(pacer: Option<&Pacer>, at: Option<Instant>) {
    match at {
        Some(at) => pace_until(pacer, at).await,
        None => std::future::pending().await,
    }
}

/// Wait until `after` past the request's t0 as `t0` publishes it (the latest value: a new
/// connection or a resend moves it), precisely (the pacer).
async fn cancel_after_t0(
    pacer: Option<&Pacer>,
    mut t0: watch::Receiver<Option<Instant>>,
    after: Duration,
) {
    loop {
        let base = *t0.borrow_and_update();
        match base {
            None => {
                if t0.changed().await.is_err() {
                    // The send ended without a t0 (it failed first): nothing to cancel.
                    std::future::pending::<()>().await;
                }
            }
            Some(base) => {
                tokio::select! {
                    biased;
                    changed = t0.changed() => {
                        if changed.is_err() {
                            pace_until(pacer, base + after).await;
                            return;
                        }
                    }
                    () = pace_until(pacer, base + after) => return,
                }
            }
        }
    }
}

/// Send one request and measure it. With `cancel`, the request is abandoned at t0 +
/// `cancel.after`: before the response head, the send future is dropped (its connection
/// closes with it, never back to a pool; HTTP/2 resets the stream); after it, the response
/// is dropped (the same). An answer that ends before the cancel point is measured as usual.
async fn measure_one(
    config: &ReplayConfig,
    client: &TargetClient,
    path: &str,
    prepared: PreparedRequest,
    intended: Option<Instant>,
    cancel: Option<Cancel>,
    pacer: Option<&Pacer>,
) -> Measured {
    let PreparedRequest {
        method,
        url,
        headers,
        body,
    } = prepared;
    let called = Instant::now();
    let called_unix_us = unix_nanos(SystemTime::now()) / 1000;
    // A reference count, not a copy: the body is read again only after the response.
    // Boxed: the send state (a pending request) is large and lives only until the response
    // head; the task of an open stream then holds only what reading it needs.
    let send = client.send_prepared(method, &url, headers, body.clone(), config.options.timeout);
    let sent = match cancel {
        None => Box::pin(send).await,
        Some(plan) => {
            let before_head = BeforeHead {
                pacer,
                plan,
                called,
                called_unix_us,
                intended,
            };
            match before_head.send_or_cancel(send).await {
                Ok(sent) => sent,
                Err(cancelled) => return cancelled,
            }
        }
    };
    let mut finishing = Finishing {
        protocol: None,
        t0: sent.t0,
        // Lag is the scheduler's: measured at the first attempt, whatever happened after.
        lag: intended.map(|t| sent.first_t0.saturating_duration_since(t).as_micros() as u64),
        sent_unix_us: sent.sent_unix_us,
        resent: sent.resent,
    };
    let (t0, deadline) = (sent.t0, sent.deadline);
    let mut response = match sent.result {
        Ok(response) => response,
        Err(SendFailure::Timeout) => {
            let outcome = finishing.apply(RequestOutcome::failed(FailureKind::Timeout));
            return Measured::of(outcome, None, None);
        }
        Err(SendFailure::Transport(cause)) => {
            let outcome = finishing.apply(RequestOutcome::transport_failure(cause));
            return Measured::of(outcome, None, None);
        }
    };
    finishing.protocol = Some(response.protocol());
    let status = response.status();
    let code = Some(status.as_u16());
    if !status.is_success() {
        return status_failure(response, deadline, &finishing, code).await;
    }
    let content_type = response.content_type().map(str::to_owned);

    // From the head on, the cancel point counts from the request's own t0. Dropping the
    // response closes its connection (HTTP/1) or resets its stream (HTTP/2): it is never
    // handed back to a pool half read.
    let cancel_wait = cancel_point(pacer, cancel.map(|plan| t0 + plan.after));
    tokio::pin!(cancel_wait);
    // One timer for the whole body, registered once, not one per read.
    let expired = tokio::time::sleep_until(deadline);
    tokio::pin!(expired);
    let mut reading = Reading {
        expired: expired.as_mut(),
        cancel_wait: cancel_wait.as_mut(),
        finishing: &finishing,
        code,
        cause: cancel.map(|plan| plan.cause),
        url: &url,
    };
    // The first read decides between a stream and one body: content types lie behind
    // gateways (SSE as `text/plain`, or none at all), the bytes do not.
    let first = tokio::select! {
        biased;
        _ = &mut reading.expired => return reading.timed_out(None),
        () = &mut reading.cancel_wait => {
            drop(response);
            return reading.cancel_now(RequestOutcome::failed(FailureKind::Empty));
        }
        chunk = response.chunk() => chunk,
    };
    let t_first = t0.elapsed().as_micros() as u64;
    let first = match first {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Measured::of(
                finishing.apply(RequestOutcome::failed(FailureKind::Empty)),
                code,
                None,
            );
        }
        Err(error) => {
            let cause = crate::client::classify(&error);
            tracing::debug!(%error, url = %common::recording::redact_url(&url), cause = cause.name(), "body failed before its first byte");
            return Measured::of(
                finishing.apply(RequestOutcome::transport_failure(cause)),
                code,
                None,
            );
        }
    };
    let content_type = content_type.as_deref();
    if !formats::response_is_streamed(path, content_type, &body, &first) {
        return reading
            .unstreamed(response, path, content_type, first, t_first)
            .await;
    }
    let family = formats::detect(path, content_type, &first).unwrap_or(Family::OpenAiChat);
    let mut meter = StreamMeter::new(family);
    // The text is kept only when a tokenizer will count it (appending is all it costs here).
    let keep_text = config.tokenizer.is_some();
    if keep_text {
        meter.keep_text();
    }
    if meter.on_read(t_first, &first).is_err() {
        let message = meter.error_message().map(str::to_owned);
        return Measured::of(finishing.apply(meter.finish_broken()), code, message);
    }
    reading.stream(response, meter, keep_text).await
}

/// What a request's outcome takes from its send, whatever its end.
struct Finishing {
    /// The protocol of the response head, once it arrived.
    protocol: Option<HttpProtocol>,
    t0: Instant,
    lag: Option<u64>,
    sent_unix_us: u64,
    resent: bool,
}

impl Finishing {
    fn apply(&self, mut outcome: RequestOutcome) -> RequestOutcome {
        if outcome_failed(&outcome) {
            // Time to failure: now, when the failure is known (a status failure sets its
            // own: the head's arrival). Never the success distributions'.
            outcome.latency_us = Some(self.t0.elapsed().as_micros() as u64);
        }
        outcome.schedule_lag_us = self.lag;
        outcome.sent_unix_us = Some(self.sent_unix_us);
        outcome.resent = self.resent;
        outcome.protocol = self.protocol;
        // The input tokens the server did not report are counted (or estimated) after the
        // request released its slot: `tokens::count_missing`.
        outcome
    }

    fn since_t0_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
}

/// A send with a cancel point: before the head, the cancel point counts from the request's
/// t0 as the client publishes it (stamped just before the write; moved when a new connection
/// had to be opened first).
struct BeforeHead<'a> {
    pacer: Option<&'a Pacer>,
    plan: Cancel,
    called: Instant,
    called_unix_us: u64,
    intended: Option<Instant>,
}

impl BeforeHead<'_> {
    /// The send's result, or the cancelled outcome when the cancel point came first.
    async fn send_or_cancel(
        self,
        send: impl std::future::Future<Output = crate::client::Sent>,
    ) -> Result<crate::client::Sent, Measured> {
        let (probe, t0_seen) = watch::channel(None);
        let mut send = Box::pin(TargetClient::with_t0_probe(probe, send));
        let before_head = cancel_after_t0(self.pacer, t0_seen.clone(), self.plan.after);
        tokio::pin!(before_head);
        tokio::select! {
            biased;
            sent = &mut send => Ok(sent),
            () = &mut before_head => {
                // Dropping the send closes its connection (or resets its stream).
                drop(send);
                let called = self.called;
                let t0 = (*t0_seen.borrow()).unwrap_or(called);
                let mut outcome = cancelled(RequestOutcome::failed(FailureKind::Empty), self.plan.cause);
                outcome.schedule_lag_us = self
                    .intended
                    .map(|t| called.saturating_duration_since(t).as_micros() as u64);
                outcome.sent_unix_us = Some(
                    self.called_unix_us + t0.saturating_duration_since(called).as_micros() as u64,
                );
                Err(Measured::of(outcome, None, None))
            }
        }
    }
}

/// A non-2xx head: the failure is known at the head, which is its time to failure. The first
/// `MAX_ERROR_BODY_KEPT` bytes are kept for the message; the rest of a short error body is
/// drained (bounded by the deadline) so the connection can be reused; past
/// `MAX_ERROR_BODY_BYTES` the connection is dropped instead of reading on.
async fn status_failure(
    mut response: crate::client::Response,
    deadline: tokio::time::Instant,
    finishing: &Finishing,
    code: Option<u16>,
) -> Measured {
    let failed_after_us = finishing.since_t0_us();
    let mut kept: Vec<u8> = Vec::new();
    let drain = async {
        let mut read = 0usize;
        while let Ok(Some(chunk)) = response.chunk().await {
            let room = MAX_ERROR_BODY_KEPT.saturating_sub(kept.len());
            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            read += chunk.len();
            if read > MAX_ERROR_BODY_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline, drain).await;
    let mut outcome = finishing.apply(RequestOutcome::failed(FailureKind::Status));
    outcome.latency_us = Some(failed_after_us);
    Measured::of(outcome, code, error_message(&kept))
}

/// A 2xx response being read: its deadline, its cancel point and what its outcome needs.
struct Reading<'a, C> {
    expired: std::pin::Pin<&'a mut tokio::time::Sleep>,
    cancel_wait: std::pin::Pin<&'a mut C>,
    finishing: &'a Finishing,
    code: Option<u16>,
    cause: Option<CancelCause>,
    url: &'a str,
}

impl<C: std::future::Future<Output = ()>> Reading<'_, C> {
    fn timed_out(&self, message: Option<String>) -> Measured {
        let outcome = self
            .finishing
            .apply(RequestOutcome::failed(FailureKind::Timeout));
        Measured::of(outcome, self.code, message)
    }

    fn cancel_now(&self, outcome: RequestOutcome) -> Measured {
        let cause = self
            .cause
            .expect("the cancel point is pending without a cancel");
        Measured::of(
            self.finishing.apply(cancelled(outcome, cause)),
            self.code,
            None,
        )
    }

    fn ended(
        &self,
        outcome: RequestOutcome,
        message: Option<String>,
        text: Option<String>,
    ) -> Measured {
        Measured {
            outcome: self.finishing.apply(outcome),
            status: self.code,
            message,
            text,
        }
    }

    /// One body: its latency is when the whole of it has arrived; no TTFT or ITL. At most
    /// `MAX_UNSTREAMED_BODY_BYTES` are kept to read its usage; the rest is timed, not held.
    async fn unstreamed(
        &mut self,
        mut response: crate::client::Response,
        path: &str,
        content_type: Option<&str>,
        first: bytes::Bytes,
        t_first: u64,
    ) -> Measured {
        let mut whole = first.to_vec();
        let mut truncated = false;
        let mut t_last = t_first;
        loop {
            let chunk = tokio::select! {
                biased;
                _ = &mut self.expired => return self.timed_out(None),
                () = &mut self.cancel_wait => {
                    drop(response);
                    let mut outcome = RequestOutcome::failed(FailureKind::Empty);
                    outcome.unstreamed = true;
                    return self.cancel_now(outcome);
                }
                chunk = response.chunk() => chunk,
            };
            t_last = match chunk {
                Ok(Some(bytes)) => {
                    if whole.len() + bytes.len() <= MAX_UNSTREAMED_BODY_BYTES {
                        whole.extend_from_slice(&bytes);
                    } else {
                        truncated = true;
                    }
                    self.finishing.since_t0_us()
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(%error, url = %common::recording::redact_url(self.url), "body cut");
                    let outcome = RequestOutcome::failed(FailureKind::Transport);
                    return Measured::of(self.finishing.apply(outcome), self.code, None);
                }
            };
        }
        if truncated {
            // Too large to keep: it arrived whole, so it succeeded; its tokens are estimated.
            tracing::warn!(
                limit = MAX_UNSTREAMED_BODY_BYTES,
                "a one-body answer was larger than the limit; its usage was not read"
            );
            let mut outcome = RequestOutcome::failed(FailureKind::Empty);
            outcome.kind = common::measure::OutcomeKind::Succeeded;
            outcome.unstreamed = true;
            outcome.latency_us = Some(t_last);
            outcome.content_frames = 1;
            return Measured::of(self.finishing.apply(outcome), self.code, None);
        }
        let family = formats::detect(path, content_type, &whole);
        let outcome = measure_unstreamed(family, &whole, t_last);
        // A one-body error object (a 200 holding `{"error":…}`) says why.
        let message = outcome_failed(&outcome)
            .then(|| error_message(&whole))
            .flatten();
        Measured::of(self.finishing.apply(outcome), self.code, message)
    }

    /// A stream after its first read: every read timed at the edge, until its terminal
    /// marker, its end, a cut, the deadline or the cancel point.
    async fn stream(
        &mut self,
        mut response: crate::client::Response,
        mut meter: StreamMeter,
        keep_text: bool,
    ) -> Measured {
        let ended = |mut meter: StreamMeter, t_us: u64, transport_error: bool| {
            let text = keep_text.then(|| meter.take_text());
            let (outcome, message) = meter.finish_with_message(t_us, transport_error);
            (outcome, message, text)
        };
        loop {
            if meter.is_terminal() {
                // The stream is complete at its terminal marker, whether or not the server
                // keeps the connection open after it.
                let t_us = self.finishing.since_t0_us();
                // Measured; the end of the body only frees the connection for the next request.
                response.finish().await;
                let (outcome, message, text) = ended(meter, t_us, false);
                return self.ended(outcome, message, text);
            }
            let chunk = tokio::select! {
                biased;
                _ = &mut self.expired => {
                    return self.timed_out(meter.error_message().map(str::to_owned));
                }
                () = &mut self.cancel_wait => {
                    let t_us = self.finishing.since_t0_us();
                    drop(response);
                    let (outcome, _, _) = ended(meter, t_us, false);
                    return self.cancel_now(outcome);
                }
                chunk = response.chunk() => chunk,
            };
            // Timestamp at the edge: the read returned; parse after.
            let t_us = self.finishing.since_t0_us();
            match chunk {
                Ok(Some(bytes)) => {
                    if meter.on_read(t_us, &bytes).is_err() {
                        let message = meter.error_message().map(str::to_owned);
                        return Measured::of(
                            self.finishing.apply(meter.finish_broken()),
                            self.code,
                            message,
                        );
                    }
                }
                Ok(None) => {
                    let (outcome, message, text) = ended(meter, t_us, false);
                    return self.ended(outcome, message, text);
                }
                Err(error) => {
                    let cause = crate::client::classify(&error);
                    tracing::debug!(%error, url = %common::recording::redact_url(self.url), cause = cause.name(), "stream cut");
                    let (mut outcome, message, text) = ended(meter, t_us, true);
                    if outcome.kind == OutcomeKind::Failed(FailureKind::Transport) {
                        outcome.transport_cause = Some(cause);
                    }
                    return self.ended(outcome, message, text);
                }
            }
        }
    }
}

#[cfg(test)]
mod cancel_tests;

#[cfg(test)]
mod hand_over_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadModel;

    fn load(schedule: Schedule, concurrency: Option<usize>, rate: Option<f64>) -> LoadModel {
        LoadModel {
            schedule,
            concurrency,
            rate,
            arrival: Arrival::Constant,
            duration: None,
            warmup: 0,
            seed: 0,
        }
    }

    /// A recorded schedule cut by `--duration`: the exchange due an hour later is not
    /// started when the duration ends (before, the engine waited the hour for it).
    #[tokio::test]
    async fn a_recorded_schedule_stops_at_the_duration_not_at_the_next_exchange() {
        let closed_port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address")
        };
        let mut model = load(Schedule::Recorded { speed: 1.0 }, None, None);
        model.duration = Some(Duration::from_millis(200));
        let config = ReplayConfig {
            target: format!("http://{closed_port}"),
            load: model,
            headers: vec![],
            sets: vec![],
            tag_requests: false,
            transport: crate::config::TransportConfig::default(),
            tokenizer: None,
            options: common::assignment::RequestOptions {
                timeout: Duration::from_secs(5),
                requests_out: false,
                reorder_window: 16,
                ..Default::default()
            },
        };
        let (items_tx, items) = mpsc::channel(4);
        for (index, at_ms) in [(0, 0), (1, 3_600_000)] {
            let exchange = serde_json::from_str(&format!(
                r#"{{"at_ms":{at_ms},"request":{{"method":"POST","path":"/v1/chat/completions","body":"{{}}"}}}}"#
            ))
            .expect("a valid exchange");
            let item = WorkItem {
                index,
                exchange,
                pin_output_tokens: None,
                pin_in_frames: false,
                cancel_after: None,
                think: None,
                reassigned: false,
            };
            items_tx.send(item).await.expect("open");
        }
        drop(items_tx);
        let (_abort_tx, abort) = watch::channel(false);
        let run = EngineRun {
            config: Arc::new(config),
            client: TargetClient::new(&crate::config::TransportConfig::default())
                .expect("a plain client"),
            items,
            start: StartAt {
                instant: Instant::now(),
            },
            metrics: MetricsHandle::spawn(Default::default()),
            abort,
            open_ended: false,
            counters: Arc::default(),
            claims: None,
        };
        let totals = tokio::time::timeout(Duration::from_secs(60), replay(run))
            .await
            .expect("the replay ended with its duration, not an hour later");
        assert_eq!((totals.issued, totals.not_started), (1, 1));
    }

    #[test]
    fn the_first_wave_sets_how_many_connections_open_ahead() {
        // A closed loop: one per slot.
        assert_eq!(
            connections_needed(&load(Schedule::Asap, Some(128), None), &[]),
            128
        );
        // A rate: the first second's requests, under the cap when there is one.
        assert_eq!(
            connections_needed(&load(Schedule::Asap, None, Some(20.0)), &[]),
            20
        );
        assert_eq!(
            connections_needed(&load(Schedule::Asap, Some(8), Some(20.0)), &[]),
            8
        );
        assert_eq!(
            connections_needed(&load(Schedule::Asap, None, Some(1e6)), &[]),
            MAX_ESTIMATED_CONNECTIONS
        );
        // A schedule: the exchanges due in the first second after the first one.
        let recorded = Schedule::Recorded { speed: 1.0 };
        let offsets = [5.0, 5.2, 5.9, 6.0, 6.5, 9.0];
        assert_eq!(connections_needed(&load(recorded, None, None), &offsets), 4);
        assert_eq!(
            connections_needed(&load(recorded, Some(2), None), &offsets),
            2
        );
        assert_eq!(connections_needed(&load(recorded, None, None), &[]), 1);
    }

    #[test]
    fn a_request_is_steady_when_sent_once_the_load_reached_its_target() {
        assert!(!is_steady(0, Some(5)), "the target not reached yet");
        assert!(!is_steady(10, Some(9)), "sent before it");
        assert!(is_steady(10, Some(10)), "sent at it");
        assert!(is_steady(10, Some(11)));
        assert!(!is_steady(10, None), "never sent");
    }

    /// A plain HTTP/1.1 target answering every request with one OpenAI chat body; it holds
    /// the answers to the first `hold` requests until that many have arrived, so a closed
    /// loop of `hold` slots fills all of them before any request ends.
    async fn gated_target(hold: usize) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (arrived_tx, arrived) = watch::channel(0usize);
        let arrived_tx = Arc::new(arrived_tx);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let arrived_tx = Arc::clone(&arrived_tx);
                let mut arrived = arrived.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        // One request: its head, then its content-length body.
                        let head_end = loop {
                            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                                break at + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head =
                            String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|line| line.strip_prefix("content-length:"))
                            .and_then(|value| value.trim().parse().ok())
                            .unwrap_or(0);
                        while buffer.len() < head_end + length {
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buffer.drain(..head_end + length);
                        let mut seen = 0;
                        arrived_tx.send_modify(|n| {
                            *n += 1;
                            seen = *n;
                        });
                        if seen <= hold {
                            let _ = arrived.wait_for(|n| *n >= hold).await;
                        }
                        let body = r#"{"choices":[{"message":{"role":"assistant","content":"hi there"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if stream.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        url
    }

    /// Replays `count` chat exchanges with `concurrency` on the gated target, steady
    /// metrics asked for; returns the main and the steady metrics.
    async fn replay_for_steady(
        concurrency: Option<usize>,
        count: u64,
        warmup: u64,
    ) -> (common::metrics::RunMetrics, common::metrics::RunMetrics) {
        let target = gated_target(concurrency.unwrap_or(count as usize)).await;
        let mut model = load(Schedule::Asap, concurrency, None);
        model.warmup = warmup;
        let config = ReplayConfig {
            target,
            load: model,
            headers: vec![],
            sets: vec![],
            tag_requests: false,
            transport: crate::config::TransportConfig::default(),
            tokenizer: None,
            options: common::assignment::RequestOptions {
                timeout: Duration::from_secs(30),
                steady_metrics: true,
                ..Default::default()
            },
        };
        let (items_tx, items) = mpsc::channel(64);
        for index in 0..count {
            let exchange = serde_json::from_str(
                r#"{"request":{"method":"POST","path":"/v1/chat/completions","body":"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"}}"#,
            )
            .expect("a valid exchange");
            let item = WorkItem {
                index,
                exchange,
                pin_output_tokens: None,
                pin_in_frames: false,
                cancel_after: None,
                think: None,
                reassigned: false,
            };
            items_tx.send(item).await.expect("open");
        }
        drop(items_tx);
        let metrics =
            MetricsHandle::spawn(crate::metrics_actor::Judging::from_options(&config.options));
        let (_abort_tx, abort) = watch::channel(false);
        let run = EngineRun {
            config: Arc::new(config),
            client: TargetClient::new(&crate::config::TransportConfig::default())
                .expect("a plain client"),
            items,
            start: StartAt {
                instant: Instant::now(),
            },
            metrics: metrics.clone(),
            abort,
            open_ended: false,
            counters: Arc::default(),
            claims: None,
        };
        let totals = tokio::time::timeout(Duration::from_secs(60), replay(run))
            .await
            .expect("the replay ends");
        assert_eq!(totals.issued, count);
        let snapshot = metrics.snapshot().await;
        let steady = snapshot.steady.expect("steady metrics asked for");
        (snapshot.metrics, steady)
    }

    /// A closed loop's first wave (its first `concurrency` requests, started together) is
    /// left out of the steady metrics; every later request is in them, with the same
    /// numbers the main metrics give it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_steady_metrics_leave_the_closed_loops_first_wave_out() {
        let (main, steady) = replay_for_steady(Some(3), 10, 0).await;
        assert_eq!(main.counters.succeeded, 10, "{:?}", main.counters);
        assert_eq!(steady.counters.succeeded, 7, "{:?}", steady.counters);
        assert_eq!(steady.counters.output_tokens, 7 * 2);
        assert_eq!(steady.histogram(common::metrics::Metric::Latency).len(), 7);
        assert!(steady.window.is_some());

        // Warm-up requests are out of both; the first wave counts every request sent.
        let (main, steady) = replay_for_steady(Some(3), 10, 4).await;
        assert_eq!(
            (main.counters.warmup, main.counters.succeeded),
            (4, 6),
            "{:?}",
            main.counters
        );
        assert_eq!(steady.counters.succeeded, 6);
        assert_eq!(steady.counters.warmup, 0);
    }

    /// Without a closed loop the load is at its target from the start: every request is
    /// steady.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_a_closed_loop_every_request_is_steady() {
        let (main, steady) = replay_for_steady(None, 5, 0).await;
        assert_eq!(main.counters.succeeded, 5, "{:?}", main.counters);
        // Connections are the run's, not any request's: the steady metrics have none.
        let requests_only = common::metrics::Counters {
            connections: Default::default(),
            ..main.counters
        };
        assert_eq!(steady.counters, requests_only);
    }
}
