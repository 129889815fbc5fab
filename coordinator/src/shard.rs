//! Sharding: which worker replays which exchange, and the feeders that stream slices.
//!
//! Sessions stay whole on one worker (chosen by a stable hash of the session id); other
//! exchanges are striped by index, so every worker's slice spans the whole schedule. The
//! assignment depends only on the recording and the worker count: it is deterministic.
//! Each feeder reads the recording itself, so slices stream and memory stays bounded; it reads
//! every line for its session and arrival only, and copies its own lines to the worker as
//! written, without their responses (`RawExchange`): no line is decoded and re-encoded. Feeders
//! never close a slice: the orchestrator sends the closing chunk once no exchange can be
//! reassigned to that worker any more.
//!
//! The feeders are where the recording is read during the run, so they also attach what
//! faithful replay needs to each exchange before its response is dropped: the recorded
//! output length and the recorded think time (`crate::faithful`), and skip the sessions a
//! `--sample-sessions` run leaves out.

use std::path::PathBuf;

use common::recording::{RawExchange, RecordingError, RecordingReader};

use std::sync::atomic::{AtomicBool, Ordering};

use crate::faithful::{SliceFaithful, ThinkTimes, recorded_pin};
use tokio::sync::mpsc;

/// Exchanges per chunk sent to a worker.
pub const CHUNK_EXCHANGES: usize = 64;

/// One exchange of a slice: its index in the whole run and its recording v1 JSON without
/// the response.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceExchange {
    pub index: u64,
    pub json: Vec<u8>,
    /// `--pin-output-length`: the output length the recording measured.
    pub pin_output_tokens: Option<u64>,
    /// `pin_output_tokens` counts content frames (no usage, no tokenizer).
    pub pin_in_frames: bool,
    /// The recorded client abandoned the exchange this long after sending it (ms).
    pub cancel_after_ms: Option<f64>,
    /// `--session-mode closed`: the recorded think time before this turn, ms.
    pub think_ms: Option<f64>,
    /// Handed over from a lost worker ([`feed_reassigned`]): the worker that gets it sends it
    /// once due, and no earlier than it arrived; its lateness on arrival and its order are
    /// not that worker's.
    pub reassigned: bool,
}

/// A batch of a worker's slice; `last` closes the slice.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SliceChunk {
    pub exchanges: Vec<SliceExchange>,
    pub last: bool,
}

/// The sending end of a worker's slice (the gRPC service streams it to the worker).
pub type SliceSender = mpsc::Sender<SliceChunk>;

/// How the recording is turned into the run's stream of exchanges.
#[derive(Debug, Clone)]
pub struct SlicePlan {
    pub recording: PathBuf,
    pub workers: usize,
    /// Total exchanges in the recording (from the scan).
    pub exchanges: u64,
    /// Stop after this many exchanges in all (the recording loops when it is shorter).
    pub requests: Option<u64>,
    /// Loop the recording without end (`common::replay::is_open_ended`).
    pub open_ended: bool,
    /// Offset added to arrival times on each pass over the recording (ms).
    pub pass_span_ms: f64,
    /// Sampled sessions, and the recorded output length and think time sent with each
    /// exchange (faithful replay).
    pub faithful: SliceFaithful,
    /// `--tokenizer`: recorded output lengths without usage are counted with it.
    pub tokenizer: Option<crate::config::RunTokenizer>,
    /// Look for recorded client cancellations (`Exchange::client_cancelled_ms`) and send
    /// their cancel points; off only for a recording known to hold none.
    pub recorded_cancels: bool,
}

/// What travels with an exchange besides its request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Extras {
    pin_output_tokens: Option<u64>,
    pin_in_frames: bool,
    think_ms: Option<f64>,
    cancel_after_ms: Option<f64>,
}

/// Whether a line may record a client cancellation, so that it is worth decoding whole for
/// its cancel point. The recording writes `"ended":"client disconnected"` on such a
/// response; `RawExchange` does not expose a line's raw response text, so every line is a
/// candidate when the plan looks for cancellations at all — which it does only for a
/// recording whose text holds the marker ([`may_hold_cancellations`]).
fn may_record_a_cancellation(plan: &SlicePlan, _raw: &RawExchange<'_>) -> bool {
    plan.recorded_cancels
}

