//! A Prometheus endpoint behind the obstacles real deployments put in front of one (issue 33,
//! items 4 and 5): a bearer it demands (LiteLLM's `/metrics` needs its key), a `307` to
//! `/metrics/` or to another origin, a `502` for some scrapes (an upstream killed mid-run).
//! A real HTTP/1.1 server on 127.0.0.1:0 (one thread per connection, `Connection: close`),
//! which records every request's path and `Authorization` header so a test can check where
//! credentials went.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, PoisonError};

/// What the gate does.
#[derive(Debug, Clone)]
pub struct GateConfig {
    /// `Authorization` value every request must carry (else `401`); `None`: none needed.
    pub bearer: Option<String>,
    /// Paths answered `307` with this `Location`, checked after the bearer.
    pub redirects: Vec<(String, String)>,
    /// The path answering Prometheus text: `gate_scrapes_total`, the scrapes it answered.
    pub metrics_path: String,
    /// The scrapes of `metrics_path` (1-based) answered `502 Bad Gateway` instead.
    pub bad_gateway: RangeInclusive<usize>,
    /// When not empty, scrape N's samples carry `pod="<replicas[N % len]>"`: a gateway that
    /// relays a different replica each time.
    pub replicas: Vec<String>,
}

impl Default for GateConfig {
    fn default() -> GateConfig {
        GateConfig {
            bearer: None,
            redirects: Vec::new(),
            metrics_path: "/metrics".to_owned(),
            // Scrapes are counted from 1: none fails.
            bad_gateway: 0..=0,
            replicas: Vec::new(),
        }
    }
}

/// One request the gate received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub path: String,
    pub authorization: Option<String>,
    pub status: u16,
}

/// A running gate (its thread lives as long as the test process).
pub struct MetricsGate {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub origin: String,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
}

impl MetricsGate {
    /// Start a gate on 127.0.0.1:0.
    pub fn start(config: GateConfig) -> MetricsGate {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let origin = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = (
            Arc::new(config),
            Arc::clone(&seen),
            Arc::new(Mutex::new(0usize)),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (config, seen, scrapes) = (
                    Arc::clone(&shared.0),
                    Arc::clone(&shared.1),
                    Arc::clone(&shared.2),
                );
                std::thread::spawn(move || {
                    let _ = answer(stream, &config, &seen, &scrapes);
                });
            }
        });
        MetricsGate { origin, seen }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Read one request head, answer it, close. A connection closed before its first byte is
/// not a request and is not recorded.
fn answer(
    stream: TcpStream,
    config: &GateConfig,
    seen: &Mutex<Vec<SeenRequest>>,
    scrapes: &Mutex<usize>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        // Closed before a byte: no request (a scrape dropped between its connect and its
        // write, as the run's end drops the periodic one), nothing to record.
        return Ok(());
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_owned();
    let mut authorization = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("authorization")
        {
            authorization = Some(value.trim().to_owned());
        }
    }
    let redirect = config
        .redirects
        .iter()
        .find(|(from, _)| *from == path)
        .map(|(_, to)| to.clone());
    let (status, extra, body) = if config.bearer.is_some() && authorization != config.bearer {
        (
            401,
            "www-authenticate: Bearer\r\n".to_owned(),
            "unauthorized\n".to_owned(),
        )
    } else if let Some(location) = redirect {
        (307, format!("location: {location}\r\n"), String::new())
    } else if path == config.metrics_path {
        let mut count = scrapes.lock().unwrap_or_else(PoisonError::into_inner);
        *count += 1;
        if config.bad_gateway.contains(&count) {
            (
                502,
                String::new(),
                "<html>502 Bad Gateway</html>\n".to_owned(),
            )
        } else {
            let labels = match config.replicas.get(*count % config.replicas.len().max(1)) {
                Some(pod) => format!("{{pod=\"{pod}\"}}"),
                None => String::new(),
            };
            let text = format!(
                "# HELP gate_scrapes_total Scrapes answered.\n\
                 # TYPE gate_scrapes_total counter\ngate_scrapes_total{labels} {count}\n"
            );
            (200, String::new(), text)
        }
    } else {
        (404, String::new(), "not found\n".to_owned())
    };
    seen.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(SeenRequest {
            path,
            authorization,
            status,
        });
    let content_type = if status == 200 {
        "text/plain; version=0.0.4"
    } else {
        "text/html"
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status} Gate\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         connection: close\r\n{extra}\r\n{body}",
        body.len()
    )?;
    out.flush()
}
