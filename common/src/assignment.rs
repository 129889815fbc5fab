//! What a worker is asked to do in one run: the assignment the coordinator builds for each
//! worker and the worker turns into its replay configuration. The protocol's form of it lives
//! in `proto::convert`; this is the only form the rest of the code sees.

use std::sync::Arc;
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
    /// `--tokenizer FILE`: the files themselves (remote workers do not share the
    /// coordinator's disk); the worker counts the tokens of streams without usage with it.
    pub tokenizer: Option<TokenizerFiles>,
    /// `--cancel-rate P% [--cancel-after D]`: cancel a drawn share of the requests.
    pub cancel: CancelOptions,
    /// `--request-usage`: OpenAI-compatible chat and completions streams that do not ask for
    /// usage ask for it (`formats::request::ask_usage`).
    pub request_usage: bool,
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
            tokenizer: None,
            cancel: CancelOptions::default(),
            request_usage: false,
        }
    }
}

/// A Hugging Face tokenizer as it travels to the workers: the bytes of its `tokenizer.json`
/// and, when there is one beside it, of its `tokenizer_config.json` (uncompressed here; the
/// wire deflates them). Shared, so cloning an assignment copies no megabytes.
#[derive(Clone)]
pub struct TokenizerFiles {
    /// The file's name as the user gave it (for the report and messages), never a path the
    /// worker opens.
    pub name: String,
    pub tokenizer_json: Arc<[u8]>,
    pub config_json: Option<Arc<[u8]>>,
    /// Both files deflated for the wire, once for every worker's assignment (compressing a
    /// 10 MB file takes about 0.1 s; a hundred workers would wait ten).
    deflated: Arc<std::sync::OnceLock<DeflatedFiles>>,
}

/// `tokenizer.json` and `tokenizer_config.json` (when there is one), deflated.
type DeflatedFiles = (Vec<u8>, Option<Vec<u8>>);

impl PartialEq for TokenizerFiles {
    /// The same files (the deflated cache is not compared).
    fn eq(&self, other: &TokenizerFiles) -> bool {
        self.name == other.name
            && self.tokenizer_json == other.tokenizer_json
            && self.config_json == other.config_json
    }
}

impl Eq for TokenizerFiles {}

impl std::fmt::Debug for TokenizerFiles {
    /// Sizes, not megabytes of JSON.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerFiles")
            .field("name", &self.name)
            .field("tokenizer_json_bytes", &self.tokenizer_json.len())
            .field(
                "config_json_bytes",
                &self.config_json.as_ref().map(|c| c.len()),
            )
            .finish()
    }
}

/// The most a tokenizer file may inflate to on a worker (real `tokenizer.json` files are
/// 2–11 MB): a peer cannot make a worker allocate without bound.
pub const MAX_TOKENIZER_BYTES: usize = 256 << 20;

/// Why the bytes of a tokenizer file from the wire cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerBytesError {
    #[error("not DEFLATE data ({0})")]
    Deflate(String),
    #[error("larger than {MAX_TOKENIZER_BYTES} bytes once inflated")]
    TooLarge,
    #[error("not JSON ({0})")]
    NotJson(String),
}

impl TokenizerFiles {
    /// The files of a tokenizer named `name` (its `tokenizer.json`, and the
    /// `tokenizer_config.json` beside it when there is one).
    pub fn new(name: String, tokenizer_json: Vec<u8>, config_json: Option<Vec<u8>>) -> Self {
        TokenizerFiles {
            name,
            tokenizer_json: tokenizer_json.into(),
            config_json: config_json.map(Into::into),
            deflated: Arc::default(),
        }
    }

    /// `tokenizer.json` and `tokenizer_config.json` deflated for the wire, compressed on the
    /// first call only (every clone shares the result).
    pub fn deflated(&self) -> (&[u8], Option<&[u8]>) {
        let (json, config) = self.deflated.get_or_init(|| {
            (
                TokenizerFiles::deflate(&self.tokenizer_json),
                self.config_json.as_deref().map(TokenizerFiles::deflate),
            )
        });
        (json, config.as_deref())
    }

    /// `bytes` compressed for the wire (raw DEFLATE): tokenizer files shrink 3–4×.
    pub fn deflate(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut encoder =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        encoder
            .write_all(bytes)
            .and_then(|()| encoder.finish())
            .expect("writing to a Vec cannot fail")
    }

