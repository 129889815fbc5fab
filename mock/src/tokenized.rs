//! `--tokenizer FILE`: synthetic output whose token count under a real tokenizer is known
//! exactly, so a client that counts output tokens by tokenizing the streamed text (a stream
//! without usage) can be checked against the truth, and `max_tokens: N` answers with exactly
//! N tokens under that tokenizer.
//!
//! At startup the mock picks from the vocabulary a list of words made of ASCII letters that
//! are one token each after a space (`" the"`, `" cat"`), the first of them also one token
//! alone (the text's first word has no space before it). A pre-tokenizer that splits on
//! ` ?\p{L}+` (byte-level BPE: GPT-2, Llama 3, Qwen; SentencePiece's `▁` likewise) never
//! merges two such words, so N words are N tokens; this is checked on the one text every
//! answer is a prefix of (the list once round, and back to its first word), so a tokenizer for
//! which it does not hold is refused at startup rather than miscounted. The tokenizer is used
//! at startup and to count each request's prompt; the output is pre-encoded from the list as
//! without it.

use std::fmt;
use std::path::{Path, PathBuf};

use common::tokenizer::Tokenizer;

/// Words kept in the list (a few hundred: readable text, cheap to build).
const WORDS: usize = 320;

/// Fewest words a usable tokenizer must offer.
const MIN_WORDS: usize = 16;

/// The output words of `--tokenizer`, and the tokenizer that counts prompts.
pub struct MockTokenizer {
    path: PathBuf,
    tokenizer: Tokenizer,
    /// One token each after a space; the first one also alone.
    words: Vec<Box<str>>,
}

/// Why `--tokenizer FILE` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MockTokenizerError {
    #[error("--tokenizer {}", path.display())]
    Load {
        path: PathBuf,
        #[source]
        source: common::tokenizer::TokenizerError,
    },
    #[error("--tokenizer {}: reading its vocabulary", path.display())]
    Vocabulary {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "--tokenizer {}: found {found} words of ASCII letters that are one token after a space, \
         the mock needs at least {MIN_WORDS} (expected a byte-level BPE or SentencePiece tokenizer)",
        path.display()
    )]
    TooFewWords { path: PathBuf, found: usize },
    #[error(
        "--tokenizer {}: {words} words, each one token, count {counted} tokens together: this \
         tokenizer merges words across spaces, so the mock cannot make text of a known length",
        path.display()
    )]
    Merges {
        path: PathBuf,
        words: usize,
        counted: u64,
    },
}

impl MockTokenizer {
    /// Load `path` (a Hugging Face `tokenizer.json`) and pick the output words.
    pub fn load(path: &Path) -> Result<MockTokenizer, MockTokenizerError> {
        let tokenizer = Tokenizer::from_file(path).map_err(|source| MockTokenizerError::Load {
            path: path.to_owned(),
            source,
        })?;
        let vocabulary = tokenizers::Tokenizer::from_file(path).map_err(|source| {
            MockTokenizerError::Vocabulary {
                path: path.to_owned(),
                source,
            }
        })?;
        // Candidates: vocabulary entries that are a word-start marker (byte-level `Ġ`,
        // SentencePiece `▁`) and ASCII letters, most frequent (lowest id) first.
        let mut candidates: Vec<(u32, &str)> = Vec::new();
        let vocab = vocabulary.get_vocab(false);
        for (piece, id) in &vocab {
            let Some(word) = piece.strip_prefix('Ġ').or_else(|| piece.strip_prefix('▁')) else {
                continue;
            };
            if (2..=12).contains(&word.len()) && word.bytes().all(|b| b.is_ascii_alphabetic()) {
                candidates.push((*id, word));
            }
        }
        candidates.sort_unstable();
        let mut words: Vec<Box<str>> = Vec::with_capacity(WORDS);
        let mut spaced = String::with_capacity(16);
        for (_, word) in candidates {
            if words.len() >= WORDS {
                break;
            }
            spaced.clear();
            spaced.push(' ');
            spaced.push_str(word);
            if tokenizer.count_text(&spaced) == 1 {
                words.push(Box::from(word));
            }
        }
        // The first word also stands alone at the start of the text.
        let Some(first) = words.iter().position(|w| tokenizer.count_text(w) == 1) else {
            return Err(MockTokenizerError::TooFewWords {
                path: path.to_owned(),
                found: 0,
            });
        };
        words.swap(0, first);
        if words.len() < MIN_WORDS {
            return Err(MockTokenizerError::TooFewWords {
                path: path.to_owned(),
                found: words.len(),
            });
        }
        let mock = MockTokenizer {
            path: path.to_owned(),
            tokenizer,
            words,
        };
        // Every answer's text is a prefix of the list repeated, so every pair of neighbours
        // it can hold is in this text.
        let round = mock.words.len() as u64 + 1;
        let counted = mock.tokenizer.count_text(&mock.text(round));
        if counted != round {
            return Err(MockTokenizerError::Merges {
                path: path.to_owned(),
                words: mock.words.len(),
                counted,
            });
        }
        Ok(mock)
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The output words, in the order answers use them.
    pub fn words(&self) -> &[Box<str>] {
        &self.words
    }

    /// Tokens of `text` under this tokenizer (no special tokens).
    pub fn count_text(&self, text: &str) -> u64 {
        self.tokenizer.count_text(text)
    }

    /// Tokens of a request's prompt, as `common::tokenizer` counts it; `None` when the body
    /// is not a prompt it can read.
    pub fn count_prompt(&self, path: &str, body: &[u8]) -> Option<u64> {
        self.tokenizer.count_prompt(path, body)
    }

    /// The text of output token `i`: a space (none before the first) and a word.
    pub fn token(&self, i: u64) -> (&'static str, &str) {
        let word = &self.words[(i % self.words.len() as u64) as usize];
        (if i == 0 { "" } else { " " }, word)
    }

    /// The text of an answer of `tokens` tokens.
    pub fn text(&self, tokens: u64) -> String {
        let mut text = String::with_capacity(tokens as usize * 8);
        for i in 0..tokens {
            let (space, word) = self.token(i);
            text.push_str(space);
            text.push_str(word);
        }
        text
    }
}

impl fmt::Debug for MockTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockTokenizer")
            .field("path", &self.path)
            .field("words", &self.words.len())
            .finish()
    }
}
