//! What a failed response said, made safe to show: the message of its body, on one line,
//! control characters neutralised, credential-shaped strings redacted and the length capped.
//!
//! A failed response's body is the only place a gateway or model server says *why* (an
//! unknown model, a bad parameter, an upstream that died). The worker reads at most
//! [`MAX_ERROR_BODY_KEPT`] bytes of it and [`error_message`] takes the message out of the JSON
//! error shapes the families use (else the first bytes of the text); an error frame's message
//! goes through [`clean_message`] as the meter reads it (`measure`), and a peer's through it
//! again as its report is decoded. It sits below both `measure` and `metrics`, which use it.

/// Bytes of a failed response's body kept to read its message (the rest is drained or the
/// connection dropped, never held).
pub const MAX_ERROR_BODY_KEPT: usize = 8 << 10;

/// Characters of a message kept (a longer one is cut and ends with `…`).
pub const MAX_MESSAGE_CHARS: usize = 300;

/// The replacement of a redacted credential.
pub const REDACTED: &str = "[redacted]";

/// The message of a failed response's `body` (its first bytes; see [`MAX_ERROR_BODY_KEPT`]):
/// from the JSON error shapes of the families (`{"error":{"message":…}}`, `{"error":"…"}`,
/// `{"message":…}`, `{"detail":…}`), else the text itself; cleaned by [`clean_message`].
/// `None` for an empty body.
pub fn error_message(body: &[u8]) -> Option<String> {
    let body = &body[..body.len().min(MAX_ERROR_BODY_KEPT)];
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let from_json = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|value| json_error_message(&value));
    let message = clean_message(from_json.as_deref().unwrap_or(text));
    (!message.is_empty()).then_some(message)
}

/// The message of an error object in any family's shape.
fn json_error_message(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let non_empty = |v: &Value| {
        v.as_str()
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
    };
    let error = &value["error"];
    non_empty(error)
        .or_else(|| non_empty(&error["message"]))
        .or_else(|| non_empty(&value["message"]))
        .or_else(|| non_empty(&value["detail"]))
        .or_else(|| non_empty(&value["detail"][0]["msg"]))
        .or_else(|| non_empty(&error["type"]))
        .or_else(|| non_empty(&error["code"]))
        .or_else(|| error.is_object().then(|| error.to_string()))
}

