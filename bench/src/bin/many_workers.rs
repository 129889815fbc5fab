//! `many-workers`: N lightweight simulated workers in one process, each speaking the real
//! worker gRPC protocol (`llm_replay.v1`) to a real coordinator started with `llm-replay run
//! --listen ADDR --expect-workers N --token T`: hello, the token challenge, the assignment,
//! the slice stream, clock pongs, `Started`, reports every interval (real HDR histograms
//! and counters, cumulative, encoded as the assignment asks, as
//! `proto::convert::report_to_proto_as` encodes them for a real worker), heartbeats, the
//! final report and the wait for `Finish`.
//!
//! No HTTP request is made: each simulated worker takes the exchanges of its slice at its
//! share of the closed-loop concurrency and "answers" each one after `--latency`, recording
//! plausible TTFT, ITL, latency and token values. It is what the coordinator sees of a worker
//! without the worker's cost, so that the coordinator's own CPU can be measured with 1,000
//! workers on a 2-core machine (`bench/run.py --rows coord-sim`).
//!
//! Prints one JSON line at the end: workers joined, finished, lost (refused or broken),
//! exchanges received, requests answered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use common::metrics::{Metric, RunMetrics, SliceTotals, Window};
use common::timeline::CompletionTimeline;
use common::worker_report::WorkerReport;
use proto::auth::{HelloFields, SessionKeys, WorkerHandshake};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

