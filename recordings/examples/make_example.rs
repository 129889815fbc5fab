//! Builds `examples/qwen3-sharegpt.jsonl`, the example recording shipped with llm-replay.
//!
//! Real prompts from ShareGPT (`../shared/data/prompts/sharegpt_v3_filtered_500.json`) are
//! paired with the real per-chunk timing of AIPerf runs of Qwen3-0.6B on one GPU
//! (`../shared/data/timing/aiperf-qwen3-0.6b/concurrency{1,2,4}/profile_export.jsonl`): each
//! exchange gets one measured request's arrival offset, time to first token and 199
//! inter-chunk gaps. The response stream is written by `common::formats::encode`, one
//! OpenAI chat chunk per network read, exactly as the mock serves it.
//!
//! Run from the workspace root:
//! `cargo run -p llm-replay-recordings --example make_example -- ../shared/data examples/qwen3-sharegpt.jsonl`

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use common::formats::encode::{Finish, StreamEncoder, StreamParams, Wire};
use common::recording::{Exchange, Frame, RecordingWriter, Request, Response};

struct Measured {
    start_offset_ms: f64,
    ttft_ms: f64,
    gaps_ms: Vec<f64>,
    output_tokens: u64,
}

fn read_profiles(path: &Path) -> anyhow::Result<Vec<Measured>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), i + 1))?;
        let start_ns = value["metadata"]["request_start_ns"]
            .as_u64()
            .context("metadata.request_start_ns")?;
        let metrics = &value["metrics"];
        let ttft_ms = metrics["time_to_first_token"]["value"]
            .as_f64()
            .context("metrics.time_to_first_token")?;
        let gaps_ms = metrics["inter_chunk_latency"]["value"]
            .as_array()
            .context("metrics.inter_chunk_latency")?
            .iter()
            .map(|g| g.as_f64().context("inter_chunk_latency value"))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        let output_tokens = metrics["output_sequence_length"]["value"]
            .as_u64()
            .context("metrics.output_sequence_length")?;
        rows.push((start_ns, ttft_ms, gaps_ms, output_tokens));
    }
    let t0 = rows.iter().map(|r| r.0).min().unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(|(start, ttft_ms, gaps_ms, output_tokens)| Measured {
            start_offset_ms: (start - t0) as f64 / 1e6,
            ttft_ms,
            gaps_ms,
            output_tokens,
        })
        .collect())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data, out] = args.as_slice() else {
        bail!("usage: make_example SHARED_DATA_DIR OUT.jsonl");
    };
    let data = PathBuf::from(data);
    let prompts: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data.join("prompts/sharegpt_v3_filtered_500.json"))
            .context("sharegpt prompts")?,
    )?;
    let prompts: Vec<String> = prompts
        .as_array()
        .context("sharegpt: expected a list")?
        .iter()
        .filter_map(|c| c["conversations"][0]["value"].as_str().map(str::to_owned))
        .collect();
    // Output words: real text from the corpus AIPerf uses, standing in for the model's words
    // (the timing data has no text).
    let corpus = std::fs::read_to_string(data.join("corpus/shakespeare.txt")).context("corpus")?;
    let words: Vec<&str> = corpus.split_whitespace().take(20_000).collect();

    // Three real runs side by side (the concurrency-1 run's first five requests), staggered
    // by about a quarter and half a request so that the replay does not open every
    // connection in the same millisecond: 25 requests, about 21 s.
    let mut measured = Vec::new();
    for (run, shift_ms, take) in [
        ("concurrency4", 0.0, 10),
        ("concurrency1", 950.0, 5),
        ("concurrency2", 1900.0, 10),
    ] {
        let path = data.join(format!(
            "timing/aiperf-qwen3-0.6b/{run}/profile_export.jsonl"
        ));
        let mut profiles = read_profiles(&path)?;
        profiles.sort_by(|a, b| a.start_offset_ms.total_cmp(&b.start_offset_ms));
        for mut m in profiles.into_iter().take(take) {
            m.start_offset_ms += shift_ms;
            measured.push((run, m));
        }
    }
    measured.sort_by(|a, b| a.1.start_offset_ms.total_cmp(&b.1.start_offset_ms));

    let mut writer = RecordingWriter::create(out)?;
    for (i, (run, m)) in measured.iter().enumerate() {
        let prompt = &prompts[i % prompts.len()];
        let body = serde_json::json!({
            "model": "Qwen/Qwen3-0.6B",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_completion_tokens": m.output_tokens,
            "messages": [{"role": "user", "content": prompt}],
        });
        let input_tokens = (prompt.chars().count() as u64).div_ceil(4);
        let mut encoder = StreamEncoder::new(
            Wire::OpenAiChat,
            StreamParams {
                id: format!("example{i}"),
                model: "Qwen/Qwen3-0.6B".to_owned(),
                created_unix_ms: 1_762_551_534_000,
                input_tokens,
                usage: true,
                system_fingerprint: "fp_example".to_owned(),
                timings: Default::default(),
            },
        );
        let mut frames = Vec::new();
        let mut bytes = Vec::new();
        let mut t = m.ttft_ms;
        encoder.preamble(&mut bytes);
        for k in 0..m.output_tokens as usize {
            if k > 0 {
                t += m.gaps_ms.get(k - 1).copied().unwrap_or(0.0);
            }
            let word = format!(" {}", words[(i * 211 + k) % words.len()]);
            encoder.token(&word, None, &mut bytes);
            frames.push(Frame::from_bytes(Some(round3(t)), &bytes));
            bytes.clear();
        }
        encoder.finish(Finish::Length, m.output_tokens, &mut bytes);
        frames.push(Frame::from_bytes(Some(round3(t + 0.2)), &bytes));
        let exchange = Exchange {
            id: Some(format!("{run}-{i}")),
            session: None,
            at_ms: Some(round3(m.start_offset_ms)),
            request: Request {
                method: "POST".to_owned(),
                path: "/v1/chat/completions".to_owned(),
                headers: [("content-type".to_owned(), "application/json".to_owned())].into(),
                body: Some(body.to_string()),
                body_b64: None,
                unknown: Default::default(),
            },
            response: Some(Response {
                status: 200,
                headers: [("content-type".to_owned(), "text/event-stream".to_owned())].into(),
                frames,
                complete: true,
                unknown: Default::default(),
            }),
            unknown: Default::default(),
        };
        writer.write(&exchange)?;
    }
    writer.finish()?;
    Ok(())
}

fn round3(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}