/// What `llm-replay record` writes on the response of an exchange its client abandoned.
const CANCELLATION_MARKER: &[u8] = b"client disconnected";

/// Whether the recording at `path` may hold a recorded client cancellation: its bytes
/// contain the marker (`"ended":"client disconnected"`). A compressed recording is not
/// searched (it may); a file that cannot be read may too (the feeder's reader reports it).
/// Read once before the run, so that the feeders of a recording without any decode no
/// line whole for it.
pub fn may_hold_cancellations(path: &std::path::Path) -> bool {
    use std::io::Read;
    if path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gz"))
    {
        return true;
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        return true;
    };
    let keep = CANCELLATION_MARKER.len() - 1;
    let mut buffer = vec![0u8; 1 << 20];
    let mut carried = 0usize;
    loop {
        let read = match file.read(&mut buffer[carried..]) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        };
        let filled = carried + read;
        if buffer[..filled]
            .windows(CANCELLATION_MARKER.len())
            .any(|window| window == CANCELLATION_MARKER)
        {
            return true;
        }
        // The marker may straddle two reads: keep the tail.
        carried = keep.min(filled);
        buffer.copy_within(filled - carried..filled, 0);
    }
}

impl SlicePlan {
    /// Exchanges the run will offer in all, when bounded.
    pub fn planned_total(&self) -> Option<u64> {
        if self.open_ended {
            None
        } else {
            Some(self.requests.unwrap_or(self.exchanges))
        }
    }
}

