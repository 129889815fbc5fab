//! What a worker is asked to do in one run: the assignment the coordinator builds for each
//! worker and the worker turns into its replay configuration. The protocol's form of it lives
//! in `proto::convert`; this is the only form the rest of the code sees.

use std::time::Duration;

use crate::formats::pin::PinMode;
use crate::load::LoadModel;

/// One worker's part of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub run_id: String,
    /// Base URL of the target, e.g. `http://127.0.0.1:8080`; recorded paths are appended.
    pub target: String,
    /// This worker's share of the run's load.
    pub load: LoadModel,
    /// `--header` name and value *templates*: `${VAR}` is expanded on the worker, from its
    /// own environment, never on the coordinator.
    pub headers: Vec<(String, String)>,
    /// `--set` top-level body fields: a JSON value when the text parses as JSON, else a
    /// string.
    pub sets: Vec<(String, String)>,
    /// The slice never ends: the run's `--duration` stops it (`common::replay::is_open_ended`).
    pub open_ended: bool,
    /// The run's options the worker applies as they are.
    pub options: RequestOptions,
    /// Send `x-llm-replay-exchange: <index>` so the embedded mock matches exactly.
    pub tag_requests: bool,
    /// The worker's join index.
    pub worker_index: u32,
    /// How to reach the target beyond its URL.
    pub transport: TargetTransport,
    /// The key this worker presents on its slice stream (never the shared token).
    pub slice_key: String,
    /// How often the worker reports (and sends heartbeats); `None` = the worker's own
    /// interval. The coordinator lengthens it when many workers report to it.
    pub report_interval: Option<Duration>,
    /// How the worker encodes its reports' histograms: plain V2 when the coordinator reads
    /// it (every coordinator since it was added says so), V2+DEFLATE otherwise.
    pub histograms: crate::metrics::HistogramEncoding,
    /// The run's heartbeat timeout: once the load is under way the worker finds the
    /// coordinator lost after this long without a message from it. `None` (an older
    /// coordinator) = the worker's own `--heartbeat-timeout`.
    pub heartbeat_timeout: Option<Duration>,
}

/// The run's options a worker applies as they are, without reading or expanding anything:
/// the coordinator fills them in from the run's options (`RunConfig::request_options`), the
/// wire carries them (`proto::convert`), the worker's replay configuration holds them
/// unchanged. A new run option the worker needs is a field here (ARCHITECTURE.md, "how to
/// add a flag").
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOptions {
    /// Per-request time limit.
    pub timeout: Duration,
    /// Keep one record per request for `--requests-out`.
    pub requests_out: bool,
    /// How many exchanges the recorded schedule reads ahead to send them in `at_ms` order.
    pub reorder_window: usize,
    /// Faithful replay: pinned output lengths and closed-loop sessions.
    pub faithful: Faithful,
    /// `--slo`: the worker counts each measured request that meets every one as good.
    pub slos: crate::slo::Slos,
    /// Keep a second set of metrics over the steady window (requests sent once the load
    /// reached its target, the closed loop's first wave left out), for a capacity probe's
    /// goals: [`crate::worker_report::WorkerReport::steady`].
    pub steady_metrics: bool,
}

impl Default for RequestOptions {
    /// The command line's defaults.
    fn default() -> RequestOptions {
        RequestOptions {
            timeout: crate::replay::DEFAULT_REQUEST_TIMEOUT,
            requests_out: false,
            reorder_window: crate::replay::DEFAULT_REORDER_WINDOW,
            faithful: Faithful::default(),
            slos: crate::slo::Slos::default(),
            steady_metrics: false,
        }
    }
}

/// How workers reach the target, beyond its URL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetTransport {
    /// PEM contents of the `--target-ca` files, in order (contents, not paths: remote
    /// workers do not share the coordinator's disk).
    pub ca_pem: Vec<String>,
    /// `--insecure`: no certificate verification.
    pub insecure: bool,
    /// `--target-h2c`: cleartext HTTP/2 with prior knowledge.
    pub h2c: bool,
    /// `--aws-sigv4 REGION`: re-sign each request for Bedrock in this region.
    pub aws_sigv4_region: Option<String>,
}

/// How faithfully the recording's users are replayed (`--pin-output-length`,
/// `--session-mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faithful {
    /// Ask each request for the output length the recording measured.
    pub pin: Option<PinMode>,
    /// A session's next turn goes out at the previous turn's replayed end plus the recorded
    /// think time (closed loop), not at its recorded offset (open loop).
    pub closed_sessions: bool,
}

/// The AWS credentials `--aws-sigv4` needs from the worker's environment.
pub const AWS_CREDENTIALS: [&str; 2] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];
/// The AWS variable `--aws-sigv4` reads when present (temporary credentials).
pub const AWS_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";

/// Which environment variables of a worker a run reads: `needed` (each `${VAR}` of the
/// header templates, and the AWS credentials for `--aws-sigv4`) and `optional` (read when
/// the worker allows them: `AWS_SESSION_TOKEN`). The one list the worker checks against its
/// `--allow-env` and the coordinator gives its local workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvReads {
    pub needed: Vec<String>,
    pub optional: Vec<String>,
}

impl EnvReads {
    /// The variables a run with these header templates and SigV4 setting reads.
    pub fn of(headers: &[(String, String)], aws_sigv4: bool) -> EnvReads {
        let mut needed: Vec<String> = headers
            .iter()
            .flat_map(|(_, value)| template_vars(value))
            .collect();
        let mut optional = Vec::new();
        if aws_sigv4 {
            needed.extend(AWS_CREDENTIALS.map(str::to_owned));
            optional.push(AWS_SESSION_TOKEN.to_owned());
        }
        EnvReads { needed, optional }
    }

    /// Every variable, needed then optional.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.needed.iter().chain(&self.optional)
    }
}

impl Assignment {
    /// The environment variables this assignment reads on the worker.
    pub fn env_reads(&self) -> EnvReads {
        EnvReads::of(&self.headers, self.transport.aws_sigv4_region.is_some())
    }
}

/// The variable names a header template expands (`${NAME}`), in order.
pub fn template_vars(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        out.push(after[..end].to_owned());
        rest = &after[end + 1..];
    }
    out
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn a_run_reads_its_header_variables_and_for_sigv4_the_aws_credentials() {
        let headers = vec![
            ("authorization".to_owned(), "Bearer ${API_KEY}".to_owned()),
            ("x-team".to_owned(), "${TEAM}-${ENV}".to_owned()),
            ("x-open".to_owned(), "${UNTERMINATED".to_owned()),
        ];
        let plain = EnvReads::of(&headers, false);
        assert_eq!(plain.needed, ["API_KEY", "TEAM", "ENV"]);
        assert!(plain.optional.is_empty());
        let signed = EnvReads::of(&headers, true);
        assert_eq!(
            signed.all().map(String::as_str).collect::<Vec<_>>(),
            [
                "API_KEY",
                "TEAM",
                "ENV",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN"
            ]
        );
    }
}
