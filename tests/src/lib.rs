//! Shared fixtures for the integration tests: locate the built binaries, start a real mock
//! server process on 127.0.0.1:0, run `llm-replay` as a real process and read its JSON report,
//! and the lock that keeps timing measurements apart from each other.

pub mod gateway;
pub mod link;
pub mod metrics_gate;
pub mod peer;
pub mod truth;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Every test of the integration binary takes one of two guards as its first line:
///
/// - `let _timing = fixtures::timing_lock();` in a test that asserts on measured time (TTFT,
///   ITL, latency, start skew, "within N %" of another run or of a baseline, "no request
///   after t + 1 ms"), or that loads the machine hard enough to disturb such a measurement
///   (100,000 requests, hundreds of open streams). It runs alone.
/// - `let _parallel = fixtures::parallel_lock();` in every other test. These run in parallel
///   with each other (48 test threads, `.cargo/config.toml`), never beside a timing test.
///   A test that measures nothing but is heavy for a while (the container build) takes this
///   one too: it slows its parallel neighbours, which assert no time, and never overlaps a
///   timing test.
///
/// A test taking neither runs whenever its thread gets to it, beside anything: it may make a
/// timing test fail.
///
/// The lock prefers the parallel tests: a timing test waits until none is running, and
/// while it waits, new parallel tests still start. The suite's time is then close to the sum
/// of the timing tests plus the parallel ones spread over the test threads; a lock that
/// preferred the waiting timing test would leave threads idle behind the longest parallel
/// test (the container build) each time. Timing tests are not starved: the parallel tests
/// are finite, and every thread that reaches a timing test stops starting new ones. A test
/// that failed while holding a guard releases it as it unwinds (it guards the cores, no data).
pub fn timing_lock() -> CoresGuard {
    let asked = Instant::now();
    FIRST_ASKED.get_or_init(|| asked);
    let mut state = CORES.state.lock().unwrap_or_else(PoisonError::into_inner);
    while state.timing || state.parallel > 0 {
        state = CORES
            .changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
    state.timing = true;
    CoresGuard::new("timing", asked)
}

/// The guard of a test that measures no time and loads the machine no more than a few
/// hundred short requests do: see [`timing_lock`].
pub fn parallel_lock() -> CoresGuard {
    let asked = Instant::now();
    FIRST_ASKED.get_or_init(|| asked);
    let mut state = CORES.state.lock().unwrap_or_else(PoisonError::into_inner);
    while state.timing {
        state = CORES
            .changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
    state.parallel += 1;
    CoresGuard::new("parallel", asked)
}

/// How many times a timing test measures before it fails: see [`remeasure`], which takes no
/// count, so no test can ask for more. A known bias is not retried around but measured
/// against the truth (the client's timing tests assert its own error against the mock's
/// truth log: [`truth`]).
pub const TIMING_ATTEMPTS: usize = 3;

/// The pause before a timing measurement is taken again.
const REMEASURE_PAUSE: Duration = Duration::from_secs(3);

/// Runs a timing measurement up to [`TIMING_ATTEMPTS`] times and passes at the first attempt
/// whose numbers are all within their tolerances; fails with every attempt's miss otherwise.
///
/// The tolerances stay as tight as their acceptance lines; what the attempts absorb is a
/// shared machine that is not ours for a few seconds. CI runs on a VM whose neighbours take
/// its cores now and then: once a 13 ms stall landed in one stream of 200 (ITL 3.4 ms against
/// the mock's 2), once every stream of a c=128 level started 5 ms late (TTFT p50 205.3 ms;
/// 200.3-201.1 ms here, idle, with both cores busy with other work, or with the whole test on
/// one core). A bias in our own code misses every attempt and fails. `measure` returns
/// `Err` with the numbers only for a time outside its tolerance; anything else it checks
/// (counts, outcomes, keys) it asserts, so a wrong answer fails at once and is never
/// measured again. Every miss is printed, so a run that needed a second attempt says so.
pub fn remeasure(what: &str, measure: impl FnMut() -> Result<(), String>) {
    remeasure_up_to(what, TIMING_ATTEMPTS, measure);
}

/// [`remeasure`] with the number of attempts given (the fixture's own tests).
fn remeasure_up_to(what: &str, attempts: usize, mut measure: impl FnMut() -> Result<(), String>) {
    let mut misses = Vec::new();
    for attempt in 1..=attempts {
        match measure() {
            Ok(()) => return,
            Err(miss) => {
                eprintln!("{what}: attempt {attempt} of {attempts} missed: {miss}");
                misses.push(format!("attempt {attempt}: {miss}"));
                if attempt < attempts {
                    // A neighbour's burst lasts seconds (CI's two misses were in consecutive
                    // tests): let it pass before measuring again.
                    std::thread::sleep(REMEASURE_PAUSE);
                }
            }
        }
    }
    panic!("{what}: every attempt missed\n{}", misses.join("\n"));
}

/// A test's hold on the cores. When it ends, one line goes to
/// `target/integration-test-times.tsv` (test, kind, seconds waited for the lock, seconds
/// held, seconds from the first lock asked for to this one's acquiring it): where the
/// suite's time goes, and which tests ran side by side, without a nightly toolchain's
/// `--report-time`.
pub struct CoresGuard {
    kind: &'static str,
    asked: Instant,
    acquired: Instant,
}

/// When the first test asked for the cores: the origin of the times file's last column.
static FIRST_ASKED: OnceLock<Instant> = OnceLock::new();

impl CoresGuard {
    fn new(kind: &'static str, asked: Instant) -> CoresGuard {
        CoresGuard {
            kind,
            asked,
            acquired: Instant::now(),
        }
    }
}

impl Drop for CoresGuard {
    fn drop(&mut self) {
        use std::io::Write;
        {
            let mut state = CORES.state.lock().unwrap_or_else(PoisonError::into_inner);
            if self.kind == "timing" {
                state.timing = false;
            } else {
                state.parallel -= 1;
            }
            CORES.changed.notify_all();
        }
        let name = std::thread::current()
            .name()
            .unwrap_or("(unnamed)")
            .to_owned();
        let origin = *FIRST_ASKED.get_or_init(|| self.asked);
        let line = format!(
            "{name}\t{}\t{:.1}\t{:.1}\t{:.1}\n",
            self.kind,
            (self.acquired - self.asked).as_secs_f64(),
            self.acquired.elapsed().as_secs_f64(),
            self.acquired
                .saturating_duration_since(origin)
                .as_secs_f64()
        );
        let path = profile_dir()
            .parent()
            .map(|target| target.join("integration-test-times.tsv"));
        if let Some(path) = path
            && let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// Who holds the cores: one timing test, or any number of parallel ones.
struct Cores {
    state: Mutex<CoresState>,
    changed: Condvar,
}

struct CoresState {
    timing: bool,
    parallel: usize,
}

static CORES: Cores = Cores {
    state: Mutex::new(CoresState {
        timing: false,
        parallel: 0,
    }),
    changed: Condvar::new(),
};

/// The workspace root (the folder holding `Cargo.toml` of the workspace).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace root")
        .to_path_buf()
}

/// `tests/data/...`: small slices of real public data, each file's source and licence in
/// `tests/data/README.md`. Tests read nothing outside the repository.
pub fn test_data(relative: &str) -> PathBuf {
    let path = workspace_root().join("tests/data").join(relative);
    assert!(path.exists(), "missing test data file {}", path.display());
    path
}

/// The profile the test binary was built with; the binaries under test use the same one.
fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Path of a workspace binary (`llm-replay`, `llm-replay-worker`), built once per test process.
///
/// `cargo test` builds the binaries of the package under test only, so the first call runs
/// `cargo build --workspace --bins --examples` with this binary's profile; the other tests
/// wait for it. Selecting the examples makes cargo resolve features as `cargo test` did (with
/// dev-dependencies), so the build reuses every library `cargo test` just built and only
/// links the two binaries (a no-op when they are up to date). The variables cargo set for
/// this test process are removed first: build scripts (ring's) rerun when one of them, such
/// as `CARGO_PKG_NAME`, differs, and the two builds would then rebuild each other's crates.
/// The binaries land beside this test binary: `target/<profile>/deps/this-test` →
/// `target/<profile>/NAME`. `LLM_REPLAY_BIN` overrides the path of `llm-replay`.
pub fn bin(name: &str) -> PathBuf {
    static PROFILE_DIR: OnceLock<PathBuf> = OnceLock::new();
    install_crypto_provider();
    if let Ok(path) = std::env::var("LLM_REPLAY_BIN")
        && name == "llm-replay"
    {
        return PathBuf::from(path);
    }
    let profile_dir = PROFILE_DIR.get_or_init(|| {
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo
            .current_dir(workspace_root())
            .args(["build", "--workspace", "--bins", "--examples"]);
        if profile() == "release" {
            cargo.arg("--release");
        }
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            let set_for_this_test = key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_MANIFEST_")
                || matches!(
                    key.as_ref(),
                    "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                        | "OUT_DIR"
                );
            if set_for_this_test {
                cargo.env_remove(key.as_ref());
            }
        }
        let status = cargo.status().expect("cargo runs");
        assert!(status.success(), "building the binaries failed");
        profile_dir()
    });
    profile_dir.join(name)
}

/// `target/<profile>`: where cargo put this test binary (in `deps/`) and the workspace's bins.
fn profile_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .filter(|dir| dir.ends_with(profile()))
        .unwrap_or_else(|| {
            std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| workspace_root().join("target"))
                .join(profile())
        })
}

