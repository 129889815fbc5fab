//! `llm-replay run` as a library: a recording and options in, a report and its verdict out.
//!
//! [`RunPlan::prepare`] scans the recording (every line checked before any load), turns the
//! options into a `RunConfig`, reads the goals and a saved baseline, and collects the
//! warnings the input earns. [`RunPlan::execute`] opens `--requests-out`, starts the embedded
//! mock when there is no target, replays every level the options ask for (one replay, or
//! each level of a sweep), builds the report, compares it with the baseline, applies the
//! faithful-replay checks, evaluates the goals and decides the verdict. The CLI checks the
//! output paths between the two steps and keeps the terminal: the progress line, the live
//! endpoint, printing and exit codes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use common::load::Schedule;
use common::measure::TlsProblem;
use common::metrics::Metric;
use tokio::sync::watch;

use crate::capacity::budget::{Need, ProbeBudget, ProbeSize, Sizer, need_of};
use crate::capacity::progress::SearchProgress;
use crate::capacity::{Dimension, FindMax, RunResult, Search, Step};
use crate::config::{BaselineSource, GlobalLoad, RunConfig, WorkerSource};
use crate::goals::{Goal, parse_goals};
use crate::outcome::{ReplayResult, RunError};
use crate::pool::{PoolSetup, WorkerPool};
use crate::replay::{ReplaySetup, replay};
use crate::report::{
    Baseline, CapacitySection, FewRequests, GoodputSection, ProbeSection, Report, ReportInput,
    RequestTotals, RequestsSection, RunInfo, SweepLevel, TimelinePoint, WorkerInfo,
    compare_reports, rfc3339_utc,
};
use crate::requests_out::RequestsOut;
use crate::scan::RecordingScan;
use crate::server_metrics::{ScrapeClientOptions, ScrapeEndpoint, ScrapeLog, Scraper};
use crate::supervisor::RunSnapshot;

/// A run whose input has been read and checked, ready to send load.
pub struct RunPlan {
    config: RunConfig,
    scanned: RecordingScan,
    /// Exchanges and sessions of the whole recording when `--sample-sessions` kept a part.
    unsampled: Option<(u64, u64)>,
    goals: Vec<Goal>,
    /// `--baseline REPORT.json`: its path and the report read from it.
    saved_baseline: Option<(PathBuf, Report)>,
    /// What the input earned before any load (insecure transport, torn lines, ...).
    warnings: Vec<String>,
}

/// What the CLI hands a run: the signals and the live views it owns.
pub struct RunHooks<'a> {
    /// Turns true on SIGINT or SIGTERM: stop the load, collect what the workers have.
    pub interrupt: watch::Receiver<bool>,
    /// Live state for the progress line and the Prometheus endpoint; `None` when nobody
    /// watches. One channel for every level of a sweep.
    pub snapshots: Option<watch::Sender<RunSnapshot>>,
    /// Told how many remote workers the run waits for and where it listens.
    pub waiting_for_workers: &'a (dyn Fn(usize, SocketAddr) + Send + Sync),
    /// Starts the local workers: `crate::launch::ProcessLauncher` (the `llm-replay`
    /// binary's `worker` command) or `worker::InProcess` (no process).
    pub launcher: Arc<dyn common::launch::WorkerLauncher>,
    /// The worker link's listener, the caller's; `None`: the run binds one (loopback for
    /// local workers, the `--listen` address for remote ones).
    pub listener: Option<tokio::net::TcpListener>,
    /// Where one line per request goes (`--requests-out`), opened by the caller; `None`:
    /// nowhere.
    pub requests_out: Option<RequestsOut>,
    /// Told what happens as it happens: join progress (and the level it is for), a worker
    /// lost or quitting. `None`: nobody is told (the report says it all the same).
    pub notices: Option<crate::supervisor::NoticeSink>,
    /// Told one line per `--find-max` probe as it is decided (probe number, load, result,
    /// the bracket so far, the search's time). `None`: nobody is told.
    pub search_lines: Option<SearchLineSink>,
    /// Told as each `--find-max` probe starts: its number and load, the verdicts so far
    /// and the bracket (the terminal's live line). `None`: nobody is told.
    pub search_progress: Option<SearchProgressSink>,
}

impl RunHooks<'static> {
    /// Hooks nobody watches: never interrupted, no live views, no listener of the caller's
    /// (the run binds its own), nobody told of notices or probes; local workers started by
    /// `launcher`. Set the fields a caller owns on the value returned.
    pub fn new(launcher: Arc<dyn common::launch::WorkerLauncher>) -> RunHooks<'static> {
        RunHooks {
            // A closed channel never turns true: the run is never interrupted.
            interrupt: watch::channel(false).1,
            snapshots: None,
            waiting_for_workers: &nobody_waits,
            launcher,
            listener: None,
            requests_out: None,
            notices: None,
            search_lines: None,
            search_progress: None,
        }
    }
}

/// Nobody is told where remote workers are awaited.
fn nobody_waits(_workers: usize, _listen: SocketAddr) {}

/// Where a search's per-probe lines go.
pub type SearchLineSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Where a search's progress goes as each probe starts.
pub type SearchProgressSink = Arc<dyn Fn(&SearchProgress) + Send + Sync>;

/// A finished run: its report, and what it means for the exit code.
#[derive(Debug)]
pub struct RunOutcome {
    pub report: Report,
    /// `--requests-out` could not be written in full (said in the report's warnings too).
    pub requests_out_failed: Option<String>,
    pub verdict: Verdict,
}

/// What a finished run means, most serious first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A goal names a server metric that the reachable endpoints never exposed: a usage
    /// error found once the run had scraped them (exit code 2; `RunError::Input` at `goal`).
    BadGoal(RunError),
    /// The run did not do what it was for (interrupted, a worker lost with `fail`, a sweep
    /// level that could not run, no response or no success): exit code 3, with why.
    RunFailed(RunError),
    /// A `--fail-if` goal failed: exit code 1.
    GoalFailed,
    /// Every goal held: exit code 0.
    Passed,
}

/// A recording read and checked, every line, before any option is decided (the default
/// schedule depends on whether it has arrival times): the first step of a run.
pub struct ScannedRecording {
    path: PathBuf,
    scan: RecordingScan,
}

impl ScannedRecording {
    /// Read `path` whole: a bad line is `RunError::Input` at its file and line, an empty
    /// recording too.
    pub async fn read(path: &std::path::Path) -> Result<ScannedRecording, RunError> {
        let scan = scan_blocking(path.to_owned(), None).await?;
        if scan.exchanges == 0 {
            return Err(RunError::file(
                path,
                format!("{}: the recording has no exchanges", path.display()),
            ));
        }
        Ok(ScannedRecording {
            path: path.to_owned(),
            scan,
        })
    }

    /// Whether its exchanges carry arrival offsets (`at_ms`): the recorded schedule is then
    /// the CLI's default.
    pub fn has_arrival_times(&self) -> bool {
        self.scan.with_arrival > 0
    }
}

impl RunPlan {
    /// Read the recording and check everything a run needs before any load is sent. An
    /// input problem is `RunError::Input` (exit code 2), naming the option or file:line.
    pub async fn prepare(config: RunConfig) -> Result<RunPlan, RunError> {
        config.validate()?;
        let recording = ScannedRecording::read(&config.recording).await?;
        RunPlan::prepare_scanned(recording, config).await
    }