/// `text` made safe to show on one line: control and bidirectional-override characters
/// become spaces, runs of white space one space, credential-shaped strings
/// [`redact_secrets`]' replacement, and at most [`MAX_MESSAGE_CHARS`] characters are kept.
pub fn clean_message(text: &str) -> String {
    let mut one_line = String::with_capacity(text.len().min(4 * MAX_ERROR_BODY_KEPT));
    let mut last_space = true;
    for c in text.chars().take(MAX_ERROR_BODY_KEPT) {
        let neutral = c.is_control()
            || c.is_whitespace()
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{061c}');
        if neutral {
            if !last_space {
                one_line.push(' ');
            }
            last_space = true;
        } else {
            one_line.push(c);
            last_space = false;
        }
    }
    let redacted = redact_secrets(one_line.trim_end());
    if redacted.chars().count() <= MAX_MESSAGE_CHARS {
        return redacted;
    }
    let mut cut: String = redacted.chars().take(MAX_MESSAGE_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// `text` with credential-shaped strings replaced by [`REDACTED`]: OpenAI-style keys
/// (`sk-…`), AWS access key ids (`AKIA…`, `ASIA…`), the word after `Bearer`/`Basic`, the
/// value after a key named like a credential (`api_key=…`, `"x-api-key": "…"`,
/// `token: …`, `password=…`), and long opaque tokens mixing letters and digits.
pub fn redact_secrets(text: &str) -> String {
    let is_word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+' | '/');
    let mut out = String::with_capacity(text.len());
    // The previous word and whether the text after it (up to this word) makes this word its
    // value: `key=`, `key: `, `"key": "`.
    let mut previous: Option<&str> = None;
    let mut separator_has_assign = false;
    let mut separator_only_quotes_and_space = true;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if is_word(c) {
            let end = rest.find(|c: char| !is_word(c)).unwrap_or(rest.len());
            let word = &rest[..end];
            let after_key = previous.is_some_and(is_credential_key)
                && separator_has_assign
                && separator_only_quotes_and_space;
            let after_scheme = previous.is_some_and(|p| {
                p.eq_ignore_ascii_case("bearer") || p.eq_ignore_ascii_case("basic")
            }) && separator_only_quotes_and_space;
            if after_key || after_scheme || looks_like_secret(word) {
                out.push_str(REDACTED);
            } else {
                out.push_str(word);
            }
            previous = Some(word);
            separator_has_assign = false;
            separator_only_quotes_and_space = true;
            rest = &rest[end..];
        } else {
            match c {
                '=' | ':' => separator_has_assign = true,
                '"' | '\'' | ' ' => {}
                _ => separator_only_quotes_and_space = false,
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// A key whose value is a credential (`api_key`, `x-api-key`, `access_token`, `password`).
fn is_credential_key(key: &str) -> bool {
    let key = key
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_ascii_lowercase();
    let key = key.replace('-', "_");
    key == "key"
        || key == "authorization"
        || [
            "api_key",
            "apikey",
            "token",
            "secret",
            "password",
            "passwd",
            "access_key",
            "secret_key",
            "private_key",
            "credential",
            "credentials",
            "signature",
            "session_key",
        ]
        .iter()
        .any(|suffix| key.ends_with(suffix))
}

/// A word that is a credential by its shape alone.
fn looks_like_secret(word: &str) -> bool {
    let bytes = word.as_bytes();
    let key_prefixed = ["sk-", "sk_", "rk-", "pk-", "xoxb-", "xoxp-", "ghp_", "hf_"]
        .iter()
        .any(|p| word.starts_with(p) && word.len() >= p.len() + 8);
    let aws_key_id = bytes.len() == 20
        && (word.starts_with("AKIA") || word.starts_with("ASIA"))
        && bytes
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    let opaque = bytes.len() >= 32
        && bytes.iter().any(u8::is_ascii_digit)
        && bytes.iter().any(u8::is_ascii_alphabetic)
        && !word.contains('/')
        && !word.contains('.');
    key_prefixed || aws_key_id || opaque
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_from_each_family_error_shape() {
        let cases: [(&str, &str); 6] = [
            (
                r#"{"error":{"message":"Invalid model name passed in model=nope","type":"None","code":"400"}}"#,
                "Invalid model name passed in model=nope",
            ),
            (
                r#"{"object":"error","message":"The model `ref-model` does not exist.","type":"NotFoundError","code":404}"#,
                "The model `ref-model` does not exist.",
            ),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                "Overloaded",
            ),
            (r#"{"error":"model 'x' not found"}"#, "model 'x' not found"),
            (
                r#"{"message":"The security token included in the request is invalid."}"#,
                "The security token included in the request is invalid.",
            ),
            ("Bad Gateway\n", "Bad Gateway"),
        ];
        for (body, expected) in cases {
            assert_eq!(error_message(body.as_bytes()).as_deref(), Some(expected));
        }
        assert_eq!(error_message(b"  \n"), None);
    }

    #[test]
    fn messages_are_one_line_without_controls_and_cut() {
        let message = error_message(b"boom\x1b[2J\r\n\tagain\xe2\x80\xae!").expect("text");
        assert_eq!(message, "boom [2J again !");
        let huge = vec![b'x'; 4 << 20];
        let cut = error_message(&huge).expect("text");
        assert_eq!(cut.chars().count(), MAX_MESSAGE_CHARS);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn credential_shaped_strings_are_redacted() {
        let cases = [
            (
                "Incorrect API key provided: sk-proj-abcdefghijklmnop1234",
                "Incorrect API key provided: [redacted]",
            ),
            (
                "header Authorization: Bearer eyJhbGciOi.payload",
                "header Authorization: [redacted] [redacted]",
            ),
            (
                "bad request to http://up:4000/v1?api_key=hunter2&x=1",
                "bad request to http://up:4000/v1?api_key=[redacted]&x=1",
            ),
            (
                r#"{"x-api-key": "abc123", "password":"pw"}"#,
                r#"{"x-api-key": "[redacted]", "password":"[redacted]"}"#,
            ),
            ("key AKIAIOSFODNN7EXAMPLE denied", "key [redacted] denied"),
            (
                "token 0123456789abcdef0123456789abcdef0 expired",
                "token [redacted] expired",
            ),
            // Words that only look near a credential stay.
            (
                "max_tokens: 5000 is too large",
                "max_tokens: 5000 is too large",
            ),
            (
                "The model meta-llama/Llama-3.1-8B-Instruct does not exist",
                "The model meta-llama/Llama-3.1-8B-Instruct does not exist",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(redact_secrets(text), expected, "{text}");
        }
        // Through the message path too, in a JSON body.
        let body = br#"{"error":{"message":"invalid x-api-key: sk-ant-api03-AAAAAAAAAAAAAAAA"}}"#;
        let message = error_message(body).expect("message");
        assert!(!message.contains("AAAA"), "{message}");
    }
}
