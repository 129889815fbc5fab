//! `llm-replay record` with several upstreams (issue 35, item 5), real processes on real
//! sockets: two real mocks behind one recorder routed by path prefix (each request reaches
//! its mock with the prefix stripped, as the mocks' own request logs show; each recorded
//! exchange names its upstream; `recording stats` counts them; `recording filter` keeps one
//! upstream's exchanges, which replay against that mock alone), routing by Host (a client
//! resolving a provider's host name to the proxy), the longest prefix winning, a request no
//! route takes (a 404 from the proxy naming the routes, counted as `no_route`, forwarded
//! nowhere and not recorded), readiness waiting for every upstream, and bad `--upstream`
//! values as usage errors.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fixtures::{MockServer, TempDir, eventually, llm_replay, num, parallel_lock};
use serde_json::{Value, json};

use crate::capture::{Recorder, stats_json};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A free loopback port (bound, then let go).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

/// A mock that logs every request it gets (`--request-log`): the truth of where requests went.
fn logged_mock(log: &Path) -> MockServer {
    MockServer::start(&[
        "--ttft",
        "0ms",
        "--itl",
        "0ms",
        "--tokens",
        "6",
        "--request-log",
        path_str(log),
    ])
}

/// The paths a mock's request log holds, in arrival order.
fn logged_paths(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| entry.get("event").is_none())
        .filter_map(|entry| entry["path"].as_str().map(str::to_owned))
        .collect()
}

fn openai_body(i: usize) -> String {
    json!({
        "model": "mock-model",
        "stream": true,
        "max_tokens": 6,
        "messages": [{"role": "user", "content": format!("openai question {i}")}],
    })
    .to_string()
}

fn anthropic_body(i: usize) -> String {
    json!({
        "model": "mock-claude",
        "stream": true,
        "max_tokens": 6,
        "messages": [{"role": "user", "content": format!("anthropic question {i}")}],
    })
    .to_string()
}

