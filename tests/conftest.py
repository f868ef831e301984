"""Starts the real `ferrum serve` binary for the tests under tests/: the
official OpenAI client (tests/openai) and the browser chat page (tests/webui).

FERRUM_BIN names the binary (default: target/release/ferrum); models come
from the Ferrum cache (`scripts/fetch-models.sh smollm2 minilm`).
"""
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = os.environ.get("FERRUM_BIN", str(ROOT / "target/release/ferrum"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args, port=None, env=None):
        """`ferrum serve ARGS` on `port` (a free one by default), with `env`
        added to the environment."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(f"/tmp/ferrum-serve-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ferrum serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("ferrum serve did not become healthy")

    def post(self, path, body):
        """POSTs `body` as JSON; returns (status, the JSON answer), errors included."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def metric(self, name):
        """A Prometheus sample's value from /metrics (the first series), or None."""
        text = urllib.request.urlopen(self.url + "/metrics").read().decode()
        m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


@pytest.fixture(scope="session")
def chat_server():
    s = Server("--model", "smollm2", "--max-queue", "64")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def embed_server():
    s = Server("--model", "minilm")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text("# ferrum API keys\nsekret\n\nsecond-key\n")
    s = Server("--model", "smollm2", "--api-key-file", str(keys), "--metrics-require-key")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def hardened_server():
    """Short read timeout, one allowed origin and host name, any model name."""
    s = Server("--model", "smollm2", "--read-timeout", "2", "--allowed-origins", "https://app.example",
               "--allowed-hosts", "ferrum.lan", "--accept-any-model")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def no_webui_server():
    s = Server("--model", "smollm2", "--no-webui")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def capped_server():
    """Two connections at most, idle ones cut after 2 s."""
    s = Server("--model", "smollm2", "--max-connections", "2", "--read-timeout", "2")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def tiny_queue_server():
    s = Server("--model", "smollm2", "--max-queue", "1")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def qwen_server():
    """Qwen2.5-Coder-0.5B-Instruct: trained for Hermes-style tool calls."""
    s = Server("--model", "qwen2.5-coder:0.5b")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def reasoning_server():
    """SmolLM2 with every answer's `<think>` part split out (`--reasoning-format deepseek`)."""
    s = Server("--model", "smollm2", "--reasoning-format", "deepseek")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def qwen_lenient_server():
    """The same model with `--tool-call-parser lenient` (fenced calls taken)."""
    s = Server("--model", "qwen2.5-coder:0.5b", "--tool-call-parser", "lenient")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def thinking_template_server():
    """SmolLM2 with a ChatML template whose generation prompt opens `<think>` (`--chat-template`),
    as DeepSeek-R1's does: every answer starts inside its reasoning. With the template argument
    `model_opens_reasoning` it leaves `<think>` to the model, as Qwen3's does by default."""
    template = Path(__file__).resolve().parent / "data" / "chatml-think.jinja"
    s = Server("--model", "smollm2", "--chat-template", str(template))
    yield s
    s.stop()
