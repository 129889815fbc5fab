//! Server metrics through a load balancer (issue 33, item 3): `/metrics` scraped through a
//! round-robin balancer in front of two replicas reaches a different replica on each scrape;
//! differencing their counters as one series gave a generation rate 55× the client's. The
//! scrape is named as mixed and no rate is stated — against two real `llm-replay mock`
//! processes behind a real TCP forwarder.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A round-robin balancer on 127.0.0.1:0 in front of `upstreams` (`host:port`), as nginx's
/// `upstream` block is: each connection goes to the next upstream, its request head gets
/// `Connection: close` (so every request is a connection of its own and the next one goes to
/// the next replica), and bytes are copied both ways. Scrapes of `/metrics` take turns on
/// their own counter, so they alternate replicas whatever the load's requests do.
fn start_round_robin(upstreams: Vec<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let upstreams = Arc::new(upstreams);
    let (scrapes, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            let upstreams = Arc::clone(&upstreams);
            let (scrapes, requests) = (Arc::clone(&scrapes), Arc::clone(&requests));
            std::thread::spawn(move || {
                let _ = forward_one(client, &upstreams, &scrapes, &requests);
            });
        }
    });
    url
}

/// Forward one connection's request to the next upstream, `Connection: close` set.
fn forward_one(
    client: TcpStream,
    upstreams: &[String],
    scrapes: &AtomicUsize,
    requests: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        if !line.to_ascii_lowercase().starts_with("connection:") {
            head.extend_from_slice(line.as_bytes());
        }
    }
    let turn = if request_line.contains(" /metrics") {
        scrapes.fetch_add(1, Ordering::SeqCst)
    } else {
        requests.fetch_add(1, Ordering::SeqCst)
    };
    let mut upstream = TcpStream::connect(&upstreams[turn % upstreams.len()])?;
    upstream.write_all(request_line.as_bytes())?;
    upstream.write_all(&head)?;
    upstream.write_all(b"Connection: close\r\n\r\n")?;
    // The rest of the request (a body) goes up; the answer comes back to the end.
    let mut up = upstream.try_clone()?;
    let buffered = reader.buffer().to_vec();
    std::thread::spawn(move || {
        let _ = up.write_all(&buffered);
        let mut rest = reader.into_inner();
        let _ = std::io::copy(&mut rest, &mut up);
    });
    let mut client_out = client;
    let mut answer = [0u8; 16 * 1024];
    loop {
        let n = upstream.read(&mut answer)?;
        if n == 0 {
            break;
        }
        client_out.write_all(&answer[..n])?;
    }
    let _ = client_out.shutdown(Shutdown::Both);
    Ok(())
}

/// Two replicas, one of which served traffic before the run (replicas never have the same
/// history), behind one round-robin balancer; the run's target is the balancer. Its
/// `/metrics` alternates replicas: the report names the series as mixed, states no server
/// rate (never one 50× the client's), and a goal on the server's tokens fails with that
/// note rather than passing on a wrong number.
#[test]
fn scrapes_through_a_round_robin_balancer_are_named_mixed_and_not_differenced() {
    let _parallel = parallel_lock();
    let args = ["--ttft", "5ms", "--itl", "2ms", "--tokens", "20"];
    let (a, b) = (MockServer::start(&args), MockServer::start(&args));
    let dir = TempDir::new("ingress-balancer");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 40, 20, None);
    // Replica A's history: 40 requests before the run.
    let warm = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &a.url,
            "--schedule",
            "asap",
            "--concurrency",
            "4",
            "--no-server-metrics",
        ],
        None,
    );
    assert_eq!(warm.code, 0, "{}\n{}", warm.stdout, warm.stderr);
    let host = |url: &str| url.trim_start_matches("http://").to_owned();
    let balancer = start_round_robin(vec![host(&a.url), host(&b.url)]);

    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &balancer,
            "--schedule",
            "asap",
            "--concurrency",
            "2",
            "--server-metrics-interval",
            "100ms",
            "--fail-if",
            "server.vllm:generation_tokens_total.rate > 1000000",
        ],
        Some(&dir.join("report.json")),
    );
    let report = out.report.unwrap_or_else(|| {
        panic!(
            "no report: exit {}\n{}\n{}",
            out.code, out.stdout, out.stderr
        )
    });
    assert_eq!(num(&report, &["requests", "succeeded"]), 40.0);
    let server = &report["server"];
    let endpoint = &server["endpoints"][0];
    assert!(num(endpoint, &["scrapes"]) >= 4.0, "{endpoint}");
    let mixed = endpoint["mixed"]
        .as_str()
        .unwrap_or_else(|| panic!("the endpoint is not named mixed: {server:#}"));
    assert!(mixed.contains("mixed series"), "{mixed}");
    assert!(mixed.contains("--server-metrics"), "{mixed}");
    // No counter of the mixed endpoint is differenced: no generation rate stated.
    assert!(
        server["metrics"]
            .get("vllm:generation_tokens_total")
            .is_none(),
        "{server:#}"
    );
    // The goal cannot pass on a number that is not one server's: it fails, saying why.
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let goal = &report["goals"][0];
    assert_eq!(goal["failed"], true, "{goal}");
    assert!(
        goal["note"].as_str().is_some_and(|n| n.contains("mixed")),
        "{goal}"
    );
    // The terminal's Server section says so.
    assert!(out.stdout.contains("mixed series"), "{}", out.stdout);
}
