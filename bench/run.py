#!/usr/bin/env python3
"""Benchmarks of the issue "Fidelity and speed at scale", measured against server truth.

The server is `llm-replay mock --write-log FILE` pinned to core 0 (`taskset -c 0`); it logs,
per request, the instant its head arrived and the instants its first and last frames were
written to the socket (CLOCK_REALTIME ns), keyed by the `x-llm-replay-exchange` tag. The
client under test is pinned to core 1: llm-replay (`run --tag-requests --requests-out`),
then `minimal-client` (hyper directly: the practical limit), then AIPerf when it is installed,
one after the other against a fresh mock with the same flags.

TTFT error of one request = client TTFT − server TTFT, where server TTFT = first frame written
− request head received (both in the mock). What the client adds on both sides of the wire —
its send path, the loopback, its receive path and its own scheduling — is the error.

Usage (from the repository root, after `cargo build --release -p llm-replay-cli -p llm-replay-bench`):

    python3 bench/run.py                      # every row, 3 repeats, median reported
    python3 bench/run.py --rows ttft16,tput --repeat 1
    python3 bench/run.py --llm-replay /path/to/other/llm-replay

Standard library only. Results: a Markdown table on stdout, and everything measured in
`--out-dir` (default target/bench/): results.json, per-run logs, truth logs, request files.
"""

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER_CORE = "0"
CLIENT_CORE = "1"

# Mock flags of the fidelity rows: a 20 ms TTFT, 16 tokens 10 ms apart (~170 ms a request).
PACED = ["--ttft", "20ms", "--itl", "10ms", "--tokens", "16"]
# The burst server: every frame at once, 256 tokens a response.
BURST = ["--ttft", "0ms", "--itl", "0ms", "--tokens", "256"]
# Slow streams for the memory row: 8 tokens 2 s apart (~16 s a stream).
SLOW = ["--ttft", "2s", "--itl", "2s", "--tokens", "8"]


# ---------------------------------------------------------------------------------------------
# Small statistics


def quantile(values, q):
    """Nearest-rank quantile (q in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# Processes


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard, 65536))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def pinned(core, argv):
    return ["taskset", "-c", core, *map(str, argv)]


def wait_rusage(proc, timeout):
    """Wait for `proc` with wait4: (exit code, user+system CPU s, peak RSS MB).

    The CPU and peak RSS include the child's own children once it has waited for them (the
    coordinator's local workers), as wait4 reports.
    """
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return code, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0
        if time.monotonic() > deadline:
            proc.kill()
            timeout = 30
            deadline = time.monotonic() + timeout
        time.sleep(0.05)


class Mock:
    """`llm-replay mock` on core 0 with its truth log."""

    def __init__(self, binary, flags, truth_path, log_path):
        self.truth_path = truth_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            pinned(
                SERVER_CORE,
                [binary, "mock", "--listen", "127.0.0.1:0", "--http1-only",
                 "--write-log", truth_path, *flags],
            ),
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            preexec_fn=raise_fd_limit,
        )
        line = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(15)
        prefix = "llm-replay mock listening on "
        if not line or not line[0].startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"mock did not start: {line!r}, see {log_path}")
        self.url = line[0][len(prefix):].strip()

    def stop(self):
        """Stop the mock (SIGTERM) and read its truth log: {tag or "#id": record}."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.log.close()
        truth = {}
        for line in Path(self.truth_path).read_text().splitlines():
            record = json.loads(line)
            key = record["exchange"] if record["exchange"] is not None else f"#{record['id']}"
            truth.setdefault(key, record)
        return truth


def server_ttft_ms(record):
    """Head received → first token's frame written (the role frame before it does not count,
    as no client counts it in TTFT)."""
    if record is None or record.get("first_token_write_ns") is None:
        return None
    return (record["first_token_write_ns"] - record["head_ns"]) / 1e6


# ---------------------------------------------------------------------------------------------
# Clients


def write_recording(path, count, gap_ms=None):
    """`count` streamed chat exchanges (no responses); `at_ms` every `gap_ms` when given."""
    body = json.dumps({
        "model": "mock-model",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    with open(path, "w") as out:
        for i in range(count):
            line = {
                "request": {
                    "method": "POST",
                    "path": "/v1/chat/completions",
                    "headers": {"content-type": "application/json"},
                    "body": body,
                }
            }
            if gap_ms is not None:
                line["at_ms"] = i * gap_ms
            out.write(json.dumps(line) + "\n")


def send_path_order(cfg):
    """The send paths of this run, rotated by the run's index so that none always goes first
    (`--send-paths`: the first is llm-replay's default, `h1`)."""
    paths = cfg.send_paths
    k = cfg.run_index % len(paths)
    return paths[k:] + paths[:k]


def variant_key(send_path):
    """The result key of llm-replay with `send_path`: `llm-replay` for the default."""
    return "llm-replay" if send_path == "h1" else f"llm-replay@{send_path}"


SCRAPE_ARGS = {
    "": [],
    "scrape100ms": ["--server-metrics-interval", "100ms"],
    "noscrape": ["--no-server-metrics"],
}


def worker_cpu_s(report):
    """CPU seconds of the run's workers, from the report."""
    workers = report.get("run", {}).get("workers", [])
    values = [w.get("cpu_seconds") for w in workers if w.get("cpu_seconds") is not None]
    return sum(values) if values else None


def run_llm_replay(cfg, url, recording, name, extra, timeout=900, send_path="h1"):
    """One `llm-replay run` on core 1: its per-request records, report, CPU and wall time.
    `h1` is the worker's one cleartext transport (the hyper `client::conn::http1` alternative
    of `docs/performance.md`, "One send path", was removed); a `+scrape…` suffix varies the
    coordinator's scraping."""
    out = cfg.out_dir
    env = dict(os.environ)
    if send_path != "h1":
        name = f"{name}@{send_path}"
    # `PATH+scrape100ms` / `PATH+noscrape`: the same send path with the coordinator scraping
    # the target's /metrics every 100 ms, or not at all (the default scrapes every second).
    send_path, _, scrape = send_path.partition("+")
    extra = list(extra) + SCRAPE_ARGS[scrape]
    requests_path = out / f"{name}.llm-replay.requests.jsonl"
    report_path = out / f"{name}.llm-replay.report.json"
    argv = [
        cfg.llm_replay, "run", recording, "--target", url, "--tag-requests",
        "--baseline", "none", "--warmup", "0",
        "--requests-out", requests_path, "--report-json", report_path, *extra,
    ]
    with open(out / f"{name}.llm-replay.log", "w") as log:
        started = time.monotonic()
        proc = subprocess.Popen(pinned(CLIENT_CORE, argv), stdout=log, stderr=log,
                                preexec_fn=raise_fd_limit, env=env)
        code, cpu_s, _ = wait_rusage(proc, timeout)
        wall_s = time.monotonic() - started
    if code not in (0, 1):
        raise RuntimeError(f"llm-replay exited {code}; see {out / (name + '.llm-replay.log')}")
    records = [json.loads(line) for line in requests_path.read_text().splitlines()]
    report = json.loads(report_path.read_text())
    return {"records": records, "report": report, "cpu_s": cpu_s, "wall_s": wall_s}


def run_minimal(cfg, url, concurrency, requests, name, timeout=900):
    out_path = cfg.out_dir / f"{name}.minimal.requests.jsonl"
    argv = [cfg.minimal_client, "--target", url, "--concurrency", concurrency,
            "--requests", requests, "--out", out_path]
    started = time.monotonic()
    proc = subprocess.Popen(pinned(CLIENT_CORE, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=raise_fd_limit)
    stdout = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()))
    reader.start()
    code, cpu_s, rss_mb = wait_rusage(proc, timeout)
    reader.join()
    wall_s = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"minimal-client exited {code}: {proc.stderr.read()[-2000:]}")
    records = [json.loads(line) for line in out_path.read_text().splitlines()]
    summary = json.loads(stdout[0].strip().splitlines()[-1])
    return {"records": records, "summary": summary, "cpu_s": cpu_s, "wall_s": wall_s,
            "peak_rss_mb": rss_mb}


