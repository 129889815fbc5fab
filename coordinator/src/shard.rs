//! Sharding: which worker replays which exchange, and the feeder that streams a worker's slice.
//!
//! Sessions stay whole on one worker (chosen by a stable hash of the session id); other
//! exchanges are striped by index, so every worker's slice spans the whole schedule. The
//! assignment depends only on the recording and the worker count: it is deterministic.
//! Each feeder reads the recording itself, so slices stream and memory stays bounded.

use std::path::PathBuf;

use common::recording::{RecordingError, RecordingReader};
use proto::v1;
use tokio::sync::mpsc;

/// Exchanges per chunk sent to a worker.
pub const CHUNK_EXCHANGES: usize = 64;

/// How the recording is turned into the run's stream of exchanges.
#[derive(Debug, Clone)]
pub struct SlicePlan {
    pub recording: PathBuf,
    pub workers: usize,
    /// Total exchanges in the recording (from the scan).
    pub exchanges: u64,
    /// Stop after this many exchanges in all (the recording loops when it is shorter).
    pub requests: Option<u64>,
    /// Loop the recording without end (a duration-bound run without a request count).
    pub loop_forever: bool,
    /// Offset added to arrival times on each pass over the recording (ms).
    pub pass_span_ms: f64,
}

/// FNV-1a: stable across builds and platforms, unlike `std`'s hasher.
fn stable_hash(text: &str) -> u64 {
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

/// Stream worker `worker`'s slice into `tx` in chunks. Runs on a blocking thread (file IO).
/// Returns the number of exchanges sent, or the recording error that stopped it.
pub fn feed_slice(
    plan: &SlicePlan,
    worker: usize,
    tx: mpsc::Sender<Result<v1::ExchangeChunk, tonic::Status>>,
) -> Result<u64, RecordingError> {
    let mut sent = 0u64;
    let mut sequence = 0u64;
    let mut chunk = Vec::with_capacity(CHUNK_EXCHANGES);
    let mut pass = 0u64;
    let limit = plan.requests;
    'passes: loop {
        let reader = RecordingReader::open(&plan.recording)?;
        let mut index = 0u64;
        for item in reader {
            let mut exchange = match item {
                Ok((_, exchange)) => exchange,
                // The scan already reported a torn last line; it is not replayed.
                Err(RecordingError::TornLastLine { .. }) => break,
                Err(error) => return Err(error),
            };
            if limit.is_some_and(|n| sequence >= n) {
                break 'passes;
            }
            let this = sequence;
            sequence += 1;
            index += 1;
            let session = exchange.session.clone().map(|s| {
                if pass == 0 {
                    s
                } else {
                    format!("{s}#pass{pass}")
                }
            });
            if worker_for(this, session.as_deref(), plan.workers) != worker {
                continue;
            }
            exchange.response = None;
            exchange.session = session;
            if pass > 0 {
                exchange.at_ms = exchange
                    .at_ms
                    .map(|at| at + pass as f64 * plan.pass_span_ms);
            }
            let json = serde_json::to_vec(&exchange).expect("an exchange always serializes");
            chunk.push(v1::Exchange {
                index: index - 1,
                json,
            });
            sent += 1;
            if chunk.len() == CHUNK_EXCHANGES {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK_EXCHANGES));
                if tx
                    .blocking_send(Ok(v1::ExchangeChunk {
                        exchanges: full,
                        last: false,
                    }))
                    .is_err()
                {
                    // The worker is gone or finished early (duration): stop reading.
                    return Ok(sent);
                }
            }
        }
        pass += 1;
        let more = plan.loop_forever || limit.is_some_and(|n| sequence < n);
        if !more || plan.exchanges == 0 {
            break;
        }
    }
    let _ = tx.blocking_send(Ok(v1::ExchangeChunk {
        exchanges: chunk,
        last: true,
    }));
    Ok(sent)
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
