//! The container examples: `deploy/build-image.sh` builds the image from the binaries this
//! test run built, and `deploy/compose.yaml` runs end to end with Docker Compose, handing
//! back its reports on the host and the coordinator's exit code; the Kubernetes manifests in
//! `deploy/k8s/` parse and agree with each other (no cluster here to run them).
//!
//! The Compose test needs the engine on the machine (nothing is pulled: the image is built
//! on `scratch`). Without `docker` it says so on stderr and passes, except under `CI=true`,
//! where a missing `docker` fails it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fixtures::{Spawned, TempDir, num, parallel_lock, workspace_root};

/// The image's size limit for `docker image ls` (decimal megabytes, as docker prints): issue
/// 9's goal. `--tokenizer` (issue 23: the `tokenizers` crate and minijinja, in both binaries)
/// took the image to 46.8 MB; since issue 34 it carries one binary, `llm-replay`, which is
/// also the worker binary under the name `llm-replay-worker` (33.4 MB).
const IMAGE_SIZE_LIMIT_BYTES: u64 = 40_000_000;

/// The uid the image runs as (deploy/Dockerfile).
const IMAGE_UID: u32 = 65532;

#[test]
fn compose_example_hands_back_reports_and_the_coordinators_exit_code() {
    // Heavy (an image build, five containers) but timed by nothing: see `parallel_lock`.
    let _parallel = parallel_lock();
    let Some(compose) = container_tools() else {
        return;
    };
    let image = Image::build();

    // The report directory of the issue ("cannot write: Permission denied"): a host directory
    // the non-root coordinator may not write. The run stops before any load, and Compose
    // exits with the coordinator's code, 2.
    let closed = TempDir::new("compose-closed");
    set_mode(closed.path(), 0o755);
    let mut run = ComposeRun::start(&compose, &image, closed.path(), "closed");
    let (code, output) = run.wait(Duration::from_secs(180));
    assert_eq!(
        code, 2,
        "compose up should exit with the coordinator's 2:\n{output}"
    );
    assert!(output.contains("cannot write"), "{output}");
    drop(run);

    // A directory the coordinator's user can write (here world-writable; deploy/README.md
    // also shows running as yourself): the run succeeds and its reports land on the host.
    let reports = TempDir::new("compose-reports");
    set_mode(reports.path(), 0o777);
    let started = Instant::now();
    // With the sweep overlay: the two `--once` worker containers take every level of the
    // sweep on one join (issue 31: before, they left after the first level).
    let mut run = ComposeRun::start_with(
        &compose,
        &image,
        reports.path(),
        "open",
        Some(("deploy/compose.sweep.yaml", "2,4")),
    );
    let (code, output) = run.wait(Duration::from_secs(300));
    let wall = started.elapsed();
    eprintln!(
        "compose example: `up --exit-code-from coordinator` took {:.1} s",
        wall.as_secs_f64()
    );
    assert_eq!(code, 0, "compose up should exit 0:\n{output}");
    for name in ["report.json", "report.html", "report.md"] {
        let path = reports.join(name);
        let size = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{} is missing ({e}):\n{output}", path.display()))
            .len();
        assert!(size > 0, "{} is empty", path.display());
    }

    let text = std::fs::read_to_string(reports.join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&text).expect("report.json is JSON");
    let recorded = std::fs::read_to_string(workspace_root().join("examples/qwen3-sharegpt.jsonl"))
        .expect("the example recording")
        .lines()
        .filter(|line| !line.trim().is_empty())
        .count() as f64;
    assert_eq!(num(&report, &["requests", "total"]), recorded, "{report:#}");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        recorded,
        "{report:#}"
    );
    let workers = report["run"]["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("no run.workers: {report:#}"));
    assert_eq!(workers.len(), 2, "two worker containers: {report:#}");
    let completed: f64 = workers
        .iter()
        .map(|worker| num(worker, &["completed"]))
        .sum();
    assert_eq!(completed, recorded, "{report:#}");
    assert!(
        workers[0]["id"] != workers[1]["id"],
        "two distinct workers: {report:#}"
    );
    let levels = report["sweep"]
        .as_array()
        .unwrap_or_else(|| panic!("no sweep levels: {report:#}"));
    assert_eq!(levels.len(), 2, "both levels of the sweep: {report:#}");
    for level in levels {
        assert_eq!(
            num(level, &["requests", "succeeded"]),
            recorded,
            "every level replays the recording: {level:#}"
        );
    }
    let goals = report["goals"].as_array().expect("goals");
    assert!(
        !goals.is_empty() && goals.iter().all(|goal| goal["failed"] == false),
        "the example's goal holds: {report:#}"
    );
    let html = std::fs::read_to_string(reports.join("report.html")).expect("report.html");
    assert!(html.contains("<html"), "report.html is HTML");

    // Written by the image's non-root user (the host sees the container's uid unless the
    // engine maps uids: rootless or userns-remap).
    if !engine_maps_uids() {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(reports.join("report.json"))
            .expect("report.json")
            .uid();
        assert_eq!(owner, IMAGE_UID, "report.json written by uid {owner}");
    }

    drop(run);

    // The recording sidecar (issue 35): an application records through it, then what was
    // recorded is replayed.
    record_through_the_sidecar_then_replay(&compose, &image);
}

/// The image carries one binary: `llm-replay`, linked as `llm-replay-worker` (its
/// entrypoint, and the workers' command in Compose and Kubernetes). Under that name it
/// answers as the `llm-replay-worker` binary does — help, version, and the usage errors of a
/// missing and of a bad flag, byte for byte with the same exit code — and works as one: it
/// joins a coordinator and replays its slice.
#[test]
fn llm_replay_linked_as_the_worker_is_the_worker_binary() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("multi-call");
    let linked = dir.join("llm-replay-worker");
    std::os::unix::fs::symlink(fixtures::bin("llm-replay"), &linked).expect("symlink");
    let worker = fixtures::bin("llm-replay-worker");
    let answer = |program: &Path, args: &[&str]| {
        let output = Command::new(program)
            .args(args)
            .env_remove("LLM_REPLAY_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("the worker runs");
        (output.status.code(), output_text(&output))
    };
    let cases: [&[&str]; 4] = [
        &["--help"],
        &["--version"],
        &["--once"],
        &["--coordinator", "127.0.0.1:1", "--heartbeat-timeout", "0s"],
    ];
    let mut answers = Vec::new();
    for args in cases {
        let expected = answer(&worker, args);
        assert_eq!(answer(&linked, args), expected, "{args:?}");
        answers.push(expected);
    }
    // What was compared is the worker's own answer, not two identical failures.
    assert_eq!(answers[0].0, Some(0));
    assert!(
        answers[0].1.contains("Usage: llm-replay-worker"),
        "{}",
        answers[0].1
    );
    assert_eq!(answers[1].0, Some(0));
    assert!(
        answers[1].1.starts_with("llm-replay-worker "),
        "{}",
        answers[1].1
    );
    assert_eq!(answers[2].0, Some(2));
    assert!(answers[2].1.contains("--coordinator"), "{}", answers[2].1);
    assert_eq!(answers[3].0, Some(2));
    assert!(
        answers[3].1.contains("must be above zero"),
        "{}",
        answers[3].1
    );

    let mock = fixtures::MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "5"]);
    let recording = dir.join("rec.jsonl");
    fixtures::write_chat_recording(&recording, 8, 5, None);
    let report = dir.join("report.json");
    let (mut coordinator, addr) = fixtures::coordinator(
        &[
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--report-json",
            report.to_str().expect("utf-8 path"),
        ],
        1,
        &[],
    );
    let mut joined = Spawned::start(
        &linked,
        &["--coordinator", &addr, "--once", "--worker-id", "linked"],
        &[],
    );
    assert_eq!(
        joined.wait_timeout(Duration::from_secs(60)),
        Some(0),
        "{}",
        joined.stderr()
    );
    assert_eq!(
        coordinator.wait_timeout(Duration::from_secs(60)),
        Some(0),
        "{}",
        coordinator.stderr()
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report.json"))
            .expect("report.json is JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 8.0, "{report:#}");
    assert_eq!(report["run"]["workers"][0]["id"], "linked", "{report:#}");
}

#[test]
fn kubernetes_example_manifests_agree_with_each_other() {
    let _parallel = parallel_lock();
    let coordinator = manifests("deploy/k8s/coordinator.yaml");
    let workers = manifests("deploy/k8s/workers.yaml");
    let collect = manifests("deploy/k8s/collect.yaml");

    let service = of_kind(&coordinator, "Service");
    let claim = of_kind(&coordinator, "PersistentVolumeClaim");
    let coordinator_job = of_kind(&coordinator, "Job");
    let workers_job = of_kind(&workers, "Job");
    let collect_pod = of_kind(&collect, "Pod");

    // Workers dial the Service, which selects the coordinator's pod.
    let service_name = text(&service["metadata"]["name"]);
    let port = service["spec"]["ports"][0]["port"]
        .as_u64()
        .expect("service port");
    let pod = &coordinator_job["spec"]["template"];
    for (key, value) in service["spec"]["selector"]
        .as_mapping()
        .expect("service selector")
    {
        assert_eq!(
            &pod["metadata"]["labels"][key], value,
            "the Service selects the coordinator's pod"
        );
    }
    let worker_container = &workers_job["spec"]["template"]["spec"]["containers"][0];
    let worker_args = strings(&worker_container["args"]);
    assert_eq!(
        flag(&worker_args, "--coordinator"),
        Some(format!("{service_name}:{port}")),
        "workers dial the Service: {worker_args:?}"
    );
    assert!(
        worker_args.iter().any(|a| a == "--once"),
        "a Job's worker runs once"
    );

    // The coordinator listens on the Service's port, waits for the workers Job's pods, and
    // writes its reports on the claim that the collect pod mounts.
    let container = &pod["spec"]["containers"][0];
    let args = strings(&container["args"]);
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    assert_eq!(
        flag(&args, "--listen"),
        Some(format!("0.0.0.0:{port}")),
        "{args:?}"
    );
    let parallelism = workers_job["spec"]["parallelism"]
        .as_u64()
        .expect("parallelism");
    assert_eq!(
        workers_job["spec"]["completions"].as_u64(),
        Some(parallelism)
    );
    assert_eq!(
        flag(&args, "--expect-workers"),
        Some(parallelism.to_string()),
        "{args:?}"
    );
    assert_eq!(pod["spec"]["restartPolicy"].as_str(), Some("Never"));
    let claim_name = text(&claim["metadata"]["name"]);
    let reports_dir = mount_of_claim(&pod["spec"], container, &claim_name)
        .expect("the coordinator mounts the report claim");
    for report_flag in ["--report-json", "--report-html", "--report-md"] {
        let path = flag(&args, report_flag).unwrap_or_else(|| panic!("no {report_flag}"));
        assert!(
            Path::new(&path).starts_with(&reports_dir),
            "{report_flag} {path} is not on the claim mounted at {reports_dir}"
        );
    }
    let collect_container = &collect_pod["spec"]["containers"][0];
    assert_eq!(
        mount_of_claim(&collect_pod["spec"], collect_container, &claim_name).as_deref(),
        Some("/reports"),
        "the collect pod mounts the claim where deploy/k8s/run-ci.sh copies from"
    );
    let script = std::fs::read_to_string(workspace_root().join("deploy/k8s/run-ci.sh"))
        .expect("deploy/k8s/run-ci.sh");
    assert!(
        script.contains("llm-replay-collect:/reports/"),
        "run-ci.sh copies the reports"
    );

    // Both run as the image's non-root user.
    for spec in [&pod["spec"], &workers_job["spec"]["template"]["spec"]] {
        assert_eq!(
            spec["securityContext"]["runAsUser"].as_u64(),
            Some(u64::from(IMAGE_UID))
        );
    }
}

#[test]
fn compose_example_writes_reports_to_a_host_volume() {
    let _parallel = parallel_lock();
    let compose = manifests("deploy/compose.yaml");
    let services = &compose[0]["services"];
    let coordinator = &services["coordinator"];
    let args = strings(&coordinator["entrypoint"]);
    let volumes = strings(&coordinator["volumes"]);
    for report_flag in ["--report-json", "--report-html", "--report-md"] {
        let path = flag(&args, report_flag).unwrap_or_else(|| panic!("no {report_flag}"));
        assert!(
            volumes
                .iter()
                .filter_map(|volume| mount_target(volume))
                .any(|mounted| Path::new(&path).starts_with(mounted)),
            "{report_flag} {path} is not on a host volume: {volumes:?}"
        );
    }
    let worker = &services["worker"];
    assert_eq!(
        flag(&args, "--expect-workers"),
        worker["deploy"]["replicas"].as_u64().map(|n| n.to_string())
    );
    // The coordinator runs as the image's non-root user unless told otherwise.
    assert_eq!(
        coordinator["user"].as_str(),
        Some(format!("${{LLM_REPLAY_USER:-{IMAGE_UID}:{IMAGE_UID}}}").as_str())
    );
}

/// deploy/compose.record.yaml end to end: the application (`llm-replay run` of the example)
/// calls the mock through the recording sidecar, which starts once its own readiness
/// endpoint says the upstream answered; `up --exit-code-from app` stops the recorder, which
/// closes its gzip file; `run --rm replay` replays the directory against the mock.
fn record_through_the_sidecar_then_replay(compose: &[String], image: &Image) {
    let recordings = TempDir::new("compose-recordings");
    let reports = TempDir::new("compose-replay-reports");
    // Written by the image's non-root user.
    set_mode(recordings.path(), 0o777);
    set_mode(reports.path(), 0o777);
    let project = format!("llm-replay-test-{}-{}-record", std::process::id(), unique());
    let file = workspace_root().join("deploy/compose.record.yaml");
    let env = [
        ("LLM_REPLAY_IMAGE", image.tag.as_str()),
        (
            "LLM_REPLAY_RECORDINGS",
            recordings.path().to_str().expect("utf-8 temp path"),
        ),
        (
            "LLM_REPLAY_REPORTS",
            reports.path().to_str().expect("utf-8 temp path"),
        ),
        ("LLM_REPLAY_USER", ""),
    ];
    let overlays = TempDir::new("compose-record-overlay");
    let fast = fast_mock_overlay(&overlays, "deploy/compose.record.yaml", "upstream");
    let compose_step = |step: &[&str], patience: Duration| -> (i32, String) {
        let mut args: Vec<&str> = compose[1..].iter().map(String::as_str).collect();
        args.extend(["-p", &project, "-f", file.to_str().expect("utf-8 path")]);
        args.extend(["-f", fast.to_str().expect("utf-8 path")]);
        args.extend_from_slice(step);
        let mut process = Spawned::start(Path::new(&compose[0]), &args, &env);
        let code = process.wait_timeout(patience).unwrap_or(-1);
        let output = format!("{}{}", process.stdout(), process.stderr());
        process.kill();
        (code, output)
    };
    let down = || {
        compose_step(
            &["down", "-v", "--remove-orphans", "-t", "1"],
            Duration::from_secs(60),
        )
    };

    let (code, output) = compose_step(&["up", "--exit-code-from", "app"], Duration::from_secs(240));
    if code != 0 {
        down();
        panic!("recording through the sidecar should exit 0, got {code}:\n{output}");
    }
    let files: Vec<PathBuf> = std::fs::read_dir(recordings.path())
        .expect("the recordings directory")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    assert!(
        !files.is_empty()
            && files.iter().all(|f| {
                let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("recording-") && name.ends_with(".jsonl.gz")
            }),
        "rotated gzip recordings: {files:?}\n{output}"
    );
    let recorded = std::fs::read_to_string(workspace_root().join("examples/qwen3-sharegpt.jsonl"))
        .expect("the example recording")
        .lines()
        .filter(|line| !line.trim().is_empty())
        .count() as f64;
    // Closed cleanly on SIGTERM: every exchange the application sent is in it, readable.
    let stats = fixtures::llm_replay(
        &[
            "recording",
            "stats",
            recordings.path().to_str().expect("utf-8"),
            "--json",
        ],
        None,
    );
    assert_eq!(stats.code, 0, "{}", stats.stderr);
    let stats: serde_json::Value = serde_json::from_str(&stats.stdout).expect("stats JSON");
    assert_eq!(num(&stats, &["exchanges"]), recorded, "{stats:#}\n{output}");
    assert_eq!(num(&stats, &["complete_responses"]), recorded, "{stats:#}");

    let (code, output) = compose_step(&["run", "--rm", "replay"], Duration::from_secs(180));
    down();
    assert_eq!(
        code, 0,
        "the replay of the recording should exit 0:\n{output}"
    );
    let text = std::fs::read_to_string(reports.join("replay.json")).expect("replay.json");
    let report: serde_json::Value = serde_json::from_str(&text).expect("replay.json is JSON");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        recorded,
        "{report:#}"
    );
}

/// The recording sidecar's manifests agree with each other: the application's base URL is
/// the sidecar's listener, the probes ask its health port, it writes on the claim the
/// collect pod mounts; in Compose, the application and the health check reach the same
/// ports and the replay reads what the recorder wrote.
#[test]
fn recording_sidecar_manifests_agree_with_each_other() {
    let _parallel = parallel_lock();
    let patch = &manifests("deploy/k8s/recorder-sidecar.yaml")[0];
    let recordings = manifests("deploy/k8s/recordings.yaml");
    let pod_spec = &patch["spec"]["template"]["spec"];
    let containers = pod_spec["containers"].as_sequence().expect("containers");
    let named = |name: &str| {
        containers
            .iter()
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no container {name}"))
    };
    let (app, recorder) = (named("app"), named("llm-replay-recorder"));
    let args = strings(&recorder["args"]);
    assert_eq!(args.first().map(String::as_str), Some("record"), "{args:?}");
    let listen = flag(&args, "--listen").expect("--listen");
    let base_url = app["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some("OPENAI_BASE_URL"))
        .map(|e| text(&e["value"]))
        .expect("OPENAI_BASE_URL");
    assert!(
        base_url.starts_with(&format!("http://{listen}/")),
        "{base_url} is not the sidecar's {listen}"
    );
    let health = flag(&args, "--health-listen").expect("--health-listen");
    let health_port: u64 = health
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(
            recorder[probe]["httpGet"]["port"].as_u64(),
            Some(health_port),
            "{probe}"
        );
        assert_eq!(
            recorder[probe]["httpGet"]["path"].as_str(),
            Some(path),
            "{probe}"
        );
    }
    assert!(recorder["resources"]["limits"]["memory"].as_str().is_some());
    let claim = of_kind(&recordings, "PersistentVolumeClaim");
    let claim_name = text(&claim["metadata"]["name"]);
    let mounted = mount_of_claim(pod_spec, recorder, &claim_name).expect("the claim is mounted");
    let out = flag(&args, "--out").expect("--out");
    assert!(
        out.ends_with('/') && Path::new(&out).starts_with(&mounted),
        "{out} on {mounted}"
    );
    let collect = of_kind(&recordings, "Pod");
    let collect_container = &collect["spec"]["containers"][0];
    assert!(
        mount_of_claim(&collect["spec"], collect_container, &claim_name).is_some(),
        "the collect pod mounts the recordings"
    );
    // The drain fits in the grace period.
    let drain: u64 = flag(&args, "--drain")
        .and_then(|d| d.trim_end_matches('s').parse().ok())
        .expect("--drain in seconds");
    assert!(pod_spec["terminationGracePeriodSeconds"].as_u64() > Some(drain));

    let compose = &manifests("deploy/compose.record.yaml")[0]["services"];
    let recorder = strings(&compose["recorder"]["entrypoint"]);
    let listen_port =
        flag(&recorder, "--listen").and_then(|l| l.rsplit(':').next().map(str::to_owned));
    let app = strings(&compose["app"]["entrypoint"]);
    assert_eq!(
        flag(&app, "--target"),
        listen_port.map(|port| format!("http://recorder:{port}"))
    );
    let health = flag(&recorder, "--health-listen").expect("--health-listen");
    let check = strings(&compose["recorder"]["healthcheck"]["test"]);
    assert!(
        check.iter().any(|a| a.ends_with(&format!(
            ":{}/readyz",
            health.rsplit(':').next().expect("port")
        ))),
        "{check:?}"
    );
    let out = flag(&recorder, "--out").expect("--out");
    let replay = strings(&compose["replay"]["entrypoint"]);
    assert_eq!(replay.get(2).map(|d| format!("{d}/")), Some(out));
}

/// The Compose command (`docker compose` or `docker-compose`), or `None` when `docker` is
/// not installed and this is not CI (the test then passes, saying loudly that it skipped).
fn container_tools() -> Option<Vec<String>> {
    if !succeeds(&["docker", "--version"]) {
        let in_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        assert!(
            !in_ci,
            "CI=true but `docker` is not installed: the container test cannot run"
        );
        eprintln!(
            "\n*** SKIPPED compose_example_hands_back_reports_and_the_coordinators_exit_code: \
             `docker` is not installed (under CI=true this fails) ***\n"
        );
        return None;
    }
    if succeeds(&["docker", "compose", "version"]) {
        return Some(vec!["docker".into(), "compose".into()]);
    }
    assert!(
        succeeds(&["docker-compose", "version"]),
        "docker is installed but neither `docker compose` nor `docker-compose` is"
    );
    Some(vec!["docker-compose".into()])
}

fn succeeds(command: &[&str]) -> bool {
    Command::new(command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Whether the engine maps container uids to others on the host (rootless, userns-remap).
fn engine_maps_uids() -> bool {
    let output = Command::new("docker")
        .args(["info", "--format", "{{json .SecurityOptions}}"])
        .output()
        .expect("docker info runs");
    let options = String::from_utf8_lossy(&output.stdout);
    options.contains("rootless") || options.contains("userns")
}

/// An image built by `deploy/build-image.sh` under a tag of its own, removed on drop.
struct Image {
    tag: String,
}

impl Image {
    /// Build from the binary of this test run (`--prebuilt`: the script runs no cargo, so it
    /// cannot rebuild anything with other features), and check its size, its user, and that
    /// its entrypoint `llm-replay-worker` is the worker binary.
    fn build() -> Image {
        let worker = fixtures::bin("llm-replay-worker");
        let bin_dir = worker.parent().expect("a binary lives in a directory");
        let coordinator = fixtures::bin("llm-replay");
        assert!(
            coordinator.parent() == Some(bin_dir),
            "LLM_REPLAY_BIN points elsewhere: the image takes its binary from {}",
            bin_dir.display()
        );
        let image = Image {
            tag: format!("llm-replay:test-{}-{}", std::process::id(), unique()),
        };
        let output = Command::new(workspace_root().join("deploy/build-image.sh"))
            .arg("--prebuilt")
            .arg(bin_dir)
            .arg(&image.tag)
            .stdin(Stdio::null())
            .output()
            .expect("deploy/build-image.sh runs");
        assert!(
            output.status.success(),
            "deploy/build-image.sh failed:\n{}",
            output_text(&output)
        );
        eprintln!("{}", output_text(&output).trim());

        let inspect = Command::new("docker")
            .args(["image", "inspect", "-f", "{{.Size}} {{.Config.User}}"])
            .arg(&image.tag)
            .output()
            .expect("docker image inspect runs");
        let inspected = String::from_utf8_lossy(&inspect.stdout).into_owned();
        let mut fields = inspected.split_whitespace();
        let size: u64 = fields
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no size in {inspected:?}"));
        assert_eq!(
            fields.next(),
            Some(format!("{IMAGE_UID}:{IMAGE_UID}").as_str())
        );
        // Issue 9's goal holds for release binaries (the ones shipped); a debug build's are
        // several times larger.
        if !cfg!(debug_assertions) {
            assert!(
                size <= IMAGE_SIZE_LIMIT_BYTES,
                "the image is {size} bytes, over {IMAGE_SIZE_LIMIT_BYTES}"
            );
        }
        // The entrypoint, `llm-replay-worker` (a link to `llm-replay`), answers as the worker
        // binary does on the host.
        let in_image = Command::new("docker")
            .args(["run", "--rm", &image.tag, "--help"])
            .stdin(Stdio::null())
            .output()
            .expect("docker run");
        let on_host = Command::new(&worker)
            .arg("--help")
            .output()
            .expect("llm-replay-worker --help");
        assert!(in_image.status.success(), "{}", output_text(&in_image));
        assert_eq!(output_text(&in_image), output_text(&on_host));
        image
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", &self.tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// One `compose up --exit-code-from coordinator` of deploy/compose.yaml under a project
/// name of its own; `down -v` on drop, whatever happened.
struct ComposeRun {
    compose: Vec<String>,
    project: String,
    env: Vec<(String, String)>,
    process: Spawned,
    /// Where the fast mock's overlay lives while the run reads it.
    _overlays: TempDir,
}

impl ComposeRun {
    fn start(compose: &[String], image: &Image, reports: &Path, tag: &str) -> ComposeRun {
        ComposeRun::start_with(compose, image, reports, tag, None)
    }

    /// The same with an overlay: a Compose file (relative to the workspace) on top of
    /// deploy/compose.yaml, and the `LLM_REPLAY_SWEEP` it reads.
    fn start_with(
        compose: &[String],
        image: &Image,
        reports: &Path,
        tag: &str,
        overlay: Option<(&str, &str)>,
    ) -> ComposeRun {
        let project = format!("llm-replay-test-{}-{}-{tag}", std::process::id(), unique());
        let env = vec![
            ("LLM_REPLAY_IMAGE".to_owned(), image.tag.clone()),
            (
                "LLM_REPLAY_REPORTS".to_owned(),
                reports.to_str().expect("utf-8 temp path").to_owned(),
            ),
            (
                "LLM_REPLAY_TOKEN".to_owned(),
                format!("test-token-{project}"),
            ),
            // Empty = the compose file's default, the image's non-root user.
            ("LLM_REPLAY_USER".to_owned(), String::new()),
            // The example's 20 s schedule in 5: the test is about the hand-back, not the
            // timing.
            ("LLM_REPLAY_SPEED".to_owned(), "4".to_owned()),
        ];
        let mut env = env;
        let mut args = compose_args(compose, &project);
        if let Some((file, sweep)) = overlay {
            env.push(("LLM_REPLAY_SWEEP".to_owned(), sweep.to_owned()));
            args.extend([
                "-f".to_owned(),
                workspace_root()
                    .join(file)
                    .to_str()
                    .expect("utf-8 path")
                    .to_owned(),
            ]);
        }
        let overlays = TempDir::new("compose-overlay");
        let fast = fast_mock_overlay(&overlays, "deploy/compose.yaml", "mock");
        args.extend([
            "-f".to_owned(),
            fast.to_str().expect("utf-8 path").to_owned(),
        ]);
        args.extend(["up", "--exit-code-from", "coordinator"].map(String::from));
        let env_refs: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = Spawned::start(Path::new(&compose[0]), &arg_refs, &env_refs);
        ComposeRun {
            compose: compose.to_vec(),
            project,
            env,
            process,
            _overlays: overlays,
        }
    }

    /// The exit code of `compose up` (-1 when it did not end within `patience`) and
    /// everything it printed.
    fn wait(&mut self, patience: Duration) -> (i32, String) {
        let code = self.process.wait_timeout(patience).unwrap_or(-1);
        let output = format!("{}{}", self.process.stdout(), self.process.stderr());
        (code, output)
    }
}

fn compose_args(compose: &[String], project: &str) -> Vec<String> {
    let mut args: Vec<String> = compose[1..].to_vec();
    args.extend(["-p".to_owned(), project.to_owned()]);
    args.extend([
        "-f".to_owned(),
        workspace_root()
            .join("deploy/compose.yaml")
            .to_str()
            .expect("utf-8 path")
            .to_owned(),
    ]);
    args
}

impl Drop for ComposeRun {
    fn drop(&mut self) {
        self.process.kill();
        let mut args = compose_args(&self.compose, &self.project);
        args.extend(["down", "-v", "--remove-orphans", "-t", "1"].map(String::from));
        let _ = Command::new(&self.compose[0])
            .args(&args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The mock's timing in the test's Compose runs: the example's responses are 200 tokens,
/// which the shipped mocks (100 ms + 200 × 10 ms in deploy/compose.yaml, 50 ms + 200 × 5 ms
/// in deploy/compose.record.yaml) stream in 2.1 and 1.05 s; at 10 ms + 200 × 1 ms each
/// takes 0.21 s, so the 25 requests of a level at 2 streams take under 3 s instead of 27 s.
/// The tests are about the hand-back, not the timing.
const FAST_MOCK: [(&str, &str); 2] = [("--ttft", "10ms"), ("--itl", "1ms")];

/// A Compose overlay, written to `dir`, that gives `service` of the shipped `file` (relative
/// to the workspace) the entrypoint it ships with but [`FAST_MOCK`]'s timing. JSON, which
/// Compose reads as YAML.
fn fast_mock_overlay(dir: &TempDir, file: &str, service: &str) -> PathBuf {
    let shipped = &manifests(file)[0]["services"][service];
    let mut entrypoint = strings(&shipped["entrypoint"]);
    for (name, value) in FAST_MOCK {
        let at = entrypoint
            .iter()
            .position(|arg| arg == name)
            .unwrap_or_else(|| panic!("{file}: {service} has no {name}: {entrypoint:?}"));
        entrypoint[at + 1] = value.to_owned();
    }
    let overlay = serde_json::json!({ "services": { service: { "entrypoint": entrypoint } } });
    let path = dir.join(&format!("fast-{service}.json"));
    std::fs::write(&path, overlay.to_string()).expect("write the overlay");
    path
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Every YAML document of a file of the repository (split at `---` lines).
fn manifests(relative: &str) -> Vec<serde_yaml::Value> {
    let path: PathBuf = workspace_root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{relative}: {e}"));
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            documents.push(String::new());
        } else if let Some(document) = documents.last_mut() {
            document.push_str(line);
            document.push('\n');
        }
    }
    documents
        .iter()
        .map(|document| {
            serde_yaml::from_str(document)
                .unwrap_or_else(|e| panic!("{relative} does not parse: {e}"))
        })
        .filter(|document: &serde_yaml::Value| !document.is_null())
        .collect()
}

fn of_kind<'a>(documents: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
    documents
        .iter()
        .find(|document| document["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} among the documents"))
}

fn text(value: &serde_yaml::Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("expected a string, found {value:?}"))
        .to_owned()
}

fn strings(value: &serde_yaml::Value) -> Vec<String> {
    value
        .as_sequence()
        .unwrap_or_else(|| panic!("expected a list, found {value:?}"))
        .iter()
        .map(text)
        .collect()
}

/// The value following `name` in an argument list.
fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1))
        .cloned()
}

/// The container path of a short-syntax Compose volume, `SOURCE:TARGET[:MODE]` (the
/// source may hold `${VAR:-default}`).
fn mount_target(volume: &str) -> Option<&str> {
    let volume = volume
        .strip_suffix(":ro")
        .or_else(|| volume.strip_suffix(":rw"))
        .unwrap_or(volume);
    volume.rsplit_once(':').map(|(_, target)| target)
}

/// Where `container` mounts the pod volume backed by the claim `claim`.
fn mount_of_claim(
    pod_spec: &serde_yaml::Value,
    container: &serde_yaml::Value,
    claim: &str,
) -> Option<String> {
    let volume = pod_spec["volumes"]
        .as_sequence()?
        .iter()
        .find(|volume| volume["persistentVolumeClaim"]["claimName"].as_str() == Some(claim))?;
    let volume_name = volume["name"].as_str()?;
    container["volumeMounts"]
        .as_sequence()?
        .iter()
        .find(|mount| mount["name"].as_str() == Some(volume_name))
        .and_then(|mount| mount["mountPath"].as_str())
        .map(str::to_owned)
}