def aiperf_tokenizer(cfg):
    """A small byte-level BPE tokenizer trained here (AIPerf needs one; nothing is downloaded)."""
    folder = cfg.out_dir / "aiperf-tokenizer"
    if (folder / "tokenizer.json").exists():
        return folder
    script = r"""
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
folder, corpus = Path(sys.argv[1]), Path(sys.argv[2])
tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus.read_text()[:200_000].splitlines(), trainer)
folder.mkdir(parents=True, exist_ok=True)
tok.save(str(folder / "tokenizer.json"))
(folder / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "<s>",
    "eos_token": "</s>", "model_max_length": 1000000}))
"""
    corpus = REPO / "tests" / "data" / "corpus" / "shakespeare_256k.txt"
    subprocess.run([cfg.aiperf_python, "-c", script, folder, corpus], check=True,
                   capture_output=True)
    return folder


def run_aiperf(cfg, url, concurrency, requests, name, timeout=1200):
    """AIPerf on core 1 (synthetic prompts, the mock fixes the output at 16 tokens).

    AIPerf cannot tag requests, so its TTFT is compared with the server's as distributions
    (quantile minus quantile), not request by request.
    """
    if not cfg.aiperf_python:
        return None
    artifacts = cfg.out_dir / f"{name}.aiperf"
    argv = [
        cfg.aiperf_python, "-m", "aiperf", "profile", "--model", "mock-model", "--url", url,
        "--endpoint-type", "chat", "--streaming", "--tokenizer", aiperf_tokenizer(cfg),
        "--concurrency", concurrency, "--request-count", requests,
        "--prompt-input-tokens-mean", "8", "--prompt-input-tokens-stddev", "0",
        "--prompt-output-tokens-mean", "16",
        "--output-artifact-dir", artifacts, "--ui-type", "none",
    ]
    with open(cfg.out_dir / f"{name}.aiperf.log", "w") as log:
        started = time.monotonic()
        proc = subprocess.Popen(pinned(CLIENT_CORE, argv), stdout=log, stderr=log,
                                cwd=cfg.out_dir, preexec_fn=raise_fd_limit)
        code, cpu_s, _ = wait_rusage(proc, timeout)
        wall_s = time.monotonic() - started
    if code != 0:
        print(f"  aiperf exited {code}; see {cfg.out_dir / (name + '.aiperf.log')}",
              file=sys.stderr)
        return None
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    return {"summary": summary, "cpu_s": cpu_s, "wall_s": wall_s}


# ---------------------------------------------------------------------------------------------
# Rows


def ttft_errors(records, truth, index_key, ttft_key):
    """Per request: client TTFT − server TTFT (ms), joined on the exchange tag."""
    errors = []
    for record in records:
        ttft = record.get(ttft_key)
        server = server_ttft_ms(truth.get(str(record.get(index_key))))
        if ttft is not None and server is not None:
            errors.append(ttft - server)
    return errors


def row_ttft(cfg, concurrency, requests):
    """TTFT error p50/p99 at `concurrency`, no warm-up: llm-replay, minimal client, AIPerf."""
    name = f"ttft-c{concurrency}"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, requests)
    result = {}

    for send_path in send_path_order(cfg):
        key = variant_key(send_path)
        mock = Mock(cfg.llm_replay, PACED, cfg.out_dir / f"{name}.{key}.truth.jsonl",
                    cfg.out_dir / f"{name}.{key}.mock.log")
        try:
            run = run_llm_replay(cfg, mock.url, recording, name,
                                 ["--concurrency", concurrency, "--requests", requests],
                                 send_path=send_path)
        finally:
            truth = mock.stop()
        errors = ttft_errors(run["records"], truth, "index", "ttft_ms")
        result[key] = summarize_errors(errors, len(run["records"]), truth)
        result[key]["worker_cpu_s"] = worker_cpu_s(run["report"])

    mock = Mock(cfg.llm_replay, PACED, cfg.out_dir / f"{name}.minimal.truth.jsonl",
                cfg.out_dir / f"{name}.minimal.mock.log")
    try:
        run = run_minimal(cfg, mock.url, concurrency, requests, name)
    finally:
        truth = mock.stop()
    errors = ttft_errors(run["records"], truth, "index", "ttft_ms")
    result["minimal"] = summarize_errors(errors, len(run["records"]), truth)

    if cfg.aiperf_python and concurrency <= cfg.aiperf_max_concurrency:
        mock = Mock(cfg.llm_replay, PACED, cfg.out_dir / f"{name}.aiperf.truth.jsonl",
                    cfg.out_dir / f"{name}.aiperf.mock.log")
        try:
            run = run_aiperf(cfg, mock.url, concurrency, requests, name)
        finally:
            truth = mock.stop()
        if run:
            server = [t for t in (server_ttft_ms(r) for r in truth.values()) if t is not None]
            ttft = run["summary"].get("time_to_first_token", {})
            result["aiperf"] = {
                "p50_ms": ttft.get("p50") - quantile(server, 0.5) if ttft.get("p50") else None,
                "p99_ms": ttft.get("p99") - quantile(server, 0.99) if ttft.get("p99") else None,
                "joined": None,
                "requests": len(truth),
            }
    return result


