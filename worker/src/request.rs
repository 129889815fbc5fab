//! Builds the replayed HTTP request from a recorded one: the recorded method, path, body and
//! non-credential headers, plus `--header` values and `--set` body overrides.

use common::env_template::{self, EnvTemplateError};
use common::formats::pin::{PinMode, pin_output_tokens};
use common::formats::request::ask_usage;
use common::recording::{
    Exchange, is_credential_header, is_hop_by_hop_header, strip_credential_query,
};
use common::replay::EXCHANGE_HEADER;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::{ReplayConfig, WorkItem};

/// A request ready to be sent, built when its slice item arrives so that nothing of it is
/// computed between the intended send time and the write: method, URL, headers, and the
/// body as shared [`bytes::Bytes`] (a resend shares it too; no copy per send).
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    pub method: reqwest::Method,
    pub url: String,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

/// Build the request `item` will send under `config`, and take the recorded body out of
/// the item (the prepared body replaces it, so a read-ahead item holds its body once).
pub fn prepare(item: &mut WorkItem, config: &ReplayConfig) -> PreparedRequest {
    let pin = config
        .options
        .faithful
        .pin
        .and_then(|mode| Some((item.pin_output_tokens?, mode)));
    let recorded = &item.exchange.request;
    let method =
        reqwest::Method::from_bytes(recorded.method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let url = replay_url(&config.target, &recorded.path);
    let headers = replay_headers(&item.exchange, config, item.index);
    let request_usage = config.options.request_usage;
    let body = match (
        &item.exchange.request.body,
        config.sets.is_empty() && pin.is_none() && !request_usage,
    ) {
        // Sent as recorded: the recorded text becomes the body without a copy.
        (Some(_), true) => bytes::Bytes::from(
            item.exchange
                .request
                .body
                .take()
                .expect("matched Some")
                .into_bytes(),
        ),
        _ => bytes::Bytes::from(rewritten_body(
            &item.exchange,
            &config.sets,
            pin,
            request_usage,
        )),
    };
    item.exchange.request.body = None;
    item.exchange.request.body_b64 = None;
    PreparedRequest {
        method,
        url,
        headers,
        body,
    }
}

/// Headers never copied from a recording: credentials, and those the HTTP client must set
/// itself for the bytes it actually sends.
fn is_dropped_header(name: &str) -> bool {
    is_credential_header(name)
        || is_hop_by_hop_header(name)
        || ["host", "content-length", "accept-encoding", EXCHANGE_HEADER]
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
}

/// A problem expanding a `--header` template: the header's name and what the one expander
/// ([`common::env_template`]) found; never its value.
#[derive(Debug, thiserror::Error)]
pub enum HeaderTemplateError {
    #[error("header {header:?}: {error}")]
    Template {
        header: String,
        error: EnvTemplateError,
    },
    #[error("header {header:?}: not a valid header after expansion")]
    Invalid { header: String },
}

/// Expand `${VAR}` in `value` with `lookup` (the worker's own environment in production).
pub fn expand_template(
    header: &str,
    value: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, HeaderTemplateError> {
    env_template::expand(value, lookup).map_err(|error| HeaderTemplateError::Template {
        header: header.to_owned(),
        error,
    })
}

/// Parse `Name: value` header templates and expand them from `lookup`.
pub fn expand_headers(
    templates: &[(String, String)],
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, HeaderTemplateError> {
    templates
        .iter()
        .map(|(name, value)| {
            let expanded = expand_template(name, value, lookup)?;
            let invalid = || HeaderTemplateError::Invalid {
                header: name.clone(),
            };
            Ok((
                HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| invalid())?,
                HeaderValue::from_str(expanded.trim()).map_err(|_| invalid())?,
            ))
        })
        .collect()
}

/// The URL a recorded `path` (with an optional query) is sent to: the target's own path
/// prefix, then the recorded path; then the recorded query, without credential parameters,
/// and the target's own query (the user's, e.g. Azure's `api-version`). A target with a query
/// gets the path inserted before it, never appended after it.
pub fn replay_url(target: &str, path: &str) -> String {
    let path = strip_credential_query(path);
    let (target_base, target_query) = match target.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (target, None),
    };
    let (recorded_path, recorded_query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path.as_ref(), None),
    };
    let mut url = format!("{}{recorded_path}", target_base.trim_end_matches('/'));
    let queries: Vec<&str> = [recorded_query, target_query]
        .into_iter()
        .flatten()
        .filter(|q| !q.is_empty())
        .collect();
    if !queries.is_empty() {
        url.push('?');
        url.push_str(&queries.join("&"));
    }
    url
}

/// The body to send: the recorded body with `sets` applied to its top-level JSON object.
/// A body that is not a JSON object is sent unchanged.
pub fn replay_body(exchange: &Exchange, sets: &[(String, serde_json::Value)]) -> Vec<u8> {
    pinned_body(exchange, sets, None)
}

/// [`replay_body`], then pinned to `pin` = (output tokens, mode) with the family's
/// max-tokens field (`common::formats::pin`). `--set` wins over the recording, the pin over
/// both: pinning is what the user asked for last.
pub fn pinned_body(
    exchange: &Exchange,
    sets: &[(String, serde_json::Value)],
    pin: Option<(u64, PinMode)>,
) -> Vec<u8> {
    rewritten_body(exchange, sets, pin, false)
}

