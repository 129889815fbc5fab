//! `--tokenizer FILE`: exact token counts from a Hugging Face `tokenizer.json` on disk, for
//! streams without a usage report (output: the generated text) and requests without one
//! (input: the prompt, through the model's chat template when it has one).
//!
//! Nothing is downloaded. The file is read by the `tokenizers` crate (pure Rust); its
//! truncation and padding are switched off, since a count must see every token.
//!
//! # Counting text fast
//!
//! [`Tokenizer::count_text`] runs once for every stream without usage, so it must keep up with
//! the load. Tokenizing a whole text through `tokenizers` (`encode_fast`) measured
//! ~1.2 M tokens/s per core; most of that is the normalizer's alignment bookkeeping and the
//! pre-tokenizer's regex, redone for words seen thousands of times. So, when the tokenizer's
//! pipeline allows it (see [`Tokenizer::describe`], "word cache"), the text is cut into chunks
//! before every ASCII space and after every newline that sits between two printable ASCII
//! characters (`"a b\nc"` → `"a"`, `" b\n"`, `"c"`), each chunk is counted once through the real tokenizer and remembered
//! (chunk → count, a per-thread cache keyed by the tokenizer), and the text's count is the
//! sum. This equals `encode(text, false).len()` exactly because each piece of the pipeline
//! cuts there too:
//! - the normalizer is absent or one of NFC, NFD, NFKC, NFKD, lowercase (or a sequence of
//!   them): each maps characters without looking across an ASCII space between two ASCII
//!   characters (no composition involves an ASCII character);
//! - the pre-tokenizer splits before such a space and after such a newline, and matches from
//!   there with no look-behind (a lone newline after a non-space character is matched alike
//!   whether a character or the text's end follows it):
//!   the byte-level pre-tokenizer with its GPT-2 regex, whitespace splitting, or a `Split`
//!   with one of the known GPT-2 / Llama 3 / Qwen 2 patterns, followed only by
//!   pre-tokenizers that work split by split (byte-level without regex, digits,
//!   punctuation);
//! - no added token contains whitespace or strips the whitespace around it;
//! - the model tokenizes each pre-token on its own (every `tokenizers` model does).
//!
//! Any other pipeline (SentencePiece's `Prepend`/`Metaspace`, a custom regex) counts the
//! whole text with `encode_fast`. The unit tests compare both ways on many texts.
//!
//! Measured once (release, one core, the test tokenizer, Shakespeare cut in 2 KB texts):
//! `encode_fast` 0.6–1.0 M tokens/s; chunked with a cold cache 3.8 M tokens/s; text not seen
//! before, after the cache warmed on other text of the same kind, 4.1 M tokens/s; text seen
//! before 30–35 M tokens/s. A cache miss costs one `encode_fast` of the chunk, so short
//! texts of unusual words (code, other scripts without spaces) count at about
//! `encode_fast`'s speed.
//!
//! # Counting a prompt
//!
//! [`Tokenizer::count_prompt`] takes the prompt the one prompt walker finds
//! ([`formats::request::prompt_of`]: chat messages in the OpenAI shape as a server's
//! OpenAI-compatible path sees them, Anthropic and Bedrock tool blocks converted to tool
//! calls and `tool` messages, or completions texts), renders the model's chat template
//! (from a `chat_template.jinja` or `tokenizer_config.json` next to the file, or a
//! `chat_template` key of `tokenizer.json`: [`config_beside`]) with
//! `add_generation_prompt`, and counts the result with its special tokens (the template
//! writes the BOS itself; no other is added, as vLLM encodes a rendered chat without special
//! tokens and llama.cpp drops a rendered BOS before adding its own). What is approximated:
//! - with a template: message content is text (the text parts of a content list
//!   concatenated; images and other non-text parts are not counted); tools are passed as
//!   OpenAI tools, and their JSON (`tojson`) has its keys sorted, where Python keeps the
//!   request's order;
//! - without a template (or when rendering fails: warned once): the message texts, tool
//!   calls and the tools' JSON are counted as one text; role markers and separators are not
//!   counted.
//!
//! Completions-style prompts (`prompt`, Ollama `/api/generate`) are counted as text, each
//! with the special tokens the server adds to a prompt it tokenizes: the BOS of a model that
//! adds one (`add_bos_token` in `tokenizer_config.json`, else the tokenizer's
//! post-processor; [`Tokenizer::sequence_specials`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::Value;

use crate::formats;
use crate::formats::request::{ChatMessage, ChatPrompt, Prompt, prompt_of};

/// A problem loading a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The file could not be read (missing, unreadable).
    #[error("{}: cannot read the tokenizer: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{name}: not a tokenizer.json: not JSON: {source}")]
    NotJson {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// The file is JSON but not a Hugging Face `tokenizer.json`.
    #[error("{name}: not a tokenizer.json: {what}")]
    NotTokenizer { name: String, what: String },
    /// `tokenizers` rejected the file.
    #[error("{name}: not a usable tokenizer.json: {source}")]
    Invalid {
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `tokenizer_config.json` is not JSON or its `chat_template` is not a template.
    #[error("{name}: {what}")]
    Config { name: String, what: String },
}

/// A loaded tokenizer. Cheap to clone (shared), usable from any thread.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

/// What [`Tokenizer::prompt_tokens`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptCount {
    /// Input tokens.
    pub tokens: u64,
    /// The prompt was rendered through the chat template (else the texts were counted as
    /// they are: an approximation, see the module doc).
    pub templated: bool,
}