def summarize_errors(errors, requests, truth):
    return {
        "p50_ms": quantile(errors, 0.5),
        "p99_ms": quantile(errors, 0.99),
        "joined": len(errors),
        "requests": requests,
        "server_ttft_p50_ms": quantile(
            [t for t in (server_ttft_ms(r) for r in truth.values()) if t is not None], 0.5),
    }


def row_throughput(cfg, concurrency, requests):
    """Output tokens per client CPU-second against the burst server."""
    name = f"tput-c{concurrency}"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, requests)
    result = {}
    for send_path in send_path_order(cfg):
        key = variant_key(send_path)
        mock = Mock(cfg.llm_replay, BURST, cfg.out_dir / f"{name}.{key}.truth.jsonl",
                    cfg.out_dir / f"{name}.{key}.mock.log")
        try:
            run = run_llm_replay(cfg, mock.url, recording, name,
                                 ["--concurrency", concurrency, "--requests", requests],
                                 send_path=send_path)
        finally:
            mock.stop()
        tokens = sum(r.get("output_tokens") or 0 for r in run["records"]
                     if r.get("outcome") == "succeeded")
        result[key] = throughput(tokens, run)
    mock = Mock(cfg.llm_replay, BURST, cfg.out_dir / f"{name}.minimal.truth.jsonl",
                cfg.out_dir / f"{name}.minimal.mock.log")
    try:
        run = run_minimal(cfg, mock.url, concurrency, requests, name)
    finally:
        mock.stop()
    result["minimal"] = throughput(run["summary"]["output_tokens"], run)
    return result


TOKENIZER = REPO / "tests" / "data" / "tokenizer.json"


def row_tokenizer(cfg, concurrency, requests):
    """Output tokens per client CPU-second for streams without usage, counted by frames (no
    `--tokenizer`) and by the tokenizer (`--tokenizer`), against the burst server sending no
    usage and real words of the same tokenizer (`mock --usage off --tokenizer`). Tokens are the
    server's truth for both (the same work), so the ratio is the tokenizer's cost alone."""
    name = f"tok-c{concurrency}"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, requests)
    flags = BURST + ["--usage", "off", "--tokenizer", str(TOKENIZER)]
    variants = [("frames", []), ("tokenizer", ["--tokenizer", str(TOKENIZER)])]
    k = cfg.run_index % len(variants)
    result = {}
    for key, extra in variants[k:] + variants[:k]:
        mock = Mock(cfg.llm_replay, flags, cfg.out_dir / f"{name}.{key}.truth.jsonl",
                    cfg.out_dir / f"{name}.{key}.mock.log")
        try:
            run = run_llm_replay(cfg, mock.url, recording, f"{name}-{key}",
                                 ["--concurrency", concurrency, "--requests", requests, *extra])
        finally:
            truth = mock.stop()
        succeeded = [r for r in run["records"] if r.get("outcome") == "succeeded"]
        served = sum((truth.get(str(r["index"])) or {}).get("output_tokens") or 0
                     for r in succeeded)
        result[key] = throughput(served, run)
        result[key]["reported_tokens"] = sum(r.get("output_tokens") or 0 for r in succeeded)
        result[key]["requests"] = len(succeeded)
    frames, tok = result["frames"], result["tokenizer"]
    result["ratio"] = ratio(tok.get("tokens_per_cpu_s"), frames.get("tokens_per_cpu_s"))
    if frames["tokens"] and tok["tokens"]:
        # Extra client CPU per token with the tokenizer.
        result["ns_per_token"] = (tok["cpu_s"] / tok["tokens"]
                                  - frames["cpu_s"] / frames["tokens"]) * 1e9
    return result


def throughput(tokens, run):
    return {
        "tokens": tokens,
        "wall_s": run["wall_s"],
        "cpu_s": run["cpu_s"],
        "tokens_per_s": tokens / run["wall_s"],
        "tokens_per_cpu_s": tokens / run["cpu_s"] if run["cpu_s"] else None,
    }


def row_schedule_lag(cfg, requests, gap_ms=5):
    """Schedule lag on a recorded schedule, `gap_ms` apart: llm-replay's own and the server's."""
    name = f"lag-{gap_ms}ms"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, requests, gap_ms=gap_ms)
    mock = Mock(cfg.llm_replay, PACED, cfg.out_dir / f"{name}.llm-replay.truth.jsonl",
                cfg.out_dir / f"{name}.llm-replay.mock.log")
    try:
        run = run_llm_replay(cfg, mock.url, recording, name,
                             ["--schedule", "recorded", "--requests", requests])
    finally:
        truth = mock.stop()
    lags = [r["schedule_lag_ms"] for r in run["records"] if r.get("schedule_lag_ms") is not None]
    # Server side: arrival of request i minus i × gap, less the smallest such value (the most
    # punctual request is taken as on time: the run's true start is not known to the server).
    heads = {int(tag): rec["head_ns"] for tag, rec in truth.items() if tag.isdigit()}
    offsets = [ns / 1e6 - i * gap_ms for i, ns in heads.items()]
    server = [o - min(offsets) for o in offsets] if offsets else []
    return {
        "llm-replay": {
            "p50_ms": quantile(lags, 0.5),
            "p99_ms": quantile(lags, 0.99),
            "server_arrival_p50_ms": quantile(server, 0.5),
            "server_arrival_p99_ms": quantile(server, 0.99),
            "requests": len(run["records"]),
        }
    }


def row_memory(cfg, streams):
    """Worker peak RSS with `streams` concurrent slow streams."""
    name = f"rss-{streams}"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, streams)
    result = {}
    for send_path in send_path_order(cfg):
        key = variant_key(send_path)
        mock = Mock(cfg.llm_replay, SLOW, cfg.out_dir / f"{name}.{key}.truth.jsonl",
                    cfg.out_dir / f"{name}.{key}.mock.log")
        try:
            run = run_llm_replay(cfg, mock.url, recording, name,
                                 ["--concurrency", streams, "--requests", streams],
                                 send_path=send_path)
        finally:
            mock.stop()
        workers = run["report"].get("run", {}).get("workers", [])
        rss = [w.get("peak_rss_mb") for w in workers if w.get("peak_rss_mb") is not None]
        succeeded = sum(1 for r in run["records"] if r.get("outcome") == "succeeded")
        result[key] = {"peak_rss_mb": max(rss) if rss else None,
                       "worker_cpu_s": worker_cpu_s(run["report"]),
                       "succeeded": succeeded, "requests": len(run["records"])}
    mock = Mock(cfg.llm_replay, SLOW, cfg.out_dir / f"{name}.minimal.truth.jsonl",
                cfg.out_dir / f"{name}.minimal.mock.log")
    try:
        run = run_minimal(cfg, mock.url, streams, streams, name)
    finally:
        mock.stop()
    result["minimal"] = {"peak_rss_mb": run["peak_rss_mb"],
                         "succeeded": run["summary"]["succeeded"]}
    return result


