//! `llm-replay import FORMAT FILE -o RECORDING`: turn recordings and traces from other tools
//! into recording format v1, one exchange at a time (inputs and outputs stream).
//!
//! One file per source format. Every importer reports bad input as `file:line: field: what`
//! and writes through [`common::recording::RecordingWriter`], so credential headers never
//! reach the output whatever the source held.

use std::path::{Path, PathBuf};

use common::recording::{Exchange, RecordingWriter, Request};
use serde_json::{Map, Value, json};

pub mod azure;
pub mod burstgpt;
pub mod har;
pub mod mooncake;
pub mod openai_batch;
pub mod otel;
pub mod proxymock;
pub mod synth;

pub use synth::{Synth, TokenizerName};

/// The source formats `import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
    /// proxymock RRPair JSON lines, or the markdown `.md` RRPair form.
    Proxymock,
    /// HAR 1.2 (browser or proxy export).
    Har,
    /// AIPerf / Mooncake `mooncake_trace` JSONL.
    Mooncake,
    /// Azure LLM inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`).
    AzureTrace,
    /// BurstGPT CSV (columns read by header name).
    Burstgpt,
    /// OpenAI batch-input JSONL (`custom_id`, `method`, `url`, `body`).
    OpenaiBatch,
    /// OpenTelemetry GenAI semantic-convention spans, OTLP JSON (one document, or one a line).
    OtelGenai,
}

impl ImportFormat {
    /// The format's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ImportFormat::Proxymock => "proxymock",
            ImportFormat::Har => "har",
            ImportFormat::Mooncake => "mooncake",
            ImportFormat::AzureTrace => "azure-trace",
            ImportFormat::Burstgpt => "burstgpt",
            ImportFormat::OpenaiBatch => "openai-batch",
            ImportFormat::OtelGenai => "otel-genai",
        }
    }
}

/// `llm-replay import` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportArgs {
    /// Source format.
    #[arg(value_enum)]
    pub format: ImportFormat,
    /// Source file.
    pub file: PathBuf,
    /// Recording to write (`.jsonl`, or `.jsonl.gz` to compress).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Model name for synthesised requests (mooncake, azure-trace, burstgpt); for burstgpt it
    /// replaces the trace's own model column.
    #[arg(long)]
    pub model: Option<String>,
    /// Text corpus the synthesised prompts are cut from (default: a small built-in
    /// public-domain text).
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Tokenizer that synthesised prompt lengths are measured with.
    #[arg(long, value_enum, default_value = "o200k_base")]
    pub tokenizer: TokenizerName,
    /// Tokens per mooncake hash block.
    #[arg(long, default_value_t = 512)]
    pub block_size: usize,
    /// Import only the first N records of the source.
    #[arg(long)]
    pub limit: Option<u64>,
}

/// The model name synthesised requests carry when `--model` is not given.
pub const DEFAULT_SYNTH_MODEL: &str = "llm-replay-synthetic";

/// A problem importing. Displays as `file:line: field: what` where a line is known.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {source}", path.display())]
    Read {
        path: PathBuf,
        line: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {field}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        line: u64,
        field: String,
        message: String,
    },
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the output is the input file; write the recording elsewhere", path.display())]
    SameFile { path: PathBuf },
    #[error(transparent)]
    Synth(#[from] synth::SynthError),
}

impl ImportError {
    /// Bad input (exit 2) rather than a failure to complete (exit 3).
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            ImportError::Invalid { .. }
                | ImportError::Open { .. }
                | ImportError::SameFile { .. }
                | ImportError::Synth(_)
        )
    }
}

/// Builds `ImportError::Invalid` for one file.
#[derive(Clone)]
pub struct Source {
    pub path: PathBuf,
}

