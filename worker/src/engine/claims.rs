//! Claims and grants (protocol 5): a worker starts an exchange of its own slice only once the
//! coordinator has granted it, so the coordinator always knows every exchange a worker may
//! have started. When it loses a worker by silence (no final report), it hands over only
//! what it never granted — nothing reaches the server twice — and counts what it granted
//! beyond the worker's last report as lost (it may have reached the server), not as "not
//! started".
//!
//! A claim is a prefix of the worker's own slice, counted in the order the exchanges arrived
//! (handed-over exchanges are never handed over again, so they are not claimed). The engine
//! asks ahead of need — the exchanges it takes next plus a look-ahead of its recent pace —
//! so a grant is normally in long before the send time; a send that has to wait for one is
//! counted and logged. Claims cost the link nothing more: a claim takes the place of the
//! heartbeat that follows each report (one per report interval), and the coordinator's grant
//! the place of its next heartbeat; only a claim the engine waits for, or the first, goes
//! out at once. So the look-ahead is two report intervals plus four claim-to-grant round
//! trips, within [`MIN_LOOKAHEAD`]..[`MAX_LOOKAHEAD`]: no longer, because what a worker
//! lost by silence was granted but never reported is neither handed over nor known to be
//! sent (it is counted lost). A worker whose link to the coordinator stalls runs out of
//! grants after that look-ahead and waits: it never runs far ahead of what the coordinator
//! knows.
//!
//! Three parties share a [`ClaimLink`]: the slice reader counts the own exchanges it hands to
//! the engine (a claim never names one that has not arrived), the engine raises its target
//! and waits on grants ([`Gate`]), and the link session sends the claims ([`Claimer`]) and
//! records the grants.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

/// The look-ahead's bounds, and the round trip assumed before one was measured.
const MIN_LOOKAHEAD: Duration = Duration::from_millis(500);
const MAX_LOOKAHEAD: Duration = Duration::from_secs(5);
const FIRST_ROUND_TRIP: Duration = Duration::from_millis(250);

/// The fewest exchanges claimed ahead of the one taken.
const MIN_AHEAD: u64 = 4;

/// The pace is measured over windows this long.
const PACE_WINDOW: Duration = Duration::from_millis(250);

/// A wait for a grant this long is worth a warning: the link, not loopback's round trip,
/// held a send (the schedule lag still counts every wait, however short).
const NOTABLE_GRANT_WAIT: Duration = Duration::from_millis(5);

/// The state the slice reader, the engine and the session share.
#[derive(Debug)]
pub struct ClaimLink {
    /// Own exchanges the slice reader handed to the engine.
    received: AtomicU64,
    /// The prefix the engine wants granted.
    target: AtomicU64,
    /// The engine waits for a grant right now.
    blocked: AtomicBool,
    /// Woken when `received`, `target` or `blocked` changes.
    changed: Notify,
    /// The prefix the coordinator granted.
    granted: watch::Sender<u64>,
    /// The claim last sent and when, until a grant covers it.
    outstanding: std::sync::Mutex<Option<(u64, Instant)>>,
    /// Claim-to-grant round trip, µs (rises at once, decays slowly); 0 before the first.
    round_trip_us: AtomicU64,
    /// How often the session claims (its report interval).
    claim_every: Duration,
}

impl ClaimLink {
    /// `claim_every`: the session's report interval, at which it claims.
    pub fn new(claim_every: Duration) -> Arc<ClaimLink> {
        Arc::new(ClaimLink {
            received: AtomicU64::new(0),
            target: AtomicU64::new(0),
            blocked: AtomicBool::new(false),
            changed: Notify::new(),
            granted: watch::Sender::new(0),
            outstanding: std::sync::Mutex::new(None),
            round_trip_us: AtomicU64::new(0),
            claim_every,
        })
    }

    /// How far ahead of its pace the engine claims (see the module's text).
    pub fn lookahead(&self) -> Duration {
        let round_trip = match self.round_trip_us.load(Ordering::Relaxed) {
            0 => FIRST_ROUND_TRIP,
            us => Duration::from_micros(us),
        };
        (self.claim_every * 2 + round_trip * 4).clamp(MIN_LOOKAHEAD, MAX_LOOKAHEAD)
    }

    fn sent_claim(&self, own_prefix: u64) {
        if let Ok(mut outstanding) = self.outstanding.lock() {
            outstanding.get_or_insert((own_prefix, Instant::now()));
        }
    }