def proc_cpu_s(pid):
    """utime + stime of `pid` itself (not its children), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def row_coordinator(cfg, workers, rounds=40):
    """Coordinator CPU (its own process only) with `workers` local worker processes.

    Two streams in flight per worker, `rounds` requests per stream (~0.55 s each): about
    22 s of replay. A run that does not end with every request done (a lost worker, a
    coordinator too starved to answer heartbeats) is reported as such, not as a CPU figure.
    """
    name = f"coord-{workers}"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, 1000)
    mock = Mock(cfg.llm_replay, ["--ttft", "50ms", "--itl", "50ms", "--tokens", "10"],
                cfg.out_dir / f"{name}.truth.jsonl", cfg.out_dir / f"{name}.mock.log")
    argv = [
        cfg.llm_replay, "run", recording, "--target", mock.url, "--baseline", "none",
        "--workers", workers, "--concurrency", workers * 2, "--requests", workers * 2 * rounds,
        "--report-json", cfg.out_dir / f"{name}.report.json",
        *(["--heartbeat-timeout", cfg.coord_heartbeat_timeout]
          if cfg.coord_heartbeat_timeout else []),
        *cfg.coord_extra.split(),
    ]
    samples = []
    try:
        with open(cfg.out_dir / f"{name}.llm-replay.log", "w") as log:
            proc = subprocess.Popen(pinned(CLIENT_CORE, argv), stdout=log, stderr=log,
                                    preexec_fn=raise_fd_limit)
            while proc.poll() is None:
                cpu = proc_cpu_s(proc.pid)
                if cpu is not None:
                    samples.append((time.monotonic(), cpu))
                time.sleep(0.5)
    finally:
        mock.stop()
    report = json.loads((cfg.out_dir / f"{name}.report.json").read_text())
    joined = len(report.get("run", {}).get("workers", []))
    succeeded = report.get("requests", {}).get("succeeded", 0)
    total = report.get("requests", {}).get("total", 0)
    if len(samples) < 4 or succeeded < total:
        return {"llm-replay": {"cpu_pct": None, "workers": joined, "succeeded": succeeded,
                               "requests": total}}
    # The middle half of the run: workers joined and replaying, before the drain and report.
    t0, t1 = samples[0][0], samples[-1][0]
    middle = [s for s in samples if t0 + (t1 - t0) * 0.25 <= s[0] <= t0 + (t1 - t0) * 0.75]
    steady = ((middle[-1][1] - middle[0][1]) / (middle[-1][0] - middle[0][0]) * 100
              if len(middle) >= 2 else None)
    whole = (samples[-1][1] - samples[0][1]) / (t1 - t0) * 100
    return {"llm-replay": {"cpu_pct": steady, "cpu_pct_whole_run": whole, "workers": joined,
                           "succeeded": succeeded, "requests": total}}


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_figures(samples):
    """% of a core over the middle half of the samples (workers joined and replaying) and
    over the whole run, from (monotonic s, CPU s) samples."""
    if len(samples) < 4:
        return None, None
    t0, t1 = samples[0][0], samples[-1][0]
    middle = [s for s in samples if t0 + (t1 - t0) * 0.25 <= s[0] <= t0 + (t1 - t0) * 0.75]
    steady = ((middle[-1][1] - middle[0][1]) / (middle[-1][0] - middle[0][0]) * 100
              if len(middle) >= 2 else None)
    whole = (samples[-1][1] - samples[0][1]) / (t1 - t0) * 100
    return steady, whole


def row_coordinator_simulated(cfg, workers, rounds=40):
    """Coordinator CPU (its own process only) with `workers` simulated workers.

    The coordinator (`--listen`, `--expect-workers`) runs on core 1; `many-workers` (the
    bench crate) runs the workers in one process on core 0, each speaking the real gRPC
    protocol and reporting real HDR histograms every 0.5 s, with no HTTP request (a request
    "takes" `--coord-sim-latency`). Two requests in flight per worker, `rounds` per slot, as
    the coord row. The target is never dialled.
    """
    name = f"coord-sim-{workers}"
    recording = cfg.out_dir / f"{name}.recording.jsonl"
    write_recording(recording, 1000)
    port = free_port()
    token = "coord-sim-" + os.urandom(8).hex()
    argv = [
        cfg.llm_replay, "run", recording, "--target", "http://127.0.0.1:9", "--baseline", "none",
        "--listen", f"127.0.0.1:{port}", "--expect-workers", workers, "--token", token,
        "--concurrency", workers * 2, "--requests", workers * 2 * rounds,
        "--join-timeout", "120s",
        "--report-json", cfg.out_dir / f"{name}.report.json",
        *(["--heartbeat-timeout", cfg.coord_heartbeat_timeout]
          if cfg.coord_heartbeat_timeout else []),
        *cfg.coord_extra.split(),
    ]
    sim_argv = [cfg.many_workers, "--coordinator", f"127.0.0.1:{port}", "--workers", workers,
                "--token", token, "--latency", cfg.coord_sim_latency]
    samples = []
    with open(cfg.out_dir / f"{name}.llm-replay.log", "w") as log, \
            open(cfg.out_dir / f"{name}.many-workers.log", "w") as sim_log:
        proc = subprocess.Popen(pinned(CLIENT_CORE, argv), stdout=log, stderr=log,
                                preexec_fn=raise_fd_limit)
        time.sleep(0.5)
        sim = subprocess.Popen(pinned(SERVER_CORE, sim_argv), stdout=sim_log, stderr=sim_log,
                               preexec_fn=raise_fd_limit)
        try:
            while proc.poll() is None:
                cpu = proc_cpu_s(proc.pid)
                if cpu is not None:
                    samples.append((time.monotonic(), cpu))
                time.sleep(0.5)
            sim.wait(timeout=120)
        finally:
            for p in (proc, sim):
                if p.poll() is None:
                    p.kill()
    report_path = cfg.out_dir / f"{name}.report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    joined = len(report.get("run", {}).get("workers", []))
    succeeded = report.get("requests", {}).get("succeeded", 0)
    total = report.get("requests", {}).get("total", 0)
    steady, whole = cpu_figures(samples)
    ok = succeeded >= total > 0
    return {"llm-replay": {"cpu_pct": steady if ok else None,
                           "cpu_pct_whole_run": whole if ok else None, "workers": joined,
                           "succeeded": succeeded, "requests": total,
                           "cpu_s_total": samples[-1][1] if samples else None}}


# The recording proxy's row: a stamping upstream (`record-load upstream`) on core 0, paced
# streamed requests (`record-load client`) on core 1, directly and through `llm-replay record`
# (also on core 1, writing a rotated gzip directory as in production).
RECORD_SHAPE = ["--ttft-ms", "5", "--itl-us", "2000", "--tokens", "16"]
# Stamped frames a response: the role frame, 16 content frames, the finish and usage frames.
RECORD_FRAMES = 16 + 3


def start_with_ready_line(argv, prefix, log_path):
    """Start `argv` (stdout piped) and wait for its `prefix<url>` line: (process, url, log)."""
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                            preexec_fn=raise_fd_limit)
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))
    reader.daemon = True
    reader.start()
    reader.join(15)
    if not line or not line[0].startswith(prefix):
        proc.kill()
        raise RuntimeError(f"{argv[3]} did not start: {line!r}, see {log_path}")
    return proc, line[0][len(prefix):].strip(), log


def proc_peak_rss_mb(pid):
    """VmHWM of `pid` in MB (peak resident set)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return None


