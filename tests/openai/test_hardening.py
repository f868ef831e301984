"""What `ferrum serve` refuses and how: stalled clients, requests a web page
could forge, API-key details, error shapes, and the OpenAI details
(`models.retrieve`, any model name, which field a context error names)."""
import json
import os
import socket
import time
from pathlib import Path
import urllib.error
import urllib.request

import openai
import pytest

MODEL = "smollm2"


def request(server, path, body=None, headers=None, method=None):
    """(status, headers, parsed JSON or None) of one request."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    hdrs = {"Content-Type": "application/json"} if isinstance(body, (dict, list)) else {}
    req = urllib.request.Request(server.url + path, data=data, method=method, headers={**hdrs, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, r.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, e.headers, json.loads(raw) if raw else None


def assert_openai_error(body, status_type):
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], body
    assert err["type"] == status_type, body


def connect(server):
    s = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10)
    s.settimeout(10)
    return s


def closed_after(sock):
    """Seconds until the server closes `sock` (reading and discarding what it sends)."""
    start = time.time()
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return time.time() - start, received
        received += chunk


def test_stalled_headers_are_cut_while_others_are_served(hardened_server):
    stalled = [connect(hardened_server) for _ in range(4)]
    for s in stalled:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
    # Others are served meanwhile.
    status, _, body = request(hardened_server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 200 and body["choices"][0]["text"] is not None
    for s in stalled:
        waited, _ = closed_after(s)
        assert waited < 5, f"a client stalled in its headers kept the connection {waited:.1f} s"


def test_stalled_body_is_408(hardened_server):
    s = connect(hardened_server)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 200\r\n\r\n{\"prompt\": \"Hel")
    waited, reply = closed_after(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    assert "did not arrive" in json.loads(body)["error"]["message"]
    assert waited < 6


def test_bad_chunk_framing_is_400(chat_server):
    """A chunked body whose chunk size is not hex is a bad request (it was
    answered as too large)."""
    s = connect(chat_server)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
    _, reply = closed_after(s)
    assert reply.startswith(b"HTTP/1.1 400"), reply


def test_host_header_must_be_one(chat_server):
    """RFC 9112: two Host headers, or none on HTTP/1.1, are bad requests
    (only the first of two was checked)."""
    for head in [b"Host: 127.0.0.1\r\nHost: evil.example\r\n", b""]:
        s = connect(chat_server)
        s.sendall(b"GET /health HTTP/1.1\r\n" + head + b"Connection: close\r\n\r\n")
        _, reply = closed_after(s)
        assert reply.startswith(b"HTTP/1.1 400"), (head, reply)
    s = connect(chat_server)
    s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
    _, reply = closed_after(s)
    assert b" 200 " in reply.split(b"\r\n")[0], reply


def test_bare_lf_line_ends_are_400(chat_server):
    """RFC 9112 lets a server take a lone LF as a line end; a proxy that does
    not would split requests differently (smuggling), so they are refused:
    in a first request's head, in a later one's after a body, and in chunk
    framing. A body's own newlines are data and pass."""
    s = connect(chat_server)
    s.sendall(b"GET /health HTTP/1.1\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    _, reply = closed_after(s)
    assert reply.startswith(b"HTTP/1.1 400"), reply
    body = b'{"prompt":\n "ab"}\n'
    s = connect(chat_server)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body) +
              b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\nConnection: close\r\n\r\n")
    _, reply = closed_after(s)
    first, _, rest = reply.partition(b"\r\n")
    assert first == b"HTTP/1.1 200 OK", reply
    assert b"HTTP/1.1 400" in rest, reply
    s = connect(chat_server)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\n{}\r\n0\r\n\r\n")
    _, reply = closed_after(s)
    assert reply.startswith(b"HTTP/1.1 400"), reply


def test_idle_keep_alive_connections_are_closed(hardened_server):
    s = connect(hardened_server)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    waited, reply = closed_after(s)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert 1 < waited < 5, f"an idle keep-alive connection stayed {waited:.1f} s"


