//! The metric families of known model servers, each with the role the reports show it in,
//! and where its name was checked in the server's own source (`KnownFamily::checked`).
//!
//! Checked against source (2026, the public repositories as stored for this work):
//! - vLLM `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger`): gauges
//!   `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
//!   (`vllm:gpu_cache_usage_perc` is its pre-0.9 name, deprecated, hidden from 0.10);
//!   counters `vllm:num_preemptions`, `vllm:prompt_tokens`, `vllm:generation_tokens`,
//!   `vllm:prefix_cache_queries`, `vllm:prefix_cache_hits` (exposed with `_total` by
//!   `prometheus_client`, which also adds a `_created` gauge per counter); histograms
//!   `vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`.
//!   `vllm:prompt_tokens` counts every prompt token, a prefix-cache hit included.
//! - SGLang `python/sglang/srt/metrics/collector.py`: gauges `sglang:num_running_reqs`,
//!   `sglang:num_queue_reqs`, `sglang:token_usage`; counters `sglang:prompt_tokens_total`
//!   (every prompt token), `sglang:generation_tokens_total`, `sglang:cached_tokens_total`;
//!   histograms `sglang:time_to_first_token_seconds`, `sglang:e2e_request_latency_seconds`.
//! - llama.cpp `tools/server/server-context.cpp` (the `/metrics` handler): counters
//!   `llamacpp:prompt_tokens_total` (`n_prompt_tokens_processed_total`: the prompt tokens
//!   evaluated, a reused cache prefix not counted), `llamacpp:tokens_predicted_total`; gauges
//!   `llamacpp:requests_processing`, `llamacpp:requests_deferred`. It exposes no KV-cache
//!   gauge any more (`llamacpp:kv_cache_usage_ratio` is gone) and no TTFT or latency.
//! - TGI `router/src/server.rs`: `tgi_queue_size`, `tgi_batch_current_size`,
//!   `tgi_request_duration` (seconds).
//!
//! Not checked (`checked` empty): every TensorRT-LLM/Triton and Dynamo name. Token
//! histograms (TGI's `tgi_request_input_length`, Dynamo's sequence lengths) are left out: the
//! token roles are counters, read as a rate.

use serde::{Deserialize, Serialize};

/// What a known family tells about the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Requests waiting for a slot (gauge).
    QueueDepth,
    /// Requests being processed (gauge).
    Running,
    /// KV-cache usage, a fraction 0..1 (gauge).
    KvCacheUsage,
    /// Preempted requests (counter).
    Preemptions,
    /// Prompt tokens processed (counter).
    PromptTokens,
    /// Tokens generated (counter).
    GenerationTokens,
    /// The server's time to first token (histogram, seconds).
    ServerTtft,
    /// The server's end-to-end request latency (histogram, seconds).
    ServerLatency,
    /// Prompt tokens served from the prefix cache (counter).
    CachedPromptTokens,
    /// Prompt tokens looked up in the prefix cache (counter): the cached share's
    /// denominator where the server has one.
    PrefixCacheQueries,
}

/// One known family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownFamily {
    /// The family name as the report keys it (with its colon; for a family split by a
    /// label, `family{label="value"}`).
    pub name: &'static str,
    /// The server that exposes it.
    pub server: &'static str,
    /// What it tells.
    pub role: Role,
    /// Where the name was checked in the server's own source (a file of its repository,
    /// see the module doc); empty when it was not.
    pub checked: &'static str,
}

impl KnownFamily {
    /// True when the name was checked in the server's source.
    #[cfg(test)]
    pub fn verified(&self) -> bool {
        !self.checked.is_empty()
    }
}

const VLLM: &str = "vllm-project/vllm vllm/v1/metrics/loggers.py";
const SGLANG: &str = "sgl-project/sglang python/sglang/srt/metrics/collector.py";
const LLAMA_CPP: &str = "ggml-org/llama.cpp tools/server/server-context.cpp";
const TGI: &str = "huggingface/text-generation-inference router/src/server.rs";
const NOT_CHECKED: &str = "";

const fn family(
    name: &'static str,
    server: &'static str,
    role: Role,
    checked: &'static str,
) -> KnownFamily {
    KnownFamily {
        name,
        server,
        role,
        checked,
    }
}

