//! Handed-over exchanges keep their recorded pace.
//!
//! Under `--on-worker-loss reassign` a lost worker's unstarted exchanges reach a survivor
//! (`WorkItem::reassigned`) once the loss is found, seconds after the first of them were due.
//! Sent as soon as they were due, the overdue ones all went out together: ~180 requests at
//! once on a 16-slot server took its TTFT p95 from 21 to 552 ms. On a recorded schedule the
//! survivor delays them instead ([`HandOvers::place`]): the first handed-over exchange that
//! arrives late sets the delay `d` (how late it is), and every handed-over exchange is then due
//! at its recorded send time + `d`: the lost worker's remaining traffic replays with its
//! recorded spacing, from the moment it arrived. One that arrives later than that (the
//! hand-over fell behind its delay, or a second loss handed more over) moves the delay up to
//! its own lateness. The delay never shrinks, so handed-over exchanges keep their recorded
//! order and no two go out closer than recorded; one that is not late while no delay is set
//! keeps its own time. The survivor's own exchanges are never moved.
//!
//! Times are on the recorded clock (ms; the wall clock × `--speed`), so the rule is a pure
//! function of numbers. What was sent of each hand-over goes to the log and to
//! [`HandOverCounters`], which the link can read for reports ([`HandOverCounters::span`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a worker replayed of the exchanges handed over to it, as its reports carry it (read
/// with [`HandOverCounters::span`]). Instants are the worker's wall clock.
pub use common::worker_report::HandOverSpan;

/// [`HandOverSpan`] as the engine updates it while it sends (one writer, the scheduler; any
/// reader): atomics, all 0 until a handed-over exchange is sent.
#[derive(Debug, Default)]
pub struct HandOverCounters {
    hand_overs: AtomicU64,
    exchanges: AtomicU64,
    first_sent_unix_us: AtomicU64,
    last_sent_unix_us: AtomicU64,
    delay_us: AtomicU64,
}

impl HandOverCounters {
    /// The span so far; `None` until a handed-over exchange was sent.
    pub fn span(&self) -> Option<HandOverSpan> {
        let exchanges = self.exchanges.load(Ordering::Relaxed);
        (exchanges > 0).then(|| HandOverSpan {
            hand_overs: self.hand_overs.load(Ordering::Relaxed),
            exchanges,
            first_sent_unix_us: self.first_sent_unix_us.load(Ordering::Relaxed),
            last_sent_unix_us: self.last_sent_unix_us.load(Ordering::Relaxed),
            delay_us: self.delay_us.load(Ordering::Relaxed),
        })
    }
}

/// A late arrival that moves the delay by more than this begins a new hand-over in the log
/// and the span's count (a second loss is found a heartbeat timeout after it happened); a
/// smaller move is the same hand-over falling behind.
pub const NEW_HAND_OVER: Duration = Duration::from_secs(1);

/// At most this many hand-overs are told apart in the log; later ones count with the last.
const MAX_HAND_OVERS_LOGGED: usize = 64;

/// Which hand-over a handed-over exchange was placed in, carried to its send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandOverMark(Option<usize>);

impl HandOverMark {
    /// A handed-over exchange that no delay applies to (its own time, or a load paced by a
    /// rate or by slots).
    pub const OWN_TIME: HandOverMark = HandOverMark(None);
}

/// Where [`HandOvers::place`] put a handed-over exchange.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    /// Its send offset on the recorded clock (ms after the start × speed): its recorded one
    /// plus the delay, never before it arrived.
    pub due_ms: f64,
    pub mark: HandOverMark,
}

/// The delay of a replay's handed-over exchanges and what was sent of each hand-over.
#[derive(Debug)]
pub struct HandOvers {
    /// `--speed`: recorded ms per wall-clock ms.
    speed: f64,
    /// Recorded-clock ms added to every handed-over exchange's offset (0: none arrived late).
    delay_ms: f64,
    /// The hand-overs that arrived late, in order: the current one last.
    hand_overs: Vec<HandOver>,
    /// Handed-over exchanges sent with no delay.
    own_time: Sent,
}