def test_connections_beyond_the_cap_wait_for_a_slot(capped_server):
    # Two silent connections fill the cap. A third is taken on a reserve
    # slot: its /health is answered at once (probes see a busy server, not
    # a dead one), its API request only when the read timeout frees a
    # regular slot, and is then served.
    # First let the fixture's readiness probe close: while its connection
    # holds a slot, a silent one would be taken on a reserve permit and
    # leave the cap one short.
    time.sleep(0.5)
    idle = [connect(capped_server) for _ in range(2)]
    time.sleep(0.3)
    start = time.time()
    status, _, _ = request(capped_server, "/health")
    assert status == 200
    assert time.time() - start < 1, f"/health at the cap took {time.time() - start:.1f} s"
    start = time.time()
    status, _, _ = request(capped_server, "/v1/models")
    waited = time.time() - start
    assert status == 200
    assert 1.2 < waited < 5, f"the third connection's request waited {waited:.1f} s"
    for s in idle:
        s.close()


def test_only_json_bodies_are_accepted(chat_server):
    for ctype in ["text/plain", "application/x-www-form-urlencoded", None]:
        headers = {"Content-Type": ctype} if ctype else {}
        status, _, body = request(chat_server, "/v1/chat/completions", json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode(),
            headers=headers)
        assert status == 415, (ctype, body)
        assert_openai_error(body, "invalid_request_error")
    status, _, _ = request(chat_server, "/tokenize", {"prompt": "hi"},
                           headers={"Content-Type": "application/json; charset=utf-8"})
    assert status == 200


