//! The replay engine: a scheduler that decides when each exchange is sent, and one stream task
//! per request that stamps every network read with a monotonic clock before parsing it.
//!
//! The scheduler pulls work items from a bounded channel (the worker's slice arrives while the
//! run goes on, so memory stays bounded whatever the recording's size), waits for the item's
//! intended send time (recorded schedule or open-loop rate) and/or a concurrency permit
//! (closed loop), and spawns the stream task. Exchanges of one session are chained: a turn
//! starts only after the previous turn of its session has finished.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::formats::{self, Family};
use common::measure::{
    FailureKind, OutcomeKind, RequestOutcome, StreamMeter, estimate_input_tokens,
};
use rand::{Rng, SeedableRng};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::client::{SendFailure, TargetClient};
use crate::config::{Arrival, ReplayConfig, Schedule, WorkItem};
use crate::metrics_actor::MetricsHandle;
use crate::request::{replay_body, replay_headers};

/// The instant the run starts, in both clocks.
#[derive(Debug, Clone, Copy)]
pub struct StartAt {
    pub instant: Instant,
}

/// What happened to the worker's slice, beyond the per-request metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineTotals {
    /// Requests sent (warm-up included).
    pub issued: u64,
    /// Exchanges received but never sent (duration reached, abort).
    pub not_started: u64,
    /// Requests in flight when the run was aborted: their outcome is unknown.
    pub lost: u64,
}

/// Live progress of the engine, read by the link for interval reports.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests sent so far (warm-up included), in slice order.
    pub issued: AtomicU64,
    /// Exchanges received but not sent (duration reached), so far.
    pub not_started: AtomicU64,
    /// Wall-clock instant the load actually started (Unix ns), 0 before.
    pub started_unix_ns: AtomicU64,
}

/// Wait for `start` precisely: tokio's timer has 1 ms granularity, so sleep until just before
/// and finish with the OS's high-resolution sleep on a blocking thread (no spinning, which
/// would steal the cores other workers on the same host need to start on time).
async fn wait_for_start(start: Instant) {
    let early = start.checked_sub(Duration::from_millis(3)).unwrap_or(start);
    tokio::time::sleep_until(early.into()).await;
    let remaining = start.saturating_duration_since(Instant::now());
    if !remaining.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(remaining)).await;
    }
}

/// Everything one replay of a slice needs.
pub struct EngineRun {
    pub config: Arc<ReplayConfig>,
    pub client: TargetClient,
    /// The slice, as it arrives.
    pub items: mpsc::Receiver<WorkItem>,
    pub start: StartAt,
    pub metrics: MetricsHandle,
    /// Turns true to stop at once.
    pub abort: watch::Receiver<bool>,
    /// The items loop until the duration ends.
    pub open_ended: bool,
    pub progress: Arc<Progress>,
}