    /// [`RunPlan::prepare`] with the recording read already (the CLI reads it first: the
    /// options' defaults depend on it).
    pub async fn prepare_scanned(
        recording: ScannedRecording,
        mut config: RunConfig,
    ) -> Result<RunPlan, RunError> {
        config.validate()?;
        let ScannedRecording {
            path: recording,
            scan: scanned,
        } = recording;
        // A sampled run counts, measures and paces only the sessions it keeps; with a
        // tokenizer the baseline counts recorded outputs without usage with it (a second scan:
        // the tokenizer is known once the options are).
        let tokenizer = config.tokenizer.as_ref().map(|t| t.tokenizer.clone());
        let (scanned, unsampled) = match config.faithful.sample {
            None if tokenizer.is_some() => (
                scan_blocking_with(recording.clone(), None, tokenizer.clone()).await?,
                None,
            ),
            None => (scanned, None),
            Some(sample) => {
                let sampled =
                    scan_blocking_with(recording.clone(), Some(sample), tokenizer.clone()).await?;
                if sampled.exchanges == 0 {
                    return Err(RunError::option(
                        "--sample-sessions",
                        format!(
                            "--sample-sessions {} --seed {}: keeps none of the {} exchanges of {}; raise the fraction or try another seed",
                            sample.fraction,
                            sample.seed,
                            scanned.exchanges,
                            recording.display()
                        ),
                    ));
                }
                let unsampled = (scanned.exchanges, scanned.sessions);
                (sampled, Some(unsampled))
            }
        };
        // Recorded cancellations are looked for only in a recording that may hold some: the
        // feeders then decode each line whole for its cancel point.
        config.recorded_cancels = {
            let path = recording.clone();
            tokio::task::spawn_blocking(move || crate::shard::may_hold_cancellations(&path))
                .await
                .unwrap_or(true)
        };
        let goals = parse_goals(&config.goals)
            .map_err(|error| RunError::option("goal", error.to_string()))?;
        if config.slos.is_empty()
            && let Some(goal) = goals.iter().find(|goal| goal.needs_slos())
        {
            return Err(RunError::option(
                "--slo",
                format!(
                    "goal {:?}: goodput counts the requests that meet every --slo; give at least one, e.g. --slo ttft:500ms",
                    goal.expr
                ),
            ));
        }
        let saved_baseline = match &config.baseline {
            BaselineSource::Report(path) => Some((path.clone(), read_saved_report(path)?)),
            _ => None,
        };
        let mut warnings = input_warnings(&config, &scanned);
        // Never more local workers than the run has exchanges to give.
        if let Some(asked) = config.fit_workers_to(scanned.exchanges) {
            warnings.push(format!(
                "--workers {asked}: the run has {} exchanges to give, so {} workers start",
                config.load.requests.unwrap_or(scanned.exchanges),
                config.workers
            ));
        }
        Ok(RunPlan {
            config,
            scanned,
            unsampled,
            goals,
            saved_baseline,
            warnings,
        })
    }

    /// The run's validated options.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// Send the load, level by level, and turn what was measured into a report and a
    /// verdict. `Err` only when nothing was measured: bad input found late
    /// (`RunError::Input`) or a first replay that could not run (another variant).
    pub async fn execute(self, mut hooks: RunHooks<'_>) -> Result<RunOutcome, RunError> {
        let RunPlan {
            config,
            scanned,
            unsampled,
            goals,
            saved_baseline,
            mut warnings,
        } = self;
        let requests_out = hooks.requests_out.take().map(Arc::new);
        // With no target, an embedded mock serves the recorded streams at their recorded
        // timing.
        let (target, embedded) = match &config.target {
            Some(target) => (target.clone(), None),
            None => {
                let mock = crate::embedded::start_embedded(&config.recording)
                    .map_err(|error| RunError::failed(format!("embedded mock: {error:#}")))?;
                (mock.url.clone(), Some(mock))
            }
        };
        // The server's own metrics, scraped beside the load by a task of their own.
        let scraper = start_scraper(&config);
        let levels = Levels::of(&config);
        // The run's workers: joined once, they take every level and probe.
        let pool = match WorkerPool::open(PoolSetup {
            config: &config,
            waiting_for_workers: hooks.waiting_for_workers,
            launcher: hooks.launcher.as_ref(),
            listener: hooks.listener.take(),
        })
        .await
        {
            Ok(pool) => pool,
            Err(error) => {
                if let Some(mock) = embedded {
                    mock.stop().await;
                }
                return Err(error);
            }
        };
        let inputs = LevelInputs {
            pool: &pool,
            target: &target,
            tag_requests: embedded.is_some() || config.tag_requests,
            exchanges: scanned.exchanges,
            pass_span_ms: pass_span_ms(&scanned),
            requests_out: requests_out.clone(),
            hooks: &hooks,
        };
        let replayed = match &levels {
            Levels::Search(find_max) => {
                let judge = ProbeJudge {
                    config: &config,
                    scanned: &scanned,
                    saved_baseline: saved_baseline.as_ref(),
                    goals: &goals,
                    scraper: scraper.as_ref(),
                };
                search(*find_max, &config, inputs, &judge).await
            }
            _ => levels.replay_all(&config, inputs).await,
        };
        // Every level is done: the workers hear that the run is over.
        pool.close().await;
        // The progress line is complete before the report is built: nothing more is sent.
        drop(hooks);
        // The last scrape comes after the load, before the embedded mock stops.
        let scraped = match scraper {
            Some(scraper) => Some(scraper.finish().await),
            None => None,
        };
        if let Some(mock) = embedded {
            mock.stop().await;
        }
        let Replayed {
            levels: results,
            failed: level_failed,
            mut capacity,
            main: main_index,
        } = replayed?;
        warnings.extend(level_warnings(
            &config,
            &results,
            capacity.as_ref(),
            level_failed.as_ref(),
        ));
        let requests_out_failed = finish_requests_out(requests_out.as_deref(), &mut warnings);
        let mut report = ReportParts {
            config: &config,
            scanned: &scanned,
            levels: &results,
            main: main_index,
            warnings,
            saved_baseline: saved_baseline.as_ref(),
        }
        .build();
        let (_, main) = &results[main_index];
        crate::faithful::apply_to_report(
            &mut report,
            crate::faithful::FaithfulInput {
                options: &config.faithful,
                recorded_speed: match (&capacity, config.load.schedule) {
                    (Some(capacity), _) if capacity.dimension == Dimension::Speed => capacity.max,
                    (Some(_), _) => None,
                    (None, Schedule::Recorded { speed }) if config.sweep.is_empty() => Some(speed),
                    (None, _) => None,
                },
                scan: &scanned,
                unsampled,
                steady: main.steady,
            },
        );
        crate::report::warn_cached_when_cold(
            &mut report,
            crate::report::cold_cache_request(&config.sets).as_deref(),
        );
        if let Some(log) = &scraped {
            attach_server_sections(log, &results, main_index, &mut report, capacity.as_mut());
        }
        let mut report = report.with_goals(&goals);
        let unknown = crate::goals::unknown_server_metrics(&goals, report.server.as_ref());
        let verdict = match &capacity {
            _ if !unknown.is_empty() => unknown_goals_verdict(&unknown),
            Some(capacity) => search_verdict(capacity, &target, &results, level_failed.as_ref()),
            None => verdict(&report, &target, main, level_failed.as_ref()),
        };
        attach_capacity(&mut report, capacity);
        Ok(RunOutcome {
            report,
            requests_out_failed,
            verdict,
        })
    }
}

/// Close `--requests-out`. A failure writing it is a failed run like a report that cannot be
/// written: said in the report (a warning), and by the CLI after the other outputs (the
/// message returned).
fn finish_requests_out(out: Option<&RequestsOut>, warnings: &mut Vec<String>) -> Option<String> {
    let out = out?;
    let error = out.finish().err()?;
    let message = format!(
        "--requests-out {}: cannot write: {error}",
        out.path().display()
    );
    warnings.push(message.clone());
    Some(message)
}

/// Goals on server families the reachable endpoints never exposed: a usage error.
fn unknown_goals_verdict(unknown: &[String]) -> Verdict {
    Verdict::BadGoal(RunError::option(
        "goal",
        format!(
            "{}: the server's metrics endpoints answered but never exposed {}; the report's server section lists what they expose",
            unknown.join(", "),
            if unknown.len() == 1 { "it" } else { "them" }
        ),
    ))
}

/// The levels a run replays: one, each concurrency of `--sweep-concurrency` in turn, or the
/// probes of a `--find-max` search.
enum Levels {
    Single,
    Sweep(Vec<usize>),
    Search(FindMax),
}