struct Inner {
    /// Distinguishes tokenizers in the per-thread chunk caches.
    id: u64,
    name: String,
    tokenizer: tokenizers::Tokenizer,
    /// The pipeline allows counting chunk by chunk (module doc).
    chunked: bool,
    template: Option<ChatTemplate>,
    /// Special tokens the server adds around each completions-style prompt (the BOS of a
    /// model that adds one): [`sequence_specials`].
    sequence_specials: u64,
    /// A template failed to render once (warned once, then silent).
    template_warned: AtomicBool,
    /// A text failed to encode once.
    encode_warned: AtomicBool,
}

struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat_template";

/// The `tokenizer_config.json` beside the `tokenizer.json` at `path`, with the chat template
/// of a `chat_template.jinja` beside it (where models keep it since transformers 4.43,
/// their config then holding none) put under its `chat_template` key: one set of config
/// bytes, as [`Tokenizer::from_parts`] and the workers take them. The `.jinja` file wins
/// over a template in the config, as in transformers. `None` when neither file is there.
pub fn config_beside(path: &Path) -> Result<Option<Vec<u8>>, TokenizerError> {
    let read = |name: &str| -> Result<Option<Vec<u8>>, TokenizerError> {
        let beside = path.with_file_name(name);
        if beside == path {
            return Ok(None);
        }
        match std::fs::read(&beside) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TokenizerError::Read {
                path: beside,
                source,
            }),
        }
    };
    let config = read("tokenizer_config.json")?;
    let Some(template) = read("chat_template.jinja")? else {
        return Ok(config);
    };
    let jinja_name = path
        .with_file_name("chat_template.jinja")
        .display()
        .to_string();
    let template = String::from_utf8(template).map_err(|_| TokenizerError::Config {
        name: jinja_name.clone(),
        what: "not UTF-8 text".to_owned(),
    })?;
    let mut object = match config {
        Some(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(object)) => object,
            _ => {
                return Err(TokenizerError::Config {
                    name: path
                        .with_file_name("tokenizer_config.json")
                        .display()
                        .to_string(),
                    what: "not a JSON object".to_owned(),
                });
            }
        },
        None => serde_json::Map::new(),
    };
    object.insert(TEMPLATE_NAME.to_owned(), Value::String(template));
    serde_json::to_vec(&object)
        .map(Some)
        .map_err(|error| TokenizerError::Config {
            name: jinja_name,
            what: error.to_string(),
        })
}