/// Replay every item from `items` under `config`, recording outcomes into `metrics`.
///
/// Returns when `items` is closed and every request has finished, or at once when `abort`
/// turns true (in-flight requests are then cancelled and counted as lost). `open_ended` means
/// the items loop until the duration ends, so items left unread are not counted as not
/// started.
pub async fn replay(run: EngineRun) -> EngineTotals {
    let EngineRun {
        config,
        client,
        mut items,
        start,
        metrics,
        mut abort,
        open_ended,
        progress,
    } = run;
    let load = &config.load;
    let permits = load.concurrency.map(|c| Arc::new(Semaphore::new(c.max(1))));
    let deadline = load.duration.map(|d| start.instant + d);
    let mut rate_rng = rand::rngs::SmallRng::seed_from_u64(load.seed);
    let mut next_rate_offset = 0.0_f64;
    let mut sessions: HashMap<String, oneshot::Receiver<()>> = HashMap::new();
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut totals = EngineTotals::default();
    let mut aborted = false;
    let mut seq: u64 = 0;

    // Every worker starts at the coordinator's one instant, whatever the load model.
    tokio::select! {
        _ = wait_for_start(start.instant) => {
            progress.started_unix_ns.store(unix_nanos(SystemTime::now()), Ordering::Relaxed);
        }
        _ = abort.wait_for(|a| *a) => aborted = true,
    }

    'items: while !aborted {
        let item = tokio::select! {
            biased;
            _ = abort.wait_for(|a| *a) => { aborted = true; break 'items; }
            item = items.recv() => item,
        };
        let Some(item) = item else { break };

        // When this item should be sent.
        let intended = if let Some(rate) = load.rate {
            let at = start.instant + Duration::from_secs_f64(next_rate_offset);
            let gap = match load.arrival {
                Arrival::Constant => 1.0 / rate,
                Arrival::Poisson => {
                    let u: f64 = rate_rng.random_range(f64::EPSILON..1.0);
                    -u.ln() / rate
                }
            };
            next_rate_offset += gap;
            Some(at)
        } else if let Schedule::Recorded { speed } = load.schedule {
            item.exchange
                .at_ms
                .map(|ms| start.instant + Duration::from_secs_f64(ms / 1000.0 / speed))
        } else {
            None
        };
        if let (Some(deadline), Some(intended)) = (deadline, intended)
            && intended >= deadline
        {
            totals.not_started += 1;
            break;
        }
        if let Some(intended) = intended {
            tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => { aborted = true; totals.not_started += 1; break 'items; }
                _ = tokio::time::sleep_until(intended.into()) => {}
            }
        }
        let permit = match &permits {
            Some(semaphore) => tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => { aborted = true; totals.not_started += 1; break 'items; }
                permit = semaphore.clone().acquire_owned() => Some(permit.expect("the semaphore is never closed")),
            },
            None => None,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            totals.not_started += 1;
            break;
        }

        let previous_turn = match &item.exchange.session {
            Some(session) => {
                let (done_tx, done_rx) = oneshot::channel::<()>();
                let previous = sessions.insert(session.clone(), done_rx);
                Some((previous, done_tx))
            }
            None => None,
        };
        let warmup = seq < load.warmup;
        seq += 1;
        totals.issued += 1;
        progress.issued.store(totals.issued, Ordering::Relaxed);
        let config = config.clone();
        let client = client.clone();
        let metrics = metrics.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let mut intended = intended;
            let _done = match previous_turn {
                Some((previous, done_tx)) => {
                    if let Some(previous) = previous {
                        // Dropped sender = the previous turn finished.
                        let _ = previous.await;
                        intended = intended.map(|t| t.max(Instant::now()));
                    }
                    Some(done_tx)
                }
                None => None,
            };
            let (outcome, status) = send_one(&config, &client, &item, intended).await;
            metrics.record(outcome, warmup, status).await;
        });

        // Reap finished tasks and forget finished sessions so both stay small.
        while tasks.try_join_next().is_some() {}
        if seq.is_multiple_of(4096) {
            sessions
                .retain(|_, rx| matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        }
    }

    progress
        .not_started
        .store(totals.not_started, Ordering::Relaxed);
    if !aborted && !open_ended {
        // Whatever was not sent (duration reached) is not started.
        loop {
            tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => { aborted = true; break; }
                item = items.recv() => match item {
                    Some(_) => {
                        totals.not_started += 1;
                        progress.not_started.store(totals.not_started, Ordering::Relaxed);
                    }
                    None => break,
                },
            }
        }
    }

    if !aborted {
        loop {
            tokio::select! {
                biased;
                _ = abort.wait_for(|a| *a) => { aborted = true; break; }
                next = tasks.join_next() => if next.is_none() { break },
            }
        }
    }
    if aborted {
        totals.lost += tasks.len() as u64;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        if !open_ended {
            while let Ok(_item) = items.try_recv() {
                totals.not_started += 1;
            }
        }
    }
    totals
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Send one request and measure its response.
async fn send_one(
    config: &ReplayConfig,
    client: &TargetClient,
    item: &WorkItem,
    intended: Option<Instant>,
) -> (RequestOutcome, Option<u16>) {
    let exchange = &item.exchange;
    let method = reqwest::Method::from_bytes(exchange.request.method.as_bytes())
        .unwrap_or(reqwest::Method::POST);
    let url = format!(
        "{}{}",
        config.target.trim_end_matches('/'),
        exchange.request.path
    );
    let body = replay_body(exchange, &config.sets);
    let input_estimate = estimate_input_tokens(&body);
    let request = client
        .request(method, &url)
        .headers(replay_headers(exchange, config, item.index))
        .body(body);

    let sent = client.send(request, config.timeout).await;
    let (t0, deadline, sent_unix_us, resent) =
        (sent.t0, sent.deadline, sent.sent_unix_us, sent.resent);
    // Lag is the scheduler's: measured at the first attempt, whatever happened after.
    let lag = intended.map(|t| sent.first_t0.saturating_duration_since(t).as_micros() as u64);
    let finish = |mut outcome: RequestOutcome| {
        outcome.schedule_lag_us = lag;
        outcome.sent_unix_us = Some(sent_unix_us);
        outcome.resent = resent;
        if outcome.input_tokens.is_none() {
            outcome.input_tokens = input_estimate;
        }
        outcome
    };

    let mut response = match sent.result {
        Ok(response) => response,
        Err(SendFailure::Timeout) => {
            return (finish(RequestOutcome::failed(FailureKind::Timeout)), None);
        }
        Err(SendFailure::Transport(cause)) => {
            return (finish(RequestOutcome::transport_failure(cause)), None);
        }
    };
    let status = response.status();
    if !status.is_success() {
        // Drain (bounded by the deadline) so the connection can be reused.
        let _ = tokio::time::timeout_at(deadline, response.bytes()).await;
        return (
            finish(RequestOutcome::failed(FailureKind::Status)),
            Some(status.as_u16()),
        );
    }
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = exchange.request.path.as_str();
    let streamed = content_type
        .as_deref()
        .is_some_and(formats::is_streaming_content_type);

    if !streamed {
        // One JSON body: it is one content frame, stamped when the whole body has arrived.
        let body = tokio::select! {
            body = response.bytes() => body,
            _ = tokio::time::sleep_until(deadline) => {
                return (finish(RequestOutcome::failed(FailureKind::Timeout)), None);
            }
        };
        let t_us = t0.elapsed().as_micros() as u64;
        let Ok(body) = body else {
            return (finish(RequestOutcome::failed(FailureKind::Transport)), None);
        };
        let family = formats::detect(path, content_type.as_deref(), &body);
        return (finish(unstreamed_outcome(family, &body, t_us)), None);
    }

    let mut meter: Option<StreamMeter> = None;
    let mut family_hint = formats::detect(path, content_type.as_deref(), &[]);
    loop {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk,
            _ = tokio::time::sleep_until(deadline) => {
                return (finish(RequestOutcome::failed(FailureKind::Timeout)), None);
            }
        };
        // Timestamp at the edge: the read returned; parse after.
        let t_us = t0.elapsed().as_micros() as u64;
        match chunk {
            Ok(Some(bytes)) => {
                let live = meter.get_or_insert_with(|| {
                    let family = family_hint
                        .take()
                        .or_else(|| formats::detect(path, content_type.as_deref(), &bytes))
                        .unwrap_or(Family::OpenAiChat);
                    StreamMeter::new(family)
                });
                if live.on_read(t_us, &bytes).is_err() {
                    let broken = meter.take().expect("the meter was just created");
                    return (finish(broken.finish_broken()), None);
                }
            }
            Ok(None) => {
                let outcome = match meter {
                    Some(meter) => meter.finish(t_us, false),
                    None => RequestOutcome::failed(FailureKind::Empty),
                };
                return (finish(outcome), None);
            }
            Err(error) => {
                let cause = crate::client::classify(&error);
                tracing::debug!(%error, url, cause = cause.name(), "stream cut");
                let mut outcome = match meter {
                    Some(meter) => meter.finish(t_us, true),
                    None => RequestOutcome::failed(FailureKind::Transport),
                };
                if outcome.kind == OutcomeKind::Failed(FailureKind::Transport) {
                    outcome.transport_cause = Some(cause);
                }
                return (finish(outcome), None);
            }
        }
    }
}

fn unstreamed_outcome(family: Option<Family>, body: &[u8], t_us: u64) -> RequestOutcome {
    let parsed = family.map(|f| formats::unstreamed(f, body));
    let mut outcome = RequestOutcome::failed(FailureKind::Empty);
    match &parsed {
        Some(Err(_)) => outcome.kind = common::measure::OutcomeKind::Failed(FailureKind::Transport),
        Some(Ok(p)) if p.error.is_some() => {
            outcome.kind = common::measure::OutcomeKind::Failed(FailureKind::ErrorFrame)
        }
        Some(Ok(p)) if !p.has_content => {}
        _ => {
            outcome.kind = common::measure::OutcomeKind::Succeeded;
            outcome.ttft_us = Some(t_us);
            outcome.latency_us = Some(t_us);
            outcome.content_frames = 1;
            if let Some(usage) = parsed.and_then(|p| p.ok()).and_then(|p| p.usage) {
                outcome.usage_output_tokens = usage.output_tokens;
                outcome.input_tokens = usage.input_tokens;
            }
        }
    }
    outcome
}
