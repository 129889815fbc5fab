//! Acceptance: against a mock with known timing (the issue's `--ttft 200ms --itl 10ms --tokens
//! 10`; see "Mock timing" below), the measured TTFT, ITL and latency are exact, at concurrency
//! 1, 16 and 128.
//!
//! Exact is asserted as the client's own error, against the mock's truth log (`--write-log`,
//! see `fixtures::truth`): every request is tagged, and its measured TTFT, ITL and latency
//! (`--requests-out`) are compared with what the mock logged for that request — the head's
//! arrival to the socket write of the first token's frame, of the last frame. At concurrency 1
//! the machine is idle before each first token, and on the CI VM the replay read TTFT
//! 1.5–2.2 ms high against the asked 200 ms: the mock's pacer and the client each wake from an
//! idle core. The truth log tells the two apart: the mock's lateness (printed) is not charged
//! to the client; a client that stamps late, or early, is.
//!
//! Tolerances (from the issue), on the client's error: the median per-request TTFT error
//! within 2 ms, ITL error within 0.5 ms, latency error within 3 ms; and the same for the
//! report's p50 against the truth's median (the numbers a user reads). The error holds two
//! loopback transits and the mock's read of the request, tens of microseconds. That the mock
//! served the asked timing is checked too, loosely (its true TTFT median within 10 ms above
//! the asked TTFT): a scenario check, not the client's accuracy, so it carries the mock's
//! wake-up.
//!
//! Mock timing: concurrency 128 runs at the acceptance line's `--ttft 200ms --itl 10ms`.
//! Concurrency 1 and 16 run at `--ttft 50ms --itl 5ms` (95 ms a request instead of 290):
//! what is asserted is the client's error in milliseconds against the truth, which does not
//! scale with the asked times, and 50 ms before each first token still leaves the cores idle
//! (the wake-up the truth log separates). At concurrency 128 the shorter timing would triple
//! the frame and request rate on two cores; that level stays as asked (2 s).
//!
//! Requests: 400 at concurrency 128, 200 at concurrency 16, 50 at concurrency 1 (5 s; 100
//! requests of 0.3 s took 31 s). The per-request errors are tight (TTFT error p1 −0.03 to
//! +0.05 ms, median +0.07 to +0.17, p99 +0.21 to +0.54 here at concurrency 1 and 16;
//! printed): between p1 and p99 there is about half a millisecond, so the median of 50 or
//! 200 is within a few hundredths of a millisecond of the median of 400, against tolerances
//! of 0.5 to 3 ms.
//! Streams are short (10 tokens): a request's ITL is (latency − TTFT) / 9, so the 0.5 ms
//! tolerance still catches a bias of 0.5 ms per frame. Each level follows a warm-up of one
//! request per connection (at least 4) and holds the timing lock. A level whose error misses
//! is measured again, up to `TIMING_ATTEMPTS` times with the same tolerances
//! (`fixtures::remeasure`), for a neighbour that takes the cores for seconds; the mock's own
//! lateness no longer needs it.

use fixtures::truth::{TruthMock, median, pair, quantile, read_requests_out};
use fixtures::{TempDir, llm_replay, num, remeasure, timing_lock};

const TOKENS: u64 = 10;

/// The tolerances on the client's error (ms).
const TTFT_TOLERANCE_MS: f64 = 2.0;
const ITL_TOLERANCE_MS: f64 = 0.5;
const LATENCY_TOLERANCE_MS: f64 = 3.0;

/// The mock's asked timing (ms): TTFT, ITL.
type Asked = (u64, u64);
/// The acceptance line's timing.
const ACCEPTANCE_TIMING: Asked = (200, 10);
/// The same client error measured in a third of the time (see the module's comment).
const SHORT_TIMING: Asked = (50, 5);

fn check_level(concurrency: usize, requests: usize, asked: Asked) {
    let _timing = timing_lock();
    remeasure(
        &format!("the client's timing error at concurrency {concurrency}"),
        || measure_level(concurrency, requests, asked),
    );
}

