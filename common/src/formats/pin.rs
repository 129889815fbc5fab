//! The request side of `--pin-output-length`: which body field of each family limits the
//! output length, and the minimum/ignore-EOS controls some servers add.
//!
//! A limit alone only caps the length: a model that stops early still answers shorter. The
//! strict controls make servers that have them generate exactly the pinned count: vLLM's
//! `min_tokens` and `ignore_eos`, llama.cpp's and TGI's `ignore_eos`. They are extensions
//! (OpenAI itself rejects unknown fields), so they are only added on request.

use serde_json::{Map, Value};

use super::{Family, family_for_path};

/// How hard a request is pinned to its recorded output length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinMode {
    /// Set the family's max-tokens field.
    Max,
    /// Also ask for at least that many tokens and to ignore end-of-sequence, where the family
    /// is OpenAI-compatible (vLLM, llama.cpp, TGI read these).
    Strict,
}

impl PinMode {
    /// The name used on the command line and on the worker link.
    pub fn name(self) -> &'static str {
        match self {
            PinMode::Max => "max",
            PinMode::Strict => "strict",
        }
    }

    /// The mode of a name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<PinMode> {
        match name {
            "max" => Some(PinMode::Max),
            "strict" => Some(PinMode::Strict),
            _ => None,
        }
    }
}

/// Set `body` (a request's top-level JSON object, sent to `path`) to ask for exactly `tokens`
/// output tokens. Returns false when the family is unknown and nothing was changed.
///
/// - OpenAI chat: `max_completion_tokens` and/or `max_tokens`, whichever the recording used
///   (`max_tokens` when it used neither);
/// - OpenAI completions and Anthropic Messages (also inside Bedrock invoke): `max_tokens`;
/// - OpenAI Responses: `max_output_tokens`;
/// - Ollama: `options.num_predict`;
/// - Bedrock Converse: `inferenceConfig.maxTokens`;
/// - Gemini (`:generateContent`, `:streamGenerateContent`): `generationConfig.maxOutputTokens`.
pub fn pin_output_tokens(
    path: &str,
    body: &mut Map<String, Value>,
    tokens: u64,
    mode: PinMode,
) -> bool {
    let n = Value::from(tokens);
    let nested = |body: &mut Map<String, Value>, outer: &str, inner: &str| {
        let entry = body
            .entry(outer.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        if let Value::Object(map) = entry {
            map.insert(inner.to_owned(), n.clone());
        }
    };
    let path_only = path.split(['?', '#']).next().unwrap_or_default();
    if path_only.contains(":generateContent") || path_only.contains(":streamGenerateContent") {
        nested(body, "generationConfig", "maxOutputTokens");
        return true;
    }
    let Some(family) = family_for_path(path) else {
        return false;
    };
    match family {
        Family::OpenAiChat => {
            let has_new = body.contains_key("max_completion_tokens");
            if has_new {
                body.insert("max_completion_tokens".into(), n.clone());
            }
            if body.contains_key("max_tokens") || !has_new {
                body.insert("max_tokens".into(), n.clone());
            }
        }
        Family::OpenAiCompletions | Family::Anthropic | Family::BedrockInvoke => {
            body.insert("max_tokens".into(), n.clone());
        }
        Family::OpenAiResponses => {
            body.insert("max_output_tokens".into(), n.clone());
        }
        Family::Ollama => nested(body, "options", "num_predict"),
        Family::BedrockConverse => nested(body, "inferenceConfig", "maxTokens"),
    }
    if mode == PinMode::Strict && matches!(family, Family::OpenAiChat | Family::OpenAiCompletions) {
        body.insert("min_tokens".into(), n);
        body.insert("ignore_eos".into(), Value::Bool(true));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(path: &str, body: &str, mode: PinMode) -> Value {
        let Value::Object(mut map) = serde_json::from_str(body).expect("json") else {
            panic!("object");
        };
        assert!(pin_output_tokens(path, &mut map, 7, mode));
        Value::Object(map)
    }

    #[test]
    fn each_family_gets_its_own_field() {
        let chat = pinned(
            "/v1/chat/completions",
            r#"{"max_tokens":100}"#,
            PinMode::Max,
        );
        assert_eq!(chat, serde_json::json!({"max_tokens": 7}));
        let new = pinned(
            "/v1/chat/completions",
            r#"{"max_completion_tokens":100}"#,
            PinMode::Max,
        );
        assert_eq!(new, serde_json::json!({"max_completion_tokens": 7}));
        let none = pinned("/v1/chat/completions", r#"{}"#, PinMode::Max);
        assert_eq!(none, serde_json::json!({"max_tokens": 7}));
        let responses = pinned("/v1/responses", r#"{}"#, PinMode::Max);
        assert_eq!(responses, serde_json::json!({"max_output_tokens": 7}));
        let ollama = pinned(
            "/api/chat",
            r#"{"options":{"num_predict":-1,"seed":1}}"#,
            PinMode::Strict,
        );
        assert_eq!(
            ollama,
            serde_json::json!({"options": {"num_predict": 7, "seed": 1}})
        );
        let converse = pinned("/model/m/converse-stream", r#"{}"#, PinMode::Max);
        assert_eq!(
            converse,
            serde_json::json!({"inferenceConfig": {"maxTokens": 7}})
        );
        let invoke = pinned(
            "/model/m/invoke-with-response-stream",
            r#"{"max_tokens":9}"#,
            PinMode::Strict,
        );
        assert_eq!(invoke, serde_json::json!({"max_tokens": 7}));
        let gemini = pinned(
            "/v1beta/models/g:streamGenerateContent?alt=sse",
            r#"{}"#,
            PinMode::Max,
        );
        assert_eq!(
            gemini,
            serde_json::json!({"generationConfig": {"maxOutputTokens": 7}})
        );
    }

    #[test]
    fn strict_adds_min_tokens_and_ignore_eos_only_where_openai_compatible() {
        let chat = pinned(
            "/v1/chat/completions",
            r#"{"max_tokens":100}"#,
            PinMode::Strict,
        );
        assert_eq!(
            chat,
            serde_json::json!({"max_tokens": 7, "min_tokens": 7, "ignore_eos": true})
        );
        let anthropic = pinned("/v1/messages", r#"{"max_tokens":100}"#, PinMode::Strict);
        assert_eq!(anthropic, serde_json::json!({"max_tokens": 7}));
    }

    #[test]
    fn an_unknown_path_is_left_alone() {
        let mut map = Map::new();
        assert!(!pin_output_tokens(
            "/v1/embeddings",
            &mut map,
            7,
            PinMode::Max
        ));
        assert!(map.is_empty());
    }
}
