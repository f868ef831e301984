"""`ferrum ps` against a running server, and the server's log: one plain line per request
(method, path, status, tokens, time), no colour codes when the log is not a terminal."""
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import BIN  # noqa: E402


def post(server, path, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(server.url + path, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def log_line(server, pattern, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        server.log.flush()
        text = Path(server.log.name).read_text()
        m = re.search(pattern, text, re.M)
        if m:
            return m, text
        time.sleep(0.2)
    raise AssertionError(f"no log line matches {pattern!r}:\n{text}")


def test_one_plain_log_line_per_request(chat_server):
    answer = json.loads(post(chat_server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5, "temperature": 0}))
    usage = answer["usage"]
    m, text = log_line(chat_server, rf"POST /v1/chat/completions 200 {usage['prompt_tokens']}\+"
                                    rf"{usage['completion_tokens']} tokens (\d+\.\d+)s$")
    assert float(m.group(1)) > 0
    # A streamed answer's line is written when its stream ends, with its tokens.
    post(chat_server, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4,
                                          "temperature": 0, "stream": True})
    log_line(chat_server, r"POST /v1/completions 200 \d+\+4 tokens \d+\.\d+s$")
    try:
        urllib.request.urlopen(chat_server.url + "/v1/nothing-here")
    except urllib.error.HTTPError as e:
        assert e.code == 404
    _, text = log_line(chat_server, r"GET /v1/nothing-here 404 \d+\.\d+s$")
    assert "\x1b[" not in text, "colour codes in a log that is not a terminal"


def test_ps_lists_the_loaded_model(chat_server):
    r = subprocess.run([BIN, "ps", "--url", chat_server.url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()
    assert head.split() == ["NAME", "FORMAT", "QUANT", "SIZE", "CONTEXT", "REQUESTS"]
    assert row.split()[:3] == ["smollm2:latest", "gguf", "Q4_1"], row
    assert row.split()[-2] == "4096", row


def test_ps_asks_for_a_key_and_names_a_missing_server(keyed_server):
    r = subprocess.run([BIN, "ps", "--url", keyed_server.url], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "needs an API key: give --api-key" in r.stderr, r.stderr
    r = subprocess.run([BIN, "ps", "--url", keyed_server.url, "--api-key", "sekret"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "smollm2" in r.stdout, r.stderr
    r = subprocess.run([BIN, "ps", "--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no server answers at http://127.0.0.1:9" in r.stderr, r.stderr
