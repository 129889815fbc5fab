//! The session under paused time: the coordinator is played over the session's own
//! channels, the engine is the real one (an open or closed slice, and for requests in flight a
//! local listener that never answers).

use std::net::TcpListener;

use tokio::runtime::Handle;

use super::*;
use crate::config::{Arrival, LoadModel, Schedule, TransportConfig};

const HEARTBEAT: Duration = Duration::from_secs(10);
const INTERVAL: Duration = Duration::from_millis(500);

/// A session and the coordinator's end of its channels.
struct Harness {
    session: SessionHandle,
    task: JoinHandle<Result<(), LinkError>>,
    out: mpsc::Receiver<ToCoordinator>,
    items: mpsc::Sender<WorkItem>,
    health: Arc<HealthState>,
}

fn spawn_session(target: &str) -> Harness {
    spawn_session_with(target, false)
}

/// [`spawn_session`], the assignment asking for steady metrics or not.
fn spawn_session_with(target: &str, steady_metrics: bool) -> Harness {
    let config = ReplayConfig {
        target: target.to_owned(),
        load: LoadModel {
            schedule: Schedule::Asap,
            concurrency: None,
            rate: None,
            arrival: Arrival::Constant,
            duration: None,
            warmup: 0,
            seed: 0,
        },
        headers: vec![],
        sets: vec![],
        tag_requests: false,
        transport: TransportConfig::default(),
        tokenizer: None,
        options: common::assignment::RequestOptions {
            timeout: Duration::from_secs(600),
            requests_out: false,
            reorder_window: common::replay::DEFAULT_REORDER_WINDOW,
            steady_metrics,
            ..Default::default()
        },
    };
    let (items_tx, items_rx) = mpsc::channel(16);
    let (out_tx, out_rx) = mpsc::channel(64);
    let health = Arc::new(HealthState::default());
    health.set(1);
    let (session, task) = SessionHandle::spawn(
        Session {
            config: Arc::new(config),
            client: TargetClient::new(&TransportConfig::default()).expect("a plain client"),
            items: items_rx,
            open_ended: false,
            load: Handle::current(),
            heartbeat_timeout: HEARTBEAT,
            report_interval: INTERVAL,
            health: health.clone(),
            claims: None,
        },
        out_tx,
    );
    Harness {
        session,
        task,
        out: out_rx,
        items: items_tx,
        health,
    }
}

/// A target that takes connections (the kernel's backlog) and never answers: requests sent
/// to it stay in flight.
fn silent_target() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    (listener, url)
}

fn item(index: u64) -> WorkItem {
    WorkItem {
        index,
        exchange: serde_json::from_str(
            r#"{"request":{"method":"POST","path":"/v1/chat/completions","body":"{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"}}"#,
        )
        .expect("a valid exchange"),
        pin_output_tokens: None,
        pin_in_frames: false,
        cancel_after: None,
        think: None,
        reassigned: false,
    }
}

/// The coordinator sent the whole slice.
fn close_slice(h: &mut Harness) {
    let (stand_in, _) = mpsc::channel(1);
    drop(std::mem::replace(&mut h.items, stand_in));
}

fn start_now() -> CoordinatorEvent {
    CoordinatorEvent::Start {
        start_unix_ns: unix_ns(),
    }
}

/// Everything the session sent so far.
fn drain(out: &mut mpsc::Receiver<ToCoordinator>) -> Vec<ToCoordinator> {
    std::iter::from_fn(|| out.try_recv().ok()).collect()
}

/// The next report, keeping the coordinator alive meanwhile; other messages go to `seen`.
async fn next_report(h: &mut Harness, seen: &mut Vec<ToCoordinator>) -> WorkerReport {
    loop {
        match h.out.recv().await.expect("the session reports") {
            ToCoordinator::Report(report) => return *report,
            other => seen.push(other),
        }
    }
}

/// Reports until one satisfies `done`, at most `patience` of them.
async fn report_where(
    h: &mut Harness,
    patience: usize,
    done: impl Fn(&WorkerReport) -> bool,
) -> WorkerReport {
    let mut seen = Vec::new();
    for _ in 0..patience {
        let report = next_report(h, &mut seen).await;
        if done(&report) {
            return report;
        }
        assert!(h.session.send(CoordinatorEvent::Alive).await);
    }
    panic!("no such report within {patience} reports");
}

