//! Sharding: which worker replays which exchange, and the feeders that stream slices.
//!
//! Sessions stay whole on one worker (chosen by a stable hash of the session id); other
//! exchanges are striped by index, so every worker's slice spans the whole schedule. The
//! assignment depends only on the recording and the worker count: it is deterministic.
//! Each feeder reads the recording itself, so slices stream and memory stays bounded. Feeders
//! never close a slice: the orchestrator sends the closing chunk once no exchange can be
//! reassigned to that worker any more.
//!
//! The feeders are where the recording is read during the run, so they also attach what
//! faithful replay needs to each exchange before its response is dropped: the recorded
//! output length and the recorded think time (`crate::faithful`), and skip the sessions a
//! `--sample-sessions` run leaves out.

use std::path::PathBuf;

use common::recording::{Exchange, RecordingError, RecordingReader};

use crate::faithful::{SliceFaithful, ThinkTimes, recorded_output_tokens};
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
    /// `--session-mode closed`: the recorded think time before this turn, ms.
    pub think_ms: Option<f64>,
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
}

/// What travels with an exchange besides its request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Extras {
    pin_output_tokens: Option<u64>,
    think_ms: Option<f64>,
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

/// Walk the run's exchanges in order: `(sequence, index in the recording, exchange, extras)`
/// with the pass adjustments applied (later passes get shifted arrival times and renamed
/// sessions), skipping the sessions a sample leaves out. `visit` returns false to stop.
fn walk(
    plan: &SlicePlan,
    visit: &mut dyn FnMut(u64, u64, Exchange, Extras) -> bool,
) -> Result<(), RecordingError> {
    let mut sequence = 0u64;
    let mut pass = 0u64;
    let mut think = ThinkTimes::default();
    loop {
        think.clear();
        for (index, item) in RecordingReader::open(&plan.recording)?.enumerate() {
            let index = index as u64;
            // A torn last line is skipped by the reader (the scan reported it).
            let (_, mut exchange) = item?;
            if plan.requests.is_some_and(|n| sequence >= n) {
                return Ok(());
            }
            if let Some(sample) = &plan.faithful.sample
                && !sample.keeps(exchange.session.as_deref(), index)
            {
                continue;
            }
            let extras = Extras {
                pin_output_tokens: if plan.faithful.pin {
                    recorded_output_tokens(&exchange)
                } else {
                    None
                },
                think_ms: if plan.faithful.think {
                    think.next(&exchange)
                } else {
                    None
                },
            };
            exchange.response = None;
            if pass > 0 {
                exchange.session = exchange.session.map(|s| format!("{s}#pass{pass}"));
                exchange.at_ms = exchange
                    .at_ms
                    .map(|at| at + pass as f64 * plan.pass_span_ms);
            }
            if !visit(sequence, index, exchange, extras) {
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
    fn push(&mut self, tx: &SliceSender, index: u64, exchange: &Exchange, extras: Extras) -> bool {
        let json = serde_json::to_vec(exchange).expect("an exchange always serializes");
        self.chunk.push(SliceExchange {
            index,
            json,
            pin_output_tokens: extras.pin_output_tokens,
            think_ms: extras.think_ms,
        });
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

/// Stream worker `worker`'s slice into `tx`. Runs on a blocking thread (file IO). Returns the
/// number of exchanges handed over; stops early (without error) when the worker is gone.
pub fn feed_slice(plan: &SlicePlan, worker: usize, tx: SliceSender) -> Result<u64, RecordingError> {
    let mut sent = 0u64;
    let mut chunker = Chunker::new();
    let mut gone = false;
    walk(plan, &mut |sequence, index, exchange, extras| {
        if worker_for(sequence, exchange.session.as_deref(), plan.workers) != worker {
            return true;
        }
        sent += 1;
        if !chunker.push(&tx, index, &exchange, extras) {
            gone = true;
            return false;
        }
        true
    })?;
    if !gone {
        chunker.flush(&tx);
    }
    Ok(sent)
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
    walk(plan, &mut |sequence, index, exchange, extras| {
        if worker_for(sequence, exchange.session.as_deref(), plan.workers) != dead {
            return true;
        }
        let mine = position;
        position += 1;
        if mine < from {
            return true;
        }
        let target = match exchange.session.as_deref() {
            Some(session) => (stable_hash(session) % survivors.len() as u64) as usize,
            None => {
                next = (next + 1) % survivors.len();
                next
            }
        };
        if chunkers[target].push(&survivors[target], index, &exchange, extras) {
            counts[target] += 1;
        }
        true
    })?;
    for (chunker, tx) in chunkers.iter_mut().zip(survivors) {
        chunker.flush(tx);
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

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