impl Tokenizer {
    /// Load `path` (a `tokenizer.json`, or a model directory holding one), and the chat
    /// template of a `tokenizer_config.json` beside it when there is one.
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let in_directory;
        let path = if path.is_dir() {
            in_directory = path.join("tokenizer.json");
            in_directory.as_path()
        } else {
            path
        };
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Read {
            path: path.to_owned(),
            source,
        })?;
        let config_path = path.with_file_name("tokenizer_config.json");
        let config = config_beside(path)?;
        Tokenizer::from_parts_named(
            &bytes,
            config.as_deref(),
            &path.display().to_string(),
            &config_path.display().to_string(),
        )
    }

    /// A tokenizer from the bytes of a `tokenizer.json` (`name` says where they came from, in
    /// errors and [`Tokenizer::describe`]).
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_parts(bytes, None, name)
    }

    /// A tokenizer from the bytes of a `tokenizer.json` and, optionally, of its
    /// `tokenizer_config.json` (chat template, BOS and EOS tokens).
    pub fn from_parts(
        tokenizer_json: &[u8],
        config_json: Option<&[u8]>,
        name: &str,
    ) -> Result<Tokenizer, TokenizerError> {
        let config_name = format!("{name} (tokenizer_config.json)");
        Tokenizer::from_parts_named(tokenizer_json, config_json, name, &config_name)
    }

    fn from_parts_named(
        tokenizer_json: &[u8],
        config_json: Option<&[u8]>,
        name: &str,
        config_name: &str,
    ) -> Result<Tokenizer, TokenizerError> {
        let json: Value =
            serde_json::from_slice(tokenizer_json).map_err(|source| TokenizerError::NotJson {
                name: name.to_owned(),
                source,
            })?;
        let not_tokenizer = |what: &str| TokenizerError::NotTokenizer {
            name: name.to_owned(),
            what: what.to_owned(),
        };
        let Some(object) = json.as_object() else {
            return Err(not_tokenizer("expected a JSON object"));
        };
        if !object.contains_key("model") {
            return Err(not_tokenizer("no \"model\" field"));
        }
        let mut tokenizer =
            tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(|source| {
                TokenizerError::Invalid {
                    name: name.to_owned(),
                    source,
                }
            })?;
        tokenizer
            .with_truncation(None)
            .map_err(|source| TokenizerError::Invalid {
                name: name.to_owned(),
                source,
            })?;
        tokenizer.with_padding(None);

        let config: Option<Value> = match config_json {
            Some(bytes) => {
                Some(
                    serde_json::from_slice(bytes).map_err(|error| TokenizerError::Config {
                        name: config_name.to_owned(),
                        what: format!("not JSON: {error}"),
                    })?,
                )
            }
            None => None,
        };
        let template_source = config
            .as_ref()
            .and_then(|c| template_text(c.get("chat_template")?))
            .or_else(|| template_text(json.get("chat_template")?));
        let token_text = |key: &str| -> String {
            let value = config.as_ref().and_then(|c| c.get(key));
            match value {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                _ => String::new(),
            }
        };
        let template = match template_source {
            Some(source) => Some(ChatTemplate {
                env: template_environment(source).map_err(|error| TokenizerError::Config {
                    name: config_name.to_owned(),
                    what: format!("chat_template: {error}"),
                })?,
                bos_token: token_text("bos_token"),
                eos_token: token_text("eos_token"),
            }),
            None => None,
        };
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let chunked = counts_by_chunks(&tokenizer);
        let add_bos = config
            .as_ref()
            .and_then(|c| c.get("add_bos_token"))
            .and_then(Value::as_bool);
        let sequence_specials = sequence_specials(&tokenizer, add_bos, &token_text("bos_token"));
        Ok(Tokenizer {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                name: name.to_owned(),
                tokenizer,
                chunked,
                template,
                sequence_specials,
                template_warned: AtomicBool::new(false),
                encode_warned: AtomicBool::new(false),
            }),
        })
    }

    /// One line for logs and reports: the file, its vocabulary size, whether it has a chat
    /// template, and how text is counted.
    pub fn describe(&self) -> String {
        let inner = &self.inner;
        format!(
            "{} (vocabulary {}, {}, {})",
            inner.name,
            inner.tokenizer.get_vocab_size(true),
            if inner.template.is_some() {
                "chat template"
            } else {
                "no chat template"
            },
            if inner.chunked {
                "word cache"
            } else {
                "whole-text encoding"
            }
        )
    }

    /// Whether a chat template was loaded.
    pub fn has_chat_template(&self) -> bool {
        self.inner.template.is_some()
    }

    /// Tokens of `text` without special tokens added (`encode(text, false)`), exactly; special
    /// tokens written in the text count as one each, as the tokenizer parses them.
    pub fn count_text(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        if !self.inner.chunked {
            return self.encode_len(text);
        }
        CHUNK_COUNTS.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.owner != self.inner.id {
                cache.map.clear();
                cache.owner = self.inner.id;
            }
            let mut total = 0u64;
            for chunk in chunks(text) {
                if chunk.len() > MAX_CACHED_CHUNK_BYTES {
                    total += self.encode_len(chunk);
                    continue;
                }
                if let Some(&count) = cache.map.get(chunk) {
                    total += u64::from(count);
                    continue;
                }
                let count = self.encode_len(chunk);
                if cache.map.len() >= MAX_CACHED_CHUNKS {
                    cache.map.clear();
                }
                cache
                    .map
                    .insert(chunk.into(), u32::try_from(count).unwrap_or(u32::MAX));
                total += count;
            }
            total
        })
    }

    /// Input tokens of a request body sent to `path` ([`Tokenizer::prompt_tokens`]); `None`
    /// when the body holds no prompt.
    pub fn count_prompt(&self, path: &str, body: &[u8]) -> Option<u64> {
        self.prompt_tokens(path, body).map(|count| count.tokens)
    }

    /// Input tokens of a request body, and whether the chat template rendered them (module
    /// doc: what is approximated). `None` when the body is not JSON or holds no prompt.
    pub fn prompt_tokens(&self, path: &str, body: &[u8]) -> Option<PromptCount> {
        let body: Value = serde_json::from_slice(body).ok()?;
        match prompt_of(formats::family_for_path(path), &body)? {
            Prompt::Text(texts) => Some(PromptCount {
                tokens: texts
                    .iter()
                    .map(|text| self.count_text(text) + self.inner.sequence_specials)
                    .sum(),
                templated: false,
            }),
            Prompt::Chat(chat) => Some(self.chat_tokens(&chat)),
        }
    }

    /// A chat prompt through the template, else (none, or it failed: warned once) its texts.
    fn chat_tokens(&self, chat: &ChatPrompt) -> PromptCount {
        if let Some(template) = &self.inner.template {
            match render(template, &chat.messages, chat.tools.as_ref()) {
                Ok(rendered) => {
                    return PromptCount {
                        tokens: self.count_text(&rendered),
                        templated: true,
                    };
                }
                Err(error) => {
                    if !self.inner.template_warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            tokenizer = %self.inner.name,
                            %error,
                            "the chat template failed to render; prompts are counted without it (role markers not counted)"
                        );
                    }
                }
            }
        }
        let mut text = String::new();
        for message in &chat.messages {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&message.content);
            if let Some(calls) = &message.tool_calls {
                text.push_str(&calls.to_string());
            }
        }
        if let Some(tools) = &chat.tools {
            text.push('\n');
            text.push_str(&tools.to_string());
        }
        PromptCount {
            tokens: self.count_text(&text),
            templated: false,
        }
    }

    /// Render the chat template for a request body, as counted by
    /// [`Tokenizer::prompt_tokens`]; `None` without a template or a prompt, or when rendering
    /// fails.
    pub fn render_prompt(&self, path: &str, body: &[u8]) -> Option<String> {
        let template = self.inner.template.as_ref()?;
        let body: Value = serde_json::from_slice(body).ok()?;
        match prompt_of(formats::family_for_path(path), &body)? {
            Prompt::Chat(chat) => render(template, &chat.messages, chat.tools.as_ref()).ok(),
            Prompt::Text(_) => None,
        }
    }

    /// Special tokens a server adds to each completions-style prompt (the BOS of a model
    /// that adds one); a chat prompt's template writes its own.
    pub fn sequence_specials(&self) -> u64 {
        self.inner.sequence_specials
    }

    /// `encode_fast(text, false).len()`; 0 (warned once) if the tokenizer fails.
    fn encode_len(&self, text: &str) -> u64 {
        match self.inner.tokenizer.encode_fast(text, false) {
            Ok(encoding) => encoding.len() as u64,
            Err(error) => {
                if !self.inner.encode_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(tokenizer = %self.inner.name, %error, "a text failed to tokenize; counted as 0 tokens");
                }
                0
            }
        }
    }

    #[cfg(test)]
    fn encode_plain(&self, text: &str) -> u64 {
        self.inner
            .tokenizer
            .encode(text, false)
            .expect("encodes")
            .len() as u64
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Chunks longer than this are counted without being cached (a long run without spaces is
/// rarely seen twice).
const MAX_CACHED_CHUNK_BYTES: usize = 64;
/// The per-thread cache is cleared when it holds this many chunks.
const MAX_CACHED_CHUNKS: usize = 100_000;

/// Chunk → token count, per thread (no lock on the hot path), for one tokenizer at a time.
#[derive(Default)]
struct ChunkCounts {
    owner: u64,
    map: HashMap<Box<str>, u32, BuildHasherDefault<FxHasher>>,
}

thread_local! {
    static CHUNK_COUNTS: RefCell<ChunkCounts> = RefCell::new(ChunkCounts::default());
}

/// The Firefox/rustc hash (multiply-rotate over 8-byte words): the default SipHash costs
/// more than the rest of a cache hit for chunks of a few bytes, and the keys are not chosen
/// by an attacker who could profit from collisions (at worst a slower count).
#[derive(Default, Clone, Copy)]
struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(
                chunk.try_into().expect("chunks_exact gives 8 bytes"),
            ));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// The special tokens a server adds to each completions-style prompt it tokenizes (vLLM
/// encodes it with `add_special_tokens=True`, llama.cpp adds the BOS when the model says it
/// does): those the tokenizer's post-processor adds to one sequence (Llama 3's
/// `TemplateProcessing` adds `<|begin_of_text|>`), with the BOS added or taken away as
/// `tokenizer_config.json`'s `add_bos_token` says when it says (transformers rebuilds the
/// post-processor from it, and llama.cpp's GGUF conversion reads it). A chat prompt gets
/// none of these: its template writes the BOS itself (vLLM renders and encodes without
/// special tokens; llama.cpp drops a rendered BOS before adding its own).
fn sequence_specials(
    tokenizer: &tokenizers::Tokenizer,
    add_bos: Option<bool>,
    bos_token: &str,
) -> u64 {
    const PROBE: &str = "a";
    let (Ok(plain), Ok(with)) = (
        tokenizer.encode_fast(PROBE, false),
        tokenizer.encode_fast(PROBE, true),
    ) else {
        return 0;
    };
    let added = with.len().saturating_sub(plain.len()) as u64;
    let bos_id = (!bos_token.is_empty())
        .then(|| tokenizer.token_to_id(bos_token))
        .flatten();
    let starts_with_bos = bos_id.is_some()
        && with.get_ids().first().copied() == bos_id
        && plain.get_ids().first().copied() != bos_id;
    match add_bos {
        Some(true) if bos_id.is_some() && !starts_with_bos => added + 1,
        Some(false) if starts_with_bos => added - 1,
        _ => added,
    }
}

/// Printable ASCII, not a space.
#[inline]
fn is_ascii_graphic(byte: u8) -> bool {
    (0x21..=0x7e).contains(&byte)
}

/// `text` cut before every ASCII space between two printable ASCII characters, and after
/// every newline between two printable ASCII characters.
fn chunks(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut breaks = memchr::memchr2_iter(b' ', b'\n', bytes);
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        for i in breaks.by_ref() {
            if i == 0 || i + 1 >= bytes.len() {
                continue;
            }
            if !(is_ascii_graphic(bytes[i - 1]) && is_ascii_graphic(bytes[i + 1])) {
                continue;
            }
            // Both neighbours are ASCII, so the cut is a character boundary.
            let cut = if bytes[i] == b' ' { i } else { i + 1 };
            if cut > start {
                let chunk = &text[start..cut];
                start = cut;
                return Some(chunk);
            }
        }
        done = true;
        Some(&text[start..])
    })
}

