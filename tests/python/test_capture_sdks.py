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
