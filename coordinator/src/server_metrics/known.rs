//! The metric families of known model servers, each with the role the reports show it in.
//!
//! Seen in the servers' own documentation (searched 2026): vLLM's `num_requests_waiting`,
//! `num_requests_running`, `gpu_cache_usage_perc` (docs.vllm.ai "Production Metrics");
//! SGLang's `prompt_tokens_total`, `generation_tokens_total`, `token_usage`,
//! `time_to_first_token_seconds` (docs.sglang.io "Production Metrics"); TGI's
//! `tgi_queue_size`, `tgi_batch_current_size`, `tgi_request_duration` (huggingface.co TGI
//! "Metrics"). Everything else is from memory, not checked (`verified: false`): vLLM's
//! V1 names `kv_cache_usage_perc`, `num_preemptions_total`, and its token counters and
//! latency histograms; SGLang's `num_queue_reqs`, `num_running_reqs`,
//! `e2e_request_latency_seconds`; every llama.cpp, TensorRT-LLM/Triton and Dynamo name.
//! Token histograms (TGI's `tgi_request_input_length`, Dynamo's sequence lengths) are left
//! out: the token roles are counters, read as a rate.

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
}

impl Role {
    /// A short human label ("queue depth").
    pub fn label(self) -> &'static str {
        match self {
            Role::QueueDepth => "queue depth",
            Role::Running => "running requests",
            Role::KvCacheUsage => "KV-cache usage",
            Role::Preemptions => "preemptions",
            Role::PromptTokens => "prompt tokens",
            Role::GenerationTokens => "generated tokens",
            Role::ServerTtft => "server TTFT",
            Role::ServerLatency => "server latency",
        }
    }
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
    /// Checked against the server's documentation (see the module doc).
    pub verified: bool,
}

const fn family(
    name: &'static str,
    server: &'static str,
    role: Role,
    verified: bool,
) -> KnownFamily {
    KnownFamily {
        name,
        server,
        role,
        verified,
    }
}

/// The table (see the module doc for what is verified).
const KNOWN: &[KnownFamily] = &[
    // vLLM
    family("vllm:num_requests_waiting", "vLLM", Role::QueueDepth, true),
    family("vllm:num_requests_running", "vLLM", Role::Running, true),
    family(
        "vllm:kv_cache_usage_perc",
        "vLLM",
        Role::KvCacheUsage,
        false,
    ),
    family(
        "vllm:gpu_cache_usage_perc",
        "vLLM",
        Role::KvCacheUsage,
        true,
    ),
    family(
        "vllm:num_preemptions_total",
        "vLLM",
        Role::Preemptions,
        false,
    ),
    family(
        "vllm:prompt_tokens_total",
        "vLLM",
        Role::PromptTokens,
        false,
    ),
    family(
        "vllm:generation_tokens_total",
        "vLLM",
        Role::GenerationTokens,
        false,
    ),
    family(
        "vllm:time_to_first_token_seconds",
        "vLLM",
        Role::ServerTtft,
        false,
    ),
    family(
        "vllm:e2e_request_latency_seconds",
        "vLLM",
        Role::ServerLatency,
        false,
    ),
    // SGLang
    family("sglang:num_queue_reqs", "SGLang", Role::QueueDepth, false),
    family("sglang:num_running_reqs", "SGLang", Role::Running, false),
    family("sglang:token_usage", "SGLang", Role::KvCacheUsage, true),
    family(
        "sglang:prompt_tokens_total",
        "SGLang",
        Role::PromptTokens,
        true,
    ),
    family(
        "sglang:generation_tokens_total",
        "SGLang",
        Role::GenerationTokens,
        true,
    ),
    family(
        "sglang:time_to_first_token_seconds",
        "SGLang",
        Role::ServerTtft,
        true,
    ),
    family(
        "sglang:e2e_request_latency_seconds",
        "SGLang",
        Role::ServerLatency,
        false,
    ),
    // TGI
    family("tgi_queue_size", "TGI", Role::QueueDepth, true),
    family("tgi_batch_current_size", "TGI", Role::Running, true),
    family("tgi_request_duration", "TGI", Role::ServerLatency, true),
    // llama.cpp
    family(
        "llamacpp:requests_deferred",
        "llama.cpp",
        Role::QueueDepth,
        false,
    ),
    family(
        "llamacpp:requests_processing",
        "llama.cpp",
        Role::Running,
        false,
    ),
    family(
        "llamacpp:kv_cache_usage_ratio",
        "llama.cpp",
        Role::KvCacheUsage,
        false,
    ),
    family(
        "llamacpp:prompt_tokens_total",
        "llama.cpp",
        Role::PromptTokens,
        false,
    ),
    family(
        "llamacpp:tokens_predicted_total",
        "llama.cpp",
        Role::GenerationTokens,
        false,
    ),
    // TensorRT-LLM (Triton's backend) and Triton
    family(
        "nv_trt_llm_request_metrics{request_type=\"waiting\"}",
        "TensorRT-LLM",
        Role::QueueDepth,
        false,
    ),
    family(
        "nv_trt_llm_request_metrics{request_type=\"active\"}",
        "TensorRT-LLM",
        Role::Running,
        false,
    ),
    family(
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"}",
        "TensorRT-LLM",
        Role::KvCacheUsage,
        false,
    ),
    family(
        "nv_inference_pending_request_count",
        "Triton",
        Role::QueueDepth,
        false,
    ),
    // Dynamo
    family(
        "dynamo_frontend_queued_requests",
        "Dynamo",
        Role::QueueDepth,
        false,
    ),
    family(
        "dynamo_frontend_inflight_requests",
        "Dynamo",
        Role::Running,
        false,
    ),
    family(
        "dynamo_frontend_time_to_first_token_seconds",
        "Dynamo",
        Role::ServerTtft,
        false,
    ),
    family(
        "dynamo_frontend_request_duration_seconds",
        "Dynamo",
        Role::ServerLatency,
        false,
    ),
];

/// The known families of vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM/Triton and Dynamo.
pub fn known_families() -> &'static [KnownFamily] {
    KNOWN
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