/// The Split patterns known to cut before a space between two non-space characters and to
/// match from there without look-behind (GPT-2, Llama 3, Qwen 2).
const KNOWN_SPLIT_PATTERNS: &[&str] = &[
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Whether `tokenizer`'s pipeline gives the same count chunk by chunk (module doc).
fn counts_by_chunks(tokenizer: &tokenizers::Tokenizer) -> bool {
    let normalizer_ok = match tokenizer.get_normalizer() {
        None => true,
        Some(normalizer) => serde_json::to_value(normalizer).is_ok_and(|n| normalizer_is_local(&n)),
    };
    let pre_tokenizer_ok = tokenizer
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_value(p).ok())
        .is_some_and(|p| pre_tokenizer_cuts_at_spaces(&p));
    let added_ok = tokenizer.get_added_tokens_decoder().values().all(|t| {
        !t.lstrip && !t.rstrip && !t.single_word && !t.content.chars().any(char::is_whitespace)
    });
    normalizer_ok && pre_tokenizer_ok && added_ok
}

fn normalizer_is_local(normalizer: &Value) -> bool {
    match normalizer.get("type").and_then(Value::as_str) {
        Some("NFC" | "NFD" | "NFKC" | "NFKD" | "Lowercase") => true,
        Some("Sequence") => normalizer
            .get("normalizers")
            .and_then(Value::as_array)
            .is_some_and(|list| list.iter().all(normalizer_is_local)),
        _ => false,
    }
}

/// The pre-tokenizer cuts before a space between two printable ASCII characters, and what
/// follows it works split by split.
fn pre_tokenizer_cuts_at_spaces(pre: &Value) -> bool {
    let kind = pre.get("type").and_then(Value::as_str);
    match kind {
        Some("Sequence") => {
            let Some(list) = pre.get("pretokenizers").and_then(Value::as_array) else {
                return false;
            };
            let Some((first, rest)) = list.split_first() else {
                return false;
            };
            pre_tokenizer_cuts_at_spaces(first) && rest.iter().all(works_split_by_split)
        }
        Some("ByteLevel") => pre.get("use_regex").and_then(Value::as_bool) != Some(false),
        Some("Whitespace" | "WhitespaceSplit" | "BertPreTokenizer") => true,
        Some("Split") => {
            let pattern = pre.pointer("/pattern/Regex").and_then(Value::as_str);
            pattern.is_some_and(|p| KNOWN_SPLIT_PATTERNS.contains(&p))
                && pre.get("behavior").and_then(Value::as_str) == Some("Isolated")
                && pre.get("invert").and_then(Value::as_bool) == Some(false)
        }
        _ => false,
    }
}

