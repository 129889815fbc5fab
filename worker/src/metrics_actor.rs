//! The metrics actor: owns the worker's histograms and counters.
//!
//! Stream tasks send one message per finished request over a bounded channel (4,096); when it
//! is full they wait, which only happens if recording falls behind by thousands of requests —
//! recording a sample is a few hundred nanoseconds. Snapshots are cloned out on request.

use std::collections::BTreeMap;

use common::measure::{RequestOutcome, TransportCause};
use common::metrics::RunMetrics;
use tokio::sync::{mpsc, oneshot};

/// A copy of the worker's metrics at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub metrics: RunMetrics,
    /// HTTP status of failed-by-status requests: code → count.
    pub status_codes: BTreeMap<u16, u64>,
    /// TLS failures by problem (`unknown issuer` → count).
    pub tls_problems: BTreeMap<String, u64>,
}

enum Message {
    Record {
        outcome: RequestOutcome,
        warmup: bool,
        status: Option<u16>,
    },
    Snapshot {
        reply: oneshot::Sender<Snapshot>,
    },
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
                    } => {
                        if warmup {
                            snapshot.metrics.counters.warmup += 1;
                            continue;
                        }
                        if let Some(code) = status {
                            *snapshot.status_codes.entry(code).or_default() += 1;
                        }
                        if let Some(TransportCause::Tls(problem)) = outcome.transport_cause {
                            *snapshot
                                .tls_problems
                                .entry(problem.description().to_owned())
                                .or_default() += 1;
                        }
                        snapshot.metrics.record(&outcome);
                    }
                    Message::Snapshot { reply } => {
                        let _ = reply.send(snapshot.clone());
                    }
                }
            }
        });
        MetricsHandle { tx }
    }

    /// Record one finished request. `status` is the HTTP status of a failed-by-status request.
    pub async fn record(&self, outcome: RequestOutcome, warmup: bool, status: Option<u16>) {
        // The actor only stops when every handle is gone, so this cannot fail while we hold one.
        let _ = self
            .tx
            .send(Message::Record {
                outcome,
                warmup,
                status,
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
