//! Ollama native NDJSON semantics (`/api/chat`, `/api/generate`; wire reference §5).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{Count, Text, parse, truthy_error_message};
use super::{ContentKind, Event, FrameError, Usage};

const FAMILY: &str = "ollama";

/// Stateless: every line is self-describing.
#[derive(Debug, Default)]
pub(crate) struct OllamaSemantics;

impl OllamaSemantics {
    /// Interpret one NDJSON line.
    pub(crate) fn on_line(
        &mut self,
        line: &[u8],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        let line: Line<'_> = parse(FAMILY, line)?;
        let (content, thinking, tool_calls) = match line.message {
            Some(message) => (message.content, message.thinking, message.tool_calls),
            None => (line.response, line.thinking, line.tool_calls),
        };
        // Visible text first; thinking arrives in chunks with `content:""`. Tool calls come as
        // whole objects: the raw JSON of the array is the content text (borrowed, no copy).
        let content = content
            .non_empty()
            .map(|text| (ContentKind::Text, text))
            .or_else(|| {
                thinking
                    .non_empty()
                    .map(|text| (ContentKind::Reasoning, text))
            })
            .or_else(|| {
                tool_calls
                    .map(RawValue::get)
                    .filter(|raw| !matches!(raw.trim(), "" | "null" | "[]"))
                    .map(|raw| (ContentKind::ToolCall, Cow::Borrowed(raw)))
            });
        if let Some((kind, text)) = content {
            on_event(Event::Content { kind, text });
        }
        if let Some(message) = line.error.and_then(truthy_error_message) {
            on_event(Event::Error { message });
        }
        if line.done == Some(true) {
            // Metrics are `omitempty`: an absent count is a zero (e.g. a fully cached prompt).
            on_event(Event::Usage(Usage {
                input_tokens: Some(line.prompt_eval_count.0.unwrap_or(0)),
                output_tokens: Some(line.eval_count.0.unwrap_or(0)),
                cached_input_tokens: None,
            }));
            on_event(Event::Terminal);
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(default, borrow)]
    message: Option<Message<'a>>,
    #[serde(default, borrow)]
    response: Text<'a>,
    #[serde(default, borrow)]
    thinking: Text<'a>,
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
    #[serde(default)]
    done: Option<bool>,
    #[serde(default)]
    eval_count: Count,
    #[serde(default)]
    prompt_eval_count: Count,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    content: Text<'a>,
    #[serde(default, borrow)]
    thinking: Text<'a>,
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Vec<String> {
        let mut seen = Vec::new();
        OllamaSemantics
            .on_line(line.as_bytes(), &mut |event| {
                seen.push(format!("{event:?}"))
            })
            .expect("valid line");
        seen
    }

    #[test]
    fn go_html_escapes_and_thinking_and_tool_calls() {
        assert_eq!(
            run(
                r#"{"model":"m","message":{"role":"assistant","content":"\u003cthink\u003e"},"done":false}"#
            ),
            vec![r#"Content { kind: Text, text: "<think>" }"#]
        );
        assert_eq!(
            run(
                r#"{"model":"m","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}"#
            ),
            vec![r#"Content { kind: Reasoning, text: "hmm" }"#]
        );
        assert_eq!(
            run(
                r#"{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"done":false}"#
            ),
            vec![
                r#"Content { kind: ToolCall, text: "[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]" }"#
            ]
        );
    }

    #[test]
    fn done_without_counts_reports_zeros() {
        assert_eq!(
            run(r#"{"model":"m","response":"","done":true,"done_reason":"load"}"#),
            vec![
                "Usage(Usage { input_tokens: Some(0), output_tokens: Some(0), cached_input_tokens: None })",
                "Terminal"
            ]
        );
    }
}