/// What every level of a run shares.
struct LevelInputs<'a> {
    pool: &'a WorkerPool,
    target: &'a str,
    tag_requests: bool,
    exchanges: u64,
    pass_span_ms: f64,
    requests_out: Option<Arc<RequestsOut>>,
    hooks: &'a RunHooks<'a>,
}

/// The levels measured, in order (at least one), and the one that could not run, if any.
struct Replayed {
    levels: Vec<(Option<usize>, ReplayResult)>,
    failed: Option<LevelFailed>,
    /// `--find-max`: the probes (one per level, in order) and the answer.
    capacity: Option<CapacitySection>,
    /// The level the report's main sections show: the last one, or the search's answer.
    main: usize,
}

/// A sweep level that could not run after earlier levels were measured.
struct LevelFailed {
    level: Option<usize>,
    error: RunError,
}

impl Levels {
    fn of(config: &RunConfig) -> Levels {
        if let Some(find_max) = config.find_max {
            Levels::Search(find_max.fitted_to(config.workers))
        } else if config.sweep.is_empty() {
            Levels::Single
        } else {
            Levels::Sweep(config.sweep.clone())
        }
    }

    /// Each level's concurrency (`None`: the run's own load); a search decides its own.
    fn concurrencies(&self) -> Vec<Option<usize>> {
        match self {
            Levels::Single | Levels::Search(_) => vec![None],
            Levels::Sweep(levels) => levels.iter().copied().map(Some).collect(),
        }
    }

    /// Replay every level in turn, stopping after an aborted one. A later level that cannot
    /// run keeps the levels measured before it.
    async fn replay_all(
        &self,
        config: &RunConfig,
        inputs: LevelInputs<'_>,
    ) -> Result<Replayed, RunError> {
        let mut results = Vec::new();
        let levels = self.concurrencies();
        let count = levels.len();
        for (at, level) in levels.into_iter().enumerate() {
            let (level_config, load) = level_config(config, level);
            let setup = ReplaySetup {
                config: &level_config,
                load,
                target: inputs.target.to_owned(),
                tag_requests: inputs.tag_requests,
                exchanges: inputs.exchanges,
                pass_span_ms: inputs.pass_span_ms,
                requests_out: inputs.requests_out.clone(),
                interrupt: inputs.hooks.interrupt.clone(),
                progress: inputs.hooks.snapshots.clone(),
                pool: inputs.pool,
                level: match level {
                    Some(c) if count > 1 => {
                        format!("sweep level {} of {count}: concurrency {c}", at + 1)
                    }
                    _ => String::new(),
                },
                notices: inputs.hooks.notices.clone(),
            };
            match replay(setup).await {
                Ok(result) => {
                    let aborted = result.aborted;
                    results.push((level, result));
                    if aborted {
                        break;
                    }
                }
                Err(error) if !results.is_empty() => {
                    return Ok(Replayed {
                        main: results.len() - 1,
                        levels: results,
                        failed: Some(LevelFailed { level, error }),
                        capacity: None,
                    });
                }
                Err(error) => return Err(error),
            }
        }
        Ok(Replayed {
            main: results.len() - 1,
            levels: results,
            failed: None,
            capacity: None,
        })
    }
}

/// Run a `--find-max` search: probe after probe, each a full replay at one load with the
/// run's budget, judged on its goals, until the search stops or a probe cannot complete.
async fn search(
    find_max: FindMax,
    config: &RunConfig,
    inputs: LevelInputs<'_>,
    judge: &ProbeJudge<'_>,
) -> Result<Replayed, RunError> {
    let mut search = Search::new(find_max);
    let mut results: Vec<(Option<usize>, ReplayResult)> = Vec::new();
    let mut probes: Vec<ProbeSection> = Vec::new();
    let mut failed = None;
    let mut cut_short: Option<String> = None;
    let began = std::time::Instant::now();
    let mut sizer = Sizer::new(
        probe_budget(config, inputs.exchanges),
        need_of(judge.goals),
        find_max.dimension,
        recording_rate(inputs.exchanges, inputs.pass_span_ms),
    );
    // A probe that came up short of the requests its goal needs runs once more, longer.
    let mut rerun: Option<(ProbeSize, String)> = None;
    if let Some(sink) = &inputs.hooks.search_lines {
        sink(&search_estimate(find_max, config, inputs.pass_span_ms));
    }
    while let Step::Probe(value) = search.next() {
        let index = results.len() + 1;
        let (size, short_before) = match rerun.take() {
            Some((size, why)) => (size, Some(why)),
            None => (sizer.size(value), None),
        };
        let (probe_config, load) = probe_config(config, find_max.dimension, value);
        let load = sized_load(load, size);
        if let Some(out) = &inputs.requests_out {
            out.set_probe(Some((index, value)));
        }
        tell_progress(&inputs, find_max, index, value, &probes, &search);
        let level = (find_max.dimension == Dimension::Concurrency).then_some(value as usize);
        let result = match replay(probe_setup(
            &inputs,
            &probe_config,
            &load,
            index,
            find_max,
            value,
        ))
        .await
        {
            Ok(result) => result,
            Err(error) if !results.is_empty() => {
                failed = Some(LevelFailed { level, error });
                break;
            }
            Err(error) => return Err(error),
        };
        let mut probe = judge.judge(value, search.attempt(), &result).await;
        probe.repeat = short_before.or_else(|| search.repeat().map(|why| why.text().to_owned()));
        let capped = capped_note(&load, &result);
        probe.client_stall = capped.is_none() && client_stalled(&result);
        probe.notes.extend(capped);
        if let Some(reason) = incomplete(&result, &probes) {
            let shown = find_max.dimension.show(value);
            cut_short = Some(format!("{reason} during the probe at {shown}"));
            // Neither passed nor failed: it decides nothing.
            probe.incomplete = Some(reason.to_owned());
            probe.passed = false;
            results.push((level, result));
            probes.push(probe);
            break;
        }
        let judged = probe.few_requests.as_ref().map(|few| few.judged);
        sizer.measured(
            value,
            judged_requests(&probe, sizer.need()),
            result.duration,
        );
        results.push((level, result));
        rerun = decide_or_rerun(&mut search, &sizer, judged, &mut probe);
        if let Some(sink) = &inputs.hooks.search_lines {
            let repeat = rerun
                .as_ref()
                .map(|(_, why)| why.clone())
                .or_else(|| search.repeat().map(|why| why.text().to_owned()));
            sink(&probe_line(
                find_max,
                index,
                &probe,
                &search.answer(),
                repeat.as_deref(),
                began.elapsed(),
            ));
        }
        probes.push(probe);
    }
    if let Some(out) = &inputs.requests_out {
        out.set_probe(None);
    }
    let mut answer = search.answer();
    if let Some(why) = cut_short.or_else(|| {
        failed
            .as_ref()
            .map(|f: &LevelFailed| format!("a probe could not run: {}", f.error))
    }) {
        answer.stopped = why;
    }
    if let Some(suggestion) = batching_suggestion(find_max, &answer, &probes) {
        answer.stopped = format!("{}; {suggestion}", answer.stopped);
    }
    let main = match answer.max {
        Some(max) => probes.iter().rposition(|p| p.value == max && p.passed),
        None => None,
    }
    .unwrap_or(results.len() - 1);
    Ok(Replayed {
        levels: results,
        failed,
        main,
        capacity: Some(CapacitySection {
            dimension: find_max.dimension,
            max: answer.max,
            min_failing: answer.min_failing,
            precision_pct: find_max.precision_pct,
            low: find_max.low,
            high: find_max.high,
            stopped: answer.stopped,
            probes,
            start: Some(find_max.start),
            duration_s: Some(began.elapsed().as_secs_f64()),
            sample_interval_s: judge
                .scraper
                .map(|_| config.server_metrics.interval.as_secs_f64()),
            limit_tier: None,
        }),
    })
}

