//! Acceptance (issue 10): the HTML report of a real sweep run with a baseline, rendered by a
//! real headless Chromium. No console errors; the TTFT and ITL CDFs, the time series and the
//! knee plots are laid out with a non-zero size and hold data; the regressions are
//! highlighted; the screenshots (light, dark) and a printed PDF are kept under
//! `target/html-report/` as the test's artifacts. The run's JSON series accounts for every
//! request of every level, and its Markdown fits a pull-request comment.
//!
//! Skipped only when no Chromium is installed and `CI` is unset; under CI a missing Chromium
//! fails the test (`.ci/run` installs Debian's `chromium`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::{MockServer, Spawned, TempDir, llm_replay, num, write_chat_recording};

/// The plots the acceptance names, by element id, and the connection-setup CDF (issue 9).
const PLOTS: [&str; 10] = [
    "plot-ttft-cdf",
    "plot-itl-cdf",
    "plot-connect-cdf",
    "plot-ttft-time",
    "plot-itl-time",
    "plot-throughput-time",
    "plot-inflight-time",
    "plot-errors-time",
    "plot-knee-ttft",
    "plot-knee-itl",
];

/// Injected at the top of a copy of the report (the report itself has no script): records
/// every error event (scripts, resources, in the capture phase) and console error or warning,
/// then, once loaded, writes each plot's laid-out size and its number of drawn marks into a
/// `<pre id="probe">` as JSON for `--dump-dom`.
const PROBE: &str = r#"<script>
window.__problems = [];
addEventListener('error', function (e) {
  __problems.push('error: ' + (e.message || (e.target && (e.target.src || e.target.href)) || 'unknown'));
}, true);
['error', 'warn'].forEach(function (level) {
  var original = console[level];
  console[level] = function () {
    __problems.push(level + ': ' + Array.prototype.join.call(arguments, ' '));
    original.apply(console, arguments);
  };
});
addEventListener('load', function () {
  var out = {problems: __problems, plots: {}};
  PLOT_IDS.forEach(function (id) {
    var figure = document.getElementById(id);
    var svg = figure && figure.querySelector('svg');
    if (!svg) { out.plots[id] = null; return; }
    var box = svg.getBoundingClientRect();
    out.plots[id] = {width: box.width, height: box.height,
      marks: svg.querySelectorAll('polyline, circle, rect[class^="f"]').length};
  });
  var regressions = document.getElementById('regressions');
  out.regressions = regressions ? regressions.className + ': ' + regressions.textContent : null;
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"#;

/// The Chromium binary, if one is installed.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"]
                .into_iter()
                .map(move |name| dir.join(name))
        })
        .find(|candidate| candidate.is_file())
}

/// Where the artifacts go: `target/html-report/`.
fn artifact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures::workspace_root().join("target"));
    let dir = target.join("html-report");
    std::fs::create_dir_all(&dir).expect("create target/html-report");
    dir
}

/// Run headless Chromium on `page` with `args`; returns (stdout, stderr).
fn headless(chromium: &Path, profile: &Path, page: &Path, args: &[&str]) -> (String, String) {
    let url = format!("file://{}", page.display());
    let profile = format!("--user-data-dir={}", profile.display());
    let mut all = vec![
        "--headless",
        // The test runs as root in CI, where Chromium's sandbox cannot start.
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        profile.as_str(),
    ];
    all.extend_from_slice(args);
    all.push(&url);
    let mut browser = Spawned::start(chromium, &all, &[]);
    let code = browser.wait_timeout(Duration::from_secs(90));
    assert_eq!(
        code,
        Some(0),
        "chromium {args:?} failed:\n{}",
        browser.stderr()
    );
    (browser.stdout(), browser.stderr())
}

/// Console lines Chromium logged for the page (`INFO:CONSOLE(...)] "message", source: ...`).
fn console_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| line.contains(":CONSOLE"))
        .collect()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Load a copy of `page` with the probe injected (written to `probed`) in headless
