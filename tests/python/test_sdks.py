"""The official Python SDKs against `llm-replay mock`, streaming, one test per client path.

Run from the repo root with plain `pytest tests/python`. The binary comes from
$LLM_REPLAY_BIN (default: target/release/llm-replay relative to the repo root).
"""

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("LLM_REPLAY_BIN", REPO_ROOT / "target" / "release" / "llm-replay"))
if not BIN.is_absolute():
    BIN = REPO_ROOT / BIN

TOKENS = 5
# The mock's synthetic tokens cycle through these words (mock/src/synth.rs).
WORDS = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit"]
EXPECTED_TEXT = " ".join(WORDS[:TOKENS])
FAST = ["--ttft", "5ms", "--itl", "1ms", "--tokens", str(TOKENS)]
MODEL_BEDROCK = "anthropic.claude-3-5-sonnet-20240620-v1:0"


class Mock:
    """A running `llm-replay mock` process."""

    def __init__(self, *args):
        if not BIN.exists():
            pytest.fail(f"mock binary not found at {BIN}: build it or set LLM_REPLAY_BIN")
        self.proc = subprocess.Popen(
            [str(BIN), "mock", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self._readline_with_timeout(10.0)
        prefix = "llm-replay mock listening on "
        if not line.startswith(prefix):
            self.stop()
            pytest.fail(f"unexpected readiness line {line!r}; stderr: {self.proc.stderr.read()}")
        self.url = line[len(prefix):].strip()

    def _readline_with_timeout(self, seconds):
        result = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(seconds)
        return result[0] if result else ""

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def mock():
    m = Mock(*FAST)
    yield m.url
    m.stop()
    assert m.proc.returncode == 0, "the mock must exit cleanly on SIGTERM"


@pytest.fixture(scope="module")
def mock_usage_off():
    m = Mock(*FAST, "--usage", "off")
    yield m.url
    m.stop()


@pytest.fixture(scope="module")
def mock_error_frame():
    m = Mock(*FAST, "--error-frame-rate", "1")
    yield m.url
    m.stop()


@pytest.fixture(scope="module")
def mock_drop():
    m = Mock(*FAST, "--drop-rate", "100%")
    yield m.url
    m.stop()


@pytest.fixture(scope="module")
def mock_fail():
    m = Mock(*FAST, "--fail-rate", "1")
    yield m.url
    m.stop()


def openai_client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


def anthropic_client(url):
    import anthropic

    return anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0)


def bedrock_client(url):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "bedrock-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=Config(retries={"max_attempts": 1}),
    )


MESSAGES = [{"role": "user", "content": "Say something."}]
ANTHROPIC_INVOKE_BODY = json.dumps(
    {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Say something."}],
    }
)


# --- OpenAI ---


def test_openai_chat_raw_stream_reads_every_token_and_usage(mock):
    client = openai_client(mock)
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(pieces) == TOKENS
    assert "".join(pieces) == EXPECTED_TEXT
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == TOKENS
    assert usage.prompt_tokens == 4  # ceil(len("Say something.") / 4)


def test_openai_chat_stream_helper(mock):
    client = openai_client(mock)
    with client.chat.completions.stream(
        model="gpt-4o-mini",
        messages=MESSAGES,
        stream_options={"include_usage": True},
    ) as stream:
        # The role chunk's `content:""` is a (empty) content.delta too, as with the real API.
        deltas = [e.delta for e in stream if e.type == "content.delta" and e.delta]
        final = stream.get_final_completion()
    assert len(deltas) == TOKENS
    assert final.choices[0].message.content == EXPECTED_TEXT
    assert final.choices[0].finish_reason == "stop"
    assert final.usage.completion_tokens == TOKENS


def test_openai_legacy_completions(mock):
    client = openai_client(mock)
    stream = client.completions.create(
        model="gpt-3.5-turbo-instruct",
        prompt="Say something.",
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.text:
                pieces.append(choice.text)
            if choice.finish_reason:
                finish = choice.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == EXPECTED_TEXT
    assert finish == "stop"
    assert usage.completion_tokens == TOKENS


def test_openai_responses_stream_helper(mock):
    client = openai_client(mock)
    with client.responses.stream(model="gpt-4.1-mini", input="Say something.") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) == TOKENS
    assert final.output_text == EXPECTED_TEXT
    assert final.status == "completed"
    assert final.usage.output_tokens == TOKENS


def test_openai_usage_off_sends_no_usage(mock_usage_off):
    client = openai_client(mock_usage_off)
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == EXPECTED_TEXT
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks), "no usage-only chunk"


def test_openai_error_frame_raises(mock_error_frame):
    import openai

    client = openai_client(mock_error_frame)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    pieces = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            pieces.extend(c.delta.content for c in chunk.choices if c.delta.content)
    assert len(pieces) == TOKENS // 2, "the error comes after half the tokens"