    /// A grant covers the outstanding claim: one round trip measured.
    fn measure(&self, own_prefix: u64) {
        let Ok(mut outstanding) = self.outstanding.lock() else {
            return;
        };
        if let Some((claimed, at)) = *outstanding
            && own_prefix >= claimed
        {
            *outstanding = None;
            let sample = at.elapsed().as_micros() as u64;
            let old = self.round_trip_us.load(Ordering::Relaxed);
            let smoothed = if old == 0 {
                sample
            } else {
                sample.max(old - old / 8 + sample / 8)
            };
            self.round_trip_us.store(smoothed.max(1), Ordering::Relaxed);
        }
    }

    /// The slice reader handed one more own exchange to the engine.
    pub fn received_one(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_one();
    }

    /// The coordinator granted the first `own_prefix` own exchanges (grants only grow).
    pub fn grant(&self, own_prefix: u64) {
        self.measure(own_prefix);
        self.granted.send_if_modified(|granted| {
            let grows = own_prefix > *granted;
            if grows {
                *granted = own_prefix;
            }
            grows
        });
    }

    /// The prefix granted so far.
    pub fn granted(&self) -> u64 {
        *self.granted.borrow()
    }

    /// What can be claimed now: the engine's target, within what has arrived.
    fn claimable(&self) -> u64 {
        self.target
            .load(Ordering::Relaxed)
            .min(self.received.load(Ordering::Relaxed))
    }

    fn want(&self, target: u64) {
        if self.target.fetch_max(target, Ordering::Relaxed) < target {
            self.changed.notify_one();
        }
    }
}

/// The session's side: when to send which claim.
#[derive(Debug)]
pub struct Claimer {
    link: Arc<ClaimLink>,
    sent: u64,
}

impl Claimer {
    pub fn new(link: Arc<ClaimLink>) -> Claimer {
        Claimer { link, sent: 0 }
    }

    /// At a report: the claim that takes the place of the heartbeat, if the claimable
    /// prefix grew.
    pub fn on_report(&mut self) -> Option<u64> {
        let wanted = self.link.claimable();
        (wanted > self.sent).then(|| self.send(wanted))
    }

    fn send(&mut self, wanted: u64) -> u64 {
        self.sent = wanted;
        self.link.sent_claim(wanted);
        wanted
    }

    /// A claim that cannot wait for the next report: the first one, or one the engine waits
    /// for. Cancel-safe.
    pub async fn urgent(&mut self) -> u64 {
        loop {
            let wanted = self.link.claimable();
            if wanted > self.sent && (self.sent == 0 || self.link.blocked.load(Ordering::Relaxed)) {
                return self.send(wanted);
            }
            self.link.changed.notified().await;
        }
    }
}

/// The engine's side: claims ahead of its pace, and admits an own exchange once granted.
#[derive(Debug)]
pub struct Gate {
    link: Arc<ClaimLink>,
    granted: watch::Receiver<u64>,
    min_ahead: u64,
    /// The current pace window: its start, and the highest ordinal taken at its start.
    window_start: Instant,
    window_first: u64,
    /// Own exchanges taken per second, in the last full window.
    pace: f64,
    /// The target last raised: it is raised again only half a look-ahead later, so a claim
    /// goes out every half look-ahead at most (not one per exchange).
    last_want: u64,
    /// Sends that waited for a grant, and the longest wait.
    pub waits: u64,
    pub longest_wait: Duration,
}

impl Gate {
    /// `min_ahead`: what the load model alone says goes out at once (a closed loop's
    /// concurrency, an open loop's rate over [`MIN_LOOKAHEAD`]).
    pub fn new(link: Arc<ClaimLink>, min_ahead: u64) -> Gate {
        let granted = link.granted.subscribe();
        Gate {
            link,
            granted,
            min_ahead: min_ahead.max(MIN_AHEAD),
            window_start: Instant::now(),
            window_first: 0,
            pace: 0.0,
            last_want: 0,
            waits: 0,
            longest_wait: Duration::ZERO,
        }
    }

    /// Claim what the engine will send first, before the start.
    pub fn claim_first_wave(&mut self) {
        self.raise(self.min_ahead);
    }

    fn raise(&mut self, target: u64) {
        if target > self.last_want {
            self.last_want = target;
            self.link.want(target);
        }
    }

