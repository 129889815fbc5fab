//! What the caller needs to set up the endpoints: `${VAR}` in a scrape header expanded from
//! the coordinator's environment, and the hint a path-prefixed target's failed `/metrics`
//! gets.

/// Expand each `${VAR}` of `template` with `lookup` (the coordinator's environment), by the
/// one expander ([`common::env_template`]): the error names an unset variable or where a `${`
/// is never closed, never the value.
pub fn expand_env(
    template: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, common::env_template::EnvTemplateError> {
    common::env_template::expand(template, lookup)
}

/// For a target whose path has a prefix before its API path (`https://host/prefix/v1`, a
/// gateway or ingress routing by path), the `/metrics` under that prefix to try when the
/// origin's own `/metrics` answers nothing usable: `try --server-metrics
/// https://host/prefix/metrics`. `None` for a target at its origin's root or at `/v1`.
pub fn prefix_hint(target: &str) -> Option<String> {
    let uri: http::Uri = target.parse().ok()?;
    let origin = format!("{}://{}", uri.scheme_str()?, uri.authority()?);
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // The API's own segments at the end (`/v1`, `/openai/v1`...) are not the prefix.
    let api_start = segments
        .iter()
        .position(|segment| is_api_segment(segment))
        .unwrap_or(segments.len());
    if api_start == 0 {
        return None;
    }
    let prefix = segments[..api_start].join("/");
    let url = format!("{origin}/{prefix}/metrics");
    Some(format!(
        "the target's path has the prefix /{prefix}: if the server's metrics are behind it too, \
         try --server-metrics {}",
        common::text::escape_controls(&common::recording::redact_url(&url))
    ))
}

/// A path segment where an LLM API's own path begins (`v1`, `v2`, `api`, `openai`).
fn is_api_segment(segment: &str) -> bool {
    let version = segment
        .strip_prefix('v')
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()));
    version || matches!(segment, "api" | "openai" | "chat" | "completions" | "model")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_templates_expand_and_name_what_is_missing() {
        let lookup = |var: &str| (var == "KEY").then(|| "s3cret".to_owned());
        assert_eq!(
            expand_env("Bearer ${KEY}", &lookup).as_deref(),
            Ok("Bearer s3cret")
        );
        assert_eq!(expand_env("plain", &lookup).as_deref(), Ok("plain"));
        let unset = expand_env("Bearer ${OTHER}", &lookup)
            .expect_err("unset")
            .to_string();
        assert!(unset.contains("${OTHER} is not set"), "{unset}");
        let open = expand_env("Bearer ${KEY", &lookup)
            .expect_err("unterminated")
            .to_string();
        // The same text as the worker's `--header` error.
        assert_eq!(
            open,
            "a ${ at character 8 has no closing } (the value is not shown)"
        );
    }

    #[test]
    fn a_path_prefixed_target_gets_its_prefix_metrics_hint() {
        let hint = prefix_hint("https://host.example/team-a/llama/v1").expect("prefixed");
        assert!(
            hint.contains("--server-metrics https://host.example/team-a/llama/metrics"),
            "{hint}"
        );
        assert!(prefix_hint("https://host.example/prefix/openai/v1").is_some());
        assert_eq!(prefix_hint("https://host.example/v1"), None);
        assert_eq!(prefix_hint("http://127.0.0.1:8000"), None);
        assert_eq!(prefix_hint("http://127.0.0.1:8000/"), None);
        // Credentials in the target never reach the hint.
        let hint = prefix_hint("https://user:pw@host.example/p/v1").expect("prefixed");
        assert!(!hint.contains("pw"), "{hint}");
    }
}