/// One hand-over: from a late arrival that set or moved the delay by at least
/// [`NEW_HAND_OVER`], until the next.
#[derive(Debug, Clone, Copy, PartialEq)]
struct HandOver {
    /// The delay it began with and its latest (recorded-clock ms).
    first_delay_ms: f64,
    delay_ms: f64,
    sent: Sent,
}

/// What was sent of a group of handed-over exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Sent {
    exchanges: u64,
    first_unix_us: u64,
    last_unix_us: u64,
}

impl Sent {
    fn add(&mut self, unix_us: u64) {
        if self.exchanges == 0 {
            self.first_unix_us = unix_us;
        }
        self.exchanges += 1;
        self.last_unix_us = unix_us;
    }
}

impl HandOvers {
    /// No hand-over yet, on a schedule replayed at `speed` (1 when not a recorded schedule).
    pub fn new(speed: f64) -> HandOvers {
        HandOvers {
            speed: if speed.is_finite() && speed > 0.0 {
                speed
            } else {
                1.0
            },
            delay_ms: 0.0,
            hand_overs: Vec::new(),
            own_time: Sent::default(),
        }
    }

    /// Place a handed-over exchange recorded at `at_ms` that arrived when the replay's
    /// recorded clock read `now_ms`: due at `at_ms` + the delay when that is not past;
    /// otherwise it is late, the delay grows to its lateness and it is due now. An exchange
    /// without an offset (due at once) is left as it is.
    pub fn place(&mut self, at_ms: f64, now_ms: f64) -> Placement {
        let current = HandOverMark(self.hand_overs.len().checked_sub(1));
        if !at_ms.is_finite() {
            return Placement {
                due_ms: at_ms,
                mark: current,
            };
        }
        let due_ms = at_ms + self.delay_ms;
        if due_ms >= now_ms {
            return Placement {
                due_ms,
                mark: current,
            };
        }
        let delay_ms = now_ms - at_ms;
        let moved_by_ms = delay_ms - self.delay_ms;
        self.delay_ms = delay_ms;
        let new_hand_over = self.hand_overs.is_empty()
            || (moved_by_ms >= NEW_HAND_OVER.as_secs_f64() * 1000.0 * self.speed
                && self.hand_overs.len() < MAX_HAND_OVERS_LOGGED);
        if new_hand_over {
            self.hand_overs.push(HandOver {
                first_delay_ms: delay_ms,
                delay_ms,
                sent: Sent::default(),
            });
            tracing::info!(
                hand_over = self.hand_overs.len(),
                delay_ms = self.wall_ms(delay_ms),
                recorded_at_ms = at_ms,
                "handed-over exchanges arrived late: they keep their recorded pace, delayed"
            );
        } else if let Some(last) = self.hand_overs.last_mut() {
            last.delay_ms = delay_ms;
            tracing::debug!(
                delay_ms = self.wall_ms(delay_ms),
                "a handed-over exchange arrived behind its delay: the delay grows"
            );
        }
        Placement {
            due_ms: now_ms,
            mark: HandOverMark(self.hand_overs.len().checked_sub(1)),
        }
    }

    /// A handed-over exchange placed in `mark` was released at `unix_us`: count it here and
    /// in `counters`.
    pub fn sent(&mut self, mark: HandOverMark, unix_us: u64, counters: &HandOverCounters) {
        let delay_ms = match mark.0.and_then(|i| self.hand_overs.get_mut(i)) {
            Some(hand_over) => {
                hand_over.sent.add(unix_us);
                hand_over.delay_ms
            }
            None => {
                self.own_time.add(unix_us);
                0.0
            }
        };
        if counters.exchanges.fetch_add(1, Ordering::Relaxed) == 0 {
            counters
                .first_sent_unix_us
                .store(unix_us, Ordering::Relaxed);
        }
        counters.last_sent_unix_us.store(unix_us, Ordering::Relaxed);
        counters.delay_us.store(
            (self.wall_ms(delay_ms) * 1000.0).round() as u64,
            Ordering::Relaxed,
        );
        counters
            .hand_overs
            .store(self.hand_overs.len() as u64, Ordering::Relaxed);
    }

