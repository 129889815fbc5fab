//! The client's own timing error: what `llm-replay run --requests-out` measured for each
//! request, beside what the mock's truth log (`llm-replay mock --write-log`) says happened to
//! that same request, matched by the exchange tag (`--tag-requests`).
//!
//! The truth log stamps, per request, when its head reached the mock, when the frame of the
//! first token and the last frame were written to the socket, and when each was due. A timing
//! test built on it asserts the client's error, `measured − (written − head)`, so a mock that
//! wakes late from an idle core (its pacer) is not charged to the client; how late the mock
//! itself was (`written − due`) is printed beside it and checked apart, if at all.
//!
//! One machine, one clock: the mock stamps CLOCK_REALTIME and so does the client's
//! `sent_unix_ms`. The client's error still holds two loopback transits and the mock's
//! reading of the request (tens of microseconds), and a write is stamped when the call
//! returns, so the client can read a frame a few microseconds before its stamp (a request's
//! error of −0.02 ms is not a clock running backwards).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Spawned, bin, eventually};

/// A `llm-replay mock --write-log` process on 127.0.0.1:0. Its log is written when it stops,
/// so [`TruthMock::stop`] sends SIGTERM and reads it.
pub struct TruthMock {
    process: Spawned,
    log: PathBuf,
    pub url: String,
}

impl TruthMock {
    /// Start `llm-replay mock --listen 127.0.0.1:0 --write-log LOG ARGS...` and wait for the
    /// URL in its readiness line.
    pub fn start(args: &[&str], log: &Path) -> TruthMock {
        let log_arg = log.to_str().expect("utf-8 path");
        let mut all = vec!["mock", "--listen", "127.0.0.1:0", "--write-log", log_arg];
        all.extend_from_slice(args);
        let process = Spawned::start(&bin("llm-replay"), &all, &[]);
        let mut url = None;
        assert!(
            eventually(Duration::from_secs(30), || {
                url = process
                    .stdout()
                    .split_whitespace()
                    .find(|w| w.starts_with("http://") || w.starts_with("https://"))
                    .map(str::to_owned);
                url.is_some()
            }),
            "the mock did not start: {}",
            process.stderr()
        );
        TruthMock {
            process,
            log: log.to_owned(),
            url: url.expect("checked above"),
        }
    }

    /// SIGTERM, wait for the exit (the log is written on the way out), and read the log's
    /// tagged records by exchange index. An exchange logged twice fails: its tag would not
    /// say which measurement is whose.
    pub fn stop(self) -> BTreeMap<u64, TruthRecord> {
        let text = self.stop_text();
        let mut records = BTreeMap::new();
        for line in text.lines() {
            let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            // Untagged: not one of the replay's exchanges (the coordinator's look at the
            // target's `/metrics`).
            let Some(exchange) = value["exchange"].as_str() else {
                continue;
            };
            let index: u64 = exchange.parse().expect("an exchange index");
            let record = TruthRecord::from_json(&value);
            assert!(
                records.insert(index, record).is_none(),
                "exchange {index} logged twice: give every request its own line"
            );
        }
        records
    }
}

impl TruthMock {
    /// SIGTERM, wait for the exit, and return the log's lines as they are (every field,
    /// including those of requests cancelled before their first token).
    pub fn stop_lines(self) -> Vec<serde_json::Value> {
        self.stop_text()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    fn stop_text(mut self) -> String {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.process.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "SIGTERM to the mock");
        assert!(
            self.process.wait_timeout(Duration::from_secs(20)).is_some(),
            "the mock did not stop: {}",
            self.process.stderr()
        );
        std::fs::read_to_string(&self.log).expect("the mock's truth log")
    }
}

/// What the mock logged of one request (Unix nanoseconds).
#[derive(Debug, Clone, Copy)]
pub struct TruthRecord {
    pub status: u16,
    pub head_ns: u64,
    pub first_token_write_ns: u64,
    pub first_token_due_ns: u64,
    pub last_write_ns: u64,
    pub last_due_ns: u64,
}

impl TruthRecord {
    fn from_json(value: &serde_json::Value) -> TruthRecord {
        let ns = |key: &str| {
            value[key]
                .as_u64()
                .unwrap_or_else(|| panic!("no {key} in the truth log's line {value}"))
        };
        TruthRecord {
            status: value["status"].as_u64().expect("status") as u16,
            head_ns: ns("head_ns"),
            first_token_write_ns: ns("first_token_write_ns"),
            first_token_due_ns: ns("first_token_due_ns"),
            last_write_ns: ns("last_write_ns"),
            last_due_ns: ns("last_due_ns"),
        }
    }

