//! What the coordinator, the worker and the mock agree on about a replay beyond the recording
//! format: the defaults both sides apply and the header that tags a replayed exchange.

use std::time::Duration;

/// Request header that names the recorded exchange a replayed request came from (its 0-based
/// index in file order); the embedded mock serves that exchange's response.
pub const EXCHANGE_HEADER: &str = "x-llm-replay-exchange";

/// How many exchanges a recorded schedule reads ahead to put lines back in `at_ms` order
/// (`--reorder-window`).
pub const DEFAULT_REORDER_WINDOW: usize = 4096;

/// A replayed request's default timeout (`--timeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether a replay is *open-ended*: its slices never end (the feeders loop over the
/// recording) and the run's `--duration` stops it. That is a duration-bound run with no
/// request count on a schedule that is not the recording's own. The one name of this idea:
/// the coordinator's feeders, the worker's engine and the assignment (`exchange_count` 0 on
/// the wire) all mean this.
pub fn is_open_ended(
    requests: Option<u64>,
    duration: Option<Duration>,
    recorded_schedule: bool,
) -> bool {
    requests.is_none() && duration.is_some() && !recorded_schedule
}