/// Chromium and return what the probe measured: problems, and each of `plots`' size and
/// marks.
fn measure_in_browser(
    chromium: &Path,
    profile: &Path,
    probed: &Path,
    page: &str,
    plots: &[&str],
) -> serde_json::Value {
    let ids = serde_json::to_string(plots).expect("ids");
    let probe = PROBE.replace("PLOT_IDS", &ids);
    std::fs::write(
        probed,
        page.replacen("<head>", &format!("<head>{probe}"), 1),
    )
    .expect("write probed copy");
    let (dom, stderr) = headless(
        chromium,
        profile,
        probed,
        &["--window-size=1280,6000", "--dump-dom"],
    );
    let start = dom.find("<pre id=\"probe\">").unwrap_or_else(|| {
        panic!(
            "the probe did not run:\n{stderr}\n{}",
            &dom[..dom.len().min(2000)]
        )
    }) + "<pre id=\"probe\">".len();
    let end = start + dom[start..].find("</pre>").expect("probe closed");
    let text = dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).expect("probe JSON")
}

#[test]
fn html_report_of_a_sweep_with_a_baseline_renders_in_chromium() {
    let _parallel = fixtures::parallel_lock();
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but no chromium is installed: .ci/run installs Debian's chromium"
        );
        eprintln!("skipped: no chromium installed (and CI is unset)");
        return;
    };
    let dir = TempDir::new("html-report");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 24, 20, None);

    // The baseline: a faster server. The replay: a slower one, so TTFT regresses.
    let fast = MockServer::start(&["--ttft", "5ms", "--itl", "4ms", "--tokens", "20"]);
    let baseline = dir.join("baseline.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &fast.url,
            "--concurrency",
            "2",
        ],
        Some(&baseline),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    drop(fast);

    let slow = MockServer::start(&["--ttft", "40ms", "--itl", "5ms", "--tokens", "20"]);
    let (html, json, md) = (
        dir.join("report.html"),
        dir.join("report.json"),
        dir.join("report.md"),
    );
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &slow.url,
            "--sweep-concurrency",
            "1,2,4",
            "--baseline",
            path_str(&baseline),
            "--fail-if",
            "llm.ttft-p95 > 100000",
            "--fail-if",
            "llm.ttft-p95.change > 20",
            "--report-html",
            path_str(&html),
            "--report-md",
            path_str(&md),
        ],
        Some(&json),
    );
    assert_eq!(
        out.code, 1,
        "the .change goal fails: {}\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("JSON report");

    // The series covers every level and accounts for every request each level answered.
    let timeline = report["timeline"].as_array().expect("timeline");
    for level in report["sweep"].as_array().expect("sweep") {
        let concurrency = &level["concurrency"];
        let points: Vec<_> = timeline
            .iter()
            .filter(|p| &p["concurrency"] == concurrency)
            .collect();
        assert!(!points.is_empty(), "no points for level {concurrency}");
        let succeeded: f64 = points.iter().map(|p| num(p, &["succeeded"])).sum();
        assert_eq!(
            succeeded,
            num(level, &["requests", "succeeded"]),
            "level {concurrency}: {timeline:#?}"
        );
        assert!(points.iter().any(|p| p["ttft_p95_ms"].is_number()));
    }
    assert!(
        timeline
            .windows(2)
            .all(|w| num(&w[0], &["t_s"]) < num(&w[1], &["t_s"])),
        "one time axis: {timeline:#?}"
    );
    assert_eq!(
        report["llm"]["cdf"]["ttft_ms"].as_array().map(Vec::len),
        Some(103)
    );

    let md_text = std::fs::read_to_string(&md).expect("markdown written");
    assert!(md_text.lines().count() < 60, "{md_text}");
    assert!(md_text.contains("### Concurrency sweep") && md_text.contains("### Regressions"));

    // The page itself: no network, no script.
    let page = std::fs::read_to_string(&html).expect("HTML written");
    assert!(
        !page.contains("<script") && !page.contains("src=") && !page.contains("href="),
        "self-contained"
    );
    let artifacts = artifact_dir();
    let kept = artifacts.join("report.html");
    std::fs::write(&kept, &page).expect("keep the report");

    let profile = dir.join("chromium-profile");
    // Light screenshot of the page as it is: Chromium logs nothing for it (it has no
    // script, so any console line is the browser reporting an error, e.g. a bad SVG path).
    let screenshot = artifacts.join("report.png");
    let _ = std::fs::remove_file(&screenshot);
    let (_, stderr) = headless(
        &chromium,
        &profile,
        &kept,
        &[
            "--window-size=1280,6000",
            &format!("--screenshot={}", screenshot.display()),
        ],
    );
    assert!(
        console_lines(&stderr).is_empty(),
        "console: {:#?}",
        console_lines(&stderr)
    );
    let png = std::fs::metadata(&screenshot).expect("screenshot written");
    assert!(png.len() > 20_000, "a real screenshot: {} bytes", png.len());

    // Dark scheme and print.
    let dark = artifacts.join("report-dark.png");
    headless(
        &chromium,
        &profile,
        &kept,
        &[
            "--window-size=1280,6000",
            "--force-dark-mode",
            "--blink-settings=preferredColorScheme=0",
            &format!("--screenshot={}", dark.display()),
        ],
    );
    assert!(dark.exists());
    let pdf = artifacts.join("report.pdf");
    headless(
        &chromium,
        &profile,
        &kept,
        &[
            "--no-pdf-header-footer",
            &format!("--print-to-pdf={}", pdf.display()),
        ],
    );
    assert!(std::fs::metadata(&pdf).expect("PDF written").len() > 10_000);

    // Measured in the browser: the probe's copy of the page.
    let measured = measure_in_browser(&chromium, &profile, &dir.join("probed.html"), &page, &PLOTS);
    assert_eq!(
        measured["problems"],
        serde_json::json!([]),
        "console errors or failed loads: {measured:#}"
    );
    for id in PLOTS {
        let plot = &measured["plots"][id];
        assert!(plot.is_object(), "{id} missing: {measured:#}");
        assert!(
            num(plot, &["width"]) > 300.0 && num(plot, &["height"]) > 100.0,
            "{id} is laid out: {plot}"
        );
        assert!(num(plot, &["marks"]) >= 1.0, "{id} draws data: {plot}");
    }
    // Three sweep levels, three knee points each.
    assert!(num(&measured["plots"]["plot-knee-ttft"], &["marks"]) >= 3.0);
    let regressions = measured["regressions"]
        .as_str()
        .expect("regressions callout");
    assert!(
        regressions.starts_with("callout bad:") && regressions.contains("Time to first token"),
        "{regressions}"
    );
}

