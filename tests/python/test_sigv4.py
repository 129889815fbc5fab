"""`llm-replay run --aws-sigv4` signs exactly what it sends, checked against botocore.

A tiny HTTP server on 127.0.0.1:0 captures the replayed Bedrock ConverseStream request; the
captured request is signed again with botocore's `SigV4Auth` at the same instant (its
`X-Amz-Date`), and the two `Authorization` headers must be byte-identical.

Run from the repo root with plain `pytest tests/python`. The binary comes from
$LLM_REPLAY_BIN (default: target/release/llm-replay relative to the repo root).
"""

import datetime
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest
from botocore import auth as botocore_auth
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("LLM_REPLAY_BIN", REPO_ROOT / "target" / "release" / "llm-replay"))
if not BIN.is_absolute():
    BIN = REPO_ROOT / BIN

REGION = "us-east-1"
ACCESS_KEY = "AKIDEXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLETOKEN+/="
# Percent-encoded as the AWS SDKs send it; SigV4 encodes the path once more.
PATH = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
BODY = json.dumps(
    {
        "messages": [{"role": "user", "content": [{"text": "How do tides work?"}]}],
        "inferenceConfig": {"maxTokens": 16},
    }
)


class Captured:
    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()


def capturing_server(captured):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with captured.lock:
                captured.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
            answer = b'{"message":"captured"}'
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


def write_recording(path):
    exchange = {
        "id": "bedrock-0",
        "request": {
            "method": "POST",
            "path": PATH,
            "headers": {
                "content-type": "application/json",
                "accept": "application/vnd.amazon.eventstream",
                # Stale credentials a recording must never replay (the recorder drops them;
                # a hand-written file may still carry them).
                "authorization": "AWS4-HMAC-SHA256 Credential=STALE",
                "x-amz-date": "20200101T000000Z",
            },
            "body": BODY,
        },
    }
    path.write_text(json.dumps(exchange) + "\n")


def botocore_authorization(request, port, with_token):
    """Sign the captured request again with botocore, at the captured `X-Amz-Date`."""
    amz_date = request["headers"]["x-amz-date"]
    instant = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ")
    headers = {
        "Content-Type": request["headers"]["content-type"],
        "Host": request["headers"]["host"],
    }
    aws_request = AWSRequest(
        method=request["method"],
        url=f"http://127.0.0.1:{port}{request['path']}",
        data=request["body"],
        headers=headers,
    )
    credentials = Credentials(ACCESS_KEY, SECRET_KEY, SESSION_TOKEN if with_token else None)

    # botocore stamps the request with its own clock (`get_current_datetime`, naive UTC):
    # give it the captured instant.
    with mock.patch.object(botocore_auth, "get_current_datetime", lambda *_, **__: instant):
        SigV4Auth(credentials, "bedrock", REGION).add_auth(aws_request)
    assert aws_request.headers["X-Amz-Date"] == amz_date
    return aws_request.headers["Authorization"]


@pytest.mark.parametrize("with_token", [False, True], ids=["keys", "session-token"])
def test_authorization_matches_botocore_byte_for_byte(tmp_path, with_token):
    if not BIN.exists():
        pytest.fail(f"binary not found at {BIN}: build it or set LLM_REPLAY_BIN")
    captured = Captured()
    server = capturing_server(captured)
    port = server.server_address[1]
    recording = tmp_path / "bedrock.jsonl"
    write_recording(recording)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
    if with_token:
        env["AWS_SESSION_TOKEN"] = SESSION_TOKEN
    try:
        result = subprocess.run(
            [
                str(BIN),
                "run",
                str(recording),
                "--target",
                f"http://127.0.0.1:{port}",
                "--aws-sigv4",
                REGION,
                "--schedule",
                "asap",
                "--baseline",
                "none",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
    # The capturing server answers 400 to the one request: no request succeeded, which is
    # exit 3 (PRODUCT.md), with the server's message named.
    assert result.returncode == 3, result.stdout + result.stderr
    assert '"captured"' in result.stderr, result.stderr
    assert len(captured.requests) == 1, captured.requests
    request = captured.requests[0]
    headers = request["headers"]
    assert request["body"] == BODY.encode()
    assert headers["host"] == f"127.0.0.1:{port}"
    if with_token:
        assert headers["x-amz-security-token"] == SESSION_TOKEN
    else:
        assert "x-amz-security-token" not in headers
    ours = headers["authorization"]
    assert "STALE" not in ours
    assert ours.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/"), ours
    assert ours == botocore_authorization(request, port, with_token)


def test_missing_credentials_fail_the_run_with_a_clear_message(tmp_path):
    if not BIN.exists():
        pytest.fail(f"binary not found at {BIN}: build it or set LLM_REPLAY_BIN")
    recording = tmp_path / "bedrock.jsonl"
    write_recording(recording)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [str(BIN), "run", str(recording), "--target", "http://127.0.0.1:9", "--aws-sigv4", REGION],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "AWS_ACCESS_KEY_ID" in result.stderr, result.stderr
