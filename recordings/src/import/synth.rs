//! Synthesised prompts of exact token lengths, cut from a text corpus with a real BPE
//! tokenizer (`tiktoken-rs`, which bundles OpenAI's vocabularies).
//!
//! The corpus is tokenized once. A *block* is a run of consecutive corpus tokens that starts
//! at a word boundary chosen by a seeded generator, so the same seed (a mooncake hash id, an
//! Azure row) always gives the same tokens, hence the same text. Prompts are built from token
//! ids and decoded once per block, so requests that share leading blocks share a byte-exact
//! text prefix (what prefix caching keys on).

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

/// Which bundled BPE vocabulary counts tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenizerName {
    /// GPT-4o / o-series vocabulary (the one AIPerf's `builtin` tokenizer uses).
    #[value(name = "o200k_base")]
    O200kBase,
    /// GPT-4 / GPT-3.5 vocabulary.
    #[value(name = "cl100k_base")]
    Cl100kBase,
}

impl TokenizerName {
    /// The vocabulary's name as written into recordings.
    pub fn name(self) -> &'static str {
        match self {
            TokenizerName::O200kBase => "o200k_base",
            TokenizerName::Cl100kBase => "cl100k_base",
        }
    }

    /// The tokenizer, built once per process.
    pub fn bpe(self) -> &'static CoreBPE {
        match self {
            TokenizerName::O200kBase => tiktoken_rs::o200k_base_singleton(),
            TokenizerName::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }
}

/// Failure to prepare a synthesiser.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{path}: cannot read the corpus: {source}")]
    Corpus {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the corpus has only {tokens} tokens; at least {needed} are needed")]
    CorpusTooSmall {
        path: String,
        tokens: usize,
        needed: usize,
    },
}

/// A prompt synthesiser over one tokenized corpus.
pub struct Synth {
    tokenizer: TokenizerName,
    corpus_name: String,
    tokens: Vec<u32>,
    /// Indices into `tokens` of tokens that begin a word (decode to text starting with a space
    /// or a line break): blocks start there so that re-tokenizing the text gives the same split.
    word_starts: Vec<u32>,
}

/// The smallest corpus accepted, in tokens (a block must fit several times over).
const MIN_CORPUS_TOKENS: usize = 4096;

impl Synth {
    /// Tokenize `text` (the corpus, named `corpus_name` in recordings and messages).
    pub fn new(
        tokenizer: TokenizerName,
        corpus_name: &str,
        text: &str,
    ) -> Result<Synth, SynthError> {
        let bpe = tokenizer.bpe();
        // Collapse runs of blank lines and indentation: they tokenize into whitespace tokens
        // whose split depends on what follows, which would blur token counts at block edges.
        let normalized = normalize_corpus(text);
        let tokens = bpe.encode_ordinary(&normalized);
        if tokens.len() < MIN_CORPUS_TOKENS {
            return Err(SynthError::CorpusTooSmall {
                path: corpus_name.to_owned(),
                tokens: tokens.len(),
                needed: MIN_CORPUS_TOKENS,
            });
        }
        let mut word_starts = Vec::with_capacity(tokens.len() / 2);
        for (i, token) in tokens.iter().enumerate() {
            if let Ok(bytes) = bpe.decode_bytes(&[*token])
                && bytes.len() > 1
                && bytes[0] == b' '
                && bytes[1].is_ascii_alphabetic()
            {
                word_starts.push(i as u32);
            }
        }
        if word_starts.is_empty() {
            word_starts.push(0);
        }
        Ok(Synth {
            tokenizer,
            corpus_name: corpus_name.to_owned(),
            tokens,
            word_starts,
        })
    }

    /// Read and tokenize the corpus at `path`, or the built-in one when `None`.
    pub fn from_path(
        tokenizer: TokenizerName,
        path: Option<&std::path::Path>,
    ) -> Result<Synth, SynthError> {
        match path {
            Some(path) => {
                let text = std::fs::read(path).map_err(|source| SynthError::Corpus {
                    path: path.display().to_string(),
                    source,
                })?;
                let text = String::from_utf8_lossy(&text);
                Synth::new(tokenizer, &path.display().to_string(), &text)
            }
            None => Synth::new(tokenizer, "built-in", builtin_corpus()),
        }
    }

