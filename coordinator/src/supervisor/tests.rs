//! The supervisor under `tokio::time::pause`: workers are played by the test over the same
//! typed channels the gRPC service uses (join, clock pongs, reports, heartbeats), so join,
//! start, loss, reassignment and abort are checked without sockets and without waiting.

use std::path::PathBuf;
use std::time::Duration;

use common::metrics::RunMetrics;
use common::metrics::SliceTotals;
use common::metrics::SparseMetrics;
use common::worker_report::ReceivedReport;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::server::{ClockSample, Control, WorkerControl, WorkerEvent};
use crate::shard::{SliceChunk, SlicePlan};

/// A recording of `n` exchanges without sessions (striped over the workers), in a file
/// removed on drop.
struct Recording(PathBuf);

impl Recording {
    fn new(tag: &str, n: usize) -> Recording {
        let path = std::env::temp_dir().join(format!(
            "llm-replay-supervisor-{tag}-{}.jsonl",
            std::process::id()
        ));
        let lines: String = (0..n)
            .map(|i| {
                format!(
                    "{{\"id\":\"e{i}\",\"at_ms\":{i},\"request\":{{\"method\":\"POST\",\"path\":\"/v1/chat/completions\",\"body\":\"{{}}\"}}}}\n"
                )
            })
            .collect();
        std::fs::write(&path, lines).expect("the temp dir is writable");
        Recording(path)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn settings(workers: usize, reassign_on_loss: bool) -> Settings {
    Settings {
        workers,
        join_timeout: Duration::from_secs(30),
        heartbeat_timeout: Duration::from_secs(5),
        reassign_on_loss,
        local_workers: false,
        max_skew: Duration::from_millis(5),
        reorder_window: 4096,
        start_lead: Duration::from_millis(500),
        min_start_lead: Duration::from_millis(500),
        clock_samples: 3,
        clock_patience: Duration::from_secs(2),
        setup_patience: Duration::ZERO,
        abort_grace: Duration::from_secs(3),
        tick: Duration::from_millis(500),
        report_interval: Duration::from_millis(500),
        live_histograms: false,
        load_duration: None,
    }
}

fn plan(recording: &Recording, workers: usize, exchanges: u64) -> SlicePlan {
    SlicePlan {
        recording: recording.0.clone(),
        workers,
        exchanges,
        requests: None,
        open_ended: false,
        pass_span_ms: 0.0,
        faithful: Default::default(),
        tokenizer: None,
        recorded_cancels: false,
    }
}

fn identity() -> RunIdentity {
    RunIdentity {
        run_id: "test-run".into(),
        target: "http://127.0.0.1:1".into(),
        load: Default::default(),
        scheduled: false,
        level: String::new(),
    }
}

struct Harness {
    events: mpsc::Sender<WorkerEvent>,
    interrupt: watch::Sender<bool>,
    run: tokio::task::JoinHandle<Result<ReplayResult, RunError>>,
}

fn start_supervisor(settings: Settings, plan: SlicePlan) -> Harness {
    let (events_tx, events) = mpsc::channel(1024);
    let (interrupt, interrupt_rx) = watch::channel(false);
    let supervisor = Supervisor::new(settings, plan, identity(), events, interrupt_rx, None);
    Harness {
        events: events_tx,
        interrupt,
        run: tokio::spawn(supervisor.run()),
    }
}

/// One worker as the supervisor sees it: the test plays its side of the link.
struct FakeWorker {
    index: usize,
    events: mpsc::Sender<WorkerEvent>,
    control: mpsc::Receiver<Control>,
    slice: mpsc::Receiver<SliceChunk>,
    /// Worker clock − coordinator clock, ns.
    offset_ns: i64,
    seq: u64,
    received: Vec<u64>,
}

impl FakeWorker {
    async fn join(harness: &Harness, index: usize, offset_ns: i64) -> FakeWorker {
        let (control, control_rx) = WorkerControl::channel(64);
        let (slice, slice_rx) = mpsc::channel(8);
        harness
            .events
            .send(WorkerEvent::Joined {
                index,
                id: format!("w{index}"),
                host: "test".into(),
                control,
                slice,
            })
            .await
            .expect("the supervisor is running");
        FakeWorker {
            index,
            events: harness.events.clone(),
            control: control_rx,
            slice: slice_rx,
            offset_ns,
            seq: 0,
            received: Vec::new(),
        }
    }

    async fn send(&self, event: WorkerEvent) {
        let _ = self.events.send(event).await;
    }

    async fn next_control(&mut self) -> Control {
        self.control
            .recv()
            .await
            .expect("the supervisor keeps the control stream open")
    }

    /// Answer clock pings (with no network delay) until the start; returns the start
    /// instant in this worker's clock.
    async fn sync_until_start(&mut self) -> u64 {
        loop {
            match self.next_control().await {
                Control::ClockPing { seq, sent_unix_ns } => {
                    let worker_time = (sent_unix_ns as i64 + self.offset_ns) as u64;
                    self.send(WorkerEvent::ClockPong {
                        index: self.index,
                        sample: ClockSample {
                            seq,
                            t1: sent_unix_ns,
                            t2: worker_time,
                            t3: worker_time,
                            t4: sent_unix_ns,
                        },
                    })
                    .await;
                }
                Control::Start { unix_ns } => {
                    self.send(WorkerEvent::Started {
                        index: self.index,
                        unix_ns,
                    })
                    .await;
                    return unix_ns;
                }
                Control::Heartbeat { .. } => {}
                other => panic!("unexpected before the start: {other:?}"),
            }
        }
    }

    /// Receive slice chunks until `n` exchanges have arrived in total.
    async fn receive(&mut self, n: usize) {
        while self.received.len() < n {
            let chunk = self.slice.recv().await.expect("the slice stays open");
            assert!(!chunk.last, "the slice closed after {:?}", self.received);
            self.received
                .extend(chunk.exchanges.iter().map(|e| e.index));
        }
    }

    /// Wait for the closing chunk.
    async fn until_slice_closed(&mut self) {
        loop {
            let chunk = self.slice.recv().await.expect("the slice stays open");
            self.received
                .extend(chunk.exchanges.iter().map(|e| e.index));
            if chunk.last {
                return;
            }
        }
    }

    async fn report(&mut self, is_final: bool, succeeded: u64, totals: SliceTotals) {
        self.report_with_steady(is_final, succeeded, totals, None)
            .await;
    }

    /// [`FakeWorker::report`], with steady metrics when `steady` says how many of the
    /// succeeded requests (the last ones) were steady.
    async fn report_with_steady(
        &mut self,
        is_final: bool,
        succeeded: u64,
        totals: SliceTotals,
        steady: Option<u64>,
    ) {
        self.seq += 1;
        let mut metrics = RunMetrics::new();
        metrics.counters.succeeded = succeeded;
        for k in 0..succeeded {
            let (ttft, lag) = fake_samples(self.index, k);
            metrics.record_value(Metric::Ttft, ttft);
            metrics.record_value(Metric::ScheduleLag, lag);
        }
        let steady = steady.map(|steady| {
            let mut metrics = RunMetrics::new();
            metrics.counters.succeeded = steady;
            for k in succeeded - steady..succeeded {
                metrics.record_value(Metric::Ttft, fake_samples(self.index, k).0);
            }
            SparseMetrics::from(&metrics)
        });
        self.send(WorkerEvent::Report {
            index: self.index,
            report: Box::new(ReceivedReport {
                seq: self.seq,
                is_final,
                metrics: SparseMetrics::from(&metrics),
                totals,
                steady,
                ..ReceivedReport::default()
            }),
            records: Vec::new(),
        })
        .await;
    }

    /// Report every received exchange as succeeded.
    async fn report_all(&mut self, is_final: bool) {
        let n = self.received.len() as u64;
        self.report(
            is_final,
            n,
            SliceTotals {
                issued: n,
                ..SliceTotals::default()
            },
        )
        .await;
    }

    /// Wait for a control message other than heartbeats.
    async fn next_order(&mut self) -> Control {
        loop {
            match self.next_control().await {
                Control::Heartbeat { .. } => {}
                other => return other,
            }
        }
    }
}

/// The TTFT and schedule lag (µs) a fake worker reports for its `k`th request: spread over
/// several magnitudes, different for each worker.
fn fake_samples(index: usize, k: u64) -> (u64, u64) {
    let i = index as u64 + 1;
    (i * 1_000 + k * k * k * 7_919, i * 37 + k * 1_001)
}

/// Send heartbeats every second (virtual time) until the returned sender is dropped.
fn keep_alive(events: mpsc::Sender<WorkerEvent>, index: usize) -> tokio::sync::oneshot::Sender<()> {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = ticker.tick() => {
                    if events.send(WorkerEvent::Heartbeat { index }).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    stop
}

#[tokio::test(start_paused = true)]
async fn a_run_joins_starts_everyone_in_its_own_clock_and_merges_the_final_reports() {
    let recording = Recording::new("happy", 20);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 3_000_000_000).await;
    let (start0, start1) = tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    // One instant, told to each worker in its own clock (offsets measured exactly here).
    assert_eq!(start1 as i64 - start0 as i64, 3_000_000_000);

    tokio::join!(w0.receive(10), w1.receive(10));
    let mut all: Vec<u64> = w0.received.iter().chain(&w1.received).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..20).collect::<Vec<u64>>(), "every exchange once");
    w0.report_all(false).await;
    w1.report_all(false).await;
    // Everything handed out was started: the slices close, the workers send final reports.
    tokio::join!(w0.until_slice_closed(), w1.until_slice_closed());
    w0.report_all(true).await;
    w1.report_all(true).await;
    assert_eq!(w0.next_order().await, Control::Finish);
    assert_eq!(w1.next_order().await, Control::Finish);

    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes");
    assert!(!result.aborted);
    assert_eq!(result.metrics.counters.succeeded, 20);
    assert_eq!(result.workers.iter().map(|w| w.assigned).sum::<u64>(), 20);
    assert_eq!(result.totals.not_started, 0);
    assert_eq!(result.start_skew_ms, Some(0.0));
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    // The merged histograms hold every worker's samples, each in its bucket: exactly those of
    // one histogram that saw them all.
    let mut all = RunMetrics::new();
    for (index, worker) in result.workers.iter().enumerate() {
        let mut own = RunMetrics::new();
        for k in 0..10 {
            let (ttft, lag) = fake_samples(index, k);
            for metrics in [&mut all, &mut own] {
                metrics.record_value(Metric::Ttft, ttft);
                metrics.record_value(Metric::ScheduleLag, lag);
            }
        }
        assert_eq!(
            worker.metrics.stats(Metric::ScheduleLag),
            own.stats(Metric::ScheduleLag)
        );
    }
    for metric in [Metric::Ttft, Metric::ScheduleLag] {
        assert!(
            result.metrics.histogram(metric) == all.histogram(metric),
            "{metric:?}"
        );
        assert_eq!(
            result.metrics.stats(metric),
            all.stats(metric),
            "{metric:?}"
        );
    }
    assert_eq!(result.metrics.histogram(Metric::Ttft).len(), 20);
    assert!(result.steady_metrics.is_none(), "no worker sent any");
}