#[tokio::test(start_paused = true)]
async fn a_silent_coordinator_before_the_start_is_lost_and_nothing_is_sent() {
    let (target, url) = silent_target();
    let mut h = spawn_session(&url);
    h.items.send(item(0)).await.expect("slice open");
    let began = Instant::now();
    tokio::time::sleep(HEARTBEAT / 2).await;
    assert!(
        h.session
            .send(CoordinatorEvent::ClockPing {
                seq: 1,
                coordinator_send_unix_ns: 11,
                received_unix_ns: 22,
            })
            .await
    );

    let outcome = h.task.await.expect("the session does not panic");
    let Err(LinkError::CoordinatorLost(reason)) = outcome else {
        panic!("expected a lost coordinator, got {outcome:?}");
    };
    assert!(reason.contains("no message for 10s"), "{reason}");
    // The timeout counts from the last message heard.
    let waited = began.elapsed();
    assert!(
        waited >= HEARTBEAT / 2 + HEARTBEAT && waited < HEARTBEAT / 2 + HEARTBEAT + INTERVAL,
        "{waited:?}"
    );
    // The ping was answered; the load never started.
    let sent = drain(&mut h.out);
    assert!(
        matches!(
            sent.as_slice(),
            [ToCoordinator::ClockPong {
                seq: 1,
                coordinator_send_unix_ns: 11,
                worker_receive_unix_ns: 22,
            }]
        ),
        "{sent:?}"
    );
    assert_eq!(h.health.phase_name(), "joined");
    let accepted = target.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the target was contacted: {accepted:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_abort_before_the_start_sends_nothing() {
    let mut h = spawn_session("http://127.0.0.1:9");
    assert!(
        h.session
            .send(CoordinatorEvent::Abort {
                reason: "operator".into(),
            })
            .await
    );
    let outcome = h.task.await.expect("the session does not panic");
    assert!(
        matches!(&outcome, Err(LinkError::Aborted(reason)) if reason == "operator"),
        "{outcome:?}"
    );
    assert!(drain(&mut h.out).is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_abort_during_the_run_stops_the_engine_and_sends_the_partial_report() {
    let (_target, url) = silent_target();
    let mut h = spawn_session(&url);
    h.items.send(item(0)).await.expect("slice open");
    h.items.send(item(1)).await.expect("slice open");
    assert!(h.session.send(start_now()).await);
    let live = report_where(&mut h, 20, |r| r.totals.issued == 2).await;
    assert!(!live.is_final);
    assert_eq!(h.health.phase_name(), "running");

    assert!(
        h.session
            .send(CoordinatorEvent::Abort {
                reason: "operator".into(),
            })
            .await
    );
    let outcome = h.task.await.expect("the session does not panic");
    assert!(
        matches!(&outcome, Err(LinkError::Aborted(reason)) if reason == "operator"),
        "{outcome:?}"
    );
    // The engine let go of the slice, and the final report has what it knew: two requests
    // sent, both in flight when the run stopped.
    assert!(h.items.is_closed());
    assert_eq!(h.health.phase_name(), "finished");
    let last = drain(&mut h.out)
        .into_iter()
        .filter_map(|m| match m {
            ToCoordinator::Report(report) => Some(report),
            _ => None,
        })
        .next_back()
        .expect("a final report");
    assert!(last.is_final);
    assert_eq!(last.seq, live.seq + 1);
    assert_eq!(
        last.totals,
        SliceTotals {
            issued: 2,
            lost: 2,
            ..SliceTotals::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn the_coordinator_stream_ending_mid_run_stops_the_load() {
    let (_target, url) = silent_target();
    let mut h = spawn_session(&url);
    h.items.send(item(0)).await.expect("slice open");
    assert!(h.session.send(start_now()).await);
    report_where(&mut h, 20, |r| r.totals.issued == 1).await;

    assert!(h.session.send(CoordinatorEvent::StreamEnded).await);
    let outcome = h.task.await.expect("the session does not panic");
    let Err(LinkError::CoordinatorLost(reason)) = &outcome else {
        panic!("expected a lost coordinator, got {outcome:?}");
    };
    assert!(reason.starts_with("its stream ended"), "{reason}");
    // No more load: the slice is closed to new exchanges, the one in flight is lost.
    assert!(h.items.send(item(1)).await.is_err());
    let last = drain(&mut h.out)
        .into_iter()
        .filter_map(|m| match m {
            ToCoordinator::Report(report) => Some(report),
            _ => None,
        })
        .next_back()
        .expect("a final report, best effort");
    assert!(last.is_final);
    assert_eq!(last.totals.issued, 1);
    assert_eq!(last.totals.lost, 1);
}

#[tokio::test(start_paused = true)]
async fn a_broken_slice_mid_run_stops_the_load() {
    let mut h = spawn_session("http://127.0.0.1:9");
    assert!(h.session.send(start_now()).await);
    report_where(&mut h, 1, |_| true).await;
    assert!(
        h.session
            .send(CoordinatorEvent::SliceFailed {
                transport: false,
                reason: "exchange 3: think_ms = -1: expected a duration in ms".into(),
            })
            .await
    );
    let outcome = h.task.await.expect("the session does not panic");
    assert!(
        matches!(&outcome, Err(LinkError::Protocol(reason)) if reason.starts_with("slice: exchange 3")),
        "{outcome:?}"
    );
    assert!(h.items.is_closed());
}

#[tokio::test(start_paused = true)]
async fn reports_tick_at_the_interval_and_started_goes_once() {
    let mut h = spawn_session("http://127.0.0.1:9");
    assert!(h.session.send(start_now()).await);
    let mut seen = Vec::new();
    let mut at = Vec::new();
    for expected_seq in 1..=12 {
        let report = next_report(&mut h, &mut seen).await;
        at.push(Instant::now());
        assert_eq!(report.seq, expected_seq);
        assert!(!report.is_final);
        assert!(h.session.send(CoordinatorEvent::Alive).await);
    }
    for pair in at.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= INTERVAL && gap < INTERVAL + Duration::from_millis(2),
            "{gap:?}"
        );
    }
    // Each report is followed by a heartbeat.
    let heartbeats = seen
        .iter()
        .filter(|m| matches!(m, ToCoordinator::Heartbeat { .. }))
        .count();
    assert!(heartbeats >= 11, "{heartbeats}");

    // The slice ends, the run finishes: one final report, and `Started` was sent once in all.
    close_slice(&mut h);
    let last = next_report(&mut h, &mut seen).await;
    assert!(last.is_final);
    assert!(h.session.send(CoordinatorEvent::Finish).await);
    let outcome = h.task.await.expect("the session does not panic");
    assert!(outcome.is_ok(), "{outcome:?}");
    seen.extend(drain(&mut h.out));
    let started: Vec<u64> = seen
        .iter()
        .filter_map(|m| match m {
            ToCoordinator::Started { unix_ns } => Some(*unix_ns),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 1, "{seen:?}");
    assert!(started[0] > 0);
}

#[tokio::test(start_paused = true)]
async fn a_finished_run_waits_for_finish() {
    let mut h = spawn_session("http://127.0.0.1:9");
    assert!(h.session.send(start_now()).await);
    close_slice(&mut h);
    let mut seen = Vec::new();
    let last = report_where(&mut h, 20, |r| r.is_final).await;
    assert_eq!(last.totals, SliceTotals::default());
    let finished_at = Instant::now();

    // Still there while the coordinator is reading the report.
    tokio::time::sleep(HEARTBEAT / 2).await;
    assert!(h.session.send(CoordinatorEvent::Alive).await);
    tokio::task::yield_now().await;
    assert!(!h.task.is_finished());
    assert!(h.session.send(CoordinatorEvent::Finish).await);
    let outcome = h.task.await.expect("the session does not panic");
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(finished_at.elapsed() < HEARTBEAT);
    seen.extend(drain(&mut h.out));
    assert!(
        !seen.iter().any(|m| matches!(m, ToCoordinator::Report(_))),
        "nothing after the final report: {seen:?}"
    );
}

/// The reports carry steady metrics when the assignment asked for them, and only then.
#[tokio::test(start_paused = true)]
async fn reports_carry_steady_metrics_only_when_asked() {
    for asked in [false, true] {
        let mut h = spawn_session_with("http://127.0.0.1:9", asked);
        assert!(h.session.send(start_now()).await);
        let mut seen = Vec::new();
        let first = next_report(&mut h, &mut seen).await;
        assert_eq!(first.steady.is_some(), asked, "an interval report");
        close_slice(&mut h);
        let last = report_where(&mut h, 20, |r| r.is_final).await;
        assert_eq!(last.steady.is_some(), asked, "the final report");
        assert!(h.session.send(CoordinatorEvent::Finish).await);
        let outcome = h.task.await.expect("the session does not panic");
        assert!(outcome.is_ok(), "{outcome:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_finish_a_finished_run_ends_after_the_heartbeat_timeout() {
    let mut h = spawn_session("http://127.0.0.1:9");
    assert!(h.session.send(start_now()).await);
    close_slice(&mut h);
    report_where(&mut h, 20, |r| r.is_final).await;
    let finished_at = Instant::now();
    let outcome = h.task.await.expect("the session does not panic");
    assert!(outcome.is_ok(), "{outcome:?}");
    let waited = finished_at.elapsed();
    assert!(
        waited >= HEARTBEAT && waited < HEARTBEAT + INTERVAL,
        "{waited:?}"
    );
}

/// Issue 19, item 5: after an abort the session sends its final report and stays (its link
/// with it) until the coordinator's Finish, so the report reaches the wire before the worker
/// exits: a survivor's final numbers are merged, not lost with its process.
#[tokio::test(start_paused = true)]
async fn after_an_abort_the_final_report_goes_out_before_the_session_ends() {
    let (_target, url) = silent_target();
    let mut h = spawn_session(&url);
    h.items.send(item(0)).await.expect("slice open");
    assert!(h.session.send(start_now()).await);
    report_where(&mut h, 20, |r| r.totals.issued == 1).await;
    assert!(
        h.session
            .send(CoordinatorEvent::Abort {
                reason: "a worker was lost".into(),
            })
            .await
    );
    let last = report_where(&mut h, 20, |r| r.is_final).await;
    assert_eq!(last.totals.lost, 1);
    let sent_at = Instant::now();
    tokio::time::sleep(HEARTBEAT / 2).await;
    assert!(
        !h.task.is_finished(),
        "the session ended before the coordinator had the report"
    );
    assert!(h.session.send(CoordinatorEvent::Finish).await);
    let outcome = h.task.await.expect("the session does not panic");
    assert!(
        matches!(&outcome, Err(LinkError::Aborted(_))),
        "{outcome:?}"
    );
    assert!(sent_at.elapsed() < HEARTBEAT);
}