/// [`pinned_body`], and with `request_usage` (`--request-usage`) an OpenAI-compatible
/// stream that does not ask for usage asks for it
/// ([`common::formats::request::ask_usage`], after `--set`: the user's last word on the
/// body is the flag). A body left unchanged is sent as recorded, byte for byte.
pub fn rewritten_body(
    exchange: &Exchange,
    sets: &[(String, serde_json::Value)],
    pin: Option<(u64, PinMode)>,
    request_usage: bool,
) -> Vec<u8> {
    let body = exchange.request.body_bytes();
    if sets.is_empty() && pin.is_none() && !request_usage {
        return body.into_owned();
    }
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(mut map)) => {
            let mut changed = !sets.is_empty();
            for (field, value) in sets {
                map.insert(field.clone(), value.clone());
            }
            if request_usage {
                changed |= ask_usage(&exchange.request.path, &mut map);
            }
            if let Some((tokens, mode)) = pin {
                pin_output_tokens(&exchange.request.path, &mut map, tokens, mode);
                changed = true;
            }
            if !changed {
                return body.into_owned();
            }
            serde_json::to_vec(&map).unwrap_or_else(|_| body.into_owned())
        }
        _ => body.into_owned(),
    }
}

/// The headers to send for `exchange`.
pub fn replay_headers(exchange: &Exchange, config: &ReplayConfig, index: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &exchange.request.headers {
        if is_dropped_header(name) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.insert(name, value);
        }
    }
    // Compression batches frames and ruins inter-token timing.
    headers.insert(
        http::header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    for (name, value) in &config.headers {
        headers.insert(name.clone(), value.clone());
    }
    if config.tag_requests {
        headers.insert(
            HeaderName::from_static(EXCHANGE_HEADER),
            HeaderValue::from(index),
        );
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_from_lookup_and_names_unset_vars() {
        let lookup = |v: &str| (v == "KEY").then(|| "sk-1".to_owned());
        assert_eq!(
            expand_template("Authorization", "Bearer ${KEY}", &lookup).expect("set"),
            "Bearer sk-1"
        );
        let err = expand_template("Authorization", "Bearer ${NOPE}", &lookup).expect_err("unset");
        assert!(err.to_string().contains("${NOPE} is not set"), "{err}");
        // The one expander's error, with the header named and the value not shown.
        let err = expand_template("Authorization", "Bearer sk-live ${KEY", &lookup)
            .expect_err("unterminated");
        assert!(matches!(
            err,
            HeaderTemplateError::Template {
                error: EnvTemplateError::Unterminated { column: 16 },
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.starts_with("header \"Authorization\": a ${ at character 16 has no closing }"),
            "{text}"
        );
        assert!(!text.contains("sk-live"), "{text}");
    }

    #[test]
    fn urls_join_paths_and_queries_and_drop_recorded_credentials() {
        assert_eq!(
            replay_url("http://h:8000/", "/v1/chat/completions"),
            "http://h:8000/v1/chat/completions"
        );
        assert_eq!(
            replay_url(
                "https://h/openai?api-version=2024-06-01",
                "/deployments/d/chat/completions"
            ),
            "https://h/openai/deployments/d/chat/completions?api-version=2024-06-01"
        );
        assert_eq!(
            replay_url(
                "http://h",
                "/v1beta/models/g:streamGenerateContent?alt=sse&key=AIza"
            ),
            "http://h/v1beta/models/g:streamGenerateContent?alt=sse"
        );
    }

    #[test]
    fn set_overrides_top_level_fields() {
        let exchange: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/v1/chat/completions","body":"{\"model\":\"a\",\"stream\":true}"}}"#,
        )
        .expect("valid");
        let body = replay_body(&exchange, &[("model".to_owned(), serde_json::json!("b"))]);
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["model"], "b");
        assert_eq!(value["stream"], true);
    }

    #[test]
    fn the_pin_wins_over_set_and_the_recording() {
        let exchange: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/v1/chat/completions","body":"{\"model\":\"a\",\"max_tokens\":100}"}}"#,
        )
        .expect("valid");
        let sets = [("max_tokens".to_owned(), serde_json::json!(50))];
        let body = pinned_body(&exchange, &sets, Some((12, PinMode::Max)));
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["max_tokens"], 12);
        assert!(value.get("ignore_eos").is_none());
        let body = pinned_body(&exchange, &[], Some((12, PinMode::Strict)));
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["min_tokens"], 12);
        assert_eq!(value["ignore_eos"], true);
    }

    #[test]
    fn credentials_and_hop_headers_are_not_replayed() {
        let exchange: Exchange = serde_json::from_str(
            r#"{"request":{"path":"/v1/messages","headers":{"x-api-key":"k","Content-Length":"9","anthropic-version":"2023-06-01"}}}"#,
        )
        .expect("valid");
        let config = ReplayConfig {
            target: "http://127.0.0.1:1".into(),
            load: crate::config::LoadModel {
                schedule: crate::config::Schedule::Asap,
                concurrency: Some(1),
                rate: None,
                arrival: crate::config::Arrival::Constant,
                duration: None,
                warmup: 0,
                seed: 0,
            },
            headers: vec![],
            sets: vec![],
            tag_requests: true,
            transport: Default::default(),
            tokenizer: None,
            options: common::assignment::RequestOptions {
                timeout: std::time::Duration::from_secs(1),
                requests_out: false,
                reorder_window: common::replay::DEFAULT_REORDER_WINDOW,
                ..Default::default()
            },
        };
        let headers = replay_headers(&exchange, &config, 7);
        assert!(headers.get("x-api-key").is_none());
        assert!(headers.get("content-length").is_none());
        assert_eq!(headers["anthropic-version"], "2023-06-01");
        assert_eq!(headers["accept-encoding"], "identity");
        assert_eq!(headers[EXCHANGE_HEADER], "7");
    }
}