/// The capacity section into the report: the tier that set the limit named, and the
/// header's time made the whole search's, not its answer probe's.
fn attach_capacity(report: &mut Report, capacity: Option<CapacitySection>) {
    let Some(mut capacity) = capacity else {
        return;
    };
    crate::capacity::tiers::name_limit_tier(&mut capacity);
    if let Some(total) = capacity.duration_s {
        report.run.duration_s = total;
    }
    report.capacity = Some(capacity);
}

/// Tell the live line where the search stands as probe `index` at `value` starts.
fn tell_progress(
    inputs: &LevelInputs<'_>,
    find_max: FindMax,
    index: usize,
    value: f64,
    probes: &[ProbeSection],
    search: &Search,
) {
    if let Some(tell) = &inputs.hooks.search_progress {
        let decided: Vec<(f64, Option<bool>)> =
            probes.iter().map(|p| (p.value, p.decided)).collect();
        tell(&SearchProgress::of(
            find_max,
            index,
            value,
            &decided,
            &search.answer(),
        ));
    }
}

/// Feed a probe's run to the search — unless it judged too few requests (`judged`) for its
/// goal's percentile and its budget can grow: then it decides nothing, and the size of the
/// run that follows at the same load is returned with why it runs.
fn decide_or_rerun(
    search: &mut Search,
    sizer: &Sizer,
    judged: Option<u64>,
    probe: &mut ProbeSection,
) -> Option<(ProbeSize, String)> {
    if let Some(judged) = judged
        && probe.repeat.as_deref() != Some(RERUN_SHORT)
        && let Some(size) =
            sizer.rerun(judged, std::time::Duration::from_secs_f64(probe.duration_s))
    {
        probe.notes.push(short_run_note(size));
        return Some((size, RERUN_SHORT.to_owned()));
    }
    let recorded = search.record(RunResult {
        passed: probe.passed,
        near_limit: crate::capacity::near_limit(&probe.goals),
        client_stall: probe.client_stall,
    });
    probe.decided = recorded.decision;
    probe.runs = recorded.decision.map(|_| recorded.runs);
    None
}

/// The repeat reason of a probe run again because the run before it judged too few
/// requests.
const RERUN_SHORT: &str = "the run before judged too few requests for its goal's percentile";

/// The replay of one probe.
fn probe_setup<'a>(
    inputs: &LevelInputs<'a>,
    probe_config: &'a RunConfig,
    load: &GlobalLoad,
    index: usize,
    find_max: FindMax,
    value: f64,
) -> ReplaySetup<'a> {
    ReplaySetup {
        config: probe_config,
        load: load.clone(),
        target: inputs.target.to_owned(),
        tag_requests: inputs.tag_requests,
        exchanges: inputs.exchanges,
        pass_span_ms: inputs.pass_span_ms,
        requests_out: inputs.requests_out.clone(),
        interrupt: inputs.hooks.interrupt.clone(),
        progress: inputs.hooks.snapshots.clone(),
        pool: inputs.pool,
        level: format!("probe {index}: {} {}", find_max.dimension.name(), value),
        notices: inputs.hooks.notices.clone(),
    }
}

/// What bounds each probe: `--requests`, `--duration`, or the whole recording.
fn probe_budget(config: &RunConfig, exchanges: u64) -> ProbeBudget {
    match (config.load.requests, config.load.duration) {
        (Some(n), _) => ProbeBudget::Requests(n),
        (None, Some(duration)) => ProbeBudget::Duration(duration),
        (None, None) => ProbeBudget::Recording { exchanges },
    }
}

/// The recording's own arrivals per second at ×1 (`None` without arrival times).
fn recording_rate(exchanges: u64, pass_span_ms: f64) -> Option<f64> {
    (pass_span_ms > 0.0 && exchanges > 0).then(|| exchanges as f64 / (pass_span_ms / 1000.0))
}

/// A probe's load, sized: a `--duration` extended, or the recording looped.
fn sized_load(mut load: GlobalLoad, size: ProbeSize) -> GlobalLoad {
    match size {
        ProbeSize::AsGiven => {}
        ProbeSize::Duration(duration) => load.duration = Some(duration),
        ProbeSize::Requests(requests) => load.requests = Some(requests),
    }
    load
}

/// The samples a probe judged its need's distribution on (its succeeded requests when no
/// goal reads a percentile).
fn judged_requests(probe: &ProbeSection, need: Option<&Need>) -> u64 {
    let llm = &probe.llm;
    let stats = match need.map(|need| need.metric) {
        Some(Metric::Ttft) => llm.ttft_ms.as_ref(),
        Some(Metric::Ttst) => llm.ttst_ms.as_ref(),
        Some(Metric::Itl) => llm.itl_ms.as_ref(),
        Some(Metric::Latency) => llm.latency_ms.as_ref(),
        Some(Metric::TokensPerSecondPerUser) => llm.tokens_per_second_per_user.as_ref(),
        Some(Metric::Isl) => llm.isl_tokens.as_ref(),
        Some(Metric::Osl) => llm.osl_tokens.as_ref(),
        Some(Metric::ScheduleLag) => llm.schedule_lag_ms.as_ref(),
        _ => return probe.requests.succeeded,
    };
    stats.map_or(0, |stats| stats.count)
}

/// What a short run says of itself when it runs again.
fn short_run_note(size: ProbeSize) -> String {
    let longer = match size {
        ProbeSize::Duration(duration) => format!("for {:.1} s", duration.as_secs_f64()),
        ProbeSize::Requests(requests) => format!("with {requests} requests"),
        ProbeSize::AsGiven => "again".to_owned(),
    };
    format!(
        "too few requests to judge its goal's percentile: the load runs again {longer}, and this run decides nothing"
    )
}

/// When even the lowest load fails a goal that more load could meet — a throughput floor
/// (`llm.request-throughput < 5`, `llm.goodput < 2`): a batching server fills its batches
/// only under load — say so and suggest a range that starts higher.
fn batching_suggestion(
    find_max: FindMax,
    answer: &crate::capacity::Answer,
    probes: &[ProbeSection],
) -> Option<String> {
    if answer.max.is_some() || answer.min_failing? > find_max.low {
        return None;
    }
    let floors: Vec<&str> = probes
        .iter()
        .rev()
        .find(|p| p.incomplete.is_none() && !p.passed)?
        .goals
        .iter()
        .filter(|g| g.failed && matches!(g.op, crate::goals::Op::Lt | crate::goals::Op::Le))
        .filter(|g| g.metric.contains("throughput") || g.metric.ends_with("goodput"))
        .map(|g| g.expr.as_str())
        .collect();
    if floors.is_empty() {
        return None;
    }
    let dimension = find_max.dimension;
    let higher = if dimension.integer() {
        (find_max.low * 4.0).min(find_max.high)
    } else {
        find_max.low * 4.0
    };
    Some(format!(
        "{} asks for a minimum that more load may reach (a batching server fills its batches only under load): try --find-max-range {}:{} or a --sweep-concurrency to see the curve",
        floors.join(", "),
        crate::capacity::show_number(higher.min(find_max.high)),
        crate::capacity::show_number(find_max.high)
    ))
}

