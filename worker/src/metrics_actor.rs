//! The metrics actor: owns the worker's histograms and counters.
//!
//! Stream tasks send one message per finished request, and the client one per new connection,
//! over a bounded channel (4,096); when it
//! is full they wait, which only happens if recording falls behind by thousands of requests —
//! recording a sample is a few hundred nanoseconds. Snapshots are cloned out on request.
//!
//! With `--requests-out`, the actor also keeps one [`RequestRecord`] per measured request
//! until the next snapshot takes them: the buffer holds at most one report interval's worth
//! of requests (the link takes a snapshot every 0.5 s), so memory stays flat on a long run.
//!
//! With `--slo` it judges each measured request as it completes ([`Slos::is_good`]) and
//! counts the good ones, so the run's count is an exact sum over workers; asked for steady
//! metrics, it keeps a second [`RunMetrics`] of the requests the engine marked steady.

use std::collections::BTreeMap;

use common::assignment::RequestOptions;
use common::measure::{FailureKind, OutcomeKind, RequestOutcome, TransportCause};
use common::metrics::{HttpProtocol, RunMetrics, TlsVersion};
use common::slo::Slos;
use common::timeline::CompletionTimeline;
use tokio::sync::{mpsc, oneshot};

/// A copy of the worker's metrics at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub metrics: RunMetrics,
    /// HTTP status of failed-by-status requests: code → count.
    pub status_codes: BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count); a name mismatch whose
    /// certificate's names the client saw is keyed with them
    /// (`name mismatch (certificate for localhost)`, [`common::tls::problem_key`]).
    pub tls_problems: BTreeMap<String, u64>,
    /// Per-request records measured since the previous snapshot (with `--requests-out`).
    pub records: Vec<RequestRecord>,
    /// Succeeded requests by completion time, and the last send (the steady-state window).
    pub timeline: CompletionTimeline,
    /// The same metrics over the steady requests alone ([`Finished::steady`]), when the
    /// run asked for them ([`Judging::steady_metrics`]).
    pub steady: Option<RunMetrics>,
}

pub use common::metrics::{RecordMeta, RequestRecord};

/// How the actor judges each measured request: the run's options it applies.
#[derive(Debug, Clone, Default)]
pub struct Judging {
    /// `--slo`: a measured request that succeeded and met every one is counted good.
    pub slos: Slos,
    /// Keep a second set of metrics over the steady requests.
    pub steady_metrics: bool,
}

impl Judging {
    /// What the run's options ask the actor to judge.
    pub fn from_options(options: &RequestOptions) -> Judging {
        Judging {
            slos: options.slos.clone(),
            steady_metrics: options.steady_metrics,
        }
    }
}

/// One finished request, as the engine hands it to the actor.
#[derive(Debug, Clone)]
pub struct Finished {
    pub outcome: RequestOutcome,
    /// Measured during warm-up: counted as such and left out of every number.
    pub warmup: bool,
    /// The HTTP status of the response, when one came.
    pub status: Option<u16>,
    /// What a failed request was told (cleaned).
    pub message: Option<String>,
    /// Asks for a per-request record (`--requests-out`).
    pub meta: Option<RecordMeta>,
    /// The output length the request asked for (`--pin-output-length`).
    pub pinned: Option<u64>,
    /// `pinned` is a recorded content-frame count: compared with the content frames.
    pub pin_in_frames: bool,
    /// Sent in this worker's steady window (`engine::is_steady`): recorded in the steady
    /// metrics too, when the run keeps them.
    pub steady: bool,
}

/// Sent once per request and moved at once into the bounded channel: boxing the large
/// variant would add an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Message {
    Record(Finished),
    /// A new connection to the target: its setup and TLS handshake, µs.
    Connection {
        connect_us: u64,
        tls_handshake_us: Option<u64>,
        protocol: HttpProtocol,
        tls: TlsVersion,
    },
    /// The names a certificate refused for its name holds (the latest), which the next
    /// name-mismatch failures are counted under.
    PresentedNames(String),
    Snapshot {
        reply: oneshot::Sender<Snapshot>,
    },
}