#[derive(Parser, Debug, Clone)]
#[command(about = "Many simulated llm-replay workers in one process, against a real coordinator")]
struct Args {
    /// The coordinator's worker address (HOST:PORT, as given to `llm-replay run --listen`).
    #[arg(long)]
    coordinator: String,
    /// Simulated workers to run.
    #[arg(long, default_value_t = 200)]
    workers: usize,
    /// The run's token (`--token` of the coordinator).
    #[arg(long, env = "LLM_REPLAY_TOKEN", hide_env_values = true)]
    token: String,
    /// Simulated request latency: TTFT is a tenth of it, the rest is spread over the tokens.
    #[arg(long, default_value = "550ms", value_parser = parse_duration)]
    latency: Duration,
    /// Output tokens per simulated request.
    #[arg(long, default_value_t = 10)]
    tokens: u64,
    /// Interval between reports, unless the coordinator's assignment asks for another (a
    /// real worker reports every 0.5 s, or as the assignment says).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    report_interval: Duration,
    /// Joins spread over this long (a thousand workers do not dial in the same millisecond).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    join_spread: Duration,
    /// Issue without claiming (as a protocol 4 worker did): for an A/B of the claims' cost.
    #[arg(long, env = "LLM_REPLAY_SIM_NO_CLAIMS")]
    no_claims: bool,
    /// Worker ids are PREFIX-0, PREFIX-1, ...
    #[arg(long, default_value = "sim")]
    id_prefix: String,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    common::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// Totals over every simulated worker, for the summary line.
#[derive(Default)]
struct Tally {
    joined: AtomicU64,
    finished: AtomicU64,
    failed: AtomicU64,
    received: AtomicU64,
    answered: AtomicU64,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // One thread: the harness must stay light next to the coordinator it measures.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let tally = Arc::new(Tally::default());
    let mut tasks = tokio::task::JoinSet::new();
    let spread = args.join_spread.as_secs_f64() / args.workers.max(1) as f64;
    for i in 0..args.workers {
        let args = args.clone();
        let tally = tally.clone();
        let delay = Duration::from_secs_f64(spread * i as f64);
        tasks.spawn(async move {
            tokio::time::sleep(delay).await;
            let id = format!("{}-{i}", args.id_prefix);
            match simulate(&args, &id, &tally).await {
                Ok(()) => {
                    tally.finished.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("{id}: {error:#}");
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    println!(
        "{}",
        serde_json::json!({
            "workers": args.workers,
            "joined": tally.joined.load(Ordering::Relaxed),
            "finished": tally.finished.load(Ordering::Relaxed),
            "failed": tally.failed.load(Ordering::Relaxed),
            "exchanges_received": tally.received.load(Ordering::Relaxed),
            "answered": tally.answered.load(Ordering::Relaxed),
        })
    );
    if tally.failed.load(Ordering::Relaxed) > 0 {
        bail!("some simulated workers failed");
    }
    Ok(())
}

fn message(msg: v1::worker_message::Msg) -> v1::WorkerMessage {
    v1::WorkerMessage { msg: Some(msg) }
}

/// The simulated load of one worker: exchanges waiting, requests in flight (their answer
/// instants), and the cumulative metrics its reports carry.
struct Load {
    queued: u64,
    in_flight: VecDeque<(Instant, u64)>,
    concurrency: usize,
    latency: Duration,
    tokens: u64,
    issued: u64,
    not_started: u64,
    metrics: RunMetrics,
    timeline: CompletionTimeline,
    slice_closed: bool,
    /// Stop issuing after this instant (`--duration`).
    deadline: Option<Instant>,
    open_ended: bool,
    started: Option<Instant>,
    jitter: u64,
    /// How the reports encode their histograms (as the assignment asks a real worker).
    encoding: common::metrics::HistogramEncoding,
    /// Protocol 5, as a real worker: an exchange is issued only once granted; claims go
    /// ahead of need (two concurrencies' worth), at most every 100 ms unless blocked.
    granted: u64,
    claimed: u64,
}

impl Load {
    /// What it would claim, as the engine's `claims::Gate` does: `ahead` (the concurrency, at
    /// least 4) beyond what it issued, raised once half of it is used, within what arrived.
    fn want(&self) -> u64 {
        let received = self.issued + self.queued + self.not_started;
        let ahead = (self.concurrency as u64).max(4);
        let target = received.min(self.issued + ahead);
        if target >= self.claimed + (ahead / 2).max(1) || self.blocked() {
            target
        } else {
            self.claimed
        }
    }

    fn blocked(&self) -> bool {
        self.queued > 0 && self.issued >= self.granted
    }

    /// A claim that cannot wait for the next report (the first, or one it waits for).
    fn urgent_claim(&mut self) -> Option<u64> {
        let want = self.want();
        (want > self.claimed && (self.claimed == 0 || self.blocked())).then(|| {
            self.claimed = want;
            want
        })
    }

    /// At a report: the claim that takes the heartbeat's place, if any.
    fn report_claim(&mut self) -> Option<u64> {
        let want = self.want();
        (want > self.claimed).then(|| {
            self.claimed = want;
            want
        })
    }
}

impl Load {
    /// Issue what the free slots can take, at `now`.
    fn issue(&mut self, now: Instant) {
        let Some(started) = self.started else {
            return;
        };
        if now < started {
            return;
        }
        let over = self.deadline.is_some_and(|d| now >= d);
        if over {
            if !self.open_ended {
                // Like the engine: what was received but not sent is not started.
                self.not_started += self.queued;
                self.queued = 0;
            }
            return;
        }
        while self.queued > 0
            && self.in_flight.len() < self.concurrency
            && self.issued < self.granted
        {
            self.queued -= 1;
            self.issued += 1;
            self.in_flight
                .push_back((now + self.latency, unix_ns() / 1000));
        }
    }

    /// Answer the requests due by `now`.
    fn complete(&mut self, now: Instant) -> u64 {
        let mut answered = 0;
        while self.in_flight.front().is_some_and(|(due, _)| *due <= now) {
            let Some((_, sent_us)) = self.in_flight.pop_front() else {
                break;
            };
            // A cheap deterministic spread of values (xorshift), so the histograms are not a
            // single bucket.
            self.jitter ^= self.jitter << 13;
            self.jitter ^= self.jitter >> 7;
            self.jitter ^= self.jitter << 17;
            let spread = 0.9 + (self.jitter % 2000) as f64 / 10_000.0;
            let latency_us = (self.latency.as_secs_f64() * 1e6 * spread) as u64;
            let ttft_us = latency_us / 10;
            let itl_us = (latency_us - ttft_us) / self.tokens.max(2).saturating_sub(1);
            let m = &mut self.metrics;
            m.record_value(Metric::Ttft, ttft_us);
            m.record_value(Metric::Ttst, itl_us);
            m.record_value(Metric::Itl, itl_us);
            m.record_value(Metric::Latency, latency_us);
            // Stored in thousandths of a token per second.
            m.record_value(
                Metric::TokensPerSecondPerUser,
                (1e9 / itl_us.max(1) as f64) as u64,
            );
            m.record_value(Metric::Isl, 100 + self.jitter % 400);
            m.record_value(Metric::Osl, self.tokens);
            m.counters.succeeded += 1;
            m.counters.usage_reported += 1;
            m.counters.output_tokens += self.tokens;
            let end_us = sent_us + latency_us;
            m.window = Some(match m.window {
                None => Window {
                    start_unix_us: sent_us,
                    end_unix_us: end_us,
                },
                Some(w) => Window {
                    start_unix_us: w.start_unix_us.min(sent_us),
                    end_unix_us: w.end_unix_us.max(end_us),
                },
            });
            self.timeline.record(end_us, self.tokens);
            answered += 1;
        }
        answered
    }

    /// A worker's load before the start: one connection per slot, as a real worker opens
    /// them before the start.
    fn new(args: &Args, id: &str, domain: &common::assignment::Assignment) -> Load {
        let concurrency = domain.load.concurrency.unwrap_or(1).max(1);
        let mut metrics = RunMetrics::new();
        for _ in 0..concurrency {
            metrics.record_connection(150, None);
        }
        Load {
            queued: 0,
            in_flight: VecDeque::new(),
            concurrency,
            latency: args.latency,
            tokens: args.tokens,
            issued: 0,
            not_started: 0,
            metrics,
            timeline: CompletionTimeline::default(),
            slice_closed: false,
            deadline: None,
            open_ended: domain.open_ended,
            encoding: domain.histograms,
            started: None,
            jitter: 0x9e37_79b9_7f4a_7c15 ^ (id.len() as u64) ^ unix_ns(),
            granted: if args.no_claims { u64::MAX } else { 0 },
            claimed: if args.no_claims { u64::MAX } else { 0 },
        }
    }

    fn done(&self, now: Instant) -> bool {
        if !self.in_flight.is_empty() || self.started.is_none() {
            return false;
        }
        let over = self.deadline.is_some_and(|d| now >= d);
        (over && self.open_ended) || (self.slice_closed && (self.queued == 0 || over))
    }

    fn report(&self, seq: u64, is_final: bool) -> v1::Report {
        proto::convert::report_to_proto_as(
            &WorkerReport {
                seq,
                is_final,
                metrics: self.metrics.clone(),
                totals: SliceTotals {
                    issued: self.issued,
                    not_started: self.not_started,
                    lost: 0,
                    sent_out_of_order: 0,
                },
                status_codes: Default::default(),
                tls_problems: Default::default(),
                cpu_seconds: 0.0,
                peak_rss_bytes: 0,
                cores: 1,
                timeline: self.timeline.clone(),
                steady: None,
                hand_over: None,
            },
            self.encoding,
        )
    }
}

/// One simulated worker's run: join, take the slice, answer it at its share of the load,
/// send the final report and wait for `Finish`, as a real worker does.
async fn simulate(args: &Args, id: &str, tally: &Tally) -> anyhow::Result<()> {
    let channel = connect(&args.coordinator).await?;
    let (mut link, assignment) = join(args, id, channel.clone()).await?;
    tally.joined.fetch_add(1, Ordering::Relaxed);
    let domain = proto::convert::assignment_from_proto(&assignment)?;
    let slice = open_slice(channel, &link, &assignment, id).await?;
    let mut load = Load::new(args, id, &domain);
    let seq = replay_slice(args, tally, &mut link, slice, &mut load, &domain).await?;
    link.out
        .send(message(v1::worker_message::Msg::Report(
            load.report(seq + 1, true),
        )))
        .await?;
    // Wait for Finish (or the end of the stream), as a real worker does.
    let wait = async {
        while let Ok(Some(msg)) = link.inbound.message().await {
            let Ok(msg) = proto::auth::open_coordinator_message(link.opener.as_mut(), msg) else {
                return;
            };
            if matches!(msg.msg, Some(v1::coordinator_message::Msg::Finish(_))) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(60), wait).await;
    Ok(())
}

/// A channel to the coordinator; like a real worker, it keeps dialling while the coordinator
/// is not listening yet (up to a minute).
async fn connect(coordinator: &str) -> anyhow::Result<tonic::transport::Channel> {
    let url = if coordinator.contains("://") {
        coordinator.to_owned()
    } else {
        format!("http://{coordinator}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url)?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
    let patience = Instant::now() + Duration::from_secs(60);
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(channel),
            Err(error) if Instant::now() > patience => {
                return Err(anyhow::Error::new(error).context("connect"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A joined worker's side of the join stream.
struct Link {
    /// Messages to the coordinator (sealed on the way once the handshake set the keys).
    out: mpsc::Sender<v1::WorkerMessage>,
    inbound: tonic::Streaming<v1::CoordinatorMessage>,
    opener: Option<proto::auth::Opener>,
    keys: Arc<OnceLock<Arc<SessionKeys>>>,
}

/// Hello, the token challenge, and the assignment.
async fn join(
    args: &Args,
    id: &str,
    channel: tonic::transport::Channel,
) -> anyhow::Result<(Link, v1::Assignment)> {
    let (out, out_rx) = mpsc::channel::<v1::WorkerMessage>(64);
    // Like a real worker: sealed with the session's keys once the handshake set them.
    let keys: Arc<OnceLock<Arc<SessionKeys>>> = Arc::new(OnceLock::new());
    let outbound = {
        let keys = Arc::clone(&keys);
        let mut sealer = None;
        ReceiverStream::new(out_rx).map(move |m| {
            if sealer.is_none() {
                sealer = keys.get().map(|k: &Arc<SessionKeys>| k.worker_sealer());
            }
            proto::auth::seal_worker_message(sealer.as_mut(), m)
        })
    };
    let handshake = WorkerHandshake::start(&args.token);
    let hello = v1::Hello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: id.to_owned(),
        host: "many-workers".into(),
        capacity: 0,
        token: String::new(),
        nonce: Vec::new(),
        pake: handshake.pake_message().to_vec(),
    };
    let mut handshake = Some(handshake);
    out.send(message(v1::worker_message::Msg::Hello(hello.clone())))
        .await?;
    let inbound = CoordinatorClient::new(channel)
        .join(outbound)
        .await
        .context("join")?
        .into_inner();
    let mut link = Link {
        out,
        inbound,
        opener: None,
        keys,
    };
    loop {
        let Some(received) = link.inbound.message().await? else {
            bail!("the coordinator closed the join stream");
        };
        let Some(msg) = proto::auth::open_coordinator_message(link.opener.as_mut(), received)?.msg
        else {
            continue;
        };
        use v1::coordinator_message::Msg;
        match msg {
            Msg::Challenge(challenge) => {
                let Some(started) = handshake.take() else {
                    bail!("a second challenge");
                };
                let (session, proof) = started
                    .finish(&HelloFields::of(&hello), &challenge)
                    .context("the coordinator does not know the token")?;
                let session = Arc::new(session);
                link.opener = Some(session.coordinator_opener());
                let _ = link.keys.set(session);
                link.out
                    .send(message(v1::worker_message::Msg::Answer(
                        v1::ChallengeAnswer { proof },
                    )))
                    .await?;
            }
            Msg::Assignment(assignment) => return Ok((link, assignment)),
            Msg::Refused(refused) => bail!("refused: {}", refused.reason),
            _ => {}
        }
    }
}

/// The worker's slice stream, and the opener of its sealed chunks.
struct Slice {
    chunks: tonic::Streaming<v1::ExchangeChunk>,
    opener: Option<proto::auth::Opener>,
}

async fn open_slice(
    channel: tonic::transport::Channel,
    link: &Link,
    assignment: &v1::Assignment,
    id: &str,
) -> anyhow::Result<Slice> {
    let chunks = CoordinatorClient::new(channel)
        .exchanges(v1::SliceRequest {
            run_id: assignment.run_id.clone(),
            worker_id: id.to_owned(),
            token: match link.keys.get() {
                Some(keys) => keys.slice_request_proof(&assignment.run_id, id),
                None => assignment.slice_key.clone(),
            },
        })
        .await
        .context("slice stream")?
        .into_inner();
    let opener = link.keys.get().map(|k| k.slice_opener(&assignment.run_id));
    Ok(Slice { chunks, opener })
}

/// Answer the slice until the load is done: reports and claims every tick, chunks as they
/// come, the coordinator's messages as they come. Returns the last report's sequence number.
async fn replay_slice(
    args: &Args,
    tally: &Tally,
    link: &mut Link,
    mut slice: Slice,
    load: &mut Load,
    domain: &common::assignment::Assignment,
) -> anyhow::Result<u64> {
    let mut seq = 0u64;
    // The coordinator may ask for a longer interval, as it asks a real worker.
    let mut ticker = tokio::time::interval(domain.report_interval.unwrap_or(args.report_interval));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut started_sent = false;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    loop {
        let now = Instant::now();
        let answered = load.complete(now);
        tally.answered.fetch_add(answered, Ordering::Relaxed);
        load.issue(now);
        if load.done(now) {
            return Ok(seq);
        }
        if let Some(own_prefix) = load.urgent_claim() {
            link.out
                .send(message(v1::worker_message::Msg::Claim(v1::Claim {
                    own_prefix,
                })))
                .await?;
        }
        let next_due = load.in_flight.front().map(|(due, _)| *due);
        let start_due = load.started.filter(|s| *s > now);
        let deadline_due = load.deadline.filter(|d| *d > now);
        let wake = [next_due, start_due, deadline_due]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(far);
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = ticker.tick(), if load.started.is_some() => {
                if !started_sent && load.started.is_some_and(|s| s <= now) {
                    started_sent = true;
                    let _ = link.out.try_send(message(v1::worker_message::Msg::Started(v1::Started {
                        unix_ns: unix_ns(),
                    })));
                }
                seq += 1;
                report_tick(&link.out, load, seq).await?;
            }
            chunk = slice.chunks.message(), if !load.slice_closed => match chunk {
                Ok(Some(chunk)) => {
                    let chunk = proto::auth::open_chunk(slice.opener.as_mut(), chunk)?;
                    let n = chunk.exchanges.len() as u64;
                    tally.received.fetch_add(n, Ordering::Relaxed);
                    load.queued += n;
                    load.slice_closed = chunk.last;
                }
                Ok(None) => load.slice_closed = true,
                Err(status) => bail!("slice stream broke: {}", status.message()),
            },
            msg = link.inbound.message() => {
                let Some(msg) = msg? else {
                    bail!("the coordinator closed the join stream");
                };
                let msg = proto::auth::open_coordinator_message(link.opener.as_mut(), msg)?;
                if let Some(msg) = msg.msg {
                    on_coordinator_message(msg, &link.out, load, &mut ticker, domain.load.duration)?;
                }
            }
        }
    }
}

/// A tick's report, and a claim in the heartbeat's place when one is due (as a real worker).
async fn report_tick(
    out: &mpsc::Sender<v1::WorkerMessage>,
    load: &mut Load,
    seq: u64,
) -> anyhow::Result<()> {
    out.send(message(v1::worker_message::Msg::Report(
        load.report(seq, false),
    )))
    .await?;
    match load.report_claim() {
        Some(own_prefix) => {
            out.send(message(v1::worker_message::Msg::Claim(v1::Claim {
                own_prefix,
            })))
            .await?;
        }
        None => {
            let _ = out.try_send(message(v1::worker_message::Msg::Heartbeat(v1::Heartbeat {
                unix_ns: unix_ns(),
            })));
        }
    }
    Ok(())
}

/// A coordinator message during the load: clock pings, the start, grants, an abort.
fn on_coordinator_message(
    msg: v1::coordinator_message::Msg,
    out: &mpsc::Sender<v1::WorkerMessage>,
    load: &mut Load,
    ticker: &mut tokio::time::Interval,
    duration: Option<Duration>,
) -> anyhow::Result<()> {
    use v1::coordinator_message::Msg;
    match msg {
        Msg::ClockPing(ping) => {
            let t2 = unix_ns();
            let _ = out.try_send(message(v1::worker_message::Msg::ClockPong(v1::ClockPong {
                seq: ping.seq,
                coordinator_send_unix_ns: ping.coordinator_send_unix_ns,
                worker_receive_unix_ns: t2,
                worker_send_unix_ns: unix_ns(),
            })));
        }
        Msg::Start(start) => {
            let wait = Duration::from_nanos(start.start_unix_ns.saturating_sub(unix_ns()));
            let at = Instant::now() + wait;
            load.started = Some(at);
            load.deadline = duration.map(|d| at + d);
            ticker.reset();
        }
        Msg::Grant(grant) => load.granted = load.granted.max(grant.own_prefix),
        Msg::Abort(abort) => bail!("aborted: {}", abort.reason),
        Msg::Finish(_) => bail!("Finish before the final report"),
        _ => {}
    }
    Ok(())
}