    /// The tokenizer's name.
    pub fn tokenizer(&self) -> TokenizerName {
        self.tokenizer
    }

    /// The corpus's name (its path, or `built-in`).
    pub fn corpus_name(&self) -> &str {
        &self.corpus_name
    }

    /// Append `n` consecutive corpus tokens starting at a word boundary picked by `seed`.
    pub fn push_block(&self, seed: u64, n: usize, out: &mut Vec<u32>) {
        let pick = splitmix64(seed) as usize % self.word_starts.len();
        let mut at = self.word_starts[pick] as usize;
        for _ in 0..n {
            if at >= self.tokens.len() {
                // Wrap to the first word start so the wrapped text still starts a word.
                at = self.word_starts[0] as usize;
            }
            out.push(self.tokens[at]);
            at += 1;
        }
    }

    /// The text of `tokens`.
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self.tokenizer.bpe().decode_bytes(tokens) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
            },
            // Every id comes from encoding the corpus, so it is in the vocabulary.
            Err(_) => String::new(),
        }
    }

    /// The number of tokens of `text` by this tokenizer.
    pub fn count(&self, text: &str) -> usize {
        self.tokenizer.bpe().encode_ordinary(text).len()
    }

    /// A prompt of exactly `n` tokens by this tokenizer (re-tokenized to check), from the
    /// corpus position picked by `seed`. Returns the text and its token count.
    pub fn exact_prompt(&self, seed: u64, n: usize) -> (String, usize) {
        let mut tokens = Vec::with_capacity(n + 8);
        self.push_block(seed, n, &mut tokens);
        let mut text = self.decode(&tokens);
        let mut count = self.count(&text);
        // Boundary merges can shift the count by a token or two: adjust and re-check.
        for _ in 0..4 {
            if count == n {
                break;
            }
            if count > n {
                let excess = count - n;
                tokens.truncate(tokens.len().saturating_sub(excess));
            } else {
                let missing = n - count;
                let next = tokens.len();
                // Continue the same corpus run so the text stays contiguous.
                let mut more = Vec::with_capacity(missing);
                self.push_block(seed, next + missing, &mut more);
                tokens.extend_from_slice(&more[next..]);
            }
            text = self.decode(&tokens);
            count = self.count(&text);
        }
        (text, count)
    }
}

/// A SplitMix64 step: a well-mixed 64-bit value from any seed (stable across platforms and
/// releases, unlike `std`'s hashers).
pub fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn normalize_corpus(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// A small public-domain text used when no `--corpus` is given (the opening of the U.S.
/// Declaration of Independence and the Gettysburg Address, repeated as needed by the blocks'
/// wrap-around).
fn builtin_corpus() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let base = include_str!("builtin_corpus.txt");
        // Repeat so that the corpus comfortably exceeds the minimum token count.
        let mut text = String::with_capacity(base.len() * 8);
        for _ in 0..8 {
            text.push_str(base);
            text.push(' ');
        }
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synth() -> Synth {
        Synth::from_path(TokenizerName::O200kBase, None).expect("built-in corpus")
    }

    #[test]
    fn same_seed_same_block_and_exact_prompts() {
        let s = synth();
        let mut a = Vec::new();
        let mut b = Vec::new();
        s.push_block(42, 512, &mut a);
        s.push_block(42, 512, &mut b);
        assert_eq!(a, b);
        let mut c = Vec::new();
        s.push_block(43, 512, &mut c);
        assert_ne!(a, c);
        for (seed, n) in [(1, 1), (2, 7), (3, 100), (4, 1500)] {
            let (text, count) = s.exact_prompt(seed, n);
            assert_eq!(count, n, "seed {seed}");
            assert_eq!(s.count(&text), n, "seed {seed}: {text:?}");
        }
    }
}