    /// The true TTFT: the head's arrival to the write of the first token's frame (ms).
    pub fn ttft_ms(&self) -> f64 {
        ms_between(self.head_ns, self.first_token_write_ns)
    }

    /// The true latency: the head's arrival to the write of the last frame (ms).
    pub fn latency_ms(&self) -> f64 {
        ms_between(self.head_ns, self.last_write_ns)
    }

    /// How late the mock wrote the first token's frame (ms).
    pub fn ttft_lateness_ms(&self) -> f64 {
        ms_between(self.first_token_due_ns, self.first_token_write_ns)
    }

    /// How late the mock wrote the last frame (ms).
    pub fn last_lateness_ms(&self) -> f64 {
        ms_between(self.last_due_ns, self.last_write_ns)
    }
}

fn ms_between(from_ns: u64, to_ns: u64) -> f64 {
    (to_ns as f64 - from_ns as f64) / 1e6
}

/// One `--requests-out` line: what the client measured.
#[derive(Debug, Clone, Copy)]
pub struct ClientRecord {
    pub sent_unix_ms: f64,
    pub ttft_ms: f64,
    pub latency_ms: f64,
    pub output_tokens: u64,
}

/// The succeeded requests of a `--requests-out` file by exchange index; any other outcome
/// fails (a timing test's requests all succeed).
pub fn read_requests_out(path: &Path) -> BTreeMap<u64, ClientRecord> {
    let text = std::fs::read_to_string(path).expect("the --requests-out file");
    let mut records = BTreeMap::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(value["outcome"], "succeeded", "{value}");
        let number = |key: &str| {
            value[key]
                .as_f64()
                .unwrap_or_else(|| panic!("no {key} in the requests-out line {value}"))
        };
        let index = value["index"].as_u64().expect("index");
        let record = ClientRecord {
            sent_unix_ms: number("sent_unix_ms"),
            ttft_ms: number("ttft_ms"),
            latency_ms: number("latency_ms"),
            output_tokens: value["output_tokens"].as_u64().expect("output_tokens"),
        };
        assert!(
            records.insert(index, record).is_none(),
            "exchange {index} measured twice"
        );
    }
    records
}

/// A measured request with the mock's account of it.
#[derive(Debug, Clone, Copy)]
pub struct Paired {
    pub client: ClientRecord,
    pub truth: TruthRecord,
}

impl Paired {
    /// The client's TTFT error: measured minus true (ms).
    pub fn ttft_error_ms(&self) -> f64 {
        self.client.ttft_ms - self.truth.ttft_ms()
    }

    /// The client's latency error (ms).
    pub fn latency_error_ms(&self) -> f64 {
        self.client.latency_ms - self.truth.latency_ms()
    }

    /// The client's ITL error (ms).
    pub fn itl_error_ms(&self) -> f64 {
        (self.client.latency_ms - self.client.ttft_ms) / self.gaps() - self.true_itl_ms()
    }

    /// The true ITL, by the run's definition of ITL, (latency − TTFT) / (tokens − 1), with
    /// the tokens the client counted (ms).
    pub fn true_itl_ms(&self) -> f64 {
        (self.truth.latency_ms() - self.truth.ttft_ms()) / self.gaps()
    }

    fn gaps(&self) -> f64 {
        self.client.output_tokens.saturating_sub(1).max(1) as f64
    }

    /// The send side of the TTFT error: the client's send stamp to the head's arrival (ms).
    pub fn send_side_ms(&self) -> f64 {
        self.truth.head_ns as f64 / 1e6 - self.client.sent_unix_ms
    }
}

/// Pair every measured request with its truth record; a measured request the mock did not
/// log fails (the tags or the log are wrong, not the timing).
pub fn pair(
    client: &BTreeMap<u64, ClientRecord>,
    truth: &BTreeMap<u64, TruthRecord>,
) -> Vec<Paired> {
    client
        .iter()
        .map(|(index, client)| {
            let truth = truth
                .get(index)
                .unwrap_or_else(|| panic!("exchange {index} was measured but not logged"));
            assert_eq!(truth.status, 200, "exchange {index}: {truth:?}");
            Paired {
                client: *client,
                truth: *truth,
            }
        })
        .collect()
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    assert!(!sorted.is_empty(), "the median of nothing");
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// The `q`-quantile of `values` (nearest rank), for the printed spread.
pub fn quantile(values: impl IntoIterator<Item = f64>, q: f64) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    assert!(!sorted.is_empty(), "the quantile of nothing");
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::{median, quantile};

    #[test]
    fn median_and_quantile_by_rank() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(quantile([5.0, 1.0, 4.0, 2.0, 3.0], 0.99), 5.0);
        assert_eq!(quantile([5.0, 1.0, 4.0, 2.0, 3.0], 0.2), 1.0);
    }
}