    /// Log what was sent of each hand-over (`info`): its size, delay and span.
    pub fn log_sent(&self) {
        let groups = std::iter::once((None, &self.own_time)).chain(
            self.hand_overs
                .iter()
                .enumerate()
                .map(|(i, h)| (Some((i + 1, h)), &h.sent)),
        );
        for (hand_over, sent) in groups.filter(|(_, sent)| sent.exchanges > 0) {
            let span_ms = sent.last_unix_us.saturating_sub(sent.first_unix_us) as f64 / 1000.0;
            let (number, first_delay_ms, delay_ms) = hand_over.map_or((0, 0.0, 0.0), |(i, h)| {
                (i, self.wall_ms(h.first_delay_ms), self.wall_ms(h.delay_ms))
            });
            tracing::info!(
                hand_over = number,
                exchanges = sent.exchanges,
                delay_ms = first_delay_ms,
                last_delay_ms = delay_ms,
                first_sent_unix_us = sent.first_unix_us,
                last_sent_unix_us = sent.last_unix_us,
                span_ms,
                "handed-over exchanges sent"
            );
        }
    }

    /// Recorded-clock ms as wall-clock ms.
    fn wall_ms(&self, recorded_ms: f64) -> f64 {
        recorded_ms / self.speed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where each of `arrivals` (`(at_ms, now_ms)`, in arrival order) is due.
    fn dues(hand_overs: &mut HandOvers, arrivals: &[(f64, f64)]) -> Vec<f64> {
        arrivals
            .iter()
            .map(|&(at_ms, now_ms)| hand_overs.place(at_ms, now_ms).due_ms)
            .collect()
    }

    #[test]
    fn a_handed_over_exchange_that_is_not_late_keeps_its_own_time() {
        let mut hand_overs = HandOvers::new(1.0);
        let placed = hand_overs.place(5_000.0, 4_000.0);
        assert_eq!(
            placed,
            Placement {
                due_ms: 5_000.0,
                mark: HandOverMark::OWN_TIME
            }
        );
        assert_eq!(hand_overs.delay_ms, 0.0);
    }

    /// The lost worker's overdue exchanges (recorded 40 ms apart, found 3 s late, all at
    /// once) go out 40 ms apart from their arrival, and so does the rest of its share: the
    /// first one late sets the delay for all.
    #[test]
    fn the_first_late_exchange_sets_the_delay_of_the_whole_hand_over() {
        let mut hand_overs = HandOvers::new(1.0);
        let arrivals: Vec<(f64, f64)> = (0..100).map(|i| (i as f64 * 40.0, 3_000.0)).collect();
        let due = dues(&mut hand_overs, &arrivals);
        let expected: Vec<f64> = (0..100).map(|i| 3_000.0 + i as f64 * 40.0).collect();
        assert_eq!(due, expected);
        // Later ones, read ahead before they are due: the same delay.
        assert_eq!(hand_overs.place(10_000.0, 9_000.0).due_ms, 13_000.0);
        assert_eq!(hand_overs.hand_overs.len(), 1);
        assert_eq!(hand_overs.hand_overs[0].first_delay_ms, 3_000.0);
    }

    /// Arriving behind its delay (the hand-over fell behind), an exchange is due at once and
    /// the delay grows to its lateness, so the next ones keep their spacing after it: the same
    /// hand-over while it moves by less than a second.
    #[test]
    fn an_exchange_later_than_its_delay_moves_the_delay_up() {
        let mut hand_overs = HandOvers::new(1.0);
        assert_eq!(hand_overs.place(0.0, 2_000.0).due_ms, 2_000.0);
        // Due at 2_040; it arrives at 2_300.
        let placed = hand_overs.place(40.0, 2_300.0);
        assert_eq!(placed.due_ms, 2_300.0);
        assert_eq!(placed.mark, HandOverMark(Some(0)));
        assert_eq!(hand_overs.place(80.0, 2_300.0).due_ms, 2_340.0);
        assert_eq!(hand_overs.hand_overs.len(), 1);
        assert_eq!(hand_overs.hand_overs[0].delay_ms, 2_260.0);
        // Due exactly now is not late.
        assert_eq!(hand_overs.place(120.0, 2_380.0).due_ms, 2_380.0);
        assert_eq!(hand_overs.delay_ms, 2_260.0);
    }

    /// A second loss later: its exchanges, later than the delay by seconds, begin a second
    /// hand-over with their own lateness; the first one's later exchanges take it too (the
    /// delay never shrinks, so none goes out closer to the one before than recorded). A
    /// hand-over less late than the delay takes the delay.
    #[test]
    fn a_second_loss_begins_a_second_hand_over() {
        let mut hand_overs = HandOvers::new(1.0);
        assert_eq!(hand_overs.place(1_000.0, 3_000.0).due_ms, 3_000.0);
        let second = hand_overs.place(20_000.0, 25_000.0);
        assert_eq!(second.due_ms, 25_000.0);
        assert_eq!(second.mark, HandOverMark(Some(1)));
        assert_eq!(hand_overs.delay_ms, 5_000.0);
        assert_eq!(hand_overs.place(21_000.0, 25_000.0).due_ms, 26_000.0);
        // Less late (1 s) than the delay (5 s): delayed by 5 s, in the current hand-over.
        let third = hand_overs.place(40_000.0, 41_000.0);
        assert_eq!(third.due_ms, 45_000.0);
        assert_eq!(third.mark, HandOverMark(Some(1)));
    }

    /// On the recorded clock: at `--speed 2` a second of wall clock is 2,000 recorded ms, so
    /// a move of 1.5 recorded seconds is the same hand-over, and delays read in wall time.
    #[test]
    fn the_speed_scales_the_new_hand_over_threshold_and_the_delays() {
        let mut hand_overs = HandOvers::new(2.0);
        hand_overs.place(0.0, 4_000.0);
        assert_eq!(hand_overs.place(1_000.0, 6_500.0).due_ms, 6_500.0);
        assert_eq!(
            hand_overs.hand_overs.len(),
            1,
            "moved by 0.75 s of wall clock"
        );
        hand_overs.place(2_000.0, 10_000.0);
        assert_eq!(
            hand_overs.hand_overs.len(),
            2,
            "moved by 1.25 s of wall clock"
        );
        let counters = HandOverCounters::default();
        hand_overs.sent(HandOverMark(Some(1)), 1_000, &counters);
        assert_eq!(counters.span().map(|s| s.delay_us), Some(4_000_000));
    }

    #[test]
    fn an_exchange_without_an_offset_stays_due_at_once() {
        let mut hand_overs = HandOvers::new(1.0);
        let placed = hand_overs.place(f64::NEG_INFINITY, 3_000.0);
        assert_eq!(placed.due_ms, f64::NEG_INFINITY);
        assert_eq!(hand_overs.delay_ms, 0.0);
    }

    /// The counters' span covers every handed-over exchange sent, delayed or not.
    #[test]
    fn the_span_counts_what_was_sent() {
        let counters = HandOverCounters::default();
        assert_eq!(counters.span(), None);
        let mut hand_overs = HandOvers::new(1.0);
        let own = hand_overs.place(9_000.0, 1_000.0).mark;
        hand_overs.sent(own, 10, &counters);
        let late = hand_overs.place(0.0, 2_500.0).mark;
        hand_overs.sent(late, 20, &counters);
        hand_overs.sent(late, 35, &counters);
        assert_eq!(
            counters.span(),
            Some(HandOverSpan {
                hand_overs: 1,
                exchanges: 3,
                first_sent_unix_us: 10,
                last_sent_unix_us: 35,
                delay_us: 2_500_000,
            })
        );
        assert_eq!(hand_overs.own_time.exchanges, 1);
        assert_eq!(
            hand_overs.hand_overs[0].sent,
            Sent {
                exchanges: 2,
                first_unix_us: 20,
                last_unix_us: 35
            }
        );
    }
}