/// Count a measured request in the timeline: a succeeded one at its completion (last content
/// frame), and every sent one as the latest send.
fn record_timeline(timeline: &mut CompletionTimeline, outcome: &RequestOutcome) {
    let Some(sent) = outcome.sent_unix_us else {
        return;
    };
    timeline.last_issued_unix_us = Some(timeline.last_issued_unix_us.unwrap_or(0).max(sent));
    if outcome.kind == OutcomeKind::Succeeded
        && let Some(latency) = outcome.latency_us
    {
        timeline.record(sent + latency, outcome.output_tokens());
    }
}

/// Record one measured request's numbers into `metrics`: its outcome, its failure's message,
/// its pinned length, and whether it was good. The same for the main and the steady metrics.
fn record_measured(
    metrics: &mut RunMetrics,
    finished: &Finished,
    good: Option<bool>,
    failed: Option<FailureKind>,
) {
    metrics.record(&finished.outcome);
    if let Some(kind) = failed {
        metrics.record_error(kind, finished.status, finished.message.as_deref());
    }
    if let Some(pinned) = finished.pinned {
        metrics.record_pinned(&finished.outcome, pinned, finished.pin_in_frames);
    }
    if good == Some(true) {
        metrics.record_good(&finished.outcome);
    }
}

/// The actor's state: what it has recorded so far and how it judges.
struct Actor {
    snapshot: Snapshot,
    judging: Judging,
    /// The latest names a certificate refused for its name held (from the client).
    presented_names: Option<String>,
}

impl Actor {
    fn new(judging: Judging) -> Actor {
        Actor {
            snapshot: Snapshot {
                steady: judging.steady_metrics.then(RunMetrics::new),
                ..Snapshot::default()
            },
            judging,
            presented_names: None,
        }
    }

    fn record(&mut self, finished: Finished) {
        let snapshot = &mut self.snapshot;
        if finished.warmup {
            snapshot.metrics.counters.warmup += 1;
            return;
        }
        let outcome = &finished.outcome;
        let failed = match outcome.kind {
            OutcomeKind::Failed(kind) => Some(kind),
            _ => None,
        };
        if let Some(code) = finished
            .status
            .filter(|_| failed == Some(FailureKind::Status))
        {
            *snapshot.status_codes.entry(code).or_default() += 1;
        }
        if let Some(TransportCause::Tls(problem)) = outcome.transport_cause {
            let key = common::tls::problem_key(problem, self.presented_names.as_deref());
            *snapshot.tls_problems.entry(key).or_default() += 1;
        }
        // Judged here, once, as the request completes: the run's good count is the sum of
        // the workers' (exact), never estimated from merged histograms.
        let good = self.judging.slos.is_good(outcome);
        record_measured(&mut snapshot.metrics, &finished, good, failed);
        if finished.steady
            && let Some(steady) = &mut snapshot.steady
        {
            record_measured(steady, &finished, good, failed);
        }
        record_timeline(&mut snapshot.timeline, outcome);
        if let Some(meta) = finished.meta {
            snapshot.records.push(RequestRecord {
                meta,
                outcome: finished.outcome,
                status: finished.status,
                message: finished.message.filter(|_| failed.is_some()),
                good,
            });
        }
    }

    fn take_snapshot(&mut self) -> Snapshot {
        let snapshot = &mut self.snapshot;
        Snapshot {
            metrics: snapshot.metrics.clone(),
            status_codes: snapshot.status_codes.clone(),
            tls_problems: snapshot.tls_problems.clone(),
            records: std::mem::take(&mut snapshot.records),
            timeline: snapshot.timeline.clone(),
            steady: snapshot.steady.clone(),
        }
    }
}

/// Cheap handle to the metrics actor.
#[derive(Clone)]
pub struct MetricsHandle {
    tx: mpsc::Sender<Message>,
}