def count_recorded(folder):
    """In a directory of rotated .jsonl.gz files: files, exchanges, complete 200 exchanges,
    and the stamped frames recorded (each frame the upstream wrote carries one `"fp-`)."""
    import gzip
    files = sorted(Path(folder).glob("*.jsonl.gz"))
    exchanges = complete = frames = 0
    for path in files:
        with gzip.open(path, "rt") as lines:
            for line in lines:
                record = json.loads(line)
                if "request" not in record:
                    continue  # the file's header line
                exchanges += 1
                response = record.get("response") or {}
                complete += bool(response.get("complete")) and response.get("status") == 200
                frames += sum(f.get("data", "").count('"fp-') for f in response.get("frames", []))
    return {"files": len(files), "exchanges": exchanges, "complete": complete, "frames": frames}


def run_record_variant(cfg, name, via_proxy):
    """One paced load run against a fresh upstream, directly or through `llm-replay record`."""
    out = cfg.out_dir
    upstream, url, upstream_log = start_with_ready_line(
        pinned(SERVER_CORE, [cfg.record_load, "upstream", *RECORD_SHAPE]),
        "record-load upstream listening on ", out / f"{name}.upstream.log")
    proxy = proxy_log = None
    folder = out / f"{name}.recording"
    try:
        target = url
        if via_proxy:
            if folder.exists():
                for old in folder.iterdir():
                    old.unlink()
            folder.mkdir(exist_ok=True)
            proxy, target, proxy_log = start_with_ready_line(
                pinned(cfg.record_proxy_core, [cfg.llm_replay, "record", "--listen", "127.0.0.1:0",
                                     "--upstream", url, "--out", f"{folder}/",
                                     "--rotate-size", cfg.record_rotate_size]),
                "llm-replay record listening on ", out / f"{name}.record.log")
        cpu_before = proc_cpu_s(proxy.pid) if proxy else None
        started = time.monotonic()
        client = subprocess.Popen(
            pinned(CLIENT_CORE, [cfg.record_load, "client", "--target", target,
                                 "--rate", cfg.record_rate, "--duration", cfg.record_duration,
                                 "--connections", cfg.record_connections]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=raise_fd_limit)
        stdout, stderr = client.communicate(timeout=600)
        window_s = time.monotonic() - started
        if client.returncode != 0:
            raise RuntimeError(f"record-load client exited {client.returncode}: {stderr[-2000:]}")
        result = json.loads(stdout.strip().splitlines()[-1])
        if proxy:
            cpu_s = proc_cpu_s(proxy.pid) - cpu_before
            requests = result["requests"] + result["warmup_requests"]
            rate = result["achieved_rate"]
            result["proxy"] = {
                "cpu_s": cpu_s, "window_s": window_s,
                "cpu_s_per_1000_requests": cpu_s / requests * 1000,
                # CPU-s per 1,000 requests = % of a core per 1,000 requests/s ÷ 100.
                "pct_core_per_1000_rps": cpu_s / requests * 1000 * 100,
                "pct_core_at_rate": cpu_s / window_s * 100, "rate": rate,
                "peak_rss_mb": proc_peak_rss_mb(proxy.pid),
            }
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(timeout=60)
            result["recording"] = count_recorded(folder)
            result["recording"].update({
                "expected": requests, "proxy_exit": proxy.returncode,
                "frames_sent": requests * RECORD_FRAMES})
        return result
    finally:
        for proc in (proxy, upstream):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in (proxy_log, upstream_log):
            if log:
                log.close()


def row_record(cfg):
    """The recording proxy's overhead: added TTFB and per-frame delay (p50/p99, through the
    proxy − direct, same run), its CPU per 1,000 requests and peak RSS, every exchange
    recorded."""
    variants = [("direct", False), ("record", True)]
    k = cfg.run_index % len(variants)
    result = {}
    for key, via_proxy in variants[k:] + variants[:k]:
        result[key] = run_record_variant(cfg, f"record-{key}", via_proxy)
    direct, proxied = result["direct"], result["record"]
    result["added_us"] = {
        f"{metric}_{q}": proxied[metric][q] - direct[metric][q]
        for metric in ("ttfb_us", "frame_delay_us") for q in ("p50", "p99")
    }
    result["load_avg"] = os.getloadavg()[0]
    return result


def row_image(cfg):
    """Size of the image deploy/build-image.sh builds from the binaries given."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return None
    bin_dir = Path(cfg.llm_replay).parent
    log = cfg.out_dir / "image.log"
    with open(log, "w") as out:
        code = subprocess.run([REPO / "deploy" / "build-image.sh", "--prebuilt", bin_dir,
                               "llm-replay:bench"], stdout=out, stderr=out).returncode
    if code != 0:
        print(f"  build-image.sh exited {code}; see {log}", file=sys.stderr)
        return None
    size = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}",
                           "llm-replay:bench"], capture_output=True, text=True, check=True)
    return {"llm-replay": {"size_mb": int(size.stdout.strip()) / 1e6}}


# ---------------------------------------------------------------------------------------------
# Table


def fmt(value, digits=2):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def pair(result, a="p50_ms", b="p99_ms"):
    if not result:
        return "–"
    return f"{fmt(result.get(a))} / {fmt(result.get(b))}"


def ratio(x, y):
    return x / y if x is not None and y not in (None, 0) else None


def build_table(rows):
    lines = [
        "| row | goal | llm-replay | minimal client | AIPerf | ratio (llm-replay ÷ minimal) | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = {key: row for key, row in rows.items() if row is not None}
    for key, label in [("ttft16", "c=16"), ("ttft128", "c=128")]:
        if key in rows:
            r = rows[key]
            lr, mc = r.get("llm-replay"), r.get("minimal")
            ok = lr and lr["p50_ms"] is not None and lr["p50_ms"] <= 0.5 and lr["p99_ms"] <= 2
            lines.append(
                f"| TTFT error vs server truth, {label}, no warm-up: p50 / p99 (ms) "
                f"| ≤ 0.5 / ≤ 2 | {pair(lr)} | {pair(mc)} | {pair(r.get('aiperf'))} "
                f"| {fmt(ratio(lr and lr['p50_ms'], mc and mc['p50_ms']))} / "
                f"{fmt(ratio(lr and lr['p99_ms'], mc and mc['p99_ms']))} "
                f"| {'pass' if ok else 'FAIL'} |")
    if "ttft1024" in rows:
        r = rows["ttft1024"]
        lr, mc = r.get("llm-replay"), r.get("minimal")
        r50 = ratio(lr and lr["p50_ms"], mc and mc["p50_ms"])
        r99 = ratio(lr and lr["p99_ms"], mc and mc["p99_ms"])
        # Errors under 0.5 ms count as within the goal whatever the minimal client did.
        ok50 = lr and lr["p50_ms"] is not None and (lr["p50_ms"] <= 0.5 or (r50 or 99) <= 1.2)
        ok99 = lr and lr["p99_ms"] is not None and (lr["p99_ms"] <= 2 or (r99 or 99) <= 1.2)
        lines.append(
            "| TTFT error vs server truth, c=1,024 (one client core): p50 / p99 (ms) "
            f"| ≤ 1.2 × minimal | {pair(lr)} | {pair(mc)} | {pair(r.get('aiperf'))} "
            f"| {fmt(r50)} / {fmt(r99)} | {'pass' if ok50 and ok99 else 'FAIL'} |")
    if "tput" in rows:
        r = rows["tput"]
        lr, mc = r.get("llm-replay", {}), r.get("minimal", {})
        q = ratio(lr.get("tokens_per_cpu_s"), mc.get("tokens_per_cpu_s"))
        lines.append(
            "| output tokens per client CPU-second, burst server, c=128 (tokens/s wall) "
            f"| ≥ 0.8 × minimal | {fmt(lr.get('tokens_per_cpu_s'), 0)} "
            f"({fmt(lr.get('tokens_per_s'), 0)}) | {fmt(mc.get('tokens_per_cpu_s'), 0)} "
            f"({fmt(mc.get('tokens_per_s'), 0)}) | – | {fmt(q)} "
            f"| {'pass' if q is not None and q >= 0.8 else 'FAIL'} |")
    if "tok" in rows:
        r = rows["tok"]
        fr, tk = r.get("frames", {}), r.get("tokenizer", {})
        q = r.get("ratio")
        lines.append(
            "| output tokens per client CPU-second, no usage, `--tokenizer` vs frames, c=128 "
            f"(extra ns a token) | ≥ 0.8 × without | {fmt(tk.get('tokens_per_cpu_s'), 0)} "
            f"({fmt(r.get('ns_per_token'), 0)}) | without: {fmt(fr.get('tokens_per_cpu_s'), 0)} "
            f"| – | {fmt(q)} | {'pass' if q is not None and q >= 0.8 else 'FAIL'} |")
    if "lag" in rows:
        lr = rows["lag"]["llm-replay"]
        ok = lr["p50_ms"] is not None and lr["p50_ms"] <= 0.2 and lr["p99_ms"] <= 1
        lines.append(
            "| schedule lag, recorded schedule, 5 ms gaps: p50 / p99 (ms) "
            f"| ≤ 0.2 / ≤ 1 | {pair(lr)} (server-observed arrival: "
            f"{pair(lr, 'server_arrival_p50_ms', 'server_arrival_p99_ms')}) | – | – | – "
            f"| {'pass' if ok else 'FAIL'} |")
    if "rss" in rows:
        r = rows["rss"]
        lr, mc = r.get("llm-replay", {}), r.get("minimal", {})
        v = lr.get("peak_rss_mb")
        lines.append(
            f"| worker peak RSS, {fmt(rows['rss'].get('streams'))} concurrent slow streams (MB) "
            f"| ≤ 180 | {fmt(v, 1)} | {fmt(mc.get('peak_rss_mb'), 1)} | – "
            f"| {fmt(ratio(v, mc.get('peak_rss_mb')))} "
            f"| {'pass' if v is not None and v <= 180 else 'FAIL'} |")
    if "coord" in rows:
        lr = rows["coord"]["llm-replay"]
        v = lr.get("cpu_pct")
        done = f"{fmt(lr.get('succeeded'))} of {fmt(lr.get('requests'))} requests done"
        lines.append(
            f"| coordinator CPU, {lr.get('workers')} workers (% of a core, steady; whole run) "
            f"| ≤ 3 (200 workers) | {fmt(v, 1)} ({fmt(lr.get('cpu_pct_whole_run'), 1)}; {done}) "
            f"| – | – | – | {'pass' if v is not None and v <= 3 else 'FAIL'} |")
    for key in sorted(k for k in rows if k.startswith("coord-sim-")):
        lr = (rows[key] or {}).get("llm-replay", {})
        v = lr.get("cpu_pct")
        n = int(key.rsplit("-", 1)[1])
        goal = 3 if n <= 200 else 15
        done = f"{fmt(lr.get('succeeded'))} of {fmt(lr.get('requests'))} requests done"
        lines.append(
            f"| coordinator CPU, {n} simulated workers (% of a core, steady; whole run) "
            f"| ≤ {goal} | {fmt(v, 1)} ({fmt(lr.get('cpu_pct_whole_run'), 1)}; {done}) "
            f"| – | – | – | {'pass' if v is not None and v <= goal else 'FAIL'} |")
    if "image" in rows:
        r = rows["image"]
        v = r and r["llm-replay"]["size_mb"]
        lines.append(f"| container image (MB) | ≤ 40 | {fmt(v, 1)} | – | – | – "
                     f"| {'pass' if v is not None and v <= 40 else 'not run' if v is None else 'FAIL'} |")
    return "\n".join(lines)


def record_lines(rows, raw):
    """The record row: direct and through the proxy (medians), what the proxy added, its cost
    and the recording's count; every run's added figures after."""
    row = rows.get("record")
    if not row:
        return ""
    d, p, a = row["direct"], row["record"], row["added_us"]
    proxy, rec = p.get("proxy", {}), p.get("recording", {})
    q = lambda r, m: f"{fmt(r[m]['p50'], 0)} / {fmt(r[m]['p99'], 0)}"
    lines = [
        "\nrecording proxy overhead (median of runs; µs p50 / p99):",
        "| | TTFB | per-frame delay | requests ok / sent | achieved rate (req/s) |",
        "|---|---|---|---|---|",
        f"| direct | {q(d, 'ttfb_us')} | {q(d, 'frame_delay_us')} "
        f"| {fmt(d['succeeded'])} / {fmt(d['requests'])} | {fmt(d['achieved_rate'], 0)} |",
        f"| through `llm-replay record` | {q(p, 'ttfb_us')} | {q(p, 'frame_delay_us')} "
        f"| {fmt(p['succeeded'])} / {fmt(p['requests'])} | {fmt(p['achieved_rate'], 0)} |",
        f"| added | {fmt(a['ttfb_us_p50'], 0)} / {fmt(a['ttfb_us_p99'], 0)} "
        f"| {fmt(a['frame_delay_us_p50'], 0)} / {fmt(a['frame_delay_us_p99'], 0)} | | |",
        f"proxy: {fmt(proxy.get('cpu_s_per_1000_requests'), 3)} CPU-s per 1,000 requests "
        f"(= {fmt(proxy.get('pct_core_per_1000_rps'), 1)} % of a core per 1,000 req/s; "
        f"{fmt(proxy.get('pct_core_at_rate'), 1)} % at the achieved rate); "
        f"peak RSS {fmt(proxy.get('peak_rss_mb'), 1)} MB; recorded "
        f"{fmt(rec.get('complete'))} complete of {fmt(rec.get('expected'))} "
        f"in {fmt(rec.get('files'))} files, {fmt(rec.get('frames'))} of "
        f"{fmt(rec.get('frames_sent'))} frames",
    ]
    for i, run in enumerate(raw.get("record") or []):
        a, proxy = run["added_us"], run["record"].get("proxy", {})
        rec = run["record"].get("recording", {})
        lines.append(
            f"  run {i + 1}: added TTFB {fmt(a['ttfb_us_p50'], 0)} / {fmt(a['ttfb_us_p99'], 0)}, "
            f"frame {fmt(a['frame_delay_us_p50'], 0)} / {fmt(a['frame_delay_us_p99'], 0)} µs; "
            f"{fmt(proxy.get('cpu_s_per_1000_requests'), 3)} CPU-s / 1,000 req; "
            f"{fmt(proxy.get('peak_rss_mb'), 1)} MB; rate {fmt(run['record']['achieved_rate'], 0)} "
            f"/ direct {fmt(run['direct']['achieved_rate'], 0)}; recorded "
            f"{fmt(rec.get('complete'))}/{fmt(rec.get('expected'))}; load {fmt(run['load_avg'])}")
    return "\n".join(lines)


def send_path_lines(cfg, raw):
    """Per row, each other send path against `h1` in the same runs: the ratio of every run
    (other ÷ h1), their median and range. Lower is better except tokens per second."""
    others = [p for p in cfg.send_paths if p != "h1"]
    if not others:
        return ""
    metrics = {"ttft16": ["p50_ms", "p99_ms", "worker_cpu_s"],
               "ttft128": ["p50_ms", "p99_ms", "worker_cpu_s"],
               "ttft1024": ["p50_ms", "p99_ms"], "tput": ["tokens_per_cpu_s", "tokens_per_s"],
               "rss": ["peak_rss_mb", "worker_cpu_s"]}
    lines = ["\nsend paths (ratio other ÷ h1 per run; median [min–max]):"]
    for key, names in metrics.items():
        for other in others:
            for metric in names:
                ratios, pairs = [], []
                for run in raw.get(key) or []:
                    base = (run or {}).get("llm-replay", {}).get(metric)
                    value = (run or {}).get(variant_key(other), {}).get(metric)
                    pairs.append(f"{fmt(base)}→{fmt(value)}")
                    if ratio(value, base) is not None:
                        ratios.append(ratio(value, base))
                if not pairs:
                    continue
                spread = (f"{fmt(median(ratios))} [{fmt(min(ratios))}–{fmt(max(ratios))}]"
                          if ratios else "–")
                lines.append(f"  {key} {metric}: {other} ÷ h1 = {spread}; runs h1→{other}: "
                             + ", ".join(pairs))
    return "\n".join(lines)


def median_of(runs):
    """The median of each numeric leaf over repeated runs of one row."""
    runs = [r for r in runs if r is not None]
    if not runs:
        return None
    first = runs[0]
    if isinstance(first, dict):
        keys = set().union(*(r.keys() for r in runs if isinstance(r, dict)))
        return {k: median_of([r.get(k) for r in runs if isinstance(r, dict)]) for k in keys}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return median([r for r in runs if isinstance(r, (int, float))])
    return first


# ---------------------------------------------------------------------------------------------


# Machine stalls: one probe per core (bench/stall_probe.py) for the whole invocation.

STALL_MS = 10.0


def start_stall_probes(cfg):
    """One stall probe per core (0: the server's, 1: the client's), unless --no-stall-probe."""
    if cfg.no_stall_probe:
        return []
    probes = []
    for core in ("0", "1"):
        path = cfg.out_dir / f"stalls-core{core}.jsonl"
        path.unlink(missing_ok=True)
        proc = subprocess.Popen(pinned(core, [sys.executable, REPO / "bench/stall_probe.py",
                                               path]))
        probes.append((core, path, proc))
    return probes


def stop_stall_probes(probes, windows):
    """Per row and run: the gaps of at least STALL_MS each core's probe saw in its window."""
    gaps = {}
    for core, path, proc in probes:
        proc.terminate()
        proc.wait(timeout=10)
        gaps[core] = [json.loads(line) for line in path.read_text().splitlines() if line]
    if not probes:
        return {}
    result = {}
    for key, runs in windows.items():
        result[key] = []
        for began, ended in runs:
            per_core = {}
            for core, seen in gaps.items():
                inside = [g["gap_ms"] for g in seen
                          if began <= g["at"] <= ended and g["gap_ms"] >= STALL_MS]
                per_core[core] = {"count": len(inside), "max_ms": max(inside, default=0.0)}
            result[key].append(per_core)
    return result


def stall_lines(stalls):
    """One line per row: the stalls of >= STALL_MS each run saw on the client core (1)."""
    if not stalls:
        return ""
    lines = [f"\nmachine stalls (a 1 ms sleep overshooting by >= {STALL_MS:.0f} ms), "
             "per run, client core 1 / server core 0:"]
    for key, runs in stalls.items():
        cells = ", ".join(
            f"{r['1']['count']} (max {r['1']['max_ms']:.0f} ms) / "
            f"{r['0']['count']} (max {r['0']['max_ms']:.0f} ms)" for r in runs)
        lines.append(f"  {key}: {cells}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm-replay", default=str(REPO / "target/release/llm-replay"))
    parser.add_argument("--minimal-client", default=str(REPO / "target/release/minimal-client"))
    parser.add_argument("--aiperf-python", default=str(REPO / "target/aiperf-venv/bin/python"),
                        help="a Python with aiperf installed ('' to skip AIPerf)")
    parser.add_argument("--aiperf-max-concurrency", type=int, default=128,
                        help="skip AIPerf above this concurrency")
    parser.add_argument("--rows", default="ttft16,ttft128,ttft1024,tput,tok,lag,rss,coord,image")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--streams", type=int, default=10_000, help="streams of the rss row")
    parser.add_argument("--coord-workers", type=int, default=50)
    parser.add_argument("--coord-heartbeat-timeout", default="",
                        help="--heartbeat-timeout of the coord row (default: llm-replay's)")
    parser.add_argument("--many-workers", default=str(REPO / "target/release/many-workers"))
    parser.add_argument("--coord-sim-workers", default="200,1000",
                        help="worker counts of the coord-sim row (comma-separated)")
    parser.add_argument("--coord-sim-latency", default="550ms",
                        help="simulated request latency of the coord-sim row")
    parser.add_argument("--coord-extra", default="",
                        help="more `llm-replay run` flags for the coord and coord-sim rows")
    parser.add_argument("--tput-requests", type=int, default=2560,
                        help="requests of the tput row (256 output tokens each)")
    parser.add_argument("--record-load", default=str(REPO / "target/release/record-load"))
    parser.add_argument("--record-rate", default="1200",
                        help="streamed requests a second of the record row")
    parser.add_argument("--record-duration", default="10",
                        help="seconds of paced load of the record row")
    parser.add_argument("--record-connections", default="64",
                        help="client connections of the record row")
    parser.add_argument("--record-proxy-core", default=CLIENT_CORE,
                        help="the core of the record row's proxy (default: the load's, 1)")
    parser.add_argument("--record-rotate-size", default="1MiB",
                        help="`llm-replay record --rotate-size` of the record row")
    parser.add_argument("--out-dir", default=str(REPO / "target/bench"))
    parser.add_argument("--send-paths", default="h1",
                        help="llm-replay variants to compare, run interleaved in every row: "
                             "h1 (the default), h1+scrape100ms or h1+noscrape (how often the "
                             "coordinator scrapes the target's /metrics; default every second)")
    parser.add_argument("--no-stall-probe", action="store_true",
                        help="do not run bench/stall_probe.py on each core beside the rows")
    cfg = parser.parse_args()
    cfg.out_dir = Path(cfg.out_dir).resolve()
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    cfg.send_paths = [p for p in cfg.send_paths.split(",") if p]
    for path in cfg.send_paths:
        base, _, scrape = path.partition("+")
        if base != "h1" or scrape not in SCRAPE_ARGS:
            parser.error(f"--send-paths {path}: only h1, h1+scrape100ms, h1+noscrape "
                         "(hyper-conn was removed; docs/performance.md, \"One send path\")")
    if "h1" not in cfg.send_paths:
        cfg.send_paths.insert(0, "h1")
    cfg.run_index = 0
    if cfg.aiperf_python and not Path(cfg.aiperf_python).exists():
        print(f"note: no AIPerf at {cfg.aiperf_python}; its column stays empty", file=sys.stderr)
        cfg.aiperf_python = ""
    raise_fd_limit()

    plan = {
        "ttft16": lambda: row_ttft(cfg, 16, 640),
        "ttft128": lambda: row_ttft(cfg, 128, 2560),
        "ttft1024": lambda: row_ttft(cfg, 1024, 5120),
        "tput": lambda: row_throughput(cfg, 128, cfg.tput_requests),
        "tok": lambda: row_tokenizer(cfg, 128, 25600),
        "lag": lambda: row_schedule_lag(cfg, 2000),
        "rss": lambda: row_memory(cfg, cfg.streams),
        "coord": lambda: row_coordinator(cfg, cfg.coord_workers),
        "image": lambda: row_image(cfg),
        "record": lambda: row_record(cfg),
    }
    keys = []
    for key in cfg.rows.split(","):
        if key == "coord-sim":
            for n in cfg.coord_sim_workers.split(","):
                n = int(n)
                plan[f"coord-sim-{n}"] = lambda n=n: row_coordinator_simulated(cfg, n)
                keys.append(f"coord-sim-{n}")
        else:
            keys.append(key)
    rows, raw, windows = {}, {}, {}
    probes = start_stall_probes(cfg)
    for key in keys:
        # The rss row is repeated only when send paths are compared in it.
        once = ("image", "coord") if len(cfg.send_paths) > 1 else ("image", "rss", "coord")
        repeats = 1 if key in once or key.startswith("coord-sim") else cfg.repeat
        runs = []
        windows[key] = []
        for i in range(repeats):
            print(f"{key}: run {i + 1}/{repeats}", file=sys.stderr, flush=True)
            began = time.time()
            cfg.run_index = i
            try:
                runs.append(plan[key]())
            except Exception as error:  # one row failing must not lose the others
                print(f"  {key} failed: {error}", file=sys.stderr)
            windows[key].append((began, time.time()))
            print(f"  {json.dumps(runs[-1] if runs else None, default=str)}", file=sys.stderr)
        raw[key] = runs
        rows[key] = median_of(runs)
        if key == "rss" and rows[key] is not None:
            rows[key]["streams"] = cfg.streams
    stalls = stop_stall_probes(probes, windows)
    machine = {
        "nproc": os.cpu_count(),
        "cpu": next((line.split(":", 1)[1].strip()
                     for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), None),
        "load_avg_at_end": os.getloadavg(),
    }
    (cfg.out_dir / "results.json").write_text(
        json.dumps({"machine": machine, "median": rows, "runs": raw, "stalls": stalls},
                   indent=2, default=str))
    print(build_table(rows))
    print(send_path_lines(cfg, raw))
    print(record_lines(rows, raw))
    print(stall_lines(stalls))
    print(f"\nmachine: {machine['nproc']} cores, {machine['cpu']}; "
          f"load average at end {machine['load_avg_at_end']}; median of repeats; "
          f"details in {cfg.out_dir / 'results.json'}")


if __name__ == "__main__":
    main()