/// One measurement of a level: `Err` with the numbers when an error is outside its
/// tolerance; counts, outcomes and tags are asserted (a wrong answer fails at once).
fn measure_level(concurrency: usize, requests: usize, asked: Asked) -> Result<(), String> {
    let (asked_ttft_ms, asked_itl_ms) = asked;
    let dir = TempDir::new("timing");
    let tokens = TOKENS.to_string();
    let mock = TruthMock::start(
        &[
            "--ttft",
            &format!("{asked_ttft_ms}ms"),
            "--itl",
            &format!("{asked_itl_ms}ms"),
            "--tokens",
            &tokens,
        ],
        &dir.join("truth.jsonl"),
    );
    let warmup = 4.max(concurrency);
    // One line per request, so that every request's tag (its line) is its own.
    let recording = dir.join("rec.jsonl");
    fixtures::write_chat_recording(&recording, requests + warmup, TOKENS as u32, None);
    let report_path = dir.join("report.json");
    let requests_out = dir.join("requests.jsonl");
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--concurrency",
            &concurrency.to_string(),
            "--requests",
            &(requests + warmup).to_string(),
            "--warmup",
            &warmup.to_string(),
            "--tag-requests",
            "--requests-out",
            requests_out.to_str().expect("utf-8 path"),
        ],
        Some(&report_path),
    );
    let truth = mock.stop();
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        requests as f64,
        "{report:#}"
    );
    let client = read_requests_out(&requests_out);
    assert_eq!(client.len(), requests, "one line per measured request");
    assert_eq!(
        truth.len(),
        requests + warmup,
        "the mock logged every request, warm-up included"
    );
    let paired = pair(&client, &truth);
    assert!(
        paired.iter().all(|p| p.client.output_tokens == TOKENS),
        "the streams are as long as asked"
    );

    let ttft_error = median(paired.iter().map(|p| p.ttft_error_ms()));
    let itl_error = median(paired.iter().map(|p| p.itl_error_ms()));
    let latency_error = median(paired.iter().map(|p| p.latency_error_ms()));
    let true_ttft = median(paired.iter().map(|p| p.truth.ttft_ms()));
    let true_latency = median(paired.iter().map(|p| p.truth.latency_ms()));
    let true_itl = median(paired.iter().map(|p| p.true_itl_ms()));
    let report_ttft = num(&report, &["llm", "ttft_ms", "p50"]);
    let report_itl = num(&report, &["llm", "itl_ms", "p50"]);
    let report_latency = num(&report, &["llm", "latency_ms", "p50"]);
    eprintln!(
        "timing concurrency {concurrency}, {requests} requests, asked TTFT {asked_ttft_ms} ms \
         ITL {asked_itl_ms} ms: client error median TTFT \
         {ttft_error:+.3} ms (p1 {:+.3}, p99 {:+.3}), ITL {itl_error:+.4} ms, latency \
         {latency_error:+.3} ms; of it, client send to the mock's read of the head {:.3} ms. \
         Report p50 TTFT {report_ttft:.3} / ITL {report_itl:.3} / latency {report_latency:.3} \
         ms; truth {true_ttft:.3} / {true_itl:.3} / {true_latency:.3} ms; the mock wrote the \
         first token {:.3} ms late (median, p99 {:.3}), the last frame {:.3} ms",
        quantile(paired.iter().map(|p| p.ttft_error_ms()), 0.01),
        quantile(paired.iter().map(|p| p.ttft_error_ms()), 0.99),
        median(paired.iter().map(|p| p.send_side_ms())),
        median(paired.iter().map(|p| p.truth.ttft_lateness_ms())),
        quantile(paired.iter().map(|p| p.truth.ttft_lateness_ms()), 0.99),
        median(paired.iter().map(|p| p.truth.last_lateness_ms())),
    );

    let mut misses = Vec::new();
    let mut check = |what: &str, error: f64, tolerance: f64| {
        if error.abs() > tolerance {
            misses.push(format!("{what} {error:+.3} ms (± {tolerance})"));
        }
    };
    check("median TTFT error", ttft_error, TTFT_TOLERANCE_MS);
    check("median ITL error", itl_error, ITL_TOLERANCE_MS);
    check("median latency error", latency_error, LATENCY_TOLERANCE_MS);
    check(
        "report TTFT p50 − truth",
        report_ttft - true_ttft,
        TTFT_TOLERANCE_MS,
    );
    check(
        "report ITL p50 − truth",
        report_itl - true_itl,
        ITL_TOLERANCE_MS,
    );
    check(
        "report latency p50 − truth",
        report_latency - true_latency,
        LATENCY_TOLERANCE_MS,
    );
    // The scenario: the mock served the asked TTFT (its own lateness included).
    let asked_ttft = asked_ttft_ms as f64;
    if !(asked_ttft..asked_ttft + 10.0).contains(&true_ttft) {
        misses.push(format!(
            "the mock's true TTFT median {true_ttft:.3} ms is not {asked_ttft}-{} ms",
            asked_ttft + 10.0
        ));
    }
    if misses.is_empty() {
        Ok(())
    } else {
        Err(misses.join("; "))
    }
}

#[test]
fn timing_concurrency_1() {
    check_level(1, 50, SHORT_TIMING);
}

#[test]
fn timing_concurrency_16() {
    check_level(16, 200, SHORT_TIMING);
}

#[test]
fn timing_concurrency_128() {
    check_level(128, 400, ACCEPTANCE_TIMING);
}