/// The table (see the module doc for what was checked where).
const KNOWN: &[KnownFamily] = &[
    // vLLM
    family("vllm:num_requests_waiting", "vLLM", Role::QueueDepth, VLLM),
    family("vllm:num_requests_running", "vLLM", Role::Running, VLLM),
    family("vllm:kv_cache_usage_perc", "vLLM", Role::KvCacheUsage, VLLM),
    // Before 0.9; deprecated there, hidden from 0.10 (same file, its comment).
    family(
        "vllm:gpu_cache_usage_perc",
        "vLLM",
        Role::KvCacheUsage,
        VLLM,
    ),
    family(
        "vllm:num_preemptions_total",
        "vLLM",
        Role::Preemptions,
        VLLM,
    ),
    family("vllm:prompt_tokens_total", "vLLM", Role::PromptTokens, VLLM),
    family(
        "vllm:generation_tokens_total",
        "vLLM",
        Role::GenerationTokens,
        VLLM,
    ),
    family(
        "vllm:prefix_cache_hits_total",
        "vLLM",
        Role::CachedPromptTokens,
        VLLM,
    ),
    family(
        "vllm:prefix_cache_queries_total",
        "vLLM",
        Role::PrefixCacheQueries,
        VLLM,
    ),
    family(
        "vllm:time_to_first_token_seconds",
        "vLLM",
        Role::ServerTtft,
        VLLM,
    ),
    family(
        "vllm:e2e_request_latency_seconds",
        "vLLM",
        Role::ServerLatency,
        VLLM,
    ),
    // SGLang
    family("sglang:num_queue_reqs", "SGLang", Role::QueueDepth, SGLANG),
    family("sglang:num_running_reqs", "SGLang", Role::Running, SGLANG),
    family("sglang:token_usage", "SGLang", Role::KvCacheUsage, SGLANG),
    family(
        "sglang:prompt_tokens_total",
        "SGLang",
        Role::PromptTokens,
        SGLANG,
    ),
    family(
        "sglang:generation_tokens_total",
        "SGLang",
        Role::GenerationTokens,
        SGLANG,
    ),
    family(
        "sglang:cached_tokens_total",
        "SGLang",
        Role::CachedPromptTokens,
        SGLANG,
    ),
    family(
        "sglang:time_to_first_token_seconds",
        "SGLang",
        Role::ServerTtft,
        SGLANG,
    ),
    family(
        "sglang:e2e_request_latency_seconds",
        "SGLang",
        Role::ServerLatency,
        SGLANG,
    ),
    // TGI
    family("tgi_queue_size", "TGI", Role::QueueDepth, TGI),
    family("tgi_batch_current_size", "TGI", Role::Running, TGI),
    family("tgi_request_duration", "TGI", Role::ServerLatency, TGI),
    // llama.cpp (no KV-cache gauge, no TTFT or latency histogram)
    family(
        "llamacpp:requests_deferred",
        "llama.cpp",
        Role::QueueDepth,
        LLAMA_CPP,
    ),
    family(
        "llamacpp:requests_processing",
        "llama.cpp",
        Role::Running,
        LLAMA_CPP,
    ),
    family(
        "llamacpp:prompt_tokens_total",
        "llama.cpp",
        Role::PromptTokens,
        LLAMA_CPP,
    ),
    family(
        "llamacpp:tokens_predicted_total",
        "llama.cpp",
        Role::GenerationTokens,
        LLAMA_CPP,
    ),
    // TensorRT-LLM (Triton's backend) and Triton
    family(
        "nv_trt_llm_request_metrics{request_type=\"waiting\"}",
        "TensorRT-LLM",
        Role::QueueDepth,
        NOT_CHECKED,
    ),
    family(
        "nv_trt_llm_request_metrics{request_type=\"active\"}",
        "TensorRT-LLM",
        Role::Running,
        NOT_CHECKED,
    ),
    family(
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}",
        "TensorRT-LLM",
        Role::KvCacheUsage,
        NOT_CHECKED,
    ),
    family(
        "nv_inference_pending_request_count",
        "Triton",
        Role::QueueDepth,
        NOT_CHECKED,
    ),
    // Dynamo
    family(
        "dynamo_frontend_queued_requests",
        "Dynamo",
        Role::QueueDepth,
        NOT_CHECKED,
    ),
    family(
        "dynamo_frontend_inflight_requests",
        "Dynamo",
        Role::Running,
        NOT_CHECKED,
    ),
    family(
        "dynamo_frontend_time_to_first_token_seconds",
        "Dynamo",
        Role::ServerTtft,
        NOT_CHECKED,
    ),
    family(
        "dynamo_frontend_request_duration_seconds",
        "Dynamo",
        Role::ServerLatency,
        NOT_CHECKED,
    ),
];