/// The line a search starts with: its range and start, what one probe costs, and an
/// estimate of the whole search (a ramp of a few doublings from the start, the bisection
/// the precision needs, one confirmation) — before any load is sent.
fn search_estimate(find_max: FindMax, config: &RunConfig, pass_span_ms: f64) -> String {
    let dimension = find_max.dimension;
    let per_probe = |load: f64| -> Option<f64> {
        let budget = config.load.duration.map(|d| d.as_secs_f64());
        let by_requests = config.load.requests.map(|n| n as f64);
        match dimension {
            Dimension::Speed => Some(budget.unwrap_or(pass_span_ms / 1000.0 / load)),
            Dimension::Rate => budget.or(by_requests.map(|n| n / load)),
            Dimension::Concurrency => budget,
        }
    };
    let bisections = (100.0 / find_max.precision_pct).log2().ceil().max(1.0);
    let probes = 3.0 + bisections + 1.0;
    let cost = match per_probe(find_max.start) {
        Some(seconds) => {
            // Loads around the start and up to 8× it: the average probe costs about what a
            // probe at twice the start does, plus a second to start and drain it.
            let typical = per_probe(find_max.start * 2.0).unwrap_or(seconds) + 1.0;
            format!(
                "a probe at {} takes about {seconds:.0} s; a knee within 8× of the start takes about {probes:.0} probes, ~{:.0} s",
                dimension.show(find_max.start),
                probes * typical
            )
        }
        None => format!(
            "each probe replays the whole recording; a knee within 8× of the start takes about {probes:.0} probes"
        ),
    };
    format!(
        "search: --find-max {} from {} over {}–{}, precision {} %: {cost}",
        dimension.name(),
        dimension.show(find_max.start),
        crate::capacity::show_number(find_max.low),
        crate::capacity::show_number(find_max.high),
        crate::capacity::show_number(find_max.precision_pct)
    )
}

/// Why a probe could not complete (it then decides nothing), or `None`.
fn incomplete(result: &ReplayResult, earlier: &[ProbeSection]) -> Option<&'static str> {
    if result.interrupted {
        Some("interrupted")
    } else if result.aborted {
        Some("aborted: a worker was lost")
    } else if unusable(result, earlier) {
        Some("could not measure the server")
    } else {
        None
    }
}

/// Whether the workers flagged their own sending during a replay: the supervisor tells a
/// worker that sent late while idle (`ClientLoad::Stalled`: the machine or the network
/// stalled it) from a saturated one; either way the client, not the server, set the pace,
/// and a failure then says nothing of the server.
fn client_stalled(result: &ReplayResult) -> bool {
    !result.client_flags.is_empty()
}

/// `offered 100/s, sent 2.3/s: capped by --concurrency 1`, when the user's cap on
/// requests in flight bounded an open loop's offered rate (sends waited for a free slot).
/// The rate sent is the requests sent over their intended span plus the latest send's lag.
fn capped_note(load: &GlobalLoad, result: &ReplayResult) -> Option<String> {
    let (Some(rate), Some(cap)) = (load.rate, load.concurrency) else {
        return None;
    };
    let issued = result.totals.issued as f64;
    let lag = result.metrics.stats(common::metrics::Metric::ScheduleLag)?;
    if issued < 2.0 {
        return None;
    }
    let sent = issued / (issued / rate + lag.max.max(0.0) / 1000.0);
    (sent < 0.9 * rate).then(|| {
        format!(
            "offered {}/s, sent {sent:.1}/s: capped by --concurrency {cap} (a send waited for a free slot)",
            crate::capacity::show_number(rate)
        )
    })
}

/// One line per probe as it is decided: its number, load, result, the verdicts so far
/// and the bracket, and the search's time so far.
fn probe_line(
    find_max: FindMax,
    index: usize,
    probe: &ProbeSection,
    answer: &crate::capacity::Answer,
    repeat: Option<&str>,
    elapsed: std::time::Duration,
) -> String {
    let dimension = find_max.dimension;
    let result = if probe.passed { "passed" } else { "FAILED" };
    let stall = if probe.client_stall && !probe.passed {
        " (the client stalled)"
    } else {
        ""
    };
    let decided = match (probe.decided, probe.runs) {
        (Some(true), Some(runs)) => format!("; decided: holds ({runs} run{})", plural(runs)),
        (Some(false), Some(runs)) => format!("; decided: fails ({runs} run{})", plural(runs)),
        _ => "; undecided".to_owned(),
    };
    let next = match repeat {
        Some(why) => format!(", runs again: {why}"),
        None => String::new(),
    };
    let bracket = crate::capacity::progress::bracket_text(dimension, answer);
    format!(
        "search: probe {index} at {} {result}{stall} in {:.1} s{decided}{next} · bracket: {bracket} · {:.0} s so far",
        dimension.show(probe.value),
        probe.duration_s,
        elapsed.as_secs_f64()
    )
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A probe that cannot say anything about the load: nothing reached the target, or (before
/// any load held) nothing succeeded — the target does not work at all, which no load
/// answers. At a higher load, a probe where nothing succeeded is a failing probe.
fn unusable(result: &ReplayResult, earlier: &[ProbeSection]) -> bool {
    no_response("", result).is_some()
        || (none_succeeded("", result).is_some() && !earlier.iter().any(|p| p.passed))
}

/// The options of one probe: the run's, at `value` along `dimension`.
fn probe_config(config: &RunConfig, dimension: Dimension, value: f64) -> (RunConfig, GlobalLoad) {
    match dimension {
        Dimension::Concurrency => level_config(config, Some(value as usize)),
        Dimension::Rate => {
            let mut load = config.load.clone();
            load.schedule = Schedule::Asap;
            load.rate = Some(value);
            (config.clone(), load)
        }
        Dimension::Speed => {
            let mut load = config.load.clone();
            load.schedule = Schedule::Recorded { speed: value };
            (config.clone(), load)
        }
    }
}

/// What judges a probe: the run's goals, against its baselines.
struct ProbeJudge<'a> {
    config: &'a RunConfig,
    scanned: &'a RecordingScan,
    saved_baseline: Option<&'a (PathBuf, Report)>,
    goals: &'a [Goal],
    /// The server's metrics, for the probe's own window (`server.` goals).
    scraper: Option<&'a Scraper>,
}

impl ProbeJudge<'_> {
    /// A probe's section: its goals judged on its steady window when it has one (requests
    /// sent once the load reached its target, the closed loop's first wave left out), else
    /// on the whole probe. The counters (`requests`) are the whole probe's either way.
    async fn judge(&self, value: f64, attempt: u32, result: &ReplayResult) -> ProbeSection {
        let (metrics, judged_on) = match &result.steady_metrics {
            Some(steady) if steady.counters.completed() > 0 => (steady, "steady window"),
            _ => (&result.metrics, "whole run"),
        };
        let mut report = level_report(LevelReport {
            config: self.config,
            scanned: self.scanned,
            result,
            metrics,
            sweep: Vec::new(),
            warnings: Vec::new(),
            timeline: Vec::new(),
            saved_baseline: self.saved_baseline,
        });
        if let Some(scraper) = self.scraper
            && let Some(log) = scraper.snapshot().await
        {
            let (from, to) = window_of(result);
            report.server = Some(log.section(from, to, result.started_at));
        }
        if let Some(steady) = result.steady {
            let seconds = steady.seconds();
            report.llm.steady_window_s = Some(seconds);
            report.llm.output_tokens_per_second_steady = Some(steady.output_tokens / seconds);
            report.llm.requests_per_second_steady = Some(steady.requests / seconds);
        }
        let goals = report.evaluate_goals(self.goals);
        let failed_goals: Vec<String> = goals
            .iter()
            .filter(|g| g.failed)
            .map(|g| g.expr.clone())
            .collect();
        let mut llm = report.llm;
        llm.cdf = None;
        let few_requests = need_of(self.goals).and_then(|need| {
            let judged = metrics.stats(need.metric).map_or(0, |stats| stats.count);
            (judged < need.requests).then_some(FewRequests {
                goal: need.goal,
                judged,
                needed: need.requests,
            })
        });
        ProbeSection {
            value,
            passed: failed_goals.is_empty(),
            failed_goals,
            goals,
            judged_on: judged_on.to_owned(),
            llm,
            requests: report.requests,
            goodput: GoodputSection::from_metrics(&self.config.slos, metrics),
            duration_s: result.duration.as_secs_f64(),
            attempt,
            decided: None,
            server: report.server,
            runs: None,
            repeat: None,
            incomplete: None,
            client_stall: false,
            notes: Vec::new(),
            few_requests,
        }
    }
}