impl MetricsHandle {
    /// Spawn the actor on the current runtime, judging each measured request by `judging`.
    /// It ends when every handle is dropped.
    pub fn spawn(judging: Judging) -> MetricsHandle {
        let (tx, mut rx) = mpsc::channel::<Message>(4096);
        tokio::spawn(async move {
            let mut actor = Actor::new(judging);
            while let Some(message) = rx.recv().await {
                match message {
                    Message::Record(finished) => actor.record(finished),
                    Message::Connection {
                        connect_us,
                        tls_handshake_us,
                        protocol,
                        tls,
                    } => {
                        let metrics = &mut actor.snapshot.metrics;
                        metrics.record_connection(connect_us, tls_handshake_us);
                        metrics.count_connection(protocol, tls);
                    }
                    Message::PresentedNames(names) => actor.presented_names = Some(names),
                    Message::Snapshot { reply } => {
                        let _ = reply.send(actor.take_snapshot());
                    }
                }
            }
        });
        MetricsHandle { tx }
    }

    /// Record one finished request.
    pub async fn record(&self, finished: Finished) {
        // The actor only stops when every handle is gone, so this cannot fail while we hold one.
        let _ = self.tx.send(Message::Record(finished)).await;
    }

    /// Record one new connection to the target (pre-opened ones included: the run needed
    /// them): its setup and, on https, its TLS handshake, µs; and what it speaks.
    pub async fn record_connection(
        &self,
        connect_us: u64,
        tls_handshake_us: Option<u64>,
        protocol: HttpProtocol,
        tls: TlsVersion,
    ) {
        let _ = self
            .tx
            .send(Message::Connection {
                connect_us,
                tls_handshake_us,
                protocol,
                tls,
            })
            .await;
    }

    /// The names the certificate of a connection refused for its name holds
    /// ([`common::tls::presented_names`]): the name-mismatch failures recorded after this are
    /// counted under a key that carries them, for the report's hint.
    pub async fn presented_names(&self, names: String) {
        let _ = self.tx.send(Message::PresentedNames(names)).await;
    }

    /// A copy of everything recorded so far.
    pub async fn snapshot(&self) -> Snapshot {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Message::Snapshot { reply }).await.is_err() {
            return Snapshot::default();
        }
        rx.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::slo::Slo;

    /// A succeeded streamed request: `ttft_ms` to its first of `tokens` tokens.
    fn succeeded(ttft_ms: u64, tokens: u64) -> RequestOutcome {
        let mut outcome = RequestOutcome::failed(FailureKind::Empty);
        outcome.kind = OutcomeKind::Succeeded;
        outcome.ttft_us = Some(ttft_ms * 1000);
        outcome.latency_us = Some((ttft_ms + 10 * tokens) * 1000);
        outcome.content_frames = tokens;
        outcome.sent_unix_us = Some(1_000_000);
        outcome
    }

    fn finished(outcome: RequestOutcome, steady: bool) -> Finished {
        Finished {
            outcome,
            warmup: false,
            status: Some(200),
            message: None,
            meta: Some(RecordMeta {
                index: 0,
                id: None,
                session: None,
            }),
            pinned: None,
            pin_in_frames: false,
            steady,
        }
    }

    fn judging(slos: &[&str], steady_metrics: bool) -> Judging {
        Judging {
            slos: Slos(
                slos.iter()
                    .map(|text| Slo::parse(text).expect("a valid slo"))
                    .collect(),
            ),
            steady_metrics,
        }
    }