def test_openai_responses_error_frame_fails_final_response(mock_error_frame):
    client = openai_client(mock_error_frame)
    with client.responses.stream(model="m", input="hi") as stream:
        types = [e.type for e in stream]
        with pytest.raises(RuntimeError):
            stream.get_final_response()
    assert "error" in types and types[-1] == "response.failed"


def test_openai_drop_raises_connection_error(mock_drop):
    import openai

    client = openai_client(mock_drop)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIConnectionError):
        for _ in stream:
            pass


def test_openai_fail_rate_gives_http_500(mock_fail):
    import openai

    client = openai_client(mock_fail)
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert err.value.status_code == 500


# --- Anthropic ---


def test_anthropic_messages_stream(mock):
    client = anthropic_client(mock)
    with client.messages.stream(
        model="claude-mock", max_tokens=100, messages=MESSAGES
    ) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert len(texts) == TOKENS
    assert message.content[0].text == EXPECTED_TEXT
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == TOKENS
    assert message.usage.input_tokens == 4


def test_anthropic_error_frame_raises(mock_error_frame):
    import anthropic

    client = anthropic_client(mock_error_frame)
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model="c", max_tokens=100, messages=MESSAGES) as stream:
            stream.get_final_message()


# --- Ollama ---


def test_ollama_chat_stream(mock):
    import ollama

    client = ollama.Client(host=mock)
    parts = list(client.chat(model="llama3.2", messages=MESSAGES, stream=True))
    text = "".join(p.message.content for p in parts)
    assert text == EXPECTED_TEXT
    assert parts[-1].done and parts[-1].done_reason == "stop"
    assert parts[-1].eval_count == TOKENS
    assert parts[-1].prompt_eval_count == 4


def test_ollama_generate_stream(mock):
    import ollama

    client = ollama.Client(host=mock)
    parts = list(client.generate(model="llama3.2", prompt="Say something.", stream=True))
    assert "".join(p.response for p in parts) == EXPECTED_TEXT
    assert parts[-1].done and parts[-1].eval_count == TOKENS


def test_ollama_error_line_raises(mock_error_frame):
    import ollama

    client = ollama.Client(host=mock_error_frame)
    with pytest.raises(ollama.ResponseError):
        for _ in client.chat(model="llama3.2", messages=MESSAGES, stream=True):
            pass


# --- Bedrock (boto3) ---


def test_boto3_converse_stream(mock):
    client = bedrock_client(mock)
    response = client.converse_stream(
        modelId=MODEL_BEDROCK,
        messages=[{"role": "user", "content": [{"text": "Say something."}]}],
        inferenceConfig={"maxTokens": 100},
    )
    pieces, stop, usage = [], None, None
    for event in response["stream"]:
        if "contentBlockDelta" in event:
            pieces.append(event["contentBlockDelta"]["delta"]["text"])
        elif "messageStop" in event:
            stop = event["messageStop"]["stopReason"]
        elif "metadata" in event:
            usage = event["metadata"]["usage"]
    assert len(pieces) == TOKENS
    assert "".join(pieces) == EXPECTED_TEXT
    assert stop == "end_turn"
    assert usage["outputTokens"] == TOKENS


def test_boto3_invoke_model_with_response_stream(mock):
    client = bedrock_client(mock)
    response = client.invoke_model_with_response_stream(
        modelId=MODEL_BEDROCK, body=ANTHROPIC_INVOKE_BODY
    )
    assert response["contentType"] == "application/json"
    events = [json.loads(e["chunk"]["bytes"]) for e in response["body"]]
    text = "".join(
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
    )
    assert text == EXPECTED_TEXT
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["usage"]["output_tokens"] == TOKENS
    assert events[-1]["type"] == "message_stop"
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == TOKENS
    assert events[0]["message"]["model"] == MODEL_BEDROCK, "the path's model id is URL-decoded"


def test_boto3_exception_frame_raises(mock_error_frame):
    from botocore.exceptions import EventStreamError

    client = bedrock_client(mock_error_frame)
    response = client.converse_stream(
        modelId=MODEL_BEDROCK,
        messages=[{"role": "user", "content": [{"text": "hi"}]}],
    )
    with pytest.raises(EventStreamError):
        for _ in response["stream"]:
            pass


def test_anthropic_bedrock_stream(mock):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.AnthropicBedrock(
        aws_access_key="AKIDEXAMPLE",
        aws_secret_key="secret",
        aws_region="us-east-1",
        base_url=mock,
        max_retries=0,
    )
    with client.messages.stream(
        model=MODEL_BEDROCK, max_tokens=100, messages=MESSAGES
    ) as stream:
        message = stream.get_final_message()
    assert message.content[0].text == EXPECTED_TEXT
    assert message.usage.output_tokens == TOKENS