/// Make ring the process's rustls provider: reqwest is built with `rustls-no-provider` when
/// the workspace is built together (the worker needs it), and then a test's
/// `reqwest::Client::new()` needs a provider installed. Every fixture that starts a process
/// calls this through [`bin`].
pub fn install_crypto_provider() {
    // Err = already installed: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("llm-replay-test-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `llm-replay mock` process, killed on drop.
pub struct MockServer {
    child: Child,
    pub url: String,
}

impl MockServer {
    /// Start `llm-replay mock --listen 127.0.0.1:0 ARGS...` and wait for its readiness line.
    pub fn start(args: &[&str]) -> MockServer {
        let mut child = Command::new(bin("llm-replay"))
            .args(["mock", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the mock starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the mock prints a readiness line");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .unwrap_or_else(|| panic!("no URL in the mock's readiness line {line:?}"))
            .to_owned();
        MockServer { child, url }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The result of one `llm-replay` invocation.
pub struct RunOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub report: Option<serde_json::Value>,
}

/// A loopback address where a connection is refused for as long as this lives: a socket
/// bound to it and never listening (the kernel answers a SYN with a reset). A port freed by
/// dropping a listener is no such address in a suite that runs tests in parallel: another
/// test's server may take it before the connection is tried (a run expecting "unreachable"
/// once met an h2c-only server there).
pub struct RefusedAddr {
    _socket: tokio::net::TcpSocket,
    pub addr: std::net::SocketAddr,
}

impl RefusedAddr {
    pub fn new() -> RefusedAddr {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind("127.0.0.1:0".parse().expect("an address"))
            .expect("bind");
        let addr = socket.local_addr().expect("its address");
        RefusedAddr {
            _socket: socket,
            addr,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Default for RefusedAddr {
    fn default() -> RefusedAddr {
        RefusedAddr::new()
    }
}

/// Run `llm-replay ARGS...`; when `report_json` is given, `--report-json` is added and read.
pub fn llm_replay(args: &[&str], report_json: Option<&Path>) -> RunOutput {
    let mut command = Command::new(bin("llm-replay"));
    command.args(args);
    if let Some(path) = report_json {
        command.arg("--report-json").arg(path);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .stdin(Stdio::null())
        .output()
        .expect("llm-replay runs");
    let report = report_json
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| serde_json::from_str(&text).ok());
    RunOutput {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        report,
    }
}

/// Read `report[path...]` as f64 (panics with the report when absent).
pub fn num(report: &serde_json::Value, path: &[&str]) -> f64 {
    let mut value = report;
    for key in path {
        value = &value[*key];
    }
    value
        .as_f64()
        .unwrap_or_else(|| panic!("report has no number at {path:?}: {report:#}"))
}

/// Write a recording of `n` OpenAI chat requests (streaming, asking for usage) with
/// `max_tokens` each, optionally with arrival times `gap_ms` apart.
pub fn write_chat_recording(path: &Path, n: usize, max_tokens: u32, gap_ms: Option<f64>) {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).expect("create recording"));
    for i in 0..n {
        let body = serde_json::json!({
            "model": "mock-model",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": format!("Question number {i}: how do tides work?")}],
        });
        let mut line = serde_json::json!({
            "id": format!("ex-{i}"),
            "request": {
                "method": "POST",
                "path": "/v1/chat/completions",
                "headers": {"content-type": "application/json"},
                "body": body.to_string(),
            },
        });
        if let Some(gap) = gap_ms {
            line["at_ms"] = serde_json::json!(i as f64 * gap);
        }
        writeln!(out, "{line}").expect("write recording");
    }
    out.flush().expect("flush recording");
}

/// Wait up to `patience` for `check` to hold, polling every 20 ms.
pub fn eventually(patience: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + patience;
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// A running process whose stderr is collected in the background.
pub struct Spawned {
    pub child: Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
}

fn collect_lines(
    reader: impl std::io::Read + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<String>> {
    let buffer = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = buffer.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            let mut text = sink.lock().expect("output lock");
            text.push_str(&line);
            text.push('\n');
        }
    });
    buffer
}

impl Spawned {
    /// Start `program ARGS...` with stdout and stderr collected.
    pub fn start(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Spawned {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("the process starts");
        let stderr = collect_lines(child.stderr.take().expect("piped stderr"));
        let stdout = collect_lines(child.stdout.take().expect("piped stdout"));
        Spawned {
            child,
            stderr,
            stdout,
        }
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("output lock").clone()
    }

    /// Everything written to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().expect("output lock").clone()
    }

    /// Wait up to `patience` for the exit code (`None` on time-out).
    pub fn wait_timeout(&mut self, patience: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader threads drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return Some(status.code().unwrap_or(-1));
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `llm-replay run ARGS... --listen 127.0.0.1:0 --expect-workers N` and return it with
/// the address workers must dial (read from its "waiting for" line).
pub fn coordinator(
    args: &[&str],
    expect_workers: usize,
    env: &[(&str, &str)],
) -> (Spawned, String) {
    let expect = expect_workers.to_string();
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--listen", "127.0.0.1:0", "--expect-workers", &expect]);
    let process = Spawned::start(&bin("llm-replay"), &all, env);
    let mut addr = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            addr = process
                .stderr()
                .lines()
                .find(|l| l.contains("waiting for"))
                .and_then(|l| l.split(" on ").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned);
            addr.is_some()
        }),
        "the coordinator did not start listening: {}",
        process.stderr()
    );
    (process, addr.expect("checked above"))
}

/// Start `llm-replay-worker --coordinator ADDR --once ARGS...`.
pub fn worker(addr: &str, id: &str, args: &[&str], env: &[(&str, &str)]) -> Spawned {
    let mut all = vec!["--coordinator", addr, "--once", "--worker-id", id];
    all.extend_from_slice(args);
    Spawned::start(&bin("llm-replay-worker"), &all, env)
}

/// The mock's request log: `(unix_ms, exchange index)` per request (its `"event"` lines, such
/// as a client's cancel, are not requests).
pub fn request_log(path: &Path) -> Vec<(f64, Option<u64>)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v.get("event").is_none())
        .map(|v| {
            (
                v["unix_ms"].as_f64().unwrap_or(0.0),
                v["exchange"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .or_else(|| v["exchange"].as_u64()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::remeasure_up_to;

    #[test]
    fn remeasure_passes_at_the_first_attempt_within_tolerance() {
        let mut attempts = 0;
        remeasure_up_to("second time lucky", 3, || {
            attempts += 1;
            if attempts == 2 {
                Ok(())
            } else {
                Err(format!("miss {attempts}"))
            }
        });
        assert_eq!(attempts, 2, "no attempt after the one that passed");
    }

    #[test]
    #[should_panic(expected = "every attempt missed\nattempt 1: 5.1 ms\nattempt 2: 5.2 ms")]
    fn remeasure_fails_when_every_attempt_misses() {
        let mut attempts = 0;
        remeasure_up_to("always late", 2, || {
            attempts += 1;
            Err(format!("5.{attempts} ms"))
        });
    }
}
