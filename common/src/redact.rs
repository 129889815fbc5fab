//! `--redact-body REGEX`: every match in a recorded or exported body is replaced with a
//! stable token, `REDACTED-` followed by the first 12 hex digits of the SHA-256 of the
//! matched bytes (so equal secrets stay equal, and different ones stay apart, without being
//! readable).

use std::borrow::Cow;

use regex::bytes::Regex;
use serde_json::Value;

/// A bad `--redact-body` pattern.
#[derive(Debug, thiserror::Error)]
#[error("--redact-body {pattern:?}: {source}")]
pub struct RedactError {
    pattern: String,
    #[source]
    source: regex::Error,
}

/// The compiled `--redact-body` patterns, applied in order.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    patterns: Vec<Regex>,
}

/// The token that replaces `matched`.
pub fn redaction_token(matched: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, matched);
    let mut token = String::with_capacity(9 + 12);
    token.push_str("REDACTED-");
    for byte in &digest.as_ref()[..6] {
        token.push_str(&format!("{byte:02x}"));
    }
    token
}

impl Redactor {
    /// Compile `patterns` (Rust `regex` syntax, matched on bytes).
    pub fn new(patterns: &[String]) -> Result<Redactor, RedactError> {
        let patterns = patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|source| RedactError {
                    pattern: p.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Redactor { patterns })
    }

    /// No pattern given.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// `bytes` with every match replaced.
    pub fn redact<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let mut out = Cow::Borrowed(bytes);
        for pattern in &self.patterns {
            if pattern.is_match(&out) {
                let replaced = pattern
                    .replace_all(&out, |caps: &regex::bytes::Captures<'_>| {
                        redaction_token(&caps[0]).into_bytes()
                    })
                    .into_owned();
                out = Cow::Owned(replaced);
            }
        }
        out
    }

    /// `text` with every match replaced (the result stays UTF-8: matches of a UTF-8 text
    /// against a Unicode-aware pattern end on character boundaries, and tokens are ASCII).
    pub fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.redact(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            Cow::Owned(bytes) => Cow::Owned(
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
        }
    }

    /// Redact a body that arrived in several reads: matches are found on the joined bytes
    /// (a secret split across two reads is still found) and each replacement token lands in
    /// the read where its match started; the reads keep their number and order.
    pub fn redact_segments(&self, segments: &mut [Vec<u8>]) {
        if self.patterns.is_empty() || segments.is_empty() {
            return;
        }
        let mut joined: Vec<u8> = segments.concat();
        // Boundaries: end offset of each segment in `joined`.
        let mut ends: Vec<usize> = segments
            .iter()
            .scan(0, |acc, s| {
                *acc += s.len();
                Some(*acc)
            })
            .collect();
        for pattern in &self.patterns {
            let matches: Vec<(usize, usize)> = pattern
                .find_iter(&joined)
                .map(|m| (m.start(), m.end()))
                .collect();
            if matches.is_empty() {
                continue;
            }
            let mut out = Vec::with_capacity(joined.len());
            let mut new_ends = ends.clone();
            let mut last = 0;
            for (start, end) in &matches {
                out.extend_from_slice(&joined[last..*start]);
                let token = redaction_token(&joined[*start..*end]);
                out.extend_from_slice(token.as_bytes());
                last = *end;
            }
            out.extend_from_slice(&joined[last..]);
            for (i, end_at) in ends.iter().enumerate() {
                new_ends[i] = map_offset(*end_at, &matches);
            }
            joined = out;
            ends = new_ends;
        }
        let mut begin = 0;
        for (segment, end) in segments.iter_mut().zip(&ends) {
            let end = (*end).max(begin);
            *segment = joined[begin..end].to_vec();
            begin = end;
        }
    }

    /// Redact every string (keys included) inside a JSON value.
    pub fn redact_json(&self, value: &mut Value) {
        if self.patterns.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(red) = self.redact_str(s) {
                    *s = red;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            Value::Object(map) => {
                let entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
                for (key, mut v) in entries {
                    self.redact_json(&mut v);
                    map.insert(self.redact_str(&key).into_owned(), v);
                }
            }
            _ => {}
        }
    }
}

/// Where offset `p` of the old joined bytes lands after replacing `matches`: a boundary inside
/// a match moves to the end of its replacement token.
fn map_offset(p: usize, matches: &[(usize, usize)]) -> usize {
    let mut shift: isize = 0;
    for (start, end) in matches {
        let token_len = 9 + 12;
        if p <= *start {
            break;
        }
        if p < *end {
            return (*start as isize + shift) as usize + token_len;
        }
        shift += token_len as isize - (*end - *start) as isize;
    }
    (p as isize + shift) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_stable_and_secrets_split_across_reads_are_found() {
        let r = Redactor::new(&["sk-[a-z0-9]{8}".to_owned()]).expect("valid");
        let a = r.redact(b"key sk-abcd1234 end");
        let b = r.redact(b"again sk-abcd1234");
        let token = redaction_token(b"sk-abcd1234");
        assert!(token.starts_with("REDACTED-") && token.len() == 21);
        assert_eq!(&*a, format!("key {token} end").as_bytes());
        assert!(String::from_utf8_lossy(&b).ends_with(&token));
        let mut segments = vec![
            b"data: sk-ab".to_vec(),
            b"cd1234 x\n\n".to_vec(),
            b"[DONE]".to_vec(),
        ];
        r.redact_segments(&mut segments);
        let joined = segments.concat();
        assert_eq!(joined, format!("data: {token} x\n\n[DONE]").into_bytes());
        assert_eq!(segments.len(), 3);
        assert_eq!(segments[2], b"[DONE]");
        let mut v = serde_json::json!({"m": ["sk-abcd1234"], "sk-abcd1234": 1});
        r.redact_json(&mut v);
        assert!(!v.to_string().contains("sk-abcd1234"));
    }
}