/// Pre-tokenizers that only cut within a split, the same whatever splits came before.
fn works_split_by_split(pre: &Value) -> bool {
    match pre.get("type").and_then(Value::as_str) {
        Some("ByteLevel" | "Digits" | "Punctuation" | "Whitespace" | "WhitespaceSplit") => true,
        Some("Split") => pre_tokenizer_cuts_at_spaces(pre),
        _ => false,
    }
}

/// A `chat_template` value: a string, or a list of `{name, template}` (the one named
/// `default`, else the first).
fn template_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |name: &str| {
                list.iter().find_map(|item| {
                    (item.get("name")?.as_str()? == name)
                        .then(|| item.get("template")?.as_str().map(str::to_owned))
                        .flatten()
                })
            };
            named("default").or_else(|| {
                list.iter()
                    .find_map(|item| item.get("template")?.as_str().map(str::to_owned))
            })
        }
        _ => None,
    }
}

/// A Jinja environment set up as Hugging Face's `apply_chat_template` sets up its own:
/// `trim_blocks`, `lstrip_blocks`, `raise_exception`, `strftime_now`, Python string methods
/// (`.strip()`, ...), and a `tojson` writing Python's `json.dumps` spacing.
fn template_environment(
    source: String,
) -> Result<minijinja::Environment<'static>, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()?;
    env.set_syntax(syntax);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_function("strftime_now", |format: String| -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        strftime(&format, now)
    });
    env.add_filter(
        "tojson",
        |value: minijinja::Value, indent: Option<usize>| -> Result<String, minijinja::Error> {
            python_json(&value, indent).map_err(|error| {
                minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, error.to_string())
            })
        },
    );
    env.add_template_owned(TEMPLATE_NAME, source)?;
    Ok(env)
}

/// `json.dumps(value, ensure_ascii=False)` (separators `", "` and `": "`), or with `indent`.
fn python_json(
    value: &minijinja::Value,
    indent: Option<usize>,
) -> Result<String, serde_json::Error> {
    use serde::Serialize;
    let mut out = Vec::new();
    match indent {
        Some(width) => {
            let spaces = vec![b' '; width];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&spaces),
            );
            value.serialize(&mut ser)?;
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            value.serialize(&mut ser)?;
        }
    }
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// serde_json's compact output with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// The few `strftime` directives chat templates use for today's date (`%d %b %Y`,
/// `%Y-%m-%d`); others are written as they are.
fn strftime(format: &str, unix_s: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (year, month, day) = crate::civil::civil_from_days((unix_s / 86_400) as i64);
    let month_name = MONTHS[(month as usize).saturating_sub(1).min(11)];
    let seconds = unix_s % 86_400;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{year:04}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('H') => out.push_str(&format!("{:02}", seconds / 3600)),
            Some('M') => out.push_str(&format!("{:02}", (seconds / 60) % 60)),
            Some('S') => out.push_str(&format!("{:02}", seconds % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The generated text of a one-body (non-streamed) JSON answer of any family, concatenated
/// as a stream's content frames would deliver it: message text, reasoning, refusals and tool
/// calls' arguments (OpenAI chat and completions, Responses, Anthropic, Ollama, Bedrock
/// Converse). `None` when the body is not JSON.
pub fn response_body_text(body: &[u8]) -> Option<String> {
    let body: Value = serde_json::from_slice(body).ok()?;
    let mut out = String::new();
    let mut push = |value: &Value| {
        if let Some(text) = value.as_str() {
            out.push_str(text);
        } else if value.is_object() {
            out.push_str(&value.to_string());
        }
    };
    for choice in body
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(&choice["text"]);
        let message = &choice["message"];
        for key in ["reasoning_content", "reasoning", "refusal"] {
            push(&message[key]);
        }
        match &message["content"] {
            Value::Array(parts) => parts.iter().for_each(|part| push(&part["text"])),
            content => push(content),
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            push(&call["function"]["arguments"]);
        }
        push(&message["function_call"]["arguments"]);
    }
    for item in body
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        // OpenAI Responses.
        for part in item["summary"].as_array().into_iter().flatten() {
            push(&part["text"]);
        }
        for part in item["content"].as_array().into_iter().flatten() {
            push(&part["text"]);
            push(&part["refusal"]);
        }
        push(&item["arguments"]);
    }
    // Anthropic (and Bedrock invoke of Claude): content blocks.
    for block in body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(&block["text"]);
        push(&block["thinking"]);
        push(&block["input"]);
    }
    // Ollama: chat message or generate response.
    push(&body["message"]["thinking"]);
    push(&body["message"]["content"]);
    push(&body["response"]);
    // Bedrock Converse.
    for block in body["output"]["message"]["content"]
        .as_array()
        .into_iter()
        .flatten()
    {
        push(&block["text"]);
        push(&block["toolUse"]["input"]);
        push(&block["reasoningContent"]["reasoningText"]["text"]);
    }
    Some(out)
}

