//! `--tokenizer` on the worker: exact token counts where the server reported none, counted
//! after the stream ended and off the runtime that stamps reads.
//!
//! A request's task releases its concurrency permit and its session's turn first, then hands
//! the streamed text and the prompt to the process's counting thread and only then gives the
//! outcome to the metrics actor: tokenizing a long answer takes milliseconds, which on a
//! runtime thread would delay the reads of every other stream it carries. One thread keeps
//! the tokenizer's chunk cache warm (a blocking pool's threads would each start cold).

use std::sync::Arc;

use common::assignment::TokenizerFiles;
use common::measure::{OutcomeKind, RequestOutcome, TokenSource, estimate_input_tokens};

pub use common::tokenizer::{Tokenizer, TokenizerError};

/// Why the assignment's tokenizer cannot be used on this worker.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer {name:?} from the assignment: {source}")]
pub struct TokenizerLoadError {
    pub name: String,
    #[source]
    pub source: TokenizerError,
}

/// The tokenizer the assignment carries, built from its bytes.
pub fn build(files: &TokenizerFiles) -> Result<Tokenizer, TokenizerLoadError> {
    Tokenizer::from_parts(
        &files.tokenizer_json,
        files.config_json.as_deref(),
        &files.name,
    )
    .map_err(|source| TokenizerLoadError {
        name: files.name.clone(),
        source,
    })
}

/// What a finished request still needs counted: its streamed text (kept only with a
/// tokenizer, [`common::measure::StreamMeter::keep_text`]), its path and body.
pub struct ToCount {
    /// The generated text of a stream that ended without a usage output count.
    pub text: Option<String>,
    pub path: String,
    pub body: bytes::Bytes,
}

/// Fill in the counts the server did not report: the output of a stream without usage
/// (`tokenized_output_tokens`) and the input tokens (`input_source` says from where: the
/// tokenizer, else the chars/4 estimate). With a tokenizer the counting runs on the counting
/// thread; call this only after the request's permit and session turn were released.
pub async fn count_missing(
    tokenizer: Option<&Arc<Tokenizer>>,
    mut outcome: RequestOutcome,
    work: ToCount,
) -> RequestOutcome {
    let ToCount { text, path, body } = work;
    let text = text.filter(|_| needs_output_count(&outcome));
    let needs_input = outcome.input_tokens.is_none();
    if let Some(tokenizer) = tokenizer
        && (text.is_some() || needs_input)
    {
        let job = Job {
            tokenizer: Arc::clone(tokenizer),
            text,
            input: needs_input.then(|| (path, body.clone())),
            reply: None,
        };
        match count_on_thread(job).await {
            Some((output, input)) => {
                if output.is_some() {
                    outcome.tokenized_output_tokens = output;
                }
                if let Some(input) = input {
                    outcome.input_tokens = Some(input);
                    outcome.input_source = Some(TokenSource::Tokenizer);
                }
            }
            None => tracing::warn!("the token-counting thread is gone; estimated instead"),
        }
    }
    if outcome.input_tokens.is_none() {
        outcome.input_tokens = estimate_input_tokens(&body);
        outcome.input_source = outcome.input_tokens.map(|_| TokenSource::Estimate);
    }
    outcome
}

/// One request's counting, done on the counting thread.
struct Job {
    tokenizer: Arc<Tokenizer>,
    text: Option<String>,
    /// The request's path and body, when its input tokens are to be counted.
    input: Option<(String, bytes::Bytes)>,
    reply: Option<tokio::sync::oneshot::Sender<(Option<u64>, Option<u64>)>>,
}

/// Jobs waiting for the counting thread; senders wait when it is full (a finished
/// request's outcome waits, no stream's reads do).
const COUNTING_QUEUE: usize = 4_096;

/// The process's one counting thread: one thread, so its per-thread chunk cache
/// (`Tokenizer::count_text`) stays warm — a pool of blocking threads would each start cold
/// and count every chunk in full (measured: ~7× the cost a token). Started at first use;
/// it lives as long as the process.
fn counting_thread() -> Option<&'static tokio::sync::mpsc::Sender<Job>> {
    static SENDER: std::sync::OnceLock<Option<tokio::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    SENDER
        .get_or_init(|| {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Job>(COUNTING_QUEUE);
            let spawned = std::thread::Builder::new()
                .name("token-count".into())
                .spawn(move || {
                    while let Some(job) = rx.blocking_recv() {
                        let output = job.text.map(|text| job.tokenizer.count_text(&text));
                        let input = job
                            .input
                            .and_then(|(path, body)| job.tokenizer.count_prompt(&path, &body));
                        if let Some(reply) = job.reply {
                            let _ = reply.send((output, input));
                        }
                    }
                });
            match spawned {
                Ok(_) => Some(tx),
                Err(error) => {
                    tracing::warn!(%error, "cannot start the token-counting thread");
                    None
                }
            }
        })
        .as_ref()
}

/// Count `job` on the counting thread; `None` when it cannot.
async fn count_on_thread(mut job: Job) -> Option<(Option<u64>, Option<u64>)> {
    let sender = counting_thread()?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    job.reply = Some(reply);
    sender.send(job).await.ok()?;
    answer.await.ok()
}

/// A stream whose output count the tokenizer should give: it produced content and reported
/// no usage output count (failed requests enter no token count).
fn needs_output_count(outcome: &RequestOutcome) -> bool {
    outcome.server_stated_output().is_none()
        && !outcome.unstreamed
        && outcome.content_frames > 0
        && !matches!(outcome.kind, OutcomeKind::Failed(_))
}