/// The scraper of the server's metrics: the target's own `<origin>/metrics` (with
/// `--target`, unless `--no-server-metrics`) with the user's `--header`s — they are the
/// target's, so they go to its origin only — and each `--server-metrics` URL with the
/// `--server-metrics-header`s instead.
/// `None` when there is nothing to scrape.
fn start_scraper(config: &RunConfig) -> Option<Scraper> {
    let options = &config.server_metrics;
    let mut endpoints = Vec::new();
    if options.target
        && let Some(target) = &config.target
        && let Some(origin) = origin_of(target)
    {
        endpoints.push(ScrapeEndpoint {
            url: format!("{origin}/metrics"),
            headers: coordinator_headers(&config.headers),
            target: true,
            hint: crate::server_metrics::prefix_hint(target),
        });
    }
    // `--server-metrics-header`s: their variables were checked when the options were read.
    let extra_headers = coordinator_headers(&options.extra_headers);
    endpoints.extend(
        options
            .extra
            .iter()
            .map(|url| ScrapeEndpoint::new(url.clone(), extra_headers.clone())),
    );
    if endpoints.is_empty() {
        return None;
    }
    Some(Scraper::start(
        endpoints,
        options.interval,
        &ScrapeClientOptions::from(&config.transport),
    ))
}

/// `scheme://authority` of a URL.
fn origin_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(format!("{}://{}", uri.scheme_str()?, uri.authority()?))
}

/// The `--header`s as the coordinator can send them: `${VAR}` expanded from the
/// coordinator's own environment; a header whose variable is not set there is left out (the
/// workers expand theirs from their own environment; this one is only for scraping).
fn coordinator_headers(templates: &[(String, String)]) -> Vec<(String, String)> {
    templates
        .iter()
        .filter_map(|(name, template)| {
            let lookup = |var: &str| std::env::var(var).ok();
            let value = crate::server_metrics::expand_env(template, &lookup).ok()?;
            Some((name.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// A replay's window in wall-clock time: its start to its end.
fn window_of(result: &ReplayResult) -> (std::time::SystemTime, std::time::SystemTime) {
    (result.started_at, result.started_at + result.duration)
}

/// Fill the report's `server` section (the whole run, or the answer's probe for a search,
/// on the run's time axis) and each sweep level's and probe's own.
fn attach_server_sections(
    log: &ScrapeLog,
    results: &[(Option<usize>, ReplayResult)],
    main: usize,
    report: &mut Report,
    capacity: Option<&mut CapacitySection>,
) {
    let Some((_, first)) = results.first() else {
        return;
    };
    let run_start = first.started_at;
    let (_, last) = &results[results.len() - 1];
    // The run's own output tokens, against which the target's generated-token counters are
    // checked (`ScrapeLog::section_against`): over the whole run only, whose bounding scrapes
    // (the probe before the load, the final one after it) hold nothing else; a level's or a
    // probe's may reach a neighbour's load by up to one interval.
    let run_tokens: f64 = results
        .iter()
        .map(|(_, result)| result.metrics.counters.output_tokens as f64)
        .sum();
    let (from, to, client_tokens) = match capacity {
        Some(capacity) => {
            for (probe, (_, result)) in capacity.probes.iter_mut().zip(results) {
                let (from, to) = window_of(result);
                probe.server = Some(log.section(from, to, run_start));
            }
            let (from, to) = window_of(&results[main].1);
            (from, to, None)
        }
        None => (run_start, window_of(last).1, Some(run_tokens)),
    };
    report.server = Some(log.section_against(from, to, run_start, client_tokens));
    for (level, (_, result)) in report.sweep.iter_mut().zip(results) {
        let (from, to) = window_of(result);
        level.server = Some(log.section(from, to, run_start));
    }
}

/// What the levels earned beyond each replay's own warnings: a `--rate` run whose
/// `--concurrency` cap bounded the offered load, and a sweep level or probe that could not
/// run.
fn level_warnings(
    config: &RunConfig,
    results: &[(Option<usize>, ReplayResult)],
    capacity: Option<&CapacitySection>,
    level_failed: Option<&LevelFailed>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if capacity.is_none()
        && let Some((_, last)) = results.last()
        && let Some(note) = capped_note(&config.load, last)
    {
        warnings.push(note);
    }
    let Some(error) = level_failed else {
        return warnings;
    };
    warnings.push(match capacity {
        Some(capacity) => format!(
            "the search stopped: a probe could not run: {}; the probes before it are reported{}",
            error.error,
            match capacity.max {
                Some(max) => format!(
                    " (the highest load that held so far: {})",
                    capacity_value(capacity, max)
                ),
                None => String::new(),
            }
        ),
        None => format!(
            "the sweep stopped: a level{} could not run: {}; the levels before it are reported",
            error
                .level
                .map_or_else(String::new, |c| format!(" (concurrency {c})")),
            error.error
        ),
    });
    warnings
}

/// A capacity value as the report's dimension reads it.
fn capacity_value(capacity: &CapacitySection, value: f64) -> String {
    capacity.dimension.show(value)
}

/// A search's verdict (PRODUCT.md, exit codes with `--find-max`): a probe that could not
/// complete is a failed run (3); no load that holds is a failed goal (1); else a maximum was
/// found (0).
fn search_verdict(
    capacity: &CapacitySection,
    target: &str,
    results: &[(Option<usize>, ReplayResult)],
    level_failed: Option<&LevelFailed>,
) -> Verdict {
    let shown = common::recording::redact_url(target);
    if let Some(failed) = level_failed {
        return Verdict::RunFailed(RunError::Incomplete {
            message: format!(
                "a probe could not run: {} (the probes before it are above)",
                failed.error
            ),
        });
    }
    if let Some((_, last)) = results.last() {
        let probe = capacity
            .probes
            .last()
            .map(|p| capacity_value(capacity, p.value))
            .unwrap_or_default();
        if last.interrupted {
            return Verdict::RunFailed(RunError::Interrupted {
                message: format!(
                    "the search was interrupted during the probe at {probe} (the probes so far are above)"
                ),
            });
        }
        if last.aborted {
            return Verdict::RunFailed(RunError::Worker {
                message: format!(
                    "the probe at {probe} was aborted: a worker was lost (the probes so far are above)"
                ),
            });
        }
        let earlier = &capacity.probes[..capacity.probes.len().saturating_sub(1)];
        if let Some(message) = no_response(&shown, last) {
            let message = format!("the probe at {probe}: {message}");
            return Verdict::RunFailed(no_response_error(&shown, last, message));
        }
        if !earlier.iter().any(|p| p.passed)
            && let Some(message) = none_succeeded(&shown, last)
        {
            return Verdict::RunFailed(RunError::NoneSucceeded {
                target: shown.clone(),
                message: format!("the probe at {probe}: {message}"),
            });
        }
    }
    match capacity.max {
        Some(_) => Verdict::Passed,
        None => Verdict::GoalFailed,
    }
}

/// The options of one level: a sweep level replays as fast as its concurrency allows, with
/// no more local workers than streams.
fn level_config(config: &RunConfig, level: Option<usize>) -> (RunConfig, GlobalLoad) {
    let mut load = config.load.clone();
    let mut level_config = config.clone();
    if let Some(concurrency) = level {
        load.concurrency = Some(concurrency);
        load.schedule = Schedule::Asap;
        load.rate = None;
        if let WorkerSource::Local(n) = config.source {
            level_config.source = WorkerSource::Local(n.min(concurrency));
        }
    }
    (level_config, load)
}

/// One pass over the recording's schedule, in ms: its last arrival plus one average gap.
fn pass_span_ms(scanned: &RecordingScan) -> f64 {
    if scanned.exchanges > 1 {
        scanned.max_at_ms * scanned.exchanges as f64 / (scanned.exchanges - 1) as f64
    } else {
        scanned.max_at_ms + 1000.0
    }
}

async fn scan_blocking(
    path: PathBuf,
    sample: Option<crate::faithful::SessionSample>,
) -> Result<RecordingScan, RunError> {
    scan_blocking_with(path, sample, None).await
}

/// [`scan_blocking`] with `--tokenizer`'s tokenizer for the baseline's output counts.
async fn scan_blocking_with(
    path: PathBuf,
    sample: Option<crate::faithful::SessionSample>,
    tokenizer: Option<std::sync::Arc<common::tokenizer::Tokenizer>>,
) -> Result<RecordingScan, RunError> {
    match tokio::task::spawn_blocking(move || {
        crate::scan::scan_with(&path, sample.as_ref(), tokenizer.as_deref())
    })
    .await
    {
        Ok(Ok(scanned)) => Ok(scanned),
        Ok(Err(error)) => Err(RunError::recording(&error)),
        Err(error) => Err(RunError::failed(error.to_string())),
    }
}

/// A saved report (`--report-json` output), read for `--baseline`.
pub fn read_saved_report(path: &std::path::Path) -> Result<Report, RunError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| RunError::file(path, format!("{}: {e}", path.display())))?;
    Report::from_json(&text).map_err(|e| RunError::file(path, format!("{}: {e}", path.display())))
}

/// What the recorder said of its recording: a sampled share, gaps it could not record.
fn recorder_warnings(recording: &str, scanned: &RecordingScan) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(share) = scanned.sample_share.filter(|s| *s < 1.0) {
        let percent = (share * 100_000.0).round() / 1000.0;
        warnings.push(format!(
            "{recording}: the recording holds {percent} % of the traffic (record --sample); --speed {} replays the recorded rate",
            (1.0 / share * 1000.0).round() / 1000.0
        ));
    }
    if scanned.gaps > 0 {
        warnings.push(format!(
            "{recording}: {} exchanges were proxied but not recorded ({} gaps marked by the recorder)",
            scanned.not_recorded, scanned.gaps
        ));
    }
    warnings
}

/// The warnings a run's input earns before any load is sent.
fn input_warnings(config: &RunConfig, scanned: &RecordingScan) -> Vec<String> {
    let recording = config.recording.display();
    let mut warnings = Vec::new();
    if config.transport.insecure {
        warnings.push(
            "INSECURE: the target's TLS certificate was not verified (--insecure); anyone on the path could have answered"
                .to_string(),
        );
    }
    warnings.extend(untemplated_chat_warning(config, scanned));
    warnings.extend(recorder_warnings(&recording.to_string(), scanned));
    if let Some(line) = scanned.torn_last_line {
        warnings.push(format!(
            "{recording}:{line}: torn last line (the recorder stopped mid-line); it was not replayed"
        ));
    }
    if scanned.skipped_long_lines > 0 {
        let lines: Vec<String> = scanned
            .skipped_long_line_numbers
            .iter()
            .map(u64::to_string)
            .collect();
        warnings.push(format!(
            "{recording}: {} line(s) over the reader's length cap skipped, not replayed (lines {}{})",
            scanned.skipped_long_lines,
            lines.join(", "),
            if scanned.skipped_long_lines > lines.len() as u64 {
                ", ..."
            } else {
                ""
            }
        ));
    }
    warnings
}

/// `--tokenizer` without a chat template, on a recording with chat requests: their input
/// counts leave out the role markers and separators the server's template adds.
fn untemplated_chat_warning(config: &RunConfig, scanned: &RecordingScan) -> Option<String> {
    let tokenizer = config.tokenizer.as_ref()?;
    if tokenizer.tokenizer.has_chat_template() {
        return None;
    }
    // Every family but legacy completions sends messages a server renders with its template
    // (Ollama's /api/generate is counted with them: its family name is shared).
    let chat: u64 = scanned
        .families
        .iter()
        .filter(|(family, _)| **family != "openai-completions")
        .map(|(_, n)| n)
        .sum();
    (chat > 0).then(|| {
        format!(
            "--tokenizer {}: no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json beside it): the input tokens of {chat} chat requests are their message texts counted without the template's role markers and separators, below what the server counts; put the model's chat_template.jinja or tokenizer_config.json beside the file",
            tokenizer.files.name
        )
    })
}

/// What the report is built from: the run's options, its recording and every level.
struct ReportParts<'a> {
    config: &'a RunConfig,
    scanned: &'a RecordingScan,
    /// Each level and its result, in order.
    levels: &'a [(Option<usize>, ReplayResult)],
    /// The level whose numbers the report's main sections show.
    main: usize,
    warnings: Vec<String>,
    /// `--baseline FILE`: a saved report the run is compared against.
    saved_baseline: Option<&'a (PathBuf, Report)>,
}

impl ReportParts<'_> {
    fn build(self) -> Report {
        let config = self.config;
        let (_, result) = &self.levels[self.main];
        let sweep: Vec<SweepLevel> = match Levels::of(config) {
            Levels::Single | Levels::Search(_) => Vec::new(),
            Levels::Sweep(_) => self
                .levels
                .iter()
                .map(|(level, result)| SweepLevel {
                    concurrency: level.unwrap_or(0) as u32,
                    metrics: result.metrics.clone(),
                    requests: request_totals(result),
                })
                .collect(),
        };
        let timeline: Vec<TimelinePoint> =
            crate::timeline::join_levels(self.levels.iter().map(|(level, result)| {
                let level = level.map(|c| c as u32);
                (level, result.started_at, &result.timeline[..])
            }));
        let mut warnings = result.warnings.clone();
        warnings.extend(self.warnings);
        level_report(LevelReport {
            config,
            scanned: self.scanned,
            result,
            metrics: &result.metrics,
            sweep,
            warnings,
            timeline,
            saved_baseline: self.saved_baseline,
        })
    }
}