fn render(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    tools: Option<&Value>,
) -> Result<String, minijinja::Error> {
    let compiled = template.env.get_template(TEMPLATE_NAME)?;
    let tools = tools.map(|t| minijinja::Value::from(minijinja::value::Serde(t)));
    compiled.render(minijinja::context! {
        messages => minijinja::Value::from(minijinja::value::Serde(messages)),
        tools => tools,
        add_generation_prompt => true,
        bos_token => template.bos_token.as_str(),
        eos_token => template.eos_token.as_str(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claude_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json")
    }

    /// Loaded once for every test (a load takes a tenth of a second).
    fn claude() -> Tokenizer {
        static CLAUDE: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
        CLAUDE
            .get_or_init(|| Tokenizer::from_file(&claude_path()).expect("the test tokenizer loads"))
            .clone()
    }

    fn sample_texts() -> Vec<String> {
        let mut texts: Vec<String> = [
            "a b",
            " a b ",
            "a  b",
            "a\nb",
            "a\n\nb",
            "a \nb",
            "a\n b",
            "!\nB",
            "x.\n\ny",
            "a\r\nb\rc",
            "\nlead\ntrail\n",
            "line one,\nline two;\n  indented\n\tTab\nend",
            "a\tb c\nd",
            "x's y'll z 've",
            "Hello , world ! 123 4567 8.9",
            "e\u{301} e\u{301} x \u{301}y",
            "ﬁ ﬁ ﬀ ² ½ Ⅻ",
            "東京 タワー 日本語のテキスト です。 中文 文本",
            "🎉 🚀 👩‍👩‍👧 emoji 🇫🇷 flags",
            "<EOT> <META> x<EOT>y <SOS>",
            "trailing space ",
            " leading",
            "   ",
            "\n\n\n",
            "tabs\t\tand\u{a0}nbsp\u{2003}em space",
            "https://example.com/a?b=c&d=e path/to/file.rs:12",
            "fn main() { println!(\"{}\", 1 + 2); }",
            "ALL CAPS AND MiXeD cAsE words",
            "Ünïcödé wörds with àccents ñ ç",
            "Привет мир , как дела ?",
            "مرحبا بالعالم",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let corpus = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/corpus/shakespeare_256k.txt"),
        )
        .expect("the test corpus");
        // Pieces of the corpus cut at arbitrary character positions.
        let chars: Vec<char> = corpus.chars().take(60_000).collect();
        let mut at = 0;
        let mut len = 1;
        while at + len < chars.len() {
            texts.push(chars[at..at + len].iter().collect());
            at += len;
            len = len * 7 % 997 + 1;
        }
        texts
    }

    #[test]
    fn counting_by_chunks_equals_encoding_the_whole_text() {
        let tokenizer = claude();
        for text in sample_texts() {
            assert_eq!(
                tokenizer.count_text(&text),
                tokenizer.encode_plain(&text),
                "{text:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_text_counts_as_its_encoding(text in "[ a-zA-Z0-9.,'!\\n\\t\u{e9}\u{301}\u{4e2d}\u{1f389}\u{a0}<>]{0,80}") {
            let tokenizer = claude();
            proptest::prop_assert_eq!(tokenizer.count_text(&text), tokenizer.encode_plain(&text));
        }
    }

    /// The test tokenizer with a Llama 3 style pre-tokenizer (a known Split, then byte-level
    /// without regex), so the chunked path is checked for that shape too.
    #[test]
    fn a_llama3_style_split_counts_by_chunks_exactly() {
        let mut json: Value =
            serde_json::from_slice(&std::fs::read(claude_path()).expect("read")).expect("json");
        json["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KNOWN_SPLIT_PATTERNS[1]},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]});
        let tokenizer =
            Tokenizer::from_bytes(json.to_string().as_bytes(), "llama3-like").expect("loads");
        assert!(tokenizer.describe().contains("word cache"));
        for text in sample_texts().iter().take(400) {
            assert_eq!(
                tokenizer.count_text(text),
                tokenizer.encode_plain(text),
                "{text:?}"
            );
        }
        // A SentencePiece-style normalizer is not chunked.
        json["normalizer"] = serde_json::json!({"type": "Prepend", "prepend": "▁"});
        let whole = Tokenizer::from_bytes(json.to_string().as_bytes(), "prepend").expect("loads");
        assert!(whole.describe().contains("whole-text"));
        assert_eq!(whole.count_text("a b c"), whole.encode_plain("a b c"));
    }

    #[test]
    fn a_bad_file_is_named_with_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("llm-replay-tok-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let missing = dir.join("missing.json");
        let error = Tokenizer::from_file(&missing)
            .expect_err("missing")
            .to_string();
        assert!(error.contains("missing.json"), "{error}");
        assert!(error.contains("cannot read"), "{error}");

        let not_json = dir.join("notjson.json");
        std::fs::write(&not_json, "hello").expect("write");
        let error = Tokenizer::from_file(&not_json)
            .expect_err("not JSON")
            .to_string();
        assert!(
            error.contains("notjson.json") && error.contains("not JSON"),
            "{error}"
        );

        let no_model = dir.join("nomodel.json");
        std::fs::write(&no_model, r#"{"version": "1.0"}"#).expect("write");
        let error = Tokenizer::from_file(&no_model)
            .expect_err("no model")
            .to_string();
        assert!(
            error.contains("nomodel.json") && error.contains("\"model\""),
            "{error}"
        );

        let bad_model = dir.join("badmodel.json");
        std::fs::write(&bad_model, r#"{"model": {"type": "BPE", "vocab": 3}}"#).expect("write");
        let error = Tokenizer::from_file(&bad_model)
            .expect_err("bad model")
            .to_string();
        assert!(error.contains("badmodel.json"), "{error}");
        std::fs::remove_dir_all(&dir).ok();
    }

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn a_chat_template_jinja_beside_the_file_is_the_template() {
        let dir = std::env::temp_dir().join(format!("llm-replay-tok-jinja-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("tokenizer.json");
        std::fs::copy(claude_path(), &path).expect("copy");
        assert!(config_beside(&path).expect("reads").is_none());
        std::fs::write(dir.join("chat_template.jinja"), CHATML).expect("write template");
        let tokenizer = Tokenizer::from_file(&path).expect("loads");
        assert!(tokenizer.has_chat_template());
        // Beside a config without a template, merged into it (its other keys kept).
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::json!({"eos_token": "<EOT>"}).to_string(),
        )
        .expect("write config");
        let config: Value =
            serde_json::from_slice(&config_beside(&path).expect("reads").expect("a config"))
                .expect("JSON");
        assert_eq!(config["chat_template"], CHATML);
        assert_eq!(config["eos_token"], "<EOT>");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_chat_template_beside_the_file_renders_the_prompt_counted_with_it() {
        let dir =
            std::env::temp_dir().join(format!("llm-replay-tok-chatml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("tokenizer.json");
        std::fs::copy(claude_path(), &path).expect("copy");
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::json!({"chat_template": [{"name": "tool_use", "template": "x"},
                                                 {"name": "default", "template": CHATML}],
                               "bos_token": {"content": "<SOS>"}, "eos_token": "<EOT>"})
            .to_string(),
        )
        .expect("write config");
        let tokenizer = Tokenizer::from_file(&path).expect("loads");
        assert!(tokenizer.has_chat_template());
        let from_directory = Tokenizer::from_file(&dir).expect("a model directory loads");
        assert!(from_directory.has_chat_template());
        let expected = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
        // The same prompt in four families.
        let bodies = [
            (
                "/v1/chat/completions",
                serde_json::json!({"messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}]}),
            ),
            (
                "/v1/messages",
                serde_json::json!({"system": [{"type": "text", "text": "You are terse."}],
                "messages": [{"role": "user", "content": "What is 2+2?"}]}),
            ),
            (
                "/model/m/converse-stream",
                serde_json::json!({"system": [{"text": "You are terse."}],
                "messages": [{"role": "user", "content": [{"text": "What is 2+2?"}]}]}),
            ),
            (
                "/v1/responses",
                serde_json::json!({"instructions": "You are terse.",
                "input": "What is 2+2?"}),
            ),
        ];
        for (path, body) in bodies {
            let body = body.to_string();
            assert_eq!(
                tokenizer.render_prompt(path, body.as_bytes()).as_deref(),
                Some(expected),
                "{path}"
            );
            // Computed once with Python `tokenizers` 0.23.3 on the rendered text.
            assert_eq!(
                tokenizer.prompt_tokens(path, body.as_bytes()),
                Some(PromptCount {
                    tokens: 52,
                    templated: true
                }),
                "{path}"
            );
        }
        // Without the config: the texts alone, approximate.
        let plain = claude();
        let body = bodies_text();
        let counted = plain
            .prompt_tokens("/v1/chat/completions", body.as_bytes())
            .expect("a prompt");
        assert!(!counted.templated);
        assert_eq!(
            counted.tokens,
            plain.count_text("You are terse.\nWhat is 2+2?")
        );
        assert_eq!(plain.count_prompt("/v1/chat/completions", b"{}"), None);
        assert_eq!(
            plain.count_prompt("/v1/chat/completions", b"not json"),
            None
        );
        assert_eq!(
            plain.count_prompt("/v1/completions", br#"{"prompt": "Hello, world!"}"#),
            Some(4)
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    fn bodies_text() -> String {
        serde_json::json!({"messages": [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"}]})
        .to_string()
    }

    /// The test tokenizer's JSON with a post-processor that adds `<SOS>` (id 4) before a
    /// single sequence, as Llama 3's `TemplateProcessing` adds `<|begin_of_text|>`.
    fn with_bos_post_processor() -> Vec<u8> {
        let mut json: Value =
            serde_json::from_slice(&std::fs::read(claude_path()).expect("read")).expect("json");
        json["post_processor"] = serde_json::json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<SOS>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<SOS>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<SOS>": {"id": "<SOS>", "ids": [4], "tokens": ["<SOS>"]}}});
        json.to_string().into_bytes()
    }

    #[test]
    fn a_completions_prompt_counts_the_bos_the_server_adds() {
        let json = std::fs::read(claude_path()).expect("read");
        let completions = |tokenizer: &Tokenizer, body: Value| {
            tokenizer
                .prompt_tokens("/v1/completions", body.to_string().as_bytes())
                .expect("a prompt")
        };
        let hello = serde_json::json!({"prompt": "Hello, world!"});
        // "Hello, world!" is 4 tokens (Python `tokenizers`); the fixture adds no BOS.
        let plain = claude();
        assert_eq!(plain.sequence_specials(), 0);
        assert_eq!(completions(&plain, hello.clone()).tokens, 4);
        // `add_bos_token: true` in tokenizer_config.json (Llama 2, Mistral, Gemma): the
        // server tokenizes the prompt with its BOS, 4 + 1.
        let config = serde_json::json!({"add_bos_token": true, "bos_token": "<SOS>"}).to_string();
        let adds = Tokenizer::from_parts(&json, Some(config.as_bytes()), "t").expect("loads");
        assert_eq!(adds.sequence_specials(), 1);
        assert_eq!(
            completions(&adds, hello.clone()),
            PromptCount {
                tokens: 5,
                templated: false
            }
        );
        // A batch of two prompts is two sequences, each with its BOS: (4 + 1) × 2.
        assert_eq!(
            completions(
                &adds,
                serde_json::json!({"prompt": ["Hello, world!", "Hello, world!"]})
            )
            .tokens,
            10
        );
        // A post-processor that adds the BOS (Llama 3's `tokenizer.json`), no config: 4 + 1;
        // a config saying `add_bos_token: false` takes it away again: 4.
        let post = with_bos_post_processor();
        let processed = Tokenizer::from_bytes(&post, "post").expect("loads");
        assert_eq!(completions(&processed, hello.clone()).tokens, 5);
        let no_bos = serde_json::json!({"add_bos_token": false, "bos_token": "<SOS>"}).to_string();
        let declined = Tokenizer::from_parts(&post, Some(no_bos.as_bytes()), "t").expect("loads");
        assert_eq!(completions(&declined, hello.clone()).tokens, 4);
        // `add_bos_token: true` with the post-processor already adding it: once, 4 + 1.
        let both = Tokenizer::from_parts(&post, Some(config.as_bytes()), "t").expect("loads");
        assert_eq!(completions(&both, hello).tokens, 5);
    }

    #[test]
    fn a_chat_template_that_writes_the_bos_is_not_given_a_second_one() {
        let json = std::fs::read(claude_path()).expect("read");
        let template = format!("{{{{ bos_token }}}}{CHATML}");
        let config = serde_json::json!({"chat_template": template, "add_bos_token": true,
            "bos_token": "<SOS>"})
        .to_string();
        let tokenizer = Tokenizer::from_parts(&json, Some(config.as_bytes()), "t").expect("loads");
        let body = bodies_text();
        let rendered = tokenizer
            .render_prompt("/v1/chat/completions", body.as_bytes())
            .expect("renders");
        assert!(
            rendered.starts_with("<SOS><|im_start|>system"),
            "{rendered}"
        );
        // The 52 tokens of the ChatML prompt (see above) and the template's one `<SOS>`; the
        // server adds no other (vLLM encodes a rendered chat without special tokens).
        assert_eq!(
            tokenizer.prompt_tokens("/v1/chat/completions", body.as_bytes()),
            Some(PromptCount {
                tokens: 53,
                templated: true
            })
        );
    }

    /// ChatML that renders tool calls and tool messages, as Qwen 2.5's template does (in
    /// brief).
    const CHATML_TOOLS: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments }}}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn anthropic_tool_history_counts_as_the_chat_a_server_converts_it_to() {
        let json = std::fs::read(claude_path()).expect("read");
        let anthropic = serde_json::json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather",
                "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": "18 C"}]}]}]})
        .to_string();
        // The chat-completions body llama.cpp's server makes of it: the tool_use an assistant
        // tool call (arguments: the input's compact JSON) with empty content, the tool_result
        // a `tool` message, no user turn around it.
        let openai = serde_json::json!({"model": "m", "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "18 C"}]})
        .to_string();
        for template in [CHATML, CHATML_TOOLS] {
            let config = serde_json::json!({"chat_template": template}).to_string();
            let tokenizer =
                Tokenizer::from_parts(&json, Some(config.as_bytes()), "t").expect("loads");
            let rendered = tokenizer
                .render_prompt("/v1/messages", anthropic.as_bytes())
                .expect("renders");
            assert_eq!(
                Some(&rendered),
                tokenizer
                    .render_prompt("/v1/chat/completions", openai.as_bytes())
                    .as_ref(),
                "{template}"
            );
            let counted = tokenizer
                .prompt_tokens("/v1/messages", anthropic.as_bytes())
                .expect("counted");
            assert!(counted.templated);
            assert_eq!(counted.tokens, tokenizer.encode_plain(&rendered));
        }
        // With the content-only ChatML of a small model, the rendered prompt is the three
        // turns and nothing of the tool call: before, the tool input's JSON was written into
        // the assistant's content and the result into a `user` turn, +5 tokens here
        // ({"city":"Paris"}), the "+4 each" of issue 33 item 11.
        let config = serde_json::json!({"chat_template": CHATML}).to_string();
        let tokenizer = Tokenizer::from_parts(&json, Some(config.as_bytes()), "t").expect("loads");
        let expected = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n18 C<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(
            tokenizer
                .render_prompt("/v1/messages", anthropic.as_bytes())
                .as_deref(),
            Some(expected)
        );
        let old = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n{\"city\":\"Paris\"}<|im_end|>\n<|im_start|>user\n18 C<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(
            tokenizer.encode_plain(old) - tokenizer.encode_plain(expected),
            tokenizer.encode_plain("{\"city\":\"Paris\"}")
        );
        assert_eq!(tokenizer.encode_plain("{\"city\":\"Paris\"}"), 5);
    }

    #[test]
    fn a_template_that_raises_falls_back_to_the_texts() {
        let json = std::fs::read(claude_path()).expect("read");
        let config = serde_json::json!({"chat_template":
            "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}{{ messages[0].content.strip() }}"})
        .to_string();
        let tokenizer = Tokenizer::from_parts(&json, Some(config.as_bytes()), "t").expect("loads");
        let user = br#"{"messages": [{"role": "user", "content": "  Hello, world!  "}]}"#;
        assert_eq!(
            tokenizer.prompt_tokens("/v1/chat/completions", user),
            Some(PromptCount {
                tokens: 4,
                templated: true
            }),
            "pycompat .strip()"
        );
        let counted = tokenizer
            .prompt_tokens("/v1/chat/completions", bodies_text().as_bytes())
            .expect("counted");
        assert!(!counted.templated);
        let bad = serde_json::json!({"chat_template": "{% for %}"}).to_string();
        let error = Tokenizer::from_parts(&json, Some(bad.as_bytes()), "t")
            .expect_err("a broken template")
            .to_string();
        assert!(error.contains("chat_template"), "{error}");
    }

    #[test]
    fn strftime_and_python_json() {
        // 2024-03-05 07:08:09 UTC.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %B %%", 1_709_622_489),
            "05 Mar 2024 07:08:09 March %"
        );
        let value = minijinja::Value::from(minijinja::value::Serde(
            serde_json::json!({"a": [1, "é"], "b": {"c": null}}),
        ));
        assert_eq!(
            python_json(&value, None).expect("json"),
            r#"{"a": [1, "é"], "b": {"c": null}}"#
        );
    }
}