    /// Bytes from the wire inflated (at most [`MAX_TOKENIZER_BYTES`]) and checked to be a
    /// JSON document; the tokenizer itself is built from them by the worker.
    pub fn inflate_json(compressed: &[u8]) -> Result<Vec<u8>, TokenizerBytesError> {
        use std::io::Read;
        let mut out = Vec::new();
        flate2::read::DeflateDecoder::new(compressed)
            .take(MAX_TOKENIZER_BYTES as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|error| TokenizerBytesError::Deflate(error.to_string()))?;
        if out.len() > MAX_TOKENIZER_BYTES {
            return Err(TokenizerBytesError::TooLarge);
        }
        serde_json::from_slice::<serde::de::IgnoredAny>(&out)
            .map_err(|error| TokenizerBytesError::NotJson(error.to_string()))?;
        Ok(out)
    }
}

/// `--cancel-rate P% [--cancel-after D]`, as AIPerf's `--request-cancellation-rate` and
/// `--request-cancellation-delay`: each exchange is drawn (deterministically, from the run's
/// seed and its index in the run: [`CancelOptions::draws`]) with probability `rate_pct / 100`, and a
/// drawn request is cancelled `after` its t0 (0 = right after it was written). A recorded
/// cancellation wins over a drawn one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CancelOptions {
    /// Percent of the requests to cancel, `0..=100` (0 = off).
    pub rate_pct: f64,
    /// How long after t0 a drawn request is cancelled.
    pub after: Duration,
    /// The run's `--seed` (not a worker's share of it): the same exchanges are drawn
    /// whatever the number of workers.
    pub seed: u64,
}

impl CancelOptions {
    /// Whether exchange `index` of a run with `seed` is drawn for cancellation: a stable hash
    /// of both (SplitMix64, the same on every worker and build) below `rate_pct / 100`.
    pub fn draws(&self, index: u64) -> bool {
        let seed = self.seed;
        if self.rate_pct.is_nan() || self.rate_pct <= 0.0 {
            return false;
        }
        if self.rate_pct >= 100.0 {
            return true;
        }
        let mut z = seed
            .wrapping_add(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(index.wrapping_mul(0xbf58_476d_1ce4_e5b9));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 high bits as a fraction in [0, 1).
        let fraction = (z >> 11) as f64 / (1u64 << 53) as f64;
        fraction < self.rate_pct / 100.0
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

/// The variable names a header template expands (`${NAME}`), in order, as the one expander
/// ([`crate::env_template`]) parses them. A template with a `${` never closed lists the
/// variables before it: expanding it fails with
/// [`EnvTemplateError::Unterminated`](crate::env_template::EnvTemplateError::Unterminated) anyway, on the worker and in the coordinator.
pub fn template_vars(value: &str) -> Vec<String> {
    use crate::env_template::{EnvTemplate, EnvTemplateError};
    match EnvTemplate::parse(value) {
        Ok(template) => template.vars().map(str::to_owned).collect(),
        Err(EnvTemplateError::Unterminated { column }) => {
            let cut = value
                .char_indices()
                .nth(column.saturating_sub(1))
                .map_or(value.len(), |(at, _)| at);
            crate::env_template::vars(&value[..cut]).unwrap_or_default()
        }
        Err(EnvTemplateError::Unset { .. }) => Vec::new(),
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn a_cancel_rate_draws_its_share_deterministically_per_seed() {
        let half = CancelOptions {
            rate_pct: 50.0,
            after: Duration::ZERO,
            seed: 7,
        };
        let drawn = (0..10_000).filter(|i| half.draws(*i)).count();
        assert!((4_800..=5_200).contains(&drawn), "{drawn}");
        let again: Vec<bool> = (0..100).map(|i| half.draws(i)).collect();
        assert_eq!(again, (0..100).map(|i| half.draws(i)).collect::<Vec<_>>());
        let other_seed = CancelOptions { seed: 8, ..half };
        let other: Vec<bool> = (0..100).map(|i| other_seed.draws(i)).collect();
        assert_ne!(again, other, "another seed draws other requests");
        let none = CancelOptions::default();
        assert!((0..1000).all(|i| !none.draws(i)));
        let all = CancelOptions {
            rate_pct: 100.0,
            ..half
        };
        assert!((0..1000).all(|i| all.draws(i)));
        let tenth = CancelOptions {
            rate_pct: 10.0,
            seed: 1,
            ..half
        };
        let drawn = (0..10_000).filter(|i| tenth.draws(*i)).count();
        assert!((900..=1_100).contains(&drawn), "{drawn}");
    }

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