/// POST `body` to `url`: the status and the whole body.
async fn post(client: &reqwest::Client, url: &str, body: String) -> (u16, String) {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: no answer: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// GET `http://ADDR/PATH`: status and body.
fn get(address: &str, path: &str) -> (u16, String) {
    runtime().block_on(async {
        match reqwest::get(format!("http://{address}{path}")).await {
            Ok(response) => {
                let status = response.status().as_u16();
                (status, response.text().await.unwrap_or_default())
            }
            Err(error) => (0, error.to_string()),
        }
    })
}

/// A Prometheus sample's value (`name{labels} value`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("readable")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

/// `llm-replay run RECORDING --target URL` as fast as it goes: the report.
fn replay(recording: &Path, target: &str, dir: &TempDir, requests: usize) -> Value {
    let report = dir.join(&format!("report-{requests}.json"));
    let requests = requests.to_string();
    let out = llm_replay(
        &[
            "run",
            path_str(recording),
            "--target",
            target,
            "--schedule",
            "asap",
            "--concurrency",
            "2",
            "--requests",
            &requests,
        ],
        Some(&report),
    );
    assert_eq!(out.code, 0, "run: {}\n{}", out.stdout, out.stderr);
    out.report.expect("report JSON")
}

#[test]
fn two_providers_behind_one_recorder_by_prefix_are_recorded_and_replayed_per_upstream() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("capture-upstreams-prefix");
    let (openai_log, anthropic_log) = (dir.join("openai.log"), dir.join("anthropic.log"));
    let openai = logged_mock(&openai_log);
    let anthropic = logged_mock(&anthropic_log);
    let out = dir.join("recorded.jsonl");
    let health = free_address();
    let recorder = Recorder::start(
        &format!("/openai={}", openai.url),
        &out,
        &[
            "--upstream",
            &format!("/anthropic={}", anthropic.url),
            "--health-listen",
            &health,
        ],
    );
    let proxy = recorder.url.clone();
    let (answers, unrouted) = runtime().block_on(async {
        let client = reqwest::Client::new();
        let mut answers = Vec::new();
        for i in 0..3 {
            let url = format!("{proxy}/openai/v1/chat/completions");
            answers.push(("openai", post(&client, &url, openai_body(i)).await));
        }
        for i in 0..2 {
            let url = format!("{proxy}/anthropic/v1/messages");
            answers.push(("anthropic", post(&client, &url, anthropic_body(i)).await));
        }
        // No route takes it (no default): the proxy answers.
        let url = format!("{proxy}/v1/chat/completions?api-key=secret");
        (answers, post(&client, &url, openai_body(9)).await)
    });
    for (family, (status, body)) in &answers {
        assert_eq!(*status, 200, "{family}: {body}");
        let end = if *family == "openai" {
            "data: [DONE]"
        } else {
            "message_stop"
        };
        assert!(body.contains(end), "{family}: a whole stream: {body}");
    }
    // Each request reached its own mock, the prefix stripped; the unrouted one reached none.
    assert_eq!(logged_paths(&openai_log), ["/v1/chat/completions"; 3]);
    assert_eq!(logged_paths(&anthropic_log), ["/v1/messages"; 2]);
    let (status, body) = unrouted;
    assert_eq!(status, 404, "{body}");
    for named in [
        "no upstream route",
        "\"/v1/chat/completions\"",
        &format!("/openai → {}", openai.url),
        &format!("/anthropic → {}", anthropic.url),
    ] {
        assert!(body.contains(named), "the 404 must name {named:?}: {body}");
    }
    assert!(!body.contains("secret"), "the query is not echoed: {body}");

    let (status, metrics) = get(&health, "/metrics");
    assert_eq!(status, 200);
    for (series, value) in [
        (
            r#"llm_replay_record_upstream_responses_total{upstream="openai",class="2xx"}"#,
            3.0,
        ),
        (
            r#"llm_replay_record_upstream_responses_total{upstream="anthropic",class="2xx"}"#,
            2.0,
        ),
        (
            r#"llm_replay_record_upstream_responses_total{upstream="anthropic",class="none"}"#,
            0.0,
        ),
        (
            r#"llm_replay_record_requests_refused_total{reason="no_route"}"#,
            1.0,
        ),
        ("llm_replay_record_exchanges_seen_total", 5.0),
        ("llm_replay_record_ready", 1.0),
    ] {
        assert_eq!(metric(&metrics, series), value, "{series}");
    }
    assert_eq!(get(&health, "/readyz").0, 200);
    recorder.stop();

    let lines = read_lines(&out);
    assert_eq!(lines.len(), 5, "the unrouted request is not recorded");
    for exchange in &lines {
        let path = exchange["request"]["path"].as_str().expect("a path");
        let (name, url) = match path {
            "/v1/chat/completions" => ("openai", &openai.url),
            "/v1/messages" => ("anthropic", &anthropic.url),
            other => panic!("recorded path {other:?}: the prefix must be stripped"),
        };
        assert_eq!(
            exchange["upstream"],
            json!({"name": name, "url": url}),
            "{exchange}"
        );
        assert_eq!(exchange["response"]["complete"], Value::Bool(true));
    }
    let stats = stats_json(&out);
    assert_eq!(stats["upstreams"], json!({"anthropic": 2, "openai": 3}));

    // One upstream's exchanges, replayed against that mock alone.
    for (name, mock, log, count, path) in [
        ("openai", &openai, &openai_log, 3, "/v1/chat/completions"),
        ("anthropic", &anthropic, &anthropic_log, 2, "/v1/messages"),
    ] {
        let filtered = dir.join(&format!("{name}.jsonl"));
        let run = llm_replay(
            &[
                "recording",
                "filter",
                path_str(&out),
                "--upstream",
                name,
                "-o",
                path_str(&filtered),
            ],
            None,
        );
        assert_eq!(run.code, 0, "filter: {}{}", run.stdout, run.stderr);
        assert_eq!(read_lines(&filtered).len(), count, "{name}");
        let report = replay(&filtered, &mock.url, &dir, count);
        assert_eq!(
            num(&report, &["requests", "succeeded"]),
            count as f64,
            "{report:#}"
        );
        assert_eq!(logged_paths(log), vec![path; 2 * count], "{name}");
    }
}