/// One level's results, and what its report is compared against.
struct LevelReport<'a> {
    config: &'a RunConfig,
    scanned: &'a RecordingScan,
    result: &'a ReplayResult,
    /// What the latency sections and goals are judged on: the level's metrics, or a
    /// probe's steady window.
    metrics: &'a common::metrics::RunMetrics,
    sweep: Vec<SweepLevel>,
    warnings: Vec<String>,
    timeline: Vec<TimelinePoint>,
    saved_baseline: Option<&'a (PathBuf, Report)>,
}

/// The one recipe that turns a level's results into a report (the run's, or a capacity
/// probe's section): its sections from `metrics`, the requests counted over the whole level,
/// where its token counts come from, and the comparison with a saved baseline.
fn level_report(level: LevelReport<'_>) -> Report {
    let LevelReport {
        config,
        scanned,
        result,
        metrics,
        sweep,
        warnings,
        timeline,
        saved_baseline,
    } = level;
    let mut report = Report::build(ReportInput {
        run: run_info(config, result),
        metrics,
        requests: request_totals(result),
        baseline: recorded_baseline(config, scanned),
        sweep,
        warnings,
        timeline,
        slos: &config.slos,
    });
    report.requests = RequestsSection::new(&result.metrics.counters, &request_totals(result))
        .with_errors(&result.metrics.errors);
    if let Some(tokenizer) = &config.tokenizer {
        report.requests.token_source.tokenizer = Some(tokenizer.name().to_owned());
    }
    report.requests.token_source.usage_requested = config.request_usage;
    match saved_baseline {
        Some((path, saved)) => compare_reports(&report, saved, &path.display().to_string()),
        None => report,
    }
}

/// The report's `run` section: who ran what, when, against what, on which workers.
fn run_info(config: &RunConfig, result: &ReplayResult) -> RunInfo {
    let started_us = result
        .started_at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let seconds = result.duration.as_secs_f64();
    let workers = result
        .workers
        .iter()
        .map(|w| WorkerInfo {
            id: w.id.clone(),
            host: w.host.clone(),
            assigned: w.assigned,
            completed: w.metrics.counters.completed(),
            lost: w.totals.lost,
            clock_offset_ms: Some(w.clock.offset_ns as f64 / 1e6),
            disconnected: w.lost && w.quit.is_none(),
            quit: w.quit.clone(),
            version: None,
            peak_rss_mb: (w.peak_rss_bytes > 0).then(|| w.peak_rss_bytes as f64 / 1_048_576.0),
            cpu_seconds: Some(w.cpu_seconds),
            clock_uncertainty_ms: Some(w.clock.uncertainty_ns as f64 / 1e6),
            schedule_lag_p99_ms: w
                .metrics
                .stats(common::metrics::Metric::ScheduleLag)
                .map(|s| s.p99),
            cpu_pct: (w.cores > 0 && seconds > 0.0)
                .then(|| 100.0 * w.cpu_seconds / seconds / f64::from(w.cores)),
        })
        .collect();
    RunInfo {
        id: result.run_id.clone(),
        started_at: rfc3339_utc(started_us),
        duration_s: seconds,
        target: if config.target.is_some() {
            common::recording::redact_url(&result.target)
        } else {
            format!("embedded mock ({}) at recorded timing", result.target)
        },
        load: result.load.clone(),
        start_skew_ms: result.start_skew_ms,
        start_skew_bound_ms: crate::supervisor::start_skew_bound_ms(&result.workers),
        workers,
        insecure: config.transport.insecure,
    }
}