impl Source {
    pub fn invalid(
        &self,
        line: u64,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ImportError {
        ImportError::Invalid {
            path: self.path.clone(),
            line,
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn read_error(&self, line: u64, source: std::io::Error) -> ImportError {
        ImportError::Read {
            path: self.path.clone(),
            line,
            source,
        }
    }

    /// Open for buffered reading.
    pub fn open(&self) -> Result<std::io::BufReader<std::fs::File>, ImportError> {
        let file = std::fs::File::open(&self.path).map_err(|source| ImportError::Open {
            path: self.path.clone(),
            source,
        })?;
        Ok(std::io::BufReader::with_capacity(256 * 1024, file))
    }
}

/// Where importers put exchanges, and the options they share.
pub struct Sink {
    writer: RecordingWriter,
    output: PathBuf,
    /// Exchanges written so far.
    pub written: u64,
    /// `--limit`.
    pub limit: Option<u64>,
}

impl Sink {
    /// Create the output recording.
    pub fn create(output: &Path, limit: Option<u64>) -> Result<Sink, ImportError> {
        let writer =
            RecordingWriter::create_replacing(output).map_err(|source| ImportError::Write {
                path: output.to_path_buf(),
                source,
            })?;
        Ok(Sink {
            writer,
            output: output.to_path_buf(),
            written: 0,
            limit,
        })
    }

    /// False once `--limit` exchanges were written.
    pub fn wants_more(&self) -> bool {
        self.limit.is_none_or(|limit| self.written < limit)
    }

    /// Append one exchange.
    pub fn emit(&mut self, exchange: &Exchange) -> Result<(), ImportError> {
        self.writer
            .write(exchange)
            .map_err(|source| ImportError::Write {
                path: self.output.clone(),
                source,
            })?;
        self.written += 1;
        Ok(())
    }

    /// Flush and close.
    pub fn finish(self) -> Result<u64, ImportError> {
        let written = self.written;
        let output = self.output.clone();
        self.writer.finish().map_err(|source| ImportError::Write {
            path: output,
            source,
        })?;
        Ok(written)
    }
}

/// An exchange with only a request.
/// Request headers an import drops: hop-by-hop ones and those the replay sets itself.
pub fn dropped_request_header(name: &str) -> bool {
    common::recording::is_hop_by_hop_header(name)
        || ["host", "content-length", "accept-encoding"]
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
}

/// Response headers an import drops: hop-by-hop ones, those that no longer describe the
/// stored (decoded) body, and `set-cookie` (a credential).
pub fn dropped_response_header(name: &str) -> bool {
    common::recording::is_hop_by_hop_header(name)
        || ["content-length", "content-encoding", "set-cookie"]
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
}

pub fn exchange(request: Request) -> Exchange {
    Exchange {
        id: None,
        session: None,
        at_ms: None,
        request,
        response: None,
        unknown: Map::new(),
    }
}

/// A `POST path` request with a JSON body.
pub fn json_request(path: &str, body: &Value) -> Request {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert("content-type".to_owned(), "application/json".to_owned());
    Request {
        method: "POST".to_owned(),
        path: path.to_owned(),
        headers,
        body: Some(body.to_string()),
        body_b64: None,
        unknown: Map::new(),
    }
}

/// A streamed OpenAI chat request with one user message and `max_tokens`.
pub fn synthetic_chat_body(model: &str, prompt: &str, max_tokens: Option<u64>) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(max_tokens) = max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    body
}

/// The `synth` note of a synthesised exchange: which tokenizer measured the prompt, how many
/// tokens it has, and the corpus it was cut from.
pub fn synth_note(synth: &Synth, input_tokens: usize) -> Value {
    json!({
        "tokenizer": synth.tokenizer().name(),
        "input_tokens": input_tokens,
        "corpus": synth.corpus_name(),
    })
}

/// Run one import; returns the number of exchanges written.
pub fn run_import(args: &ImportArgs) -> Result<u64, ImportError> {
    run_import_with_notes(args).map(|(written, _)| written)
}

/// Run one import; returns the number of exchanges written and what the importer has to
/// say about its source (lines for stderr: what was skipped, what the source lacked).
pub fn run_import_with_notes(args: &ImportArgs) -> Result<(u64, Vec<String>), ImportError> {
    let source = Source {
        path: args.file.clone(),
    };
    // Open the source before creating the output, so a wrong path leaves no empty file.
    drop(source.open()?);
    if common::recording::is_same_file(&args.file, &args.output) {
        return Err(ImportError::SameFile {
            path: args.output.clone(),
        });
    }
    if args.block_size == 0 {
        return Err(source.invalid(0, "--block-size", "expected a positive number of tokens"));
    }
    let mut sink = Sink::create(&args.output, args.limit)?;
    let model = args.model.as_deref();
    let synth = || Synth::from_path(args.tokenizer, args.corpus.as_deref());
    let mut notes = Vec::new();
    match args.format {
        ImportFormat::Proxymock => proxymock::import(&source, &mut sink)?,
        ImportFormat::Har => har::import(&source, &mut sink)?,
        ImportFormat::OpenaiBatch => openai_batch::import(&source, &mut sink)?,
        ImportFormat::Mooncake => mooncake::import(
            &source,
            &mut sink,
            &synth()?,
            model.unwrap_or(DEFAULT_SYNTH_MODEL),
            args.block_size,
        )?,
        ImportFormat::AzureTrace => azure::import(
            &source,
            &mut sink,
            &synth()?,
            model.unwrap_or(DEFAULT_SYNTH_MODEL),
        )?,
        ImportFormat::Burstgpt => burstgpt::import(&source, &mut sink, &synth()?, model)?,
        ImportFormat::OtelGenai => notes = otel::import(&source, &mut sink)?.lines(),
    }
    Ok((sink.finish()?, notes))
}

/// Split one CSV line into fields (RFC 4180 quotes; no line breaks inside fields).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_handle_quotes() {
        assert_eq!(csv_fields("a,b,,c"), vec!["a", "b", "", "c"]);
        assert_eq!(
            csv_fields(r#"1,"GPT-4, turbo","say ""hi""""#),
            vec!["1", "GPT-4, turbo", r#"say "hi""#]
        );
    }
}

/// Imports of slices of real files (`tests/data`, sources in its README), checked with the
/// tokenizer itself.
#[cfg(test)]
mod real_data_tests {
    use super::*;

    fn test_data(relative: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data")
            .join(relative)
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("llm-replay-import-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join(name)
    }

    fn args(
        format: ImportFormat,
        file: PathBuf,
        output: PathBuf,
        limit: Option<u64>,
    ) -> ImportArgs {
        ImportArgs {
            format,
            file,
            output,
            model: Some("m".into()),
            corpus: Some(test_data("corpus/shakespeare_256k.txt")),
            tokenizer: TokenizerName::O200kBase,
            block_size: 512,
            limit,
        }
    }

    fn prompt(exchange: &Exchange) -> String {
        let body: Value =
            serde_json::from_slice(&exchange.request.body_bytes()).expect("JSON body");
        body["messages"][0]["content"]
            .as_str()
            .expect("one user message")
            .to_owned()
    }

    #[test]
    fn azure_prompts_have_exactly_context_tokens() {
        // Tokenizing keeps a core busy: not beside a timing test.
        let _timing = common::test_timing::timing_lock_blocking();
        let out = temp("azure.jsonl");
        let csv = test_data("azure-2023/AzureLLMInferenceTrace_code_300.csv");
        let written = run_import(&args(
            ImportFormat::AzureTrace,
            csv.clone(),
            out.clone(),
            Some(300),
        ))
        .expect("imports");
        assert_eq!(written, 300);
        let text = std::fs::read_to_string(&csv).expect("csv");
        let rows: Vec<Vec<String>> = text.lines().skip(1).map(csv_fields).collect();
        let bpe = TokenizerName::O200kBase.bpe();
        for (i, ex) in common::recording::read_all(&out)
            .expect("valid")
            .iter()
            .enumerate()
        {
            let want: usize = rows[i][1].parse().expect("ContextTokens");
            assert_eq!(
                bpe.encode_ordinary(&prompt(ex)).len(),
                want,
                "row {}",
                i + 2
            );
            assert_eq!(ex.unknown["synth"]["tokenizer"], "o200k_base");
            let body: Value = serde_json::from_slice(&ex.request.body_bytes()).expect("JSON");
            let max: u64 = rows[i][2].parse().expect("GeneratedTokens");
            assert_eq!(body["max_tokens"], json!(max.max(1)));
        }
    }

    #[test]
    fn mooncake_prompts_within_two_percent_and_shared_prefixes() {
        // Tokenizing keeps a core busy: not beside a timing test.
        let _timing = common::test_timing::timing_lock_blocking();
        let out = temp("mooncake.jsonl");
        let trace = test_data("mooncake/conversation_trace_200.jsonl");
        let n = 200;
        run_import(&args(
            ImportFormat::Mooncake,
            trace.clone(),
            out.clone(),
            Some(n),
        ))
        .expect("imports");
        let lines: Vec<Value> = std::fs::read_to_string(&trace)
            .expect("trace")
            .lines()
            .take(n as usize)
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        let exchanges = common::recording::read_all(&out).expect("valid");
        assert_eq!(exchanges.len(), n as usize);
        let bpe = TokenizerName::O200kBase.bpe();
        let mut worst: f64 = 0.0;
        let prompts: Vec<String> = exchanges.iter().map(prompt).collect();
        for (line, text) in lines.iter().zip(&prompts) {
            let want = line["input_length"].as_f64().expect("input_length");
            let got = bpe.encode_ordinary(text).len() as f64;
            worst = worst.max((got - want).abs() / want);
        }
        assert!(
            worst < 0.02,
            "worst token-count deviation {:.3} %",
            worst * 100.0
        );
        // Every pair sharing k leading hash ids (with k whole blocks in both) shares the text
        // of those k blocks.
        let synth = Synth::from_path(
            TokenizerName::O200kBase,
            Some(&test_data("corpus/shakespeare_256k.txt")),
        )
        .expect("corpus");
        let ids = |v: &Value| -> Vec<u64> {
            v["hash_ids"]
                .as_array()
                .expect("ids")
                .iter()
                .filter_map(Value::as_u64)
                .collect()
        };
        let mut checked = 0;
        for a in 0..lines.len() {
            for b in (a + 1)..lines.len().min(a + 40) {
                let (ia, ib) = (ids(&lines[a]), ids(&lines[b]));
                let k = ia.iter().zip(&ib).take_while(|(x, y)| x == y).count();
                let whole = |v: &Value| v["input_length"].as_u64().unwrap_or(0) as usize / 512;
                let k = k.min(whole(&lines[a])).min(whole(&lines[b]));
                let (mut t, mut blk) = (Vec::new(), Vec::new());
                if k == 0 {
                    let (pa, pb) = (&prompts[a], &prompts[b]);
                    if ia.first() != ib.first() {
                        assert_ne!(pa[..64], pb[..64], "lines {} and {}", a + 1, b + 1);
                    }
                    continue;
                }
                let (prefix, _) =
                    mooncake::prompt_for(&synth, &ia[..k], k * 512, 512, 0, &mut t, &mut blk);
                assert!(prompts[a].starts_with(&prefix) && prompts[b].starts_with(&prefix));
                checked += 1;
            }
        }
        assert!(checked > 100, "only {checked} pairs shared a prefix");
    }
}