/// Acceptance (issue 21): the HTML report of a real `--find-max` search draws the knee — the
/// goal's value at each probe against the load, with the limit and the answer — and renders
/// in Chromium without a console error.
#[test]
fn html_report_of_a_capacity_search_draws_the_knee_in_chromium() {
    let _parallel = fixtures::parallel_lock();
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have chromium installed (.ci/run installs it)"
        );
        eprintln!("skipped: no chromium installed");
        return;
    };
    let mock = MockServer::start(&[
        "--ttft",
        "20ms",
        "--itl",
        "5ms",
        "--tokens",
        "20",
        "--max-streams",
        "2",
    ]);
    let dir = TempDir::new("html-capacity");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 20, 20, None);
    let html = dir.join("report.html");
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--find-max",
            "concurrency",
            "--find-max-range",
            "1:8",
            "--requests",
            "30",
            "--fail-if",
            "llm.ttft-p95 > 60",
            "--report-html",
            path_str(&html),
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report");
    let probes = report["capacity"]["probes"]
        .as_array()
        .expect("probes")
        .len();
    let page = std::fs::read_to_string(&html).expect("html");
    assert!(
        !page.contains("<script") && !page.contains("src="),
        "self-contained"
    );
    let kept = artifact_dir().join("capacity.html");
    std::fs::write(&kept, &page).expect("keep the report");
    let profile = dir.join("chromium-profile");
    let screenshot = artifact_dir().join("capacity.png");
    let (_, stderr) = headless(
        &chromium,
        &profile,
        &kept,
        &[
            "--window-size=1280,4000",
            &format!("--screenshot={}", screenshot.display()),
        ],
    );
    assert!(
        console_lines(&stderr).is_empty(),
        "console: {:#?}",
        console_lines(&stderr)
    );
    let measured = measure_in_browser(
        &chromium,
        &profile,
        &dir.join("probed.html"),
        &page,
        &["plot-capacity-0"],
    );
    assert_eq!(measured["problems"], serde_json::json!([]), "{measured:#}");
    let plot = &measured["plots"]["plot-capacity-0"];
    assert!(plot.is_object(), "the knee chart is missing: {measured:#}");
    assert!(
        num(plot, &["width"]) > 300.0 && num(plot, &["height"]) > 100.0,
        "laid out: {plot}"
    );
    // The passing probes are discs (1 and 2 pass against two slots), plus the line joining
    // every probe.
    assert!(num(plot, &["marks"]) >= 3.0, "{probes} probes: {plot}");
}