#[test]
fn host_routes_the_longest_prefix_and_readiness_waiting_for_every_upstream() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("capture-upstreams-host");
    let logs: Vec<_> = ["short", "long", "host"]
        .iter()
        .map(|n| dir.join(n))
        .collect();
    let mocks: Vec<MockServer> = logs.iter().map(|log| logged_mock(log)).collect();
    // Nothing listens there: /readyz names it until it answers.
    let dead = free_address();
    let out = dir.join("recorded.jsonl");
    let health = free_address();
    let recorder = Recorder::start(
        &format!("/openai={}", mocks[0].url),
        &out,
        &[
            "--upstream",
            &format!("/openai/special/={}/v1", mocks[1].url),
            "--upstream",
            &format!("API.Provider.test={}", mocks[2].url),
            "--upstream",
            &format!("/dead=http://{dead}"),
            "--health-listen",
            &health,
        ],
    );
    let proxy: SocketAddr = recorder
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("the proxy's address");
    let statuses = runtime().block_on(async {
        // A client that uses the proxy as the provider's base URL under the provider's name.
        let client = reqwest::Client::builder()
            .resolve("api.provider.test", proxy)
            .build()
            .expect("client");
        let port = proxy.port();
        let mut statuses = Vec::new();
        for url in [
            format!("{}/openai/v1/chat/completions", recorder.url),
            format!("{}/openai/special/chat/completions", recorder.url),
            format!("{}/openaix/v1/chat/completions", recorder.url),
            format!("http://api.provider.test:{port}/openai/v1/chat/completions"),
        ] {
            statuses.push(post(&client, &url, openai_body(0)).await.0);
        }
        statuses
    });
    assert_eq!(statuses, [200, 200, 404, 200]);
    assert_eq!(logged_paths(&logs[0]), ["/v1/chat/completions"]);
    // The longer prefix won and was stripped; the upstream URL's own path went before it.
    assert_eq!(logged_paths(&logs[1]), ["/v1/chat/completions"]);
    // By Host: the path forwarded whole.
    assert_eq!(logged_paths(&logs[2]), ["/openai/v1/chat/completions"]);

    // Every upstream but the dead one was reached: not ready, naming it alone.
    let mut readyz = (0, String::new());
    assert!(
        eventually(Duration::from_secs(10), || {
            readyz = get(&health, "/readyz");
            readyz.1.contains("dead")
        }),
        "{readyz:?}"
    );
    assert_eq!(readyz.0, 503, "{readyz:?}");
    assert!(readyz.1.contains(&dead), "{readyz:?}");
    for reached in ["openai", "api.provider.test"] {
        assert!(!readyz.1.contains(&format!("{reached} (")), "{readyz:?}");
    }
    let (_, metrics) = get(&health, "/metrics");
    assert_eq!(
        metric(
            &metrics,
            r#"llm_replay_record_upstream_ready{upstream="dead"}"#
        ),
        0.0
    );
    assert_eq!(
        metric(
            &metrics,
            r#"llm_replay_record_upstream_ready{upstream="openai/special"}"#
        ),
        1.0
    );
    assert_eq!(metric(&metrics, "llm_replay_record_ready"), 0.0);
    recorder.stop();

    let names: Vec<(String, String)> = read_lines(&out)
        .iter()
        .map(|e| {
            (
                e["upstream"]["name"]
                    .as_str()
                    .unwrap_or("(none)")
                    .to_owned(),
                e["request"]["path"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(
        names,
        [
            (
                "api.provider.test".into(),
                "/openai/v1/chat/completions".into()
            ),
            ("openai".into(), "/v1/chat/completions".into()),
            ("openai/special".into(), "/chat/completions".into()),
        ]
    );
}

#[test]
fn bad_upstream_values_are_usage_errors_naming_the_value() {
    let dir = TempDir::new("capture-upstreams-usage");
    let out = dir.join("never.jsonl");
    for (upstreams, named, why) in [
        (
            vec!["/a=http://127.0.0.1:1", "/a/=http://127.0.0.1:2"],
            "/a/=http://127.0.0.1:2",
            "same path prefix twice",
        ),
        (
            vec!["http://127.0.0.1:1", "http://127.0.0.1:2"],
            "http://127.0.0.1:2",
            "second default",
        ),
        (
            vec!["/=http://127.0.0.1:1"],
            "/=http://127.0.0.1:1",
            "empty path prefix",
        ),
        (
            vec!["/a=ftp://x"],
            "/a=ftp://x",
            "expected http:// or https://",
        ),
        (vec!["provider"], "provider", "expected a URL"),
    ] {
        let mut args = vec!["record", "--listen", "127.0.0.1:0", "--out", path_str(&out)];
        for upstream in &upstreams {
            args.extend(["--upstream", upstream]);
        }
        let run = llm_replay(&args, None);
        assert_eq!(run.code, 2, "{upstreams:?}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains(named) && run.stderr.contains(why),
            "{upstreams:?}: the error must name {named:?} and say {why:?}: {}",
            run.stderr
        );
        assert!(!out.exists(), "{upstreams:?}: nothing written");
    }
}