    /// The engine takes (or is about to wait for) own exchange `ordinal`: claim it and
    /// what its pace says follows within the look-ahead.
    pub fn cover(&mut self, ordinal: u64) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.window_start);
        if elapsed >= PACE_WINDOW {
            self.pace = ordinal.saturating_sub(self.window_first) as f64 / elapsed.as_secs_f64();
            self.window_start = now;
            self.window_first = ordinal;
        }
        let ahead =
            ((self.pace * self.link.lookahead().as_secs_f64()).ceil() as u64).max(self.min_ahead);
        let target = ordinal.saturating_add(1 + ahead);
        // Half the look-ahead is still granted ahead of this one: no claim yet.
        if target >= self.last_want.saturating_add((ahead / 2).max(1)) || ordinal >= self.last_want
        {
            self.raise(target);
        }
    }

    /// Claim exactly up to `ordinal` (an exchange due within the look-ahead).
    pub fn cover_only(&mut self, ordinal: u64) {
        self.raise(ordinal.saturating_add(1));
    }

    /// How far ahead the engine claims now.
    pub fn lookahead(&self) -> Duration {
        self.link.lookahead()
    }

    /// Wait until own exchange `ordinal` is granted; false when `abort` came first.
    pub async fn admit(&mut self, ordinal: u64, abort: &mut watch::Receiver<bool>) -> bool {
        if *self.granted.borrow() > ordinal {
            return true;
        }
        let ahead = self.min_ahead;
        self.raise(ordinal.saturating_add(1 + ahead));
        let began = Instant::now();
        self.link.blocked.store(true, Ordering::Relaxed);
        self.link.changed.notify_one();
        let admitted = tokio::select! {
            biased;
            _ = abort.wait_for(|a| *a) => false,
            granted = self.granted.wait_for(|g| *g > ordinal) => granted.is_ok(),
        };
        self.link.blocked.store(false, Ordering::Relaxed);
        // A send the run's end released was never sent: it went out neither late nor at all,
        // so it is no wait (an open loop always ends with one send waiting for its grant).
        if admitted {
            self.waits += 1;
            self.longest_wait = self.longest_wait.max(began.elapsed());
        }
        admitted
    }

    /// Say in the worker's log how many sends waited for a grant: a warning when one waited
    /// [`NOTABLE_GRANT_WAIT`] or more, a debug line for the sub-millisecond waits of a
    /// grant that crossed loopback just after its exchange fell due.
    pub fn log_waits(&self) {
        if self.waits == 0 {
            return;
        }
        let longest_ms = self.longest_wait.as_secs_f64() * 1000.0;
        if self.longest_wait >= NOTABLE_GRANT_WAIT {
            tracing::warn!(
                sends = self.waits,
                longest_ms,
                "sends waited for the coordinator's grant (a slow or stalled link to it): they went out late, and their lateness is in the schedule lag"
            );
        } else {
            tracing::debug!(
                sends = self.waits,
                longest_ms,
                "sends waited briefly for a grant"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_claim_never_names_what_has_not_arrived_and_waits_for_its_grant() {
        let link = ClaimLink::new(Duration::from_millis(500));
        let mut gate = Gate::new(link.clone(), 4);
        let mut claimer = Claimer::new(link.clone());
        gate.claim_first_wave();
        // Nothing arrived: nothing to claim.
        let early = tokio::time::timeout(Duration::from_millis(50), claimer.urgent()).await;
        assert!(early.is_err(), "{early:?}");
        assert_eq!(claimer.on_report(), None);
        for _ in 0..10 {
            link.received_one();
        }
        // The first wave (the minimum look-ahead, 4), at once.
        assert_eq!(claimer.urgent().await, 4);
        // Nothing more wanted: no claim at the next report.
        assert_eq!(claimer.on_report(), None);
        let (_abort_tx, mut abort) = watch::channel(false);
        let admitted = tokio::time::timeout(Duration::from_millis(50), gate.admit(0, &mut abort));
        assert!(admitted.await.is_err(), "admitted without a grant");
        link.grant(3);
        // Granted: no wait (the one given up on above was never admitted, so not counted).
        assert!(gate.admit(2, &mut abort).await);
        assert_eq!(gate.waits, 0);
        // Beyond the grant: waits, and the wait is counted.
        let waiting = tokio::spawn(async move {
            let admitted = gate.admit(5, &mut abort).await;
            (admitted, gate.waits)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        link.grant(6);
        assert_eq!(waiting.await.expect("joins"), (true, 1));
    }

    #[tokio::test]
    async fn an_abort_ends_a_wait_for_a_grant() {
        let link = ClaimLink::new(Duration::from_millis(500));
        let mut gate = Gate::new(link.clone(), 4);
        let (abort_tx, mut abort) = watch::channel(false);
        let waiting = tokio::spawn(async move { gate.admit(0, &mut abort).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        abort_tx.send(true).expect("the gate listens");
        assert!(!waiting.await.expect("joins"));
    }
}
