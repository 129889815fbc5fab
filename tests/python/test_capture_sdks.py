"""The official openai and anthropic SDKs streaming through `llm-replay record` in front of
`llm-replay mock`: every token still arrives, and the recording holds each stream, complete,
with frame timing and without the API keys.

Run from the repo root with `pytest tests/python`. The binary comes from $LLM_REPLAY_BIN
(default: target/release/llm-replay relative to the repo root).
"""

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("LLM_REPLAY_BIN", REPO_ROOT / "target" / "release" / "llm-replay"))
if not BIN.is_absolute():
    BIN = REPO_ROOT / BIN

TOKENS = 12
OPENAI_KEY = "sk-capture-test-OPENAIKEY"
ANTHROPIC_KEY = "sk-ant-capture-test-ANTHROPICKEY"


class Process:
    """A running `llm-replay` server process that prints one readiness line with its URL."""

    def __init__(self, *args, prefix):
        if not BIN.exists():
            pytest.fail(f"binary not found at {BIN}: build it or set LLM_REPLAY_BIN")
        self.proc = subprocess.Popen(
            [str(BIN), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        result = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(15.0)
        line = result[0] if result else ""
        if not line.startswith(prefix):
            self.proc.kill()
            pytest.fail(f"unexpected readiness line {line!r}; stderr: {self.proc.stderr.read()}")
        self.url = line[len(prefix):].strip()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def mock():
    m = Process(
        "mock", "--listen", "127.0.0.1:0", "--ttft", "20ms", "--itl", "2ms", "--tokens", str(TOKENS),
        prefix="llm-replay mock listening on ",
    )
    yield m.url
    m.stop()


def openai_stream(url):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=OPENAI_KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    return pieces, finish, usage.completion_tokens if usage else None


def anthropic_stream(url):
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key=ANTHROPIC_KEY, max_retries=0)
    with client.messages.stream(
        model="claude-3-5-sonnet-latest",
        max_tokens=100,
        messages=[{"role": "user", "content": "Say something."}],
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    return pieces, final.stop_reason, final.usage.output_tokens


def test_sdks_stream_through_the_recording_proxy(mock, tmp_path):
    out = tmp_path / "recorded.jsonl"
    recorder = Process(
        "record", "--listen", "127.0.0.1:0", "--upstream", mock, "--out", str(out),
        prefix="llm-replay record listening on ",
    )
    try:
        direct_openai = openai_stream(mock)
        via_openai = openai_stream(recorder.url)
        direct_anthropic = anthropic_stream(mock)
        via_anthropic = anthropic_stream(recorder.url)
    finally:
        code = recorder.stop()
    assert code == 0, recorder.proc.stderr.read()

    # Every token read through the proxy, exactly as directly.
    assert len(via_openai[0]) == TOKENS
    assert via_openai == direct_openai
    assert via_openai[1] == "stop" and via_openai[2] == TOKENS
    assert len("".join(via_anthropic[0]).split()) == TOKENS
    assert via_anthropic == direct_anthropic
    assert via_anthropic[2] == TOKENS

    text = out.read_text()
    assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["request"]["path"] for line in lines] == ["/v1/chat/completions", "/v1/messages"]
    for line in lines:
        response = line["response"]
        assert response["status"] == 200
        assert response["complete"] is True
        frames = response["frames"]
        assert len(frames) >= 2
        assert all("t_ms" in f for f in frames)
        offsets = [f["t_ms"] for f in frames]
        assert offsets == sorted(offsets)
        assert offsets[-1] >= 20.0  # content comes after the mock's 20 ms time to first token
        assert "authorization" not in line["request"]["headers"]
        assert "x-api-key" not in line["request"]["headers"]


@pytest.fixture(scope="module")
def paced_mock():
    """A mock whose stream length follows each request's max tokens, paced slowly enough that
    the replay's own cost (well under a millisecond) is small beside 3 % of every number."""
    m = Process(
        "mock", "--listen", "127.0.0.1:0", "--ttft", "100ms", "--itl", "5ms",
        prefix="llm-replay mock listening on ",
    )
    yield m.url
    m.stop()


def mixed_sdk_traffic(url, kind, max_tokens):
    """One request of `kind` through the official SDKs; returns the generated pieces."""
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=url + "/v1", api_key=OPENAI_KEY, max_retries=0)
    messages = [{"role": "user", "content": f"Explain tides in {max_tokens} words."}]
    if kind == "chat-usage":
        stream = oai.chat.completions.create(
            model="m", messages=messages, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True},
        )
        return [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    if kind == "chat-no-usage":
        stream = oai.chat.completions.create(
            model="m", messages=messages, max_tokens=max_tokens, stream=True,
        )
        return [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    if kind == "completions":
        stream = oai.completions.create(
            model="m", prompt="Tides are", max_tokens=max_tokens, stream=True,
        )
        return [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    if kind == "chat-unstreamed":
        answer = oai.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens)
        return [answer.choices[0].message.content]
    if kind == "anthropic":
        client = anthropic.Anthropic(base_url=url, api_key=ANTHROPIC_KEY, max_retries=0)
        with client.messages.stream(model="claude", max_tokens=max_tokens, messages=messages) as s:
            return list(s.text_stream)
    raise ValueError(kind)


def test_mixed_sdk_traffic_recorded_then_replayed_matches_its_baseline(paced_mock, tmp_path):
    """Acceptance (issue 11): streamed chat with and without usage, completions, Anthropic
    messages and non-streamed chat, overlapping and of very different lengths, recorded
    through the proxy; replayed against the embedded mock, TTFT, ITL and latency p50 and p95
    are within 3 % of the recording's own numbers, schedule lag p99 is under 5 ms, and no
    saturation is reported — although the proxy wrote the exchanges as they completed, out of
    arrival order."""
    import concurrent.futures
    import time

    out = tmp_path / "mixed.jsonl"
    recorder = Process(
        "record", "--listen", "127.0.0.1:0", "--upstream", paced_mock, "--out", str(out),
        prefix="llm-replay record listening on ",
    )
    kinds = ["chat-usage", "chat-no-usage", "completions", "anthropic", "chat-unstreamed"]
    # Long streams start first, short ones after: the file order becomes completion order.
    plan = []
    for round_ in range(5):
        for i, kind in enumerate(kinds):
            plan.append((kind, [160, 12, 60, 100, 30][(i + round_) % 5]))
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            futures = []
            for kind, max_tokens in plan:
                futures.append(pool.submit(mixed_sdk_traffic, recorder.url, kind, max_tokens))
                time.sleep(0.06)
            results = [f.result(timeout=60) for f in futures]
    finally:
        code = recorder.stop()
    assert code == 0, recorder.proc.stderr.read()
    assert all(results), "every SDK call got content"

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == len(plan)
    arrivals = [line["at_ms"] for line in lines]
    assert arrivals != sorted(arrivals), "the proxy wrote completion order, not arrival order"

    stats = subprocess.run(
        [str(BIN), "recording", "stats", str(out), "--json"], capture_output=True, text=True,
    )
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["order"]["out_of_order"] > 0

    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [str(BIN), "run", str(out), "--report-json", str(report_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_path.read_text())
    print(run.stdout)
    assert report["requests"]["succeeded"] == len(plan)
    assert report["requests"]["unstreamed"] == 5
    assert report["llm"]["ttft_ms"]["count"] == len(plan) - 5
    assert report["llm"]["latency_ms"]["count"] == len(plan)
    changes = report["baseline"]["changes"]
    for key in ["ttft_ms", "itl_ms", "latency_ms"]:
        for stat in ["p50", "p95"]:
            change = changes[f"{key}.{stat}"]["change_pct"]
            assert abs(change) <= 3.0, f"{key}.{stat} changed {change:.2f} %"
    lag_p99 = report["llm"]["schedule_lag_ms"]["p99"]
    assert lag_p99 < 5.0, f"schedule lag p99 {lag_p99} ms"
    assert "saturated" not in run.stdout + run.stderr
