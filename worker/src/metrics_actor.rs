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

use std::collections::BTreeMap;

use common::measure::{RequestOutcome, TransportCause};
use common::metrics::{HttpProtocol, RunMetrics, TlsVersion};
use common::timeline::CompletionTimeline;
use tokio::sync::{mpsc, oneshot};

/// A copy of the worker's metrics at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub metrics: RunMetrics,
    /// HTTP status of failed-by-status requests: code → count.
    pub status_codes: BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count).
    pub tls_problems: BTreeMap<String, u64>,
    /// Per-request records measured since the previous snapshot (with `--requests-out`).
    pub records: Vec<RequestRecord>,
    /// Succeeded requests by completion time, and the last send (the steady-state window).
    pub timeline: CompletionTimeline,
}

pub use common::metrics::{RecordMeta, RequestRecord};

/// Sent once per request and moved at once into the bounded channel: boxing the large
/// variant would add an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Message {
    Record {
        outcome: RequestOutcome,
        warmup: bool,
        status: Option<u16>,
        message: Option<String>,
        meta: Option<RecordMeta>,
        pinned: Option<u64>,
    },
    /// A new connection to the target: its setup and TLS handshake, µs.
    Connection {
        connect_us: u64,
        tls_handshake_us: Option<u64>,
        protocol: HttpProtocol,
        tls: TlsVersion,
    },
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
    if outcome.kind == common::measure::OutcomeKind::Succeeded
        && let Some(latency) = outcome.latency_us
    {
        timeline.record(sent + latency, outcome.output_tokens());
    }
}

/// Cheap handle to the metrics actor.
#[derive(Clone)]
pub struct MetricsHandle {
    tx: mpsc::Sender<Message>,
}

impl MetricsHandle {
    /// Spawn the actor on the current runtime. It ends when every handle is dropped.
    pub fn spawn() -> MetricsHandle {
        let (tx, mut rx) = mpsc::channel::<Message>(4096);
        tokio::spawn(async move {
            let mut snapshot = Snapshot::default();
            while let Some(message) = rx.recv().await {
                match message {
                    Message::Record {
                        outcome,
                        warmup,
                        status,
                        message,
                        meta,
                        pinned,
                    } => {
                        if warmup {
                            snapshot.metrics.counters.warmup += 1;
                            continue;
                        }
                        if let Some(code) = status.filter(|_| {
                            matches!(
                                outcome.kind,
                                common::measure::OutcomeKind::Failed(
                                    common::measure::FailureKind::Status
                                )
                            )
                        }) {
                            *snapshot.status_codes.entry(code).or_default() += 1;
                        }
                        if let Some(TransportCause::Tls(problem)) = outcome.transport_cause {
                            *snapshot
                                .tls_problems
                                .entry(problem.description().to_owned())
                                .or_default() += 1;
                        }
                        snapshot.metrics.record(&outcome);
                        let failed =
                            matches!(outcome.kind, common::measure::OutcomeKind::Failed(_));
                        if let common::measure::OutcomeKind::Failed(kind) = outcome.kind {
                            snapshot
                                .metrics
                                .record_error(kind, status, message.as_deref());
                        }
                        if let Some(pinned) = pinned {
                            snapshot.metrics.record_pinned(&outcome, pinned);
                        }
                        record_timeline(&mut snapshot.timeline, &outcome);
                        if let Some(meta) = meta {
                            snapshot.records.push(RequestRecord {
                                meta,
                                outcome,
                                status,
                                message: message.filter(|_| failed),
                            });
                        }
                    }
                    Message::Connection {
                        connect_us,
                        tls_handshake_us,
                        protocol,
                        tls,
                    } => {
                        snapshot
                            .metrics
                            .record_connection(connect_us, tls_handshake_us);
                        snapshot.metrics.count_connection(protocol, tls);
                    }
                    Message::Snapshot { reply } => {
                        let records = std::mem::take(&mut snapshot.records);
                        let _ = reply.send(Snapshot {
                            metrics: snapshot.metrics.clone(),
                            status_codes: snapshot.status_codes.clone(),
                            tls_problems: snapshot.tls_problems.clone(),
                            records,
                            timeline: snapshot.timeline.clone(),
                        });
                    }
                }
            }
        });
        MetricsHandle { tx }
    }

    /// Record one finished request. `status` is the HTTP status of the response when one
    /// came; `message` what a failed one was told (cleaned); `meta` asks for a per-request
    /// record (`--requests-out`); `pinned` is the output length the request asked for
    /// (`--pin-output-length`).
    pub async fn record(
        &self,
        outcome: RequestOutcome,
        warmup: bool,
        status: Option<u16>,
        message: Option<String>,
        meta: Option<RecordMeta>,
        pinned: Option<u64>,
    ) {
        // The actor only stops when every handle is gone, so this cannot fail while we hold one.
        let _ = self
            .tx
            .send(Message::Record {
                outcome,
                warmup,
                status,
                message,
                meta,
                pinned,
            })
            .await;
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

    /// A copy of everything recorded so far.
    pub async fn snapshot(&self) -> Snapshot {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Message::Snapshot { reply }).await.is_err() {
            return Snapshot::default();
        }
        rx.await.unwrap_or_default()
    }
}