/// [`prompt_tokens_meaning`] of a counter that counts every prompt token, a prefix-cache
/// hit included.
pub const COUNTS_CACHED: &str = "counts cached tokens too";

/// What each server's prompt-token counter counts, by server (as `KnownFamily::server`
/// names it): the report says it beside the rate, as they differ (module doc).
pub fn prompt_tokens_meaning(server: &str) -> Option<&'static str> {
    match server {
        "vLLM" | "SGLang" => Some(COUNTS_CACHED),
        "llama.cpp" => Some("leaves a cached prefix out"),
        _ => None,
    }
}

/// The known family `name` (as the report keys it), if it is one.
pub fn known_family(name: &str) -> Option<&'static KnownFamily> {
    KNOWN.iter().find(|known| known.name == name)
}

/// The known server whose families are named like `name` (`vllm:…` is vLLM's), whether or
/// not this family has a role: the report's footer counts a server's other families as its.
pub fn server_of(name: &str) -> Option<&'static str> {
    const PREFIXES: [(&str, &str); 7] = [
        ("vllm:", "vLLM"),
        ("sglang:", "SGLang"),
        ("llamacpp:", "llama.cpp"),
        ("tgi_", "TGI"),
        ("nv_trt_llm_", "TensorRT-LLM"),
        ("nv_inference_", "Triton"),
        ("dynamo_", "Dynamo"),
    ];
    PREFIXES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, server)| *server)
}

/// The role of family `name` (as the report keys it), if it is a known one.
pub fn role_of(name: &str) -> Option<Role> {
    KNOWN
        .iter()
        .find(|known| known.name == name)
        .map(|known| known.role)
}

/// True for a histogram family measured in seconds: its name (before any `{label}`) ends
/// `_seconds`, or it is a known server's timing family (TTFT, latency) without a
/// `_milliseconds`/`_ms` suffix — TGI's `tgi_request_duration` is in seconds too. Its
/// statistics are reported in ms (`ServerMetric::in_ms`).
pub fn in_seconds(name: &str) -> bool {
    let family = name.split('{').next().unwrap_or(name);
    if family.ends_with("_seconds") {
        return true;
    }
    let timing = matches!(role_of(name), Some(Role::ServerTtft | Role::ServerLatency))
        || super::gateway::is_gateway_timing(name);
    timing && !(family.ends_with("_milliseconds") || family.ends_with("_ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_roles_found() {
        let mut names: Vec<&str> = KNOWN.iter().map(|known| known.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KNOWN.len());
        assert_eq!(role_of("vllm:num_requests_waiting"), Some(Role::QueueDepth));
        assert_eq!(role_of("sglang:token_usage"), Some(Role::KvCacheUsage));
        assert_eq!(role_of("vllm:unknown"), None);
        assert_eq!(
            role_of("llamacpp:kv_cache_usage_ratio"),
            None,
            "not exposed any more"
        );
        assert!(known_family("vllm:kv_cache_usage_perc").is_some_and(KnownFamily::verified));
        assert_eq!(
            server_of("llamacpp:prompt_seconds_total"),
            Some("llama.cpp")
        );
        assert_eq!(server_of("process_cpu_seconds_total"), None);
        // Every family of a server whose source was read says where.
        for known in KNOWN {
            let checked = ["vLLM", "SGLang", "llama.cpp", "TGI"].contains(&known.server);
            assert_eq!(known.verified(), checked, "{}", known.name);
        }
    }

    #[test]
    fn families_of_seconds_are_named_or_known() {
        assert!(in_seconds("vllm:time_to_first_token_seconds"));
        assert!(in_seconds("h_seconds{model=\"m\"}"));
        assert!(in_seconds("tgi_request_duration"));
        assert!(!in_seconds("vllm:request_prompt_tokens"));
        assert!(!in_seconds("h_milliseconds"));
        assert!(!in_seconds("process_cpu_seconds_total"));
    }
}