#[tokio::test(start_paused = true)]
async fn missing_workers_fail_the_join_at_the_join_timeout() {
    let recording = Recording::new("join", 4);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 4));
    let _w0 = FakeWorker::join(&harness, 0, 0).await;
    let started = tokio::time::Instant::now();
    let error = harness
        .run
        .await
        .expect("no panic")
        .expect_err("one worker never joins");
    assert!(
        error.to_string().contains("only 1 of 2 workers joined"),
        "{error}"
    );
    assert_eq!(started.elapsed().as_secs(), 30, "waited the join timeout");
}

/// Issue 19, item 1: a worker that joined first hears heartbeats while the others come, so
/// its own heartbeat timeout (5 s) does not run out during a longer join wait.
#[tokio::test(start_paused = true)]
async fn an_early_worker_hears_heartbeats_during_the_join_wait() {
    let recording = Recording::new("join-heartbeats", 4);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 4));
    let mut early = FakeWorker::join(&harness, 0, 0).await;
    let joined = tokio::time::Instant::now();
    let mut heard = Vec::new();
    while joined.elapsed() < Duration::from_secs(8) {
        match tokio::time::timeout(Duration::from_secs(1), early.next_control()).await {
            Ok(Control::Heartbeat { .. }) => heard.push(joined.elapsed()),
            Ok(other) => panic!("unexpected before every worker joined: {other:?}"),
            Err(_) => {}
        }
    }
    assert!(heard.len() >= 8, "heartbeats at {heard:?}");
    for pair in heard.windows(2) {
        assert!(pair[1] - pair[0] <= Duration::from_secs(1), "{heard:?}");
    }
    // The second worker joins after 8 s: the run goes on.
    let mut late = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(early.sync_until_start(), late.sync_until_start());
    tokio::join!(early.receive(2), late.receive(2));
    early.report_all(true).await;
    late.report_all(true).await;
    let result = harness.run.await.expect("no panic").expect("the run");
    assert_eq!(result.workers.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_remote_worker_that_leaves_before_everyone_joined_frees_its_place() {
    let recording = Recording::new("rejoin", 4);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 4));
    let gone = FakeWorker::join(&harness, 1, 0).await;
    gone.send(WorkerEvent::Gone {
        index: 1,
        reason: "its stream ended".into(),
    })
    .await;
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    // The same place taken again, e.g. by the worker restarted by its orchestrator.
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    tokio::join!(w0.receive(2), w1.receive(2));
    w0.report_all(true).await;
    w1.report_all(true).await;
    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes");
    assert_eq!(result.metrics.counters.succeeded, 4);
    assert!(!result.aborted);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_leaves_during_the_clock_sync_fails_the_start() {
    let recording = Recording::new("leave", 4);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 4));
    let _w0 = FakeWorker::join(&harness, 0, 0).await;
    let gone = FakeWorker::join(&harness, 1, 0).await;
    gone.send(WorkerEvent::Gone {
        index: 1,
        reason: "its stream ended".into(),
    })
    .await;
    let error = harness
        .run
        .await
        .expect("no panic")
        .expect_err("a worker left during the clock sync");
    assert!(
        error
            .to_string()
            .contains("worker w1 left before the start"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_worker_is_lost_and_its_exchanges_go_to_the_survivor() {
    let recording = Recording::new("reassign", 20);
    let harness = start_supervisor(settings(2, true), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    let _alive = keep_alive(harness.events.clone(), 0);
    tokio::join!(w0.receive(10), w1.receive(10));
    // Worker 1 started 4 of its 10, answered 3, then went silent.
    w1.report(
        false,
        3,
        SliceTotals {
            issued: 4,
            ..SliceTotals::default()
        },
    )
    .await;
    let silent_since = tokio::time::Instant::now();
    // Its 6 unstarted exchanges reach the survivor (while heartbeats keep going).
    w0.receive(16).await;
    // Virtual time may run on while the blocking feeder reads the file: only a lower bound.
    let waited = silent_since.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "lost only after the heartbeat timeout (5 s), took {waited:?}"
    );
    let mut reassigned: Vec<u64> = w0.received[10..].to_vec();
    reassigned.sort_unstable();
    let mut unstarted: Vec<u64> = w1.received[4..].to_vec();
    unstarted.sort_unstable();
    assert_eq!(
        reassigned, unstarted,
        "exactly the lost worker's unstarted exchanges"
    );
    w0.report_all(false).await;
    w0.until_slice_closed().await;
    w0.report_all(true).await;
    assert_eq!(w0.next_order().await, Control::Finish);

    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes");
    assert!(!result.aborted, "reassign keeps the run going");
    assert_eq!(result.metrics.counters.succeeded, 16 + 3);
    assert_eq!(
        result.totals.lost, 1,
        "the one in flight on the lost worker"
    );
    let assigned: Vec<u64> = result.workers.iter().map(|w| w.assigned).collect();
    assert_eq!(assigned, vec![16, 4]);
    assert!(result.workers[1].lost);
    assert!(
        result
            .warnings
            .iter()
            .any(|w| w.contains("6 exchanges of worker w1") && w.contains("reassigned")),
        "{:?}",
        result.warnings
    );
}

/// Issue 31, item 9 (protocol 5): a worker starts only what it was granted. One lost by
/// silence after claims beyond its last report hands over only what it was never granted
/// (nothing reaches the server twice); what it was granted but never reported is counted
/// lost — it may have been sent — not handed over and not "not started".
#[tokio::test(start_paused = true)]
async fn a_silent_workers_granted_exchanges_are_lost_and_only_the_rest_is_handed_over() {
    let recording = Recording::new("claims", 20);
    let harness = start_supervisor(settings(2, true), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    let _alive = keep_alive(harness.events.clone(), 0);
    tokio::join!(w0.receive(10), w1.receive(10));
    // Worker 1 claims its first 7, is granted them, reports 4 started (3 answered), then
    // goes silent.
    w1.send(WorkerEvent::Claim {
        index: 1,
        own_prefix: 7,
    })
    .await;
    assert_eq!(w1.next_order().await, Control::Grant { own_prefix: 7 });
    w1.report(
        false,
        3,
        SliceTotals {
            issued: 4,
            ..SliceTotals::default()
        },
    )
    .await;
    // Only its 3 never-granted exchanges reach the survivor.
    w0.receive(13).await;
    let mut reassigned: Vec<u64> = w0.received[10..].to_vec();
    reassigned.sort_unstable();
    let mut ungranted: Vec<u64> = w1.received[7..].to_vec();
    ungranted.sort_unstable();
    assert_eq!(reassigned, ungranted, "exactly the never-granted exchanges");
    w0.report_all(false).await;
    w0.until_slice_closed().await;
    assert_eq!(w0.received.len(), 13, "nothing more was handed over");
    w0.report_all(true).await;
    assert_eq!(w0.next_order().await, Control::Finish);

    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes");
    assert_eq!(result.metrics.counters.succeeded, 13 + 3);
    assert_eq!(
        result.totals.lost,
        1 + 3,
        "the one in flight, and the 3 granted after its last report"
    );
    assert_eq!(result.totals.not_started, 0);
    let assigned: Vec<u64> = result.workers.iter().map(|w| w.assigned).collect();
    assert_eq!(assigned, vec![13, 7]);
    assert!(
        result.warnings.iter().any(|w| w.contains(
            "3 exchanges it was granted after its last report may have reached the server"
        )),
        "{:?}",
        result.warnings
    );
}

/// Issue 19, item 4: a lost worker is fenced. It is told to stop (an abort naming its
/// loss); the reports its stalled link delivers afterwards — up to a final one that accounts
/// for its whole slice — are not counted; what it had not started by its last report before
/// the loss goes to the survivor once, and every exchange is accounted for once.
#[tokio::test(start_paused = true)]
async fn a_lost_worker_is_fenced_and_what_it_sends_afterwards_is_not_counted() {
    let recording = Recording::new("fence", 20);
    let harness = start_supervisor(settings(2, true), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    let _alive = keep_alive(harness.events.clone(), 0);
    tokio::join!(w0.receive(10), w1.receive(10));
    w1.report(
        false,
        3,
        SliceTotals {
            issued: 4,
            ..SliceTotals::default()
        },
    )
    .await;
    // Silent for the heartbeat timeout: lost, and told to stop.
    match w1.next_order().await {
        Control::Abort { reason } => assert!(
            reason.contains("declared lost") && reason.contains("no heartbeat"),
            "{reason}"
        ),
        other => panic!("expected the fence's abort, got {other:?}"),
    }
    // Its link comes back with what it sent meanwhile: more answered, then a final report
    // for its whole slice. None of it counts.
    w1.report(
        false,
        8,
        SliceTotals {
            issued: 9,
            ..SliceTotals::default()
        },
    )
    .await;
    w1.report_all(true).await;
    w0.receive(16).await;
    w0.report_all(false).await;
    w0.until_slice_closed().await;
    w0.report_all(true).await;
    assert_eq!(w0.next_order().await, Control::Finish);
    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes");
    assert_eq!(result.metrics.counters.succeeded, 16 + 3);
    assert_eq!(result.totals.lost, 1, "the one in flight when it was lost");
    assert_eq!(result.totals.not_started, 0);
    let total =
        result.metrics.counters.completed() + result.totals.not_started + result.totals.lost;
    assert_eq!(total, 20, "every exchange once");
    let assigned: Vec<u64> = result.workers.iter().map(|w| w.assigned).collect();
    assert_eq!(assigned, vec![16, 4]);
    assert!(result.workers[1].lost && !result.workers[0].lost);
    assert_eq!(result.workers[1].metrics.counters.succeeded, 3);
}

#[tokio::test(start_paused = true)]
async fn fail_mode_aborts_and_keeps_the_survivors_partial_report() {
    let recording = Recording::new("abort", 20);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    tokio::join!(w0.receive(10), w1.receive(10));
    w0.report(
        false,
        5,
        SliceTotals {
            issued: 6,
            ..SliceTotals::default()
        },
    )
    .await;
    w1.send(WorkerEvent::Gone {
        index: 1,
        reason: "its stream broke: connection reset".into(),
    })
    .await;
    match w0.next_order().await {
        Control::Abort { reason } => assert!(reason.contains("worker was lost"), "{reason}"),
        other => panic!("expected an abort, got {other:?}"),
    }
    // The survivor's partial final report: one more answered, one lost in flight, 3 never
    // started.
    w0.report(
        true,
        6,
        SliceTotals {
            issued: 7,
            not_started: 3,
            lost: 1,
            ..SliceTotals::default()
        },
    )
    .await;
    // Issue 19, item 5: its final report is in, so it may leave (its link flushes first).
    assert_eq!(w0.next_order().await, Control::Finish);
    let result = harness.run.await.expect("no panic").expect("a result");
    assert!(result.aborted);
    assert!(!result.interrupted);
    assert!(!result.workers[0].lost, "the survivor is not disconnected");
    assert_eq!(result.metrics.counters.succeeded, 6);
    // Worker 1 never reported: its 10 were never started (planned − assigned).
    assert_eq!(result.totals.not_started, 3 + 10);
    assert_eq!(result.totals.lost, 1);
    let total =
        result.metrics.counters.completed() + result.totals.not_started + result.totals.lost;
    assert_eq!(total, 20, "every planned exchange accounted for");
}

/// The steady metrics are merged as the main ones are: each worker's latest report's, a
/// lost worker's last one included.
#[tokio::test(start_paused = true)]
async fn the_steady_metrics_of_every_worker_are_merged_a_lost_ones_last_included() {
    let recording = Recording::new("steady", 20);
    let harness = start_supervisor(settings(2, false), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    tokio::join!(w0.receive(10), w1.receive(10));
    let issued = |issued| SliceTotals {
        issued,
        ..SliceTotals::default()
    };
    w0.report_with_steady(false, 5, issued(6), Some(3)).await;
    w1.report_with_steady(false, 4, issued(4), Some(1)).await;
    w1.report_with_steady(false, 5, issued(5), Some(2)).await;
    w1.send(WorkerEvent::Gone {
        index: 1,
        reason: "its stream broke: connection reset".into(),
    })
    .await;
    match w0.next_order().await {
        Control::Abort { reason } => assert!(reason.contains("worker was lost"), "{reason}"),
        other => panic!("expected an abort, got {other:?}"),
    }
    let final_totals = SliceTotals {
        issued: 7,
        not_started: 3,
        lost: 1,
        ..SliceTotals::default()
    };
    w0.report_with_steady(true, 6, final_totals, Some(4)).await;
    assert_eq!(w0.next_order().await, Control::Finish);
    let result = harness.run.await.expect("no panic").expect("a result");
    assert!(result.workers[1].lost);
    assert_eq!(result.metrics.counters.succeeded, 6 + 5);
    let steady = result
        .steady_metrics
        .expect("the workers sent steady metrics");
    assert_eq!(steady.counters.succeeded, 4 + 2, "w0's final, w1's last");
    // Each worker's steady samples, each in its bucket.
    let mut expected = RunMetrics::new();
    for (index, succeeded, steady) in [(0, 6, 4), (1, 5, 2)] {
        for k in succeeded - steady..succeeded {
            expected.record_value(Metric::Ttft, fake_samples(index, k).0);
        }
    }
    assert!(steady.histogram(Metric::Ttft) == expected.histogram(Metric::Ttft));
    assert_eq!(steady.histogram(Metric::Ttft).len(), 6);
}

/// A report whose steady metrics count more than the report itself is invalid: the worker is
/// lost, its last valid report kept.
#[tokio::test(start_paused = true)]
async fn steady_metrics_past_the_reports_own_counts_lose_the_worker() {
    let recording = Recording::new("steady-invalid", 10);
    let harness = start_supervisor(settings(1, false), plan(&recording, 1, 10));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    w0.sync_until_start().await;
    w0.receive(10).await;
    let issued = |issued| SliceTotals {
        issued,
        ..SliceTotals::default()
    };
    w0.report_with_steady(false, 2, issued(2), Some(1)).await;
    w0.seq += 1;
    let mut steady = RunMetrics::new();
    steady.counters.succeeded = 4;
    let mut metrics = RunMetrics::new();
    metrics.counters.succeeded = 3;
    w0.send(WorkerEvent::Report {
        index: 0,
        report: Box::new(ReceivedReport {
            seq: w0.seq,
            metrics: SparseMetrics::from(&metrics),
            totals: issued(3),
            steady: Some(SparseMetrics::from(&steady)),
            ..ReceivedReport::default()
        }),
        records: Vec::new(),
    })
    .await;
    let result = harness.run.await.expect("no panic").expect("a result");
    assert!(result.workers[0].lost);
    assert_eq!(
        result.metrics.counters.succeeded, 2,
        "the last valid report"
    );
    let steady = result
        .steady_metrics
        .expect("its last valid steady metrics");
    assert_eq!(steady.counters.succeeded, 1);
    assert!(
        result
            .warnings
            .iter()
            .any(|w| w.contains("steady metrics: succeeded 4 of 3 in the whole report")),
        "{:?}",
        result.warnings
    );
}

#[tokio::test(start_paused = true)]
async fn an_interrupt_aborts_and_waits_only_the_grace_period() {
    let recording = Recording::new("interrupt", 8);
    let harness = start_supervisor(settings(1, false), plan(&recording, 1, 8));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    w0.sync_until_start().await;
    w0.receive(8).await;
    let _alive = keep_alive(harness.events.clone(), 0);
    harness.interrupt.send_replace(true);
    match w0.next_order().await {
        Control::Abort { reason } => assert!(reason.contains("interrupted"), "{reason}"),
        other => panic!("expected an abort, got {other:?}"),
    }
    let asked = tokio::time::Instant::now();
    // The worker never answers: the supervisor gives up after the grace period.
    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("a partial result");
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_millis(3500),
        "the 3 s grace period, took {waited:?}"
    );
    assert!(result.interrupted && result.aborted);
    assert_eq!(result.totals.not_started, 8);
}

#[tokio::test(start_paused = true)]
async fn a_report_answering_for_more_than_issued_loses_the_worker_but_keeps_its_last_valid_data() {
    let recording = Recording::new("invalid", 10);
    let harness = start_supervisor(settings(1, false), plan(&recording, 1, 10));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    w0.sync_until_start().await;
    w0.receive(10).await;
    w0.report(
        false,
        2,
        SliceTotals {
            issued: 2,
            ..SliceTotals::default()
        },
    )
    .await;
    w0.report(
        false,
        9,
        SliceTotals {
            issued: 3,
            ..SliceTotals::default()
        },
    )
    .await;
    let result = harness.run.await.expect("no panic").expect("a result");
    assert!(result.aborted);
    assert!(result.workers[0].lost);
    assert_eq!(
        result.metrics.counters.succeeded, 2,
        "the last valid report"
    );
    assert!(
        result
            .warnings
            .iter()
            .any(|w| w.contains("invalid report (9 answered of 3 issued)")),
        "{:?}",
        result.warnings
    );
}

/// `--requests 10000000 --duration 5s`: the budget is cut by the duration. The feed must stop
/// with the duration (what was never handed out is not started) instead of walking the whole
/// budget so that the workers count it as not started, which with 50 workers kept the
/// coordinator busy for minutes and starved its heartbeats.
#[tokio::test(start_paused = true)]
async fn a_large_budget_cut_by_the_duration_feeds_only_what_the_duration_can_use() {
    const BUDGET: u64 = 10_000_000;
    let recording = Recording::new("budget", 100);
    let mut settings = settings(2, false);
    settings.load_duration = Some(Duration::from_secs(5));
    let mut plan = plan(&recording, 2, 100);
    plan.requests = Some(BUDGET);
    let harness = start_supervisor(settings, plan);
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 0).await;
    tokio::join!(w0.sync_until_start(), w1.sync_until_start());
    // The start is `start_lead` (500 ms) after the start message.
    let end_of_duration = tokio::time::Instant::now() + Duration::from_millis(5_500);
    let mut workers = [w0, w1];
    let mut issued = [0u64; 2];
    let mut not_started = [0u64; 2];
    let mut closed = [false; 2];
    // Play the engine: issue what arrives until the duration is over, then count the rest
    // as not started until the slice closes. The feed runs on a thread of its own (a blocking
    // task, which holds the paused clock's auto-advance): the test moves time itself, and
    // gives the feed a few real milliseconds each step.
    while !closed.iter().all(|c| *c) {
        std::thread::sleep(Duration::from_millis(5));
        tokio::time::advance(Duration::from_millis(250)).await;
        let over = tokio::time::Instant::now() >= end_of_duration;
        for (i, worker) in workers.iter_mut().enumerate() {
            while let Ok(chunk) = worker.slice.try_recv() {
                let n = chunk.exchanges.len() as u64;
                if over {
                    not_started[i] += n;
                } else {
                    issued[i] += n;
                }
                closed[i] |= chunk.last;
            }
            assert!(
                issued[i] + not_started[i] < 100_000,
                "worker {i} was fed {} exchanges: the feed went on after the duration",
                issued[i] + not_started[i]
            );
            let totals = SliceTotals {
                issued: issued[i],
                not_started: not_started[i],
                ..SliceTotals::default()
            };
            worker.report(false, issued[i], totals).await;
        }
        assert!(
            tokio::time::Instant::now() < end_of_duration + Duration::from_secs(120),
            "the slices were not closed within 120 s of the duration's end"
        );
    }
    for (i, worker) in workers.iter_mut().enumerate() {
        let totals = SliceTotals {
            issued: issued[i],
            not_started: not_started[i],
            ..SliceTotals::default()
        };
        worker.report(true, issued[i], totals).await;
    }
    for worker in &mut workers {
        assert_eq!(worker.next_order().await, Control::Finish);
    }
    let result = harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes");
    let answered: u64 = issued.iter().sum();
    assert!(answered > 0, "the workers were fed while the duration ran");
    assert_eq!(result.metrics.counters.succeeded, answered);
    // Every planned exchange is accounted for: answered, or not started.
    assert_eq!(result.totals.not_started, BUDGET - answered);
    assert!(!result.aborted);
}

/// Issue 19, item 16: one schedule-lag outlier is no saturation; high lag on an idle worker
/// is named as a stall, not as saturation.
#[test]
fn saturation_needs_lasting_lag_and_a_busy_cpu() {
    let stats = |p50: f64, p90: f64, p99: f64| common::metrics::Stats {
        p50,
        p90,
        p99,
        ..Default::default()
    };
    assert_eq!(
        load_warning("w", Some(&stats(0.1, 0.3, 40.0)), 0.05, 2),
        None
    );
    let (load, stalled) = load_warning("w", Some(&stats(12.0, 30.0, 40.0)), 0.01, 2).expect("late");
    assert_eq!(load, ClientLoad::Stalled);
    assert!(
        stalled.contains("not saturated") && stalled.contains("stalled"),
        "{stalled}"
    );
    let (load, saturated) =
        load_warning("w", Some(&stats(12.0, 30.0, 40.0)), 0.8, 2).expect("busy");
    assert_eq!(load, ClientLoad::Saturated);
    assert!(saturated.contains("was saturated"), "{saturated}");
    let (load, pegged) = load_warning("w", Some(&stats(0.1, 0.2, 0.3)), 0.95, 2).expect("pegged");
    assert_eq!(load, ClientLoad::Saturated);
    assert!(pegged.contains("was saturated"), "{pegged}");
    assert_eq!(load_warning("w", None, 0.2, 2), None);
}

// Issue 19, item 2: clock error is invisible to the measured start skew; the bound shows it,
// and a long or jittery path gets more clock samples.

/// What a fake worker's clock sync over a path did: its start instant (its own clock) and
/// how many pings it answered.
struct PathSync {
    start_unix_ns: u64,
    pings: u64,
}

/// Answer clock pings over a path whose one-way delays for ping `seq` are
/// `path(seq) = (coordinator → worker, worker → coordinator)`: the pong arrives after their
/// sum (virtual time), stamped as a real link would stamp it. Then report the start.
async fn sync_over_path(
    worker: &mut FakeWorker,
    path: impl Fn(u64) -> (Duration, Duration),
) -> PathSync {
    let mut pings = 0;
    loop {
        match worker.next_control().await {
            Control::ClockPing { seq, sent_unix_ns } => {
                pings += 1;
                let (down, up) = path(seq);
                tokio::time::sleep(down + up).await;
                let t1 = sent_unix_ns as i128;
                let worker_time = (t1 + down.as_nanos() as i128 + worker.offset_ns as i128) as u64;
                worker
                    .send(WorkerEvent::ClockPong {
                        index: worker.index,
                        sample: ClockSample {
                            seq,
                            t1: sent_unix_ns,
                            t2: worker_time,
                            t3: worker_time,
                            t4: (t1 + (down + up).as_nanos() as i128) as u64,
                        },
                    })
                    .await;
            }
            Control::Start { unix_ns } => {
                worker
                    .send(WorkerEvent::Started {
                        index: worker.index,
                        unix_ns,
                    })
                    .await;
                return PathSync {
                    start_unix_ns: unix_ns,
                    pings,
                };
            }
            Control::Heartbeat { .. } => {}
            other => panic!("unexpected before the start: {other:?}"),
        }
    }
}

fn start_scheduled_supervisor(settings: Settings, plan: SlicePlan) -> Harness {
    let (events_tx, events) = mpsc::channel(1024);
    let (interrupt, interrupt_rx) = watch::channel(false);
    let identity = RunIdentity {
        scheduled: true,
        ..identity()
    };
    let supervisor = Supervisor::new(settings, plan, identity, events, interrupt_rx, None);
    Harness {
        events: events_tx,
        interrupt,
        run: tokio::spawn(supervisor.run()),
    }
}

/// Every exchange reported as succeeded, final reports, finish: the run's result.
async fn finish_two(harness: Harness, w0: &mut FakeWorker, w1: &mut FakeWorker) -> ReplayResult {
    tokio::join!(w0.receive(10), w1.receive(10));
    w0.report_all(false).await;
    w1.report_all(false).await;
    tokio::join!(w0.until_slice_closed(), w1.until_slice_closed());
    w0.report_all(true).await;
    w1.report_all(true).await;
    assert_eq!(w0.next_order().await, Control::Finish);
    assert_eq!(w1.next_order().await, Control::Finish);
    let _keep = harness.interrupt;
    harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes")
}

async fn finish_one(harness: Harness, w0: &mut FakeWorker) -> ReplayResult {
    w0.receive(10).await;
    w0.report_all(false).await;
    w0.until_slice_closed().await;
    w0.report_all(true).await;
    assert_eq!(w0.next_order().await, Control::Finish);
    let _keep = harness.interrupt;
    harness
        .run
        .await
        .expect("no panic")
        .expect("the run completes")
}

const MS: Duration = Duration::from_millis(1);

/// The reproduction: one worker 40 ms up / 5 ms down, the other 5 up / 40 down.
/// Each offset is off by 17.5 ms (half the asymmetry) in opposite directions: the true
/// start skew is 35 ms while the measured one, computed through the same offsets, is 0.
/// The bound (22.5 + 22.5 ms) covers it, and the warning says it is a bound. Before the
/// bound existed the run had no warning at all (the skew was 0 < 5 ms).
#[tokio::test(start_paused = true)]
async fn asymmetric_paths_hide_35_ms_of_start_skew_that_the_bound_covers() {
    let recording = Recording::new("asymmetric-clock", 20);
    let harness = start_scheduled_supervisor(settings(2, false), plan(&recording, 2, 20));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let mut w1 = FakeWorker::join(&harness, 1, 3_000_000_000).await;
    let (s0, s1) = tokio::join!(
        sync_over_path(&mut w0, |_| (5 * MS, 40 * MS)),
        sync_over_path(&mut w1, |_| (40 * MS, 5 * MS)),
    );
    let true_start = |sync: &PathSync, worker: &FakeWorker| {
        sync.start_unix_ns as i128 - worker.offset_ns as i128
    };
    let true_skew_ms = (true_start(&s0, &w0) - true_start(&s1, &w1)).abs() as f64 / 1e6;
    assert!(
        (true_skew_ms - 35.0).abs() < 1e-6,
        "true skew {true_skew_ms} ms"
    );
    // A 45 ms round trip is long: more pings than `clock_samples` (3), at most 4 times as many.
    assert_eq!((s0.pings, s1.pings), (12, 12));
    let result = finish_two(harness, &mut w0, &mut w1).await;
    assert_eq!(
        result.start_skew_ms,
        Some(0.0),
        "blind to the offsets' error"
    );
    for worker in &result.workers {
        assert_eq!(worker.clock.uncertainty_ns, 22_500_000);
    }
    let bound = start_skew_bound_ms(&result.workers).expect("both started");
    assert!((bound - 45.0).abs() < 1e-6, "bound {bound} ms");
    assert!(bound >= true_skew_ms);
    let warning = result
        .warnings
        .iter()
        .find(|w| w.contains("START SKEW BOUND"))
        .unwrap_or_else(|| panic!("no bound warning in {:?}", result.warnings));
    assert!(
        warning.contains("45.00 ms exceeds --max-skew 5.00 ms")
            && warning.contains("not a measured skew")
            && warning.contains("w0 -17.50 ± 22.50 ms")
            && warning.contains("w1 +3017.50 ± 22.50 ms"),
        "{warning}"
    );
}

/// Jitter: the first pings are slow, a short round trip comes later. The extra pings find it:
/// the uncertainty is 1 ms, where `clock_samples` pings alone left 4.5 ms (best of 9, 20, 18).
#[tokio::test(start_paused = true)]
async fn a_jittery_path_gets_extra_clock_samples_until_a_short_round_trip() {
    let recording = Recording::new("jittery-clock", 10);
    let harness = start_scheduled_supervisor(settings(1, false), plan(&recording, 1, 10));
    let mut w0 = FakeWorker::join(&harness, 0, -7_000_000).await;
    // Round trips 9, 20, 18 ms, then 2 ms (1 ms each way) from the fourth ping on.
    let sync = sync_over_path(&mut w0, |seq| match seq {
        0 => (3 * MS, 6 * MS),
        1 => (10 * MS, 10 * MS),
        2 => (9 * MS, 9 * MS),
        _ => (MS, MS),
    })
    .await;
    assert!(
        sync.pings > 3 && sync.pings <= 12,
        "{} pings: more than clock_samples, at most 4 times as many",
        sync.pings
    );
    let result = finish_one(harness, &mut w0).await;
    let clock = result.workers[0].clock;
    assert_eq!(clock.uncertainty_ns, 1_000_000);
    assert_eq!(
        clock.offset_ns, -7_000_000,
        "the symmetric short sample is exact"
    );
    // One worker: nothing to be skewed against.
    assert_eq!(start_skew_bound_ms(&result.workers), Some(0.0));
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
}

/// A short steady path (loopback, a LAN) costs no extra pings.
#[tokio::test(start_paused = true)]
async fn a_short_steady_path_takes_only_clock_samples_pings() {
    let recording = Recording::new("steady-clock", 10);
    let harness = start_scheduled_supervisor(settings(1, false), plan(&recording, 1, 10));
    let mut w0 = FakeWorker::join(&harness, 0, 0).await;
    let sync = sync_over_path(&mut w0, |seq| {
        let wobble = Duration::from_micros(seq % 3 * 20);
        (
            Duration::from_micros(150) + wobble,
            Duration::from_micros(150),
        )
    })
    .await;
    assert_eq!(sync.pings, 3);
    finish_one(harness, &mut w0).await;
}

/// The extra pings stay within the clock sync's time budget: on a 150 ms path with the
/// default 8 samples (1.2 s), extra rounds run only while they end within 2 s; on a 300 ms
/// path the 8 rounds alone take 2.4 s and none is added.
#[tokio::test(start_paused = true)]
async fn extra_clock_samples_stay_within_the_time_budget() {
    for (one_way, expected_pings) in [(75 * MS, 13), (150 * MS, 8)] {
        let recording = Recording::new("budget-clock", 10);
        let mut settings = settings(1, false);
        settings.clock_samples = 8;
        let harness = start_scheduled_supervisor(settings, plan(&recording, 1, 10));
        let began = tokio::time::Instant::now();
        let mut w0 = FakeWorker::join(&harness, 0, 0).await;
        let sync = sync_over_path(&mut w0, |_| (one_way, one_way)).await;
        let took = began.elapsed();
        assert_eq!(sync.pings, expected_pings, "{one_way:?} each way");
        assert!(
            took <= CLOCK_SYNC_BUDGET.max(2 * one_way * 8) + MS,
            "{one_way:?} each way: the sync took {took:?}"
        );
        finish_one(harness, &mut w0).await;
    }
}

fn started(id: &str, start_ms: f64, uncertainty_ms: f64) -> WorkerOutcome {
    WorkerOutcome {
        id: id.into(),
        host: "test".into(),
        assigned: 0,
        totals: SliceTotals::default(),
        metrics: SparseMetrics::default(),
        lost: false,
        quit: None,
        cpu_seconds: 0.0,
        cores: 1,
        peak_rss_bytes: 0,
        clock: ClockEstimate {
            offset_ns: 0,
            uncertainty_ns: (uncertainty_ms * 1e6) as u64,
        },
        started_unix_ns: Some(1_700_000_000_000_000_000 + (start_ms * 1e6) as u64),
    }
}

/// The bound is the largest `ŝᵢ − ŝⱼ + uᵢ + uⱼ` over pairs of different workers, checked
/// against every pair; one worker's is 0; a worker that never started leaves it unknown.
#[test]
fn the_start_skew_bound_is_the_worst_pair_of_start_windows() {
    let workers = vec![
        started("a", 0.0, 2.0),
        started("b", 1.0, 0.1),
        started("c", 0.5, 5.0),
        started("d", 0.2, 0.0),
    ];
    let mut brute = 0.0f64;
    for (i, wi) in workers.iter().enumerate() {
        for (j, wj) in workers.iter().enumerate() {
            if i != j {
                let si = wi.started_unix_ns.expect("started") as f64 / 1e6;
                let sj = wj.started_unix_ns.expect("started") as f64 / 1e6;
                let ui = wi.clock.uncertainty_ns as f64 / 1e6;
                let uj = wj.clock.uncertainty_ns as f64 / 1e6;
                brute = brute.max(si - sj + ui + uj);
            }
        }
    }
    let bound = start_skew_bound_ms(&workers).expect("all started");
    assert!((bound - brute).abs() < 1e-6, "{bound} vs {brute}");
    // c may start as late as 5.5 ms, a as early as -2 ms.
    assert!((bound - 7.5).abs() < 1e-6, "{bound}");
    assert_eq!(start_skew_bound_ms(&workers[..1]), Some(0.0));
    // The same worker is both the latest and the earliest possible: paired with others.
    let wide = [started("x", 0.0, 10.0), started("y", 0.0, 0.0)];
    assert_eq!(start_skew_bound_ms(&wide), Some(10.0));
    let mut unstarted = workers.clone();
    unstarted[2].started_unix_ns = None;
    assert_eq!(start_skew_bound_ms(&unstarted), None);
    assert_eq!(start_skew_bound_ms(&[]), None);
}

/// The start lead: the floor on loopback, twice the longest round trip on top of it on a
/// slower link, never more than the ceiling.
#[test]
fn the_start_lead_grows_with_the_longest_round_trip_up_to_its_ceiling() {
    let mut settings = settings(1, false);
    settings.min_start_lead = Duration::from_millis(250);
    let lead = |rtt_us: u64| start_lead_for(&settings, Duration::from_micros(rtt_us));
    assert_eq!(lead(0), Duration::from_millis(250));
    assert_eq!(lead(100), Duration::from_micros(250_200));
    assert_eq!(lead(50_000), Duration::from_millis(350));
    assert_eq!(lead(125_000), Duration::from_millis(500));
    assert_eq!(lead(300_000), Duration::from_millis(500));
}