    #[test]
    fn each_measured_request_is_judged_against_the_objectives_and_the_good_ones_counted() {
        let mut actor = Actor::new(judging(&["ttft:100ms"], false));
        actor.record(finished(succeeded(50, 4), false)); // good
        actor.record(finished(succeeded(100, 3), false)); // good: at the limit
        actor.record(finished(succeeded(150, 5), false)); // too slow
        let mut failed = finished(RequestOutcome::failed(FailureKind::Status), false);
        failed.status = Some(503);
        failed.outcome.ttft_us = Some(1_000);
        actor.record(failed); // failed: never good
        let mut warmup = finished(succeeded(1, 9), false);
        warmup.warmup = true;
        actor.record(warmup); // warm-up: out of every number
        let snapshot = actor.take_snapshot();
        let c = &snapshot.metrics.counters;
        assert_eq!((c.succeeded, c.failed_status, c.warmup), (3, 1, 1));
        assert_eq!((c.good, c.good_output_tokens), (2, 4 + 3));
        let verdicts: Vec<_> = snapshot.records.iter().map(|r| r.good).collect();
        assert_eq!(verdicts, [Some(true), Some(true), Some(false), Some(false)]);
        assert!(snapshot.steady.is_none(), "not asked for");

        // Without objectives nothing is good, and no record says either way.
        let mut actor = Actor::new(Judging::default());
        actor.record(finished(succeeded(50, 4), true));
        let snapshot = actor.take_snapshot();
        assert_eq!(snapshot.metrics.counters.good, 0);
        assert_eq!(snapshot.records[0].good, None);
        assert!(snapshot.steady.is_none());
    }

    #[test]
    fn the_steady_metrics_record_the_steady_requests_alone_as_the_main_ones_do() {
        let mut actor = Actor::new(judging(&["ttft:100ms"], true));
        actor.record(finished(succeeded(50, 4), false)); // first wave: main only
        actor.record(finished(succeeded(60, 2), true)); // good, steady
        actor.record(finished(succeeded(150, 5), true)); // not good, steady
        let mut failed = finished(RequestOutcome::failed(FailureKind::Status), true);
        failed.status = Some(429);
        failed.message = Some("slow down".into());
        actor.record(failed);
        let mut pinned = finished(succeeded(70, 8), true);
        pinned.pinned = Some(8);
        actor.record(pinned);

        let snapshot = actor.take_snapshot();
        let main = &snapshot.metrics.counters;
        let steady = snapshot.steady.as_ref().expect("asked for");
        let s = &steady.counters;
        assert_eq!((main.succeeded, s.succeeded), (4, 3));
        assert_eq!((main.good, s.good), (3, 2));
        assert_eq!((main.good_output_tokens, s.good_output_tokens), (14, 10));
        assert_eq!((main.failed_status, s.failed_status), (1, 1));
        assert_eq!((s.pinned, s.pinned_matched), (1, 1));
        assert_eq!(steady.errors, snapshot.metrics.errors);
        assert_eq!(steady.histogram(common::metrics::Metric::Ttft).len(), 3);
        // A later snapshot still has them: they are cumulative, as the main ones.
        actor.record(finished(succeeded(10, 1), true));
        let again = actor.take_snapshot();
        assert_eq!(again.steady.expect("kept").counters.succeeded, 4);
    }

    #[tokio::test]
    async fn a_name_mismatch_is_counted_under_the_names_the_certificate_holds() {
        use common::measure::TlsProblem;
        let metrics = MetricsHandle::spawn(Judging::default());
        let mismatch =
            || RequestOutcome::transport_failure(TransportCause::Tls(TlsProblem::NameMismatch));
        // Before the client saw any names: the bare problem.
        metrics.record(finished(mismatch(), false)).await;
        metrics.presented_names("localhost, ::1".into()).await;
        metrics.record(finished(mismatch(), false)).await;
        metrics.record(finished(mismatch(), false)).await;
        let expired = TransportCause::Tls(TlsProblem::Expired);
        metrics
            .record(finished(RequestOutcome::transport_failure(expired), false))
            .await;
        let snapshot = metrics.snapshot().await;
        assert_eq!(
            snapshot.tls_problems,
            BTreeMap::from([
                ("expired".to_owned(), 1),
                ("name mismatch".to_owned(), 1),
                (
                    "name mismatch (certificate for localhost, ::1)".to_owned(),
                    2
                ),
            ])
        );
    }
}
