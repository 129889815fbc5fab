//! The pre-scan of a recording: validates every line (so bad input fails before any load is
//! sent), counts exchanges and sessions, and measures the baseline from the recorded frames
//! with the same [`common::measure`] code the workers use.

use std::collections::BTreeMap;
use std::path::Path;

use common::measure::{recorded_family, recorded_outcome};
use common::metrics::RunMetrics;
use common::recording::{RecordingError, RecordingReader};

/// What the coordinator knows about a recording before replaying it.
#[derive(Debug, Clone, Default)]
pub struct RecordingScan {
    pub exchanges: u64,
    /// Exchanges with an arrival offset.
    pub with_arrival: u64,
    /// Largest arrival offset (ms).
    pub max_at_ms: f64,
    /// Distinct sessions.
    pub sessions: u64,
    /// Exchanges whose response frames all have timing (they make the baseline).
    pub with_frame_timing: u64,
    /// The recording's own metrics, measured from its frames; `None` without frame timing.
    pub baseline: Option<RunMetrics>,
    /// Families seen, by name.
    pub families: BTreeMap<&'static str, u64>,
    /// A torn last line that was skipped (reported, not fatal).
    pub torn_last_line: Option<u64>,
}

/// Scan `path`. Any invalid line is an error naming file, line and field.
pub fn scan(path: &Path) -> Result<RecordingScan, RecordingError> {
    let mut out = RecordingScan::default();
    let mut baseline = RunMetrics::new();
    let mut sessions = std::collections::HashSet::new();
    let mut reader = RecordingReader::open(path)?;
    for item in reader.by_ref() {
        let (_, exchange) = item?;
        out.exchanges += 1;
        if let Some(at) = exchange.at_ms {
            out.with_arrival += 1;
            out.max_at_ms = out.max_at_ms.max(at);
        }
        if let Some(session) = &exchange.session
            && !sessions.contains(session.as_str())
        {
            sessions.insert(session.clone());
        }
        if let Some(family) = recorded_family(&exchange) {
            *out.families.entry(family.name()).or_default() += 1;
        }
        if let Some(outcome) = recorded_outcome(&exchange) {
            out.with_frame_timing += 1;
            baseline.record(&outcome);
        }
    }
    out.torn_last_line = reader.torn_last_line();
    out.sessions = sessions.len() as u64;
    if out.with_frame_timing > 0 {
        out.baseline = Some(baseline);
    }
    Ok(out)
}