/// FNV-1a: stable across builds and platforms, unlike `std`'s hasher.
pub fn stable_hash(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The worker (0-based) that replays the `sequence`-th exchange of the run.
pub fn worker_for(sequence: u64, session: Option<&str>, workers: usize) -> usize {
    let workers = workers.max(1) as u64;
    match session {
        Some(session) => (stable_hash(session) % workers) as usize,
        None => (sequence % workers) as usize,
    }
}

/// One exchange of the run as the walk meets it: the recording line with its fields left
/// unparsed, and the session and arrival it has on this pass.
struct Item<'r, 'a> {
    raw: &'r RawExchange<'a>,
    index: u64,
    pass: u64,
    /// The session on this pass (`conv-1#pass2` on the third).
    session: Option<String>,
    /// The arrival on this pass (shifted by whole passes).
    at_ms: Option<f64>,
}

impl Item<'_, '_> {
    /// What faithful replay sends with the exchange. Only here is a line decoded whole (its
    /// response holds the recorded output length and the turn's end), and only when the run
    /// asks for either; `think` must see every turn of a session in order.
    fn extras(&self, plan: &SlicePlan, think: &mut ThinkTimes) -> Result<Extras, RecordingError> {
        let faithful = &plan.faithful;
        let cancels = may_record_a_cancellation(plan, self.raw);
        if !faithful.pin && !faithful.think && !cancels {
            return Ok(Extras::default());
        }
        let exchange = self.raw.parse()?;
        let pin = if faithful.pin {
            recorded_pin(
                &exchange,
                plan.tokenizer.as_ref().map(|t| t.tokenizer.as_ref()),
            )
        } else {
            None
        };
        Ok(Extras {
            pin_output_tokens: pin.map(|(tokens, _)| tokens),
            pin_in_frames: pin.is_some_and(|(_, in_frames)| in_frames),
            think_ms: if faithful.think {
                think.next(&exchange)
            } else {
                None
            },
            cancel_after_ms: if cancels {
                exchange.client_cancelled_ms()
            } else {
                None
            },
        })
    }

    /// The exchange as its worker gets it: the recorded line without its response, copied
    /// field by field as written (never re-encoded from a decoded exchange), with this pass's
    /// session and arrival.
    /// The request part is checked here (a line the scan passed can have changed since: the
    /// error then names its file, line and field, and stops the run).
    fn slice_exchange(&self, extras: Extras) -> Result<SliceExchange, RecordingError> {
        let json = if self.pass == 0 {
            self.raw.checked_json_without_response(None, None)?
        } else {
            self.raw
                .checked_json_without_response(self.session.as_deref(), self.at_ms)?
        };
        Ok(SliceExchange {
            index: self.index,
            json,
            pin_output_tokens: extras.pin_output_tokens,
            pin_in_frames: extras.pin_in_frames,
            think_ms: extras.think_ms,
            cancel_after_ms: extras.cancel_after_ms,
            reassigned: false,
        })
    }
}

/// Walk the run's exchanges in order: `(sequence, item)` with the pass adjustments applied
/// (later passes get shifted arrival times and renamed sessions), skipping the sessions a
/// sample leaves out. Each line is read for its session and arrival only; `visit` decides
/// what more it needs of the lines it keeps, and returns false to stop.
fn walk(
    plan: &SlicePlan,
    visit: &mut dyn FnMut(u64, &Item<'_, '_>) -> Result<bool, RecordingError>,
) -> Result<(), RecordingError> {
    let mut sequence = 0u64;
    let mut pass = 0u64;
    loop {
        let mut reader = RecordingReader::open(&plan.recording)?;
        let mut index = 0u64;
        // A torn last line is skipped by the reader (the scan reported it).
        while let Some(raw) = reader.next_raw() {
            let raw = raw?;
            let this_index = index;
            index += 1;
            if plan.requests.is_some_and(|n| sequence >= n) {
                return Ok(());
            }
            let session = raw.session()?;
            if let Some(sample) = &plan.faithful.sample
                && !sample.keeps(session.as_deref(), this_index)
            {
                continue;
            }
            let (session, at_ms) = if pass == 0 {
                (session.map(|s| s.into_owned()), None)
            } else {
                (
                    session.map(|s| format!("{s}#pass{pass}")),
                    raw.at_ms()?.map(|at| at + pass as f64 * plan.pass_span_ms),
                )
            };
            let item = Item {
                raw: &raw,
                index: this_index,
                pass,
                session,
                at_ms,
            };
            if !visit(sequence, &item)? {
                return Ok(());
            }
            sequence += 1;
        }
        pass += 1;
        let more = plan.open_ended || plan.requests.is_some_and(|n| sequence < n);
        if !more || plan.exchanges == 0 {
            return Ok(());
        }
    }
}

/// Buffers exchanges into chunks per destination.
struct Chunker {
    chunk: Vec<SliceExchange>,
}

impl Chunker {
    fn new() -> Chunker {
        Chunker {
            chunk: Vec::with_capacity(CHUNK_EXCHANGES),
        }
    }

    /// Add one exchange; returns false when the destination is gone.
    fn push(&mut self, tx: &SliceSender, exchange: SliceExchange) -> bool {
        self.chunk.push(exchange);
        if self.chunk.len() == CHUNK_EXCHANGES {
            return self.flush(tx);
        }
        true
    }

    fn flush(&mut self, tx: &SliceSender) -> bool {
        if self.chunk.is_empty() {
            return true;
        }
        let full = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK_EXCHANGES));
        tx.blocking_send(SliceChunk {
            exchanges: full,
            last: false,
        })
        .is_ok()
    }
}

/// What the supervisor can tell the feeder while it runs: stop altogether (the run's
/// duration is over: nothing sent now could be started in time), or stop feeding one worker
/// (it was lost; a hung worker's full channel must not hold the others back).
#[derive(Debug)]
pub struct FeedControl {
    stop: AtomicBool,
    dropped: Vec<AtomicBool>,
}

