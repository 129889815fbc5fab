"""AIPerf itself accepts `llm-replay export aiperf`: a recording (imported from a slice of the
real Mooncake trace in `tests/data`) is exported to `mooncake_trace` JSONL and `aiperf profile`
replays it against `llm-replay mock` on loopback with no request errors.

AIPerf needs a tokenizer; a small byte-level BPE one is trained at test time with the
`tokenizers` package and saved to a temp folder, so nothing is downloaded.

Run from the repo root with `pytest tests/python`. The binary comes from $LLM_REPLAY_BIN
(default: target/release/llm-replay relative to the repo root).
"""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

aiperf = pytest.importorskip(
    "aiperf", reason="aiperf is not installed (pip install -r tests/python/requirements-aiperf.txt)"
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("LLM_REPLAY_BIN", REPO_ROOT / "target" / "release" / "llm-replay"))
if not BIN.is_absolute():
    BIN = REPO_ROOT / BIN
DATA = REPO_ROOT / "tests" / "data"
LINES = 16
SECRET = "sk-live-EXPORTSECRET42"


def build_tokenizer(folder: Path, corpus: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["[UNK]", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus.read_text()[:200_000].splitlines(), trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "[UNK]",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": 1_000_000,
            }
        )
    )


def llm_replay(*args):
    run = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"llm-replay {' '.join(args)}: {run.stdout}{run.stderr}"
    return run


def start_mock():
    proc = subprocess.Popen(
        [str(BIN), "mock", "--listen", "127.0.0.1:0", "--ttft", "5ms", "--itl", "1ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()))
    reader.daemon = True
    reader.start()
    reader.join(15.0)
    line = result[0] if result else ""
    prefix = "llm-replay mock listening on "
    if not line.startswith(prefix):
        proc.kill()
        pytest.fail(f"unexpected readiness line {line!r}")
    return proc, line[len(prefix):].strip()


def test_aiperf_profiles_the_export_without_errors(tmp_path):
    if not BIN.exists():
        pytest.fail(f"binary not found at {BIN}: build it or set LLM_REPLAY_BIN")
    corpus = DATA / "corpus" / "shakespeare_256k.txt"
    recording = tmp_path / "recording.jsonl"
    llm_replay(
        "import", "mooncake", str(DATA / "mooncake" / "conversation_trace_200.jsonl"),
        "-o", str(recording), "--corpus", str(corpus), "--model", "mock-model",
        "--limit", str(LINES),
    )
    # Plant a secret in one prompt: the export's --redact-body must remove it.
    lines = recording.read_text().splitlines()
    first = json.loads(lines[0])
    body = json.loads(first["request"]["body"])
    body["messages"][0]["content"] = f"my key is {SECRET}. " + body["messages"][0]["content"]
    first["request"]["body"] = json.dumps(body)
    lines[0] = json.dumps(first)
    recording.write_text("\n".join(lines) + "\n")

    trace = tmp_path / "trace.jsonl"
    llm_replay("export", "aiperf", str(recording), "-o", str(trace), "--redact-body", r"sk-live-[A-Za-z0-9]+")
    text = trace.read_text()
    assert SECRET not in text and "REDACTED-" in text
    exported = [json.loads(line) for line in text.splitlines()]
    assert len(exported) == LINES
    assert all(set(e) <= {"timestamp", "session_id", "messages", "output_length", "extra"} for e in exported)

    tokenizer = tmp_path / "tokenizer"
    build_tokenizer(tokenizer, corpus)
    mock, url = start_mock()
    artifacts = tmp_path / "artifacts"
    try:
        run = subprocess.run(
            [
                sys.executable, "-m", "aiperf", "profile",
                "--model", "mock-model",
                "--url", url,
                "--endpoint-type", "chat",
                "--streaming",
                "--tokenizer", str(tokenizer),
                "--input-file", str(trace),
                "--custom-dataset-type", "mooncake_trace",
                "--output-artifact-dir", str(artifacts),
                "--ui-type", "none",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait(timeout=15)
    assert run.returncode == 0, f"aiperf failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    # AIPerf omits error_request_count on clean runs.
    errors = summary.get("error_request_count") or {"avg": 0}
    assert errors["avg"] == 0, summary.get("error_summary")
    assert summary["request_count"]["avg"] == LINES