/// The recording's own measurement, when the run compares against it.
fn recorded_baseline<'a>(config: &RunConfig, scanned: &'a RecordingScan) -> Option<Baseline<'a>> {
    let (BaselineSource::Recorded, Some(metrics)) = (&config.baseline, &scanned.baseline) else {
        return None;
    };
    let recording = config.recording.display();
    Some(Baseline {
        source: if scanned.with_source_timing > 0 {
            format!(
                "recording {recording} ({} of {} exchanges timed by their source, e.g. a span)",
                scanned.with_source_timing,
                scanned.with_frame_timing + scanned.with_source_timing
            )
        } else {
            format!("recording {recording}")
        },
        metrics,
    })
}

fn request_totals(result: &ReplayResult) -> RequestTotals {
    RequestTotals {
        slice: result.totals,
        status_codes: result.status_codes.clone(),
        tls_problems: result.tls_problems.clone(),
        not_started_because: if result.interrupted {
            Some("the run was interrupted".into())
        } else if result.aborted {
            Some(
                "a worker was lost or quit, and the run was aborted (--on-worker-loss fail); no worker reported sending them"
                    .into(),
            )
        } else {
            None
        },
    }
}

/// The run's verdict, most serious cause first.
fn verdict(
    report: &Report,
    target: &str,
    main: &ReplayResult,
    level_failed: Option<&LevelFailed>,
) -> Verdict {
    let target = common::recording::redact_url(target);
    if main.interrupted {
        return Verdict::RunFailed(RunError::Interrupted {
            message: "the run was interrupted (partial report above)".into(),
        });
    }
    if main.aborted {
        return Verdict::RunFailed(RunError::Worker {
            message: "the run was aborted: a worker was lost (partial report above)".into(),
        });
    }
    if let Some(failed) = level_failed {
        return Verdict::RunFailed(RunError::Incomplete {
            message: format!(
                "a sweep level could not run: {} (the levels before it are above)",
                failed.error
            ),
        });
    }
    if let Some(shortfall) = main.shortfalls.first() {
        return Verdict::RunFailed(RunError::Incomplete {
            message: format!("the run did not do all its work: {shortfall}"),
        });
    }
    if let Some(message) = no_response(&target, main) {
        return Verdict::RunFailed(no_response_error(&target, main, message));
    }
    if let Some(message) = none_succeeded(&target, main) {
        return Verdict::RunFailed(RunError::NoneSucceeded {
            target: target.clone(),
            message,
        });
    }
    if report.any_goal_failed() {
        return Verdict::GoalFailed;
    }
    Verdict::Passed
}

/// When every request failed before any response arrived, why: "unreachable" only when no
/// connection could be made at all (refused, DNS); a TLS failure names its problem.
fn no_response(target: &str, result: &ReplayResult) -> Option<String> {
    let c = &result.metrics.counters;
    if !(c.failed_transport > 0 && c.completed() == c.failed_transport && c.warmup == 0) {
        return None;
    }
    let causes = c
        .transport
        .by_name()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{} {n}", name.replace('_', " ")))
        .collect::<Vec<_>>()
        .join(", ");
    if c.transport.no_connection() == c.failed_transport {
        return Some(format!(
            "the target {target} was unreachable: no connection could be made ({causes})"
        ));
    }
    if c.transport.tls > 0 {
        let problems = result
            .tls_problems
            .iter()
            .map(|(problem, n)| format!("{problem} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Some(format!(
            "TLS with the target {target} failed: {problems} ({causes}); {}",
            tls_hint(result)
        ));
    }
    if c.transport.http2_only > 0 {
        return Some(format!(
            "the target {target} answered in HTTP/2 ({causes}): it speaks only cleartext HTTP/2 (h2c); run with --target-h2c"
        ));
    }
    if c.transport.closed_after_head > 0 {
        // A response head came: "no response" would send the user after the network.
        return Some(format!(
            "no request to {target} got an answer: {} got a response head and then lost their connection or stream before any content (a gateway's read timeout shorter than the time to first token?); every one failed in transport ({causes}){}",
            c.transport.closed_after_head,
            most_said(result)
        ));
    }
    Some(format!(
        "no request to {target} got a response: every one failed in transport ({causes}){}",
        most_said(result)
    ))
}

/// What to do about a failed TLS handshake. A certificate valid for other names is not
/// fixed by trusting a CA: name the names it holds (from the worker's failure, carried in
/// the problem's key: `common::tls::problem_key`) and say to use one in the URL (no flag
/// sets the TLS server name apart from the URL's host).
fn tls_hint(result: &ReplayResult) -> String {
    let insecure = "--insecure skips verification";
    let mismatch = TlsProblem::NameMismatch.description();
    if let Some(names) = result
        .tls_problems
        .keys()
        .find_map(|key| common::tls::names_of_key(key))
    {
        return format!(
            "the certificate is for {names}: use one of those names as the target URL's host (an /etc/hosts entry can point it at the server); {insecure}"
        );
    }
    if result.tls_problems.keys().any(|key| key == mismatch) {
        return format!(
            "the certificate is for another name than the target URL's host: use a name it holds in the URL; {insecure}"
        );
    }
    format!("--target-ca FILE trusts a private CA, {insecure}")
}

/// What `no_response` found, as a variant: no connection at all is an unreachable target.
fn no_response_error(target: &str, result: &ReplayResult, message: String) -> RunError {
    let c = &result.metrics.counters;
    let target = target.to_owned();
    if c.transport.no_connection() == c.failed_transport {
        RunError::Unreachable { target, message }
    } else {
        RunError::NoResponse { target, message }
    }
}

/// A run in which requests got answers but none succeeded could not do what it was for
/// (PRODUCT.md: "no request succeeded" is exit 3): say what the answers were.
fn none_succeeded(target: &str, result: &ReplayResult) -> Option<String> {
    let c = &result.metrics.counters;
    if c.succeeded > 0 || c.completed() == 0 {
        return None;
    }
    let mut what: Vec<String> = Vec::new();
    if !result.status_codes.is_empty() {
        let codes = result
            .status_codes
            .iter()
            .map(|(code, n)| format!("{code} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        what.push(format!("status {codes}"));
    }
    for (name, n) in [
        ("ended early", c.ended_early),
        ("error frame", c.failed_error_frame),
        ("in transport", c.failed_transport),
        ("timed out", c.failed_timeout),
        ("empty", c.failed_empty),
    ] {
        if n > 0 {
            what.push(format!("{name} {n}"));
        }
    }
    Some(format!(
        "no request to {target} succeeded: {} answered, none successfully ({}){}; the report above says more",
        c.completed(),
        what.join(", "),
        most_said(result)
    ))
}

/// `; most often the server said "…" (×N)`, from the run's error summary, or nothing.
fn most_said(result: &ReplayResult) -> String {
    result
        .metrics
        .errors
        .most_frequent_message()
        .and_then(|sample| {
            let message = sample.message.as_deref()?;
            let status = sample.status.map(|s| format!("{s} ")).unwrap_or_default();
            Some(format!(
                "; most often the server said {status}\"{message}\" (×{})",
                sample.count
            ))
        })
        .unwrap_or_default()
}