impl FeedControl {
    /// Control of a feed to `workers` workers.
    pub fn new(workers: usize) -> FeedControl {
        FeedControl {
            stop: AtomicBool::new(false),
            dropped: (0..workers).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Stop the whole feed: it returns what it handed over so far.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Feed nothing more to worker `index`.
    pub fn drop_worker(&self, index: usize) {
        if let Some(flag) = self.dropped.get(index) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn is_dropped(&self, index: usize) -> bool {
        self.dropped
            .get(index)
            .is_some_and(|flag| flag.load(Ordering::Relaxed))
    }
}

/// How often a feeder waiting for room in a full slice tries again and looks at its
/// [`FeedControl`]: a worker holds thousands of exchanges, so a few ms of delay refilling its
/// slice never leaves it without work, and a feeder that waits costs a hundred wake-ups a
/// second at most.
const FEED_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// What became of a chunk handed to a worker's slice.
enum Delivery {
    Delivered,
    /// The worker is gone or dropped: nothing more goes to it.
    Gone,
    /// The feed was stopped.
    Stopped,
}

/// Hand `chunk` to worker `index`, waiting for room in its bounded slice while neither the
/// feed is stopped nor the worker dropped.
fn deliver(
    control: &FeedControl,
    index: usize,
    tx: &SliceSender,
    mut chunk: SliceChunk,
) -> Delivery {
    loop {
        match tx.try_send(chunk) {
            Ok(()) => return Delivery::Delivered,
            Err(mpsc::error::TrySendError::Closed(_)) => return Delivery::Gone,
            Err(mpsc::error::TrySendError::Full(back)) => chunk = back,
        }
        if control.stopped() {
            return Delivery::Stopped;
        }
        if control.is_dropped(index) {
            return Delivery::Gone;
        }
        std::thread::sleep(FEED_RETRY);
    }
}

/// Stream every worker's slice into `slices` (worker `i`'s into `slices[i]`) in one walk of
/// the recording: each line is read once for the whole run, whatever the worker count (one
/// walk per worker would read every line once per worker). Runs on a blocking thread (file
/// IO). Returns the number of exchanges
/// handed to each worker; stops early (without error) when `control` says so, and skips a
/// worker that is gone or dropped.
///
/// Slices fill in the run's order, so a worker whose slice is full holds the walk back: the
/// walk waits (for room, a stop, or the worker being dropped) while the others replay what
/// they hold. Every worker takes its stripe at the same pace, and each holds a deep buffer
/// (its slice channel, the HTTP/2 window and the worker's own queue), so only a worker
/// thousands of exchanges behind the others, or hung, holds anyone back; a hung worker is
/// found silent and dropped.
pub fn feed_slices(
    plan: &SlicePlan,
    slices: &[SliceSender],
    control: &FeedControl,
) -> Result<Vec<u64>, RecordingError> {
    let mut sent = vec![0u64; slices.len()];
    let mut chunks: Vec<Vec<SliceExchange>> = slices.iter().map(|_| Vec::new()).collect();
    let mut gone = vec![false; slices.len()];
    let mut stopped = false;
    let mut think = ThinkTimes::default();
    let mut pass = 0;
    let mut deliver_to = |worker: usize, chunk: Vec<SliceExchange>, gone: &mut [bool]| {
        let n = chunk.len() as u64;
        let chunk = SliceChunk {
            exchanges: chunk,
            last: false,
        };
        match deliver(control, worker, &slices[worker], chunk) {
            Delivery::Delivered => {
                sent[worker] += n;
                true
            }
            Delivery::Gone => {
                gone[worker] = true;
                true
            }
            Delivery::Stopped => false,
        }
    };
    walk(plan, &mut |sequence, item| {
        if control.stopped() {
            stopped = true;
            return Ok(false);
        }
        if item.pass != pass {
            // A new pass renames every session: no turn follows one of the last pass.
            pass = item.pass;
            think.clear();
        }
        let worker = worker_for(sequence, item.session.as_deref(), plan.workers);
        if gone.get(worker).is_none_or(|gone| *gone) {
            return Ok(true);
        }
        // Sessions are whole on one worker, so one `think` serves every worker's sessions.
        let extras = item.extras(plan, &mut think)?;
        chunks[worker].push(item.slice_exchange(extras)?);
        if chunks[worker].len() == CHUNK_EXCHANGES {
            let full = std::mem::replace(&mut chunks[worker], Vec::with_capacity(CHUNK_EXCHANGES));
            if !deliver_to(worker, full, &mut gone) {
                stopped = true;
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    if !stopped {
        for worker in 0..slices.len() {
            let rest = std::mem::take(&mut chunks[worker]);
            if !gone[worker] && !rest.is_empty() && !deliver_to(worker, rest, &mut gone) {
                break;
            }
        }
    }
    Ok(sent)
}

/// Stream worker `worker`'s slice into `tx` alone (tests; the run feeds every slice in one
/// walk with [`feed_slices`]). Returns the number of exchanges handed over.
#[cfg(test)]
pub fn feed_slice(plan: &SlicePlan, worker: usize, tx: SliceSender) -> Result<u64, RecordingError> {
    let (sink, closed) = mpsc::channel(1);
    drop(closed);
    let slices: Vec<SliceSender> = (0..plan.workers)
        .map(|i| {
            if i == worker {
                tx.clone()
            } else {
                sink.clone()
            }
        })
        .collect();
    let control = FeedControl::new(plan.workers);
    for i in (0..plan.workers).filter(|&i| i != worker) {
        control.drop_worker(i);
    }
    let sent = feed_slices(plan, &slices, &control)?;
    Ok(sent[worker])
}

/// Re-route the exchanges of dead worker `dead` from position `from` of its slice onwards to
/// the `survivors` (sessions whole by hash, others round-robin). Returns how many each
/// survivor got, in `survivors` order.
pub fn feed_reassigned(
    plan: &SlicePlan,
    dead: usize,
    from: u64,
    survivors: &[SliceSender],
) -> Result<Vec<u64>, RecordingError> {
    let mut counts = vec![0u64; survivors.len()];
    if survivors.is_empty() {
        return Ok(counts);
    }
    let mut chunkers: Vec<Chunker> = survivors.iter().map(|_| Chunker::new()).collect();
    let mut position = 0u64;
    let mut next = 0usize;
    let mut think = ThinkTimes::default();
    let mut pass = 0;
    walk(plan, &mut |sequence, item| {
        if item.pass != pass {
            pass = item.pass;
            think.clear();
        }
        if worker_for(sequence, item.session.as_deref(), plan.workers) != dead {
            return Ok(true);
        }
        let mine = position;
        position += 1;
        // The turns already handed out still count for the think time of the next one.
        let extras = item.extras(plan, &mut think)?;
        if mine < from {
            return Ok(true);
        }
        let target = match item.session.as_deref() {
            Some(session) => (stable_hash(session) % survivors.len() as u64) as usize,
            None => {
                next = (next + 1) % survivors.len();
                next
            }
        };
        let exchange = SliceExchange {
            reassigned: true,
            ..item.slice_exchange(extras)?
        };
        if chunkers[target].push(&survivors[target], exchange) {
            counts[target] += 1;
        }
        Ok(true)
    })?;
    for (chunker, tx) in chunkers.iter_mut().zip(survivors) {
        chunker.flush(tx);
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::recording::Exchange;

    fn recording(name: &str, lines: &[&str]) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "llm-replay-shard-{}-{name}.jsonl",
            std::process::id()
        ));
        std::fs::write(&path, lines.join("\n") + "\n").expect("write the recording");
        path
    }

    fn drain(rx: &mut mpsc::Receiver<SliceChunk>) -> Vec<SliceExchange> {
        let mut out = Vec::new();
        while let Ok(chunk) = rx.try_recv() {
            out.extend(chunk.exchanges);
        }
        out
    }

    #[test]
    fn slices_carry_each_line_without_its_response_and_passes_rename_sessions() {
        let lines = [
            r#"{"session":"a","at_ms":0,"request":{"path":"/v1/chat/completions","body":"{\"x\":1}"},"response":{"status":200,"frames":[{"t_ms":100,"data":"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"},{"t_ms":150,"data":"data: [DONE]\n\n"}]}}"#,
            r#"{"at_ms":10,"extra":{"kept":true},"request":{"path":"/v1/completions"}}"#,
            r#"{"session":"a","at_ms":400,"request":{"path":"/v1/chat/completions"}}"#,
        ];
        let path = recording("passes", &lines);
        let plan = SlicePlan {
            recording: path.clone(),
            workers: 1,
            exchanges: 3,
            requests: Some(5),
            open_ended: false,
            pass_span_ms: 1000.0,
            faithful: SliceFaithful {
                pin: false,
                think: true,
                sample: None,
            },
            tokenizer: None,
            recorded_cancels: false,
        };
        let (tx, mut rx) = mpsc::channel(16);
        assert_eq!(feed_slice(&plan, 0, tx).expect("feeds"), 5);
        let slice = drain(&mut rx);
        let parsed: Vec<Exchange> = slice
            .iter()
            .map(|e| serde_json::from_slice(&e.json).expect("exchange JSON"))
            .collect();
        assert!(parsed.iter().all(|e| e.response.is_none()));
        assert_eq!(
            slice.iter().map(|e| e.index).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1]
        );
        assert_eq!(
            parsed[1].unknown.get("extra"),
            Some(&serde_json::json!({"kept": true}))
        );
        assert_eq!(parsed[3].session.as_deref(), Some("a#pass1"));
        assert_eq!(parsed[3].at_ms, Some(1000.0));
        assert_eq!(parsed[4].session, None);
        assert_eq!(parsed[4].at_ms, Some(1010.0));
        // The second turn of "a" follows the first's end (0 + 150 ms) by 250 ms; the new pass
        // starts its sessions afresh.
        assert_eq!(
            slice.iter().map(|e| e.think_ms).collect::<Vec<_>>(),
            [None, None, Some(250.0), None, None]
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_dead_workers_rest_goes_to_survivors_with_its_think_times() {
        let lines = [
            r#"{"session":"s","at_ms":0,"request":{"path":"/v1/completions"},"response":{"status":200,"frames":[{"t_ms":50,"data":"data: [DONE]\n\n"}]}}"#,
            r#"{"session":"s","at_ms":80,"request":{"path":"/v1/completions"}}"#,
        ];
        let path = recording("reassign", &lines);
        let plan = SlicePlan {
            recording: path.clone(),
            workers: 2,
            exchanges: 2,
            requests: None,
            open_ended: false,
            pass_span_ms: 0.0,
            faithful: SliceFaithful {
                pin: false,
                think: true,
                sample: None,
            },
            tokenizer: None,
            recorded_cancels: false,
        };
        let dead = worker_for(0, Some("s"), 2);
        let (tx, mut rx) = mpsc::channel(16);
        let counts = feed_reassigned(&plan, dead, 1, &[tx]).expect("feeds");
        assert_eq!(counts, [1]);
        let slice = drain(&mut rx);
        assert_eq!(slice.len(), 1);
        assert_eq!((slice[0].index, slice[0].think_ms), (1, Some(30.0)));
        assert!(
            slice[0].reassigned,
            "the survivor is told it was handed over"
        );
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn one_walk_feeds_every_worker_and_a_full_slice_of_a_dropped_worker_holds_nobody() {
        let lines: Vec<String> = (0..600)
            .map(|i| format!(r#"{{"at_ms":{i},"request":{{"path":"/v1/completions"}}}}"#))
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let path = recording("one-walk", &refs);
        let plan = SlicePlan {
            recording: path.clone(),
            workers: 3,
            exchanges: 600,
            requests: Some(1200),
            open_ended: false,
            pass_span_ms: 1000.0,
            faithful: SliceFaithful::default(),
            tokenizer: None,
            recorded_cancels: false,
        };
        // Worker 1 never reads: its one-chunk slice is full after its first chunk.
        let (tx0, mut rx0) = mpsc::channel(64);
        let (tx1, _rx1) = mpsc::channel(1);
        let (tx2, mut rx2) = mpsc::channel(64);
        let control = std::sync::Arc::new(FeedControl::new(3));
        let dropper = {
            let control = control.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                control.drop_worker(1);
            })
        };
        let sent = feed_slices(&plan, &[tx0, tx1, tx2], &control).expect("feeds");
        dropper.join().expect("the dropper thread");
        assert_eq!((sent[0], sent[1], sent[2]), (400, 64, 400));
        let (slice0, slice2) = (drain(&mut rx0), drain(&mut rx2));
        assert_eq!(slice0.len(), 400);
        assert!(slice0.iter().all(|e| e.index % 3 == 0));
        assert!(slice2.iter().all(|e| e.index % 3 == 2));

        // A stopped feed returns at once, even while a slice is full.
        let (tx, _rx) = mpsc::channel(1);
        let control = FeedControl::new(1);
        let one = SlicePlan {
            workers: 1,
            requests: Some(10_000_000),
            ..plan
        };
        let stopper = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                control.stop();
            });
            feed_slices(&one, &[tx], &control).expect("feeds")
        });
        assert_eq!(stopper, [64]);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_recorded_cancellation_travels_with_its_exchange_and_frame_pins_say_so() {
        let lines = [
            r#"{"at_ms":0,"request":{"path":"/v1/chat/completions"},"response":{"status":200,"frames":[{"t_ms":100,"data":"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"}],"complete":false,"ended":"client disconnected","cancelled_ms":141.5}}"#,
            r#"{"at_ms":10,"request":{"path":"/v1/chat/completions"},"response":{"status":200,"frames":[{"t_ms":100,"data":"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"},{"t_ms":120,"data":"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"},{"t_ms":150,"data":"data: [DONE]\n\n"}],"complete":true}}"#,
        ];
        let path = recording("cancels", &lines);
        let plan = SlicePlan {
            recording: path.clone(),
            workers: 1,
            exchanges: 2,
            requests: None,
            open_ended: false,
            pass_span_ms: 0.0,
            faithful: SliceFaithful {
                pin: true,
                think: false,
                sample: None,
            },
            tokenizer: None,
            recorded_cancels: true,
        };
        let (tx, mut rx) = mpsc::channel(16);
        assert_eq!(feed_slice(&plan, 0, tx).expect("feeds"), 2);
        let slice = drain(&mut rx);
        assert_eq!(slice[0].cancel_after_ms, Some(141.5));
        assert_eq!(slice[1].cancel_after_ms, None);
        // No usage, no tokenizer: the pin is the recorded content frames, and says so.
        assert_eq!(slice[1].pin_output_tokens, Some(2));
        assert!(slice[1].pin_in_frames);

        // A plan that does not look for cancellations sends none (and decodes nothing more).
        let plan = SlicePlan {
            recorded_cancels: false,
            faithful: SliceFaithful::default(),
            ..plan
        };
        let (tx, mut rx) = mpsc::channel(16);
        feed_slice(&plan, 0, tx).expect("feeds");
        assert!(drain(&mut rx).iter().all(|e| e.cancel_after_ms.is_none()));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn only_a_recording_holding_the_marker_is_searched_for_cancellations() {
        let with = recording(
            "marker",
            &[
                r#"{"request":{"path":"/v1/completions"},"response":{"status":200,"frames":[],"complete":false,"ended":"client disconnected"}}"#,
            ],
        );
        let without = recording("no-marker", &[r#"{"request":{"path":"/v1/completions"}}"#]);
        assert!(may_hold_cancellations(&with));
        assert!(!may_hold_cancellations(&without));
        // Across the 1 MiB reads: the marker straddles the first boundary.
        let mut line = String::from(r#"{"request":{"path":"/v1/completions","body":""#);
        line.push_str(&"x".repeat((1 << 20) - line.len() - 5));
        line.push_str(r#""},"response":{"status":200,"ended":"client disconnected"}}"#);
        let straddling = recording("straddling", &[&line]);
        assert!(may_hold_cancellations(&straddling));
        for path in [with, without, straddling] {
            let _ = std::fs::remove_file(path);
        }
        assert!(may_hold_cancellations(std::path::Path::new(
            "/nonexistent/rec.jsonl"
        )));
    }

    #[test]
    fn sessions_stay_whole_and_stripes_cover_every_worker() {
        assert_eq!(
            worker_for(5, Some("conv-1"), 4),
            worker_for(9, Some("conv-1"), 4)
        );
        let mut per_worker = [0u64; 4];
        for seq in 0..400 {
            per_worker[worker_for(seq, None, 4)] += 1;
        }
        assert_eq!(per_worker, [100; 4]);
    }
}