def test_foreign_host_names_are_refused(chat_server, hardened_server):
    port = chat_server.url.rsplit(":", 1)[1]
    status, _, body = request(chat_server, "/v1/models", headers={"Host": f"rebound.example:{port}"})
    assert status == 403 and "--allowed-hosts rebound.example" in body["error"]["message"]
    assert_openai_error(body, "permission_error")
    for host in [f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"]:
        assert request(chat_server, "/v1/models", headers={"Host": host})[0] == 200, host
    assert request(hardened_server, "/health", headers={"Host": "ferrum.lan"})[0] == 200


def test_cross_origin_requests_need_listing(chat_server, hardened_server):
    evil = {"Origin": "https://evil.example"}
    status, _, body = request(chat_server, "/v1/models", headers=evil)
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    status, _, _ = request(chat_server, "/v1/chat/completions", method="OPTIONS",
                           headers={**evil, "Access-Control-Request-Method": "POST"})
    assert status == 403
    # The server's own page is same-origin.
    assert request(chat_server, "/v1/models", headers={"Origin": chat_server.url})[0] == 200

    app = {"Origin": "https://app.example"}
    status, headers, _ = request(hardened_server, "/v1/chat/completions", method="OPTIONS",
                                 headers={**app, "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "authorization" in headers["Access-Control-Allow-Headers"]
    status, headers, body = request(hardened_server, "/v1/completions", {"prompt": "Hi", "max_tokens": 1},
                                    headers=app)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert request(hardened_server, "/v1/models", headers=evil)[0] == 403


def test_api_key_details(keyed_server):
    for auth in ["Bearer sekret", "bearer sekret", "BEARER   second-key"]:
        assert request(keyed_server, "/v1/models", headers={"Authorization": auth})[0] == 200, auth
    for auth in ["Bearer sekre", "Basic sekret", "Bearer # ferrum API keys", "Bearer "]:
        status, _, body = request(keyed_server, "/v1/models", headers={"Authorization": auth})
        assert status == 401, auth
        assert_openai_error(body, "authentication_error")
    # --metrics-require-key; /health stays open for probes.
    assert request(keyed_server, "/metrics")[0] == 401
    with urllib.request.urlopen(urllib.request.Request(keyed_server.url + "/metrics",
                                                       headers={"Authorization": "Bearer sekret"})) as r:
        assert r.status == 200 and b"ferrum_model_ready" in r.read()
    assert request(keyed_server, "/health")[0] == 200


def test_errors_have_openai_shape(chat_server):
    status, headers, body = request(chat_server, "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST"
    assert_openai_error(body, "invalid_request_error")
    status, _, body = request(chat_server, "/v1/models", method="DELETE")
    assert status == 405
    assert_openai_error(body, "invalid_request_error")
    status, _, body = request(chat_server, "/v2/nothing")
    assert status == 404
    assert_openai_error(body, "not_found_error")


def test_models_retrieve(chat_server):
    client = openai.OpenAI(base_url=chat_server.url + "/v1", api_key="none", max_retries=0)
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o-mini")


def test_any_model_name_when_asked(chat_server, hardened_server):
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert request(chat_server, "/v1/chat/completions", body)[0] == 404
    status, _, reply = request(hardened_server, "/v1/chat/completions", body)
    assert status == 200 and reply["model"] == MODEL


def test_context_errors_name_the_field(chat_server):
    long = "word " * 5000
    status, _, body = request(chat_server, "/v1/completions", {"model": MODEL, "prompt": long, "max_tokens": 1})
    assert status == 400 and body["error"]["param"] == "prompt", body
    status, _, body = request(chat_server, "/v1/chat/completions",
                              {"model": MODEL, "messages": [{"role": "user", "content": long}], "max_tokens": 1})
    assert status == 400 and body["error"]["param"] == "messages", body


def test_echo_with_logprobs_scores_the_prompt(chat_server):
    client = openai.OpenAI(base_url=chat_server.url + "/v1", api_key="none", max_retries=0)
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    choice, usage = r.choices[0], r.usage
    lp = choice.logprobs
    assert choice.text.startswith(prompt)
    # One entry per prompt token, then one per generated token.
    assert len(lp.tokens) == usage.prompt_tokens + usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # The generated part is scored as without echo.
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=2)
    assert lp.token_logprobs[usage.prompt_tokens:] == plain.choices[0].logprobs.token_logprobs


def test_health_answers_while_big_bodies_are_tokenized(chat_server):
    """Tokenizing is CPU work off the async threads: two 6 MB /tokenize
    bodies (as many as the CI machine has cores) do not hold up /health.
    Before, they took every async thread and /health waited seconds."""
    import threading

    text = "the quick brown fox jumps over the lazy dog " * 140_000
    done = []

    def tokenize():
        status, _, body = request(chat_server, "/tokenize", {"model": MODEL, "prompt": text})
        done.append((status, body["count"] if status == 200 else body))

    workers = [threading.Thread(target=tokenize) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(0.2)
    slowest = 0.0
    while any(w.is_alive() for w in workers):
        start = time.time()
        with urllib.request.urlopen(chat_server.url + "/health", timeout=30) as r:
            assert r.status == 200
        slowest = max(slowest, time.time() - start)
        time.sleep(0.05)
    for w in workers:
        w.join()
    assert [s for s, _ in done] == [200, 200], done
    assert slowest < 1.0, f"/health took {slowest:.2f} s while tokenizing"


def test_model_file_truncated_while_serving(tmp_path):
    """A mapped model file truncated under a running server stops it with
    an error that says so (status 74), not a silent SIGBUS; with --no-mmap
    the model is in memory and the server keeps answering."""
    import shutil
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from conftest import Server

    src = Path(os.environ.get("FERRUM_MODELS", Path.home() / ".cache/ferrum/models")) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not src.exists():
        pytest.skip(f"{src} not found (scripts/fetch-models.sh smollm2)")
    body = {"model": "m.gguf", "prompt": "Hello", "max_tokens": 2}
    for no_mmap in [False, True]:
        model = tmp_path / f"{no_mmap}" / "m.gguf"
        model.parent.mkdir()
        shutil.copy(src, model)
        s = Server("--model", str(model), *(["--no-mmap"] if no_mmap else []))
        try:
            with open(model, "r+b") as f:
                f.truncate(4096)
            status, _, reply = request(s, "/v1/completions", body) if no_mmap else (None, None, None)
            if no_mmap:
                assert status == 200, reply
                continue
            try:
                request(s, "/v1/completions", body)
            except Exception:
                pass
            assert s.proc.wait(timeout=60) == 74
            log = Path(s.log.name).read_text()
            assert "model file changed on disk" in log, log[-500:]
        finally:
            if s.proc.poll() is None:
                s.stop()
            else:
                s.log.close()
