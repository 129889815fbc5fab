//! The recording's sessions as the coordinator reads them: which sessions a
//! `--sample-sessions` run keeps, and the recorded think time before each turn.
//!
//! Both are computed where the recording is read (the scan and the slice feeders), in the
//! recording's order; `faithful` turns them into what the workers get and the report shows.

use std::collections::HashMap;

use common::recording::Exchange;

/// `--sample-sessions FRACTION --seed N`: a deterministic subset of whole sessions.
///
/// The choice is a hash of (seed, session id) — of (seed, line index) for an exchange without
/// a session — compared with the fraction, never a draw from a random sequence: the same
/// sessions are kept whatever the number of workers, the order of reading, or the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SessionSample {
    /// Share of sessions kept, in (0, 1].
    pub fraction: f64,
    pub seed: u64,
}

impl SessionSample {
    /// True when the exchange at `index` (0-based line order of the recording) of `session`
    /// is replayed.
    pub fn keeps(&self, session: Option<&str>, index: u64) -> bool {
        if self.fraction >= 1.0 {
            return true;
        }
        let key = match session {
            Some(session) => mix(self.seed, 1, session.as_bytes()),
            None => mix(self.seed, 2, &index.to_le_bytes()),
        };
        // The top 53 bits as a uniform number in [0, 1).
        ((key >> 11) as f64 / (1u64 << 53) as f64) < self.fraction
    }
}

/// FNV-1a over (seed, kind, bytes), finished with SplitMix64 so that ids differing in one
/// character land far apart.
fn mix(seed: u64, kind: u8, bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in seed.to_le_bytes().iter().chain([kind].iter()).chain(bytes) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// Recorded think times, read in the recording's order: a session's turns are recorded one
/// after the other (a turn starts after the previous one's answer), so file order is turn
/// order within a session.
#[derive(Debug, Default)]
pub struct ThinkTimes {
    /// Session → where its latest turn ended (`at_ms` + last frame `t_ms`), when known.
    ended_ms: HashMap<String, Option<f64>>,
}

impl ThinkTimes {
    /// The recorded think time before `exchange` (ms): its `at_ms` − (the previous turn's
    /// `at_ms` + that turn's last frame `t_ms`), never negative. `None` for a session's first
    /// turn, an exchange without a session, or when either side lacks the timing.
    pub fn next(&mut self, exchange: &Exchange) -> Option<f64> {
        let session = exchange.session.as_ref()?;
        let ended = exchange.at_ms.and_then(|at| {
            let last = exchange.response.as_ref()?.frames.last()?.t_ms?;
            Some(at + last)
        });
        let previous = self.ended_ms.insert(session.clone(), ended)?;
        Some((exchange.at_ms? - previous?).max(0.0))
    }

    /// Forget every session (a new pass over the recording renames them).
    pub fn clear(&mut self) {
        self.ended_ms.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_a_pure_function_of_seed_and_session() {
        let sample = SessionSample {
            fraction: 0.25,
            seed: 7,
        };
        let kept: Vec<bool> = (0..4000)
            .map(|i| sample.keeps(Some(&format!("conv-{i}")), i))
            .collect();
        let again: Vec<bool> = (0..4000)
            .rev()
            .map(|i| sample.keeps(Some(&format!("conv-{i}")), 99))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert_eq!(kept, again, "the index does not matter for a session");
        let share = kept.iter().filter(|k| **k).count() as f64 / 4000.0;
        assert!((share - 0.25).abs() < 0.03, "{share}");
        let other_seed = SessionSample { seed: 8, ..sample };
        let differs = (0..4000)
            .filter(|i| other_seed.keeps(Some(&format!("conv-{i}")), 0) != kept[*i as usize])
            .count();
        assert!(
            differs > 500,
            "another seed picks other sessions: {differs}"
        );
        let loose = (0..4000).filter(|i| sample.keeps(None, *i)).count() as f64 / 4000.0;
        assert!((loose - 0.25).abs() < 0.03, "{loose}");
    }

    #[test]
    fn think_time_is_next_start_minus_previous_end() {
        let turn = |session: &str, at: f64, last_t: f64| -> Exchange {
            serde_json::from_value(serde_json::json!({
                "session": session, "at_ms": at,
                "request": {"path": "/v1/chat/completions"},
                "response": {"status": 200, "frames": [{"t_ms": 10.0, "data": "x"}, {"t_ms": last_t, "data": "y"}]}
            }))
            .expect("exchange")
        };
        let mut think = ThinkTimes::default();
        assert_eq!(think.next(&turn("a", 0.0, 300.0)), None);
        assert_eq!(think.next(&turn("b", 50.0, 100.0)), None);
        assert_eq!(think.next(&turn("a", 500.0, 300.0)), Some(200.0));
        assert_eq!(
            think.next(&turn("b", 140.0, 100.0)),
            Some(0.0),
            "never negative"
        );
    }
}
