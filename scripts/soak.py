"""Soak test for `ferrum serve` (issue #61's mix): N concurrent clients for a
while, each of one kind in turn: streaming chat (a third of those hang up
mid-stream), `logprobs` with `n` choices, structured output (a JSON schema),
plain completions, and readers that stop reading a stream (the server's
write timeout must cut them). Beside them: clients that stall mid-request
(half the headers or body, or nothing; the read timeout must cut them), one
that posts oversized /tokenize bodies, and a probe that times /health every
100 ms.

Reports status counts (5xx must be 0), the /health latency percentiles (p99
must be under 100 ms), how long stalled connections were held, the
server's resident memory over time against its idle base and KV pool (peak
under base + pool + 100 MB), and the KV caches and queued requests left at
the end (both must be 0).

    python scripts/soak.py --bin target/release/ferrum --minutes 10 --clients 64
"""
import argparse
import json
import statistics
import random
import re
import socket
import subprocess
import threading
import time
import os
import urllib.error
import urllib.request


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ferrum")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--stalled", type=int, default=4, help="clients that stall mid-request, over and over")
    ap.add_argument("--read-timeout", type=int, default=5, help="the server's --read-timeout (s)")
    ap.add_argument("--write-timeout", type=int, default=10, help="the server's --write-timeout (s)")
    ap.add_argument("--tokenize-mb", type=float, default=16, help="size of the oversized /tokenize bodies")
    a = ap.parse_args()
    url = f"http://127.0.0.1:{a.port}"
    log = open(f"/tmp/ferrum-soak-{a.port}.log", "w+")
    proc = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", str(a.port),
                             "--read-timeout", str(a.read_timeout), "--write-timeout", str(a.write_timeout),
                             "--max-queue", str(4 * a.clients)],
                            stdout=log, stderr=subprocess.STDOUT, env={"NO_COLOR": "1", **os.environ})
    while True:
        try:
            if urllib.request.urlopen(url + "/health").status == 200:
                break
        except Exception:
            time.sleep(0.2)
    time.sleep(2)
    base_mb = rss_mb(proc.pid)
    log.seek(0)
    pool = re.search(r"KV pool: .*?\(([0-9.]+) MiB", log.read())
    pool_mb = float(pool.group(1)) if pool else None
    stats = {"ok": 0, "disconnected": 0, "write_timeout_cut": 0, "stalled_reader_finished": 0, "4xx": 0,
             "5xx": 0, "other": 0, "tokens": 0}
    kinds = {}
    lock = threading.Lock()
    end = time.time() + a.minutes * 60

    def post(path, body, timeout=600):
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout)

    def chat(rng, **extra):
        return {"model": a.model, "max_tokens": rng.randint(8, 64), "temperature": rng.choice([0, 0.7, 1.0]),
                "messages": [{"role": "user", "content": f"Tell me fact number {rng.randint(1, 1000)} about space."}],
                **extra}

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "moons": {"type": "integer"}},
              "required": ["name", "moons"], "additionalProperties": False}

    def streaming(rng, i):
        hang_up = i % 2 == 0 and rng.random() < 0.9
        with post("/v1/chat/completions", chat(rng, stream=True)) as r:
            n = 0
            for line in r:
                if line.startswith(b"data: {"):
                    n += 1
                if hang_up and n >= rng.randint(2, 6):
                    return "disconnected", n
                if line.strip() == b"data: [DONE]":
                    return "ok", n
        return "other", n

    def logprobs(rng, i):
        with post("/v1/chat/completions", chat(rng, n=rng.choice([2, 4, 8]), logprobs=True,
                                                top_logprobs=rng.choice([5, 20]))) as r:
            body = json.load(r)
        choices = body["choices"]
        ok = all(c["logprobs"]["content"] for c in choices)
        return ("ok" if ok else "other"), sum(len(c["logprobs"]["content"]) for c in choices)

    def structured(rng, i):
        with post("/v1/chat/completions", chat(rng, max_tokens=64, response_format={
                "type": "json_schema", "json_schema": {"name": "planet", "schema": schema}})) as r:
            body = json.load(r)
        choice = body["choices"][0]
        if choice["finish_reason"] == "stop":
            json.loads(choice["message"]["content"])  # must parse when complete
        return "ok", body["usage"]["completion_tokens"]

    def completion(rng, i):
        with post("/v1/completions", {"model": a.model, "prompt": "The planets of the solar system are",
                                      "max_tokens": rng.randint(8, 64)}) as r:
            body = json.load(r)
        return "ok", body["usage"]["completion_tokens"]

    def stalled_reader(rng, i):
        # A streaming request whose reader stops reading: a small receive
        # buffer fills, the server's writes block, and its write timeout
        # must close the connection (and free its sequence). Under load the
        # stream may come slower than the buffers fill in the pause: then it
        # finishes ([DONE]) once reading resumes, which is counted apart.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", a.port))
        body = json.dumps(chat(rng, stream=True, max_tokens=2000, temperature=1.0)).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = sock.recv(256)
        time.sleep(a.write_timeout * 6)
        sock.settimeout(300)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got = got[-64:] + chunk
            result = "stalled_reader_finished" if b"data: [DONE]" in got else "write_timeout_cut"
        except OSError:
            result = "other"
        sock.close()
        return result, 0

    def client(i):
        rng = random.Random(i)
        kind = [streaming, logprobs, structured, completion, streaming, logprobs, structured, stalled_reader][i % 8]
        while time.time() < end:
            try:
                key, n = kind(rng, i)
            except urllib.error.HTTPError as e:
                key, n = ("5xx" if e.code >= 500 else "4xx"), 0
            except Exception:
                key, n = "other", 0
            with lock:
                stats[key] += 1
                stats["tokens"] += n
                kinds.setdefault(kind.__name__, {}).setdefault(key, 0)
                kinds[kind.__name__][key] += 1

    tokenize = {"ok": 0, "4xx": 0, "5xx": 0, "other": 0, "seconds_max": 0.0}

    def oversized_tokenize():
        text = ("word " * int(a.tokenize_mb * 1024 * 1024 / 5))
        while time.time() < end:
            start = time.time()
            try:
                with post("/tokenize", {"prompt": text}, timeout=300) as r:
                    r.read()
                key = "ok"
            except urllib.error.HTTPError as e:
                key = "5xx" if e.code >= 500 else "4xx"
            except Exception:
                key = "other"
            with lock:
                tokenize[key] += 1
                tokenize["seconds_max"] = round(max(tokenize["seconds_max"], time.time() - start), 1)
            time.sleep(5)

    health_ms = []
    health_failed = [0]

    def probe():
        while time.time() < end:
            start = time.time()
            try:
                with urllib.request.urlopen(url + "/health", timeout=10) as r:
                    r.read()
                health_ms.append((time.time() - start) * 1000)
            except Exception:
                health_failed[0] += 1
            time.sleep(0.1)

    stalls = {"cut": 0, "held_s_max": 0.0, "not_cut": 0}
    partial = [b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty",
               b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: 400\r\n\r\n{\"messages\": [{\"role\": \"user\", \"con",
               b""]  # connect and say nothing

    def staller(i):
        k = 0
        while time.time() < end:
            sock = socket.create_connection(("127.0.0.1", a.port))
            sock.settimeout(a.read_timeout * 4)
            start = time.time()
            try:
                sock.sendall(partial[k % len(partial)])
                while sock.recv(4096):
                    pass
                held = time.time() - start
                with lock:
                    stalls["cut"] += 1
                    stalls["held_s_max"] = round(max(stalls["held_s_max"], held), 2)
            except OSError:
                with lock:
                    stalls["not_cut"] += 1
            finally:
                sock.close()
            k += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    threads += [threading.Thread(target=staller, args=(i,)) for i in range(a.stalled)]
    threads += [threading.Thread(target=oversized_tokenize), threading.Thread(target=probe)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append((round(time.time() - end + a.minutes * 60), round(rss_mb(proc.pid), 1)))
        time.sleep(10)
    for t in threads:
        t.join()
    time.sleep(1)
    health_ms.sort()
    q = statistics.quantiles(health_ms, n=100) if len(health_ms) > 1 else [0] * 99
    peak = max(mb for _, mb in samples)
    result = {
        "minutes": a.minutes,
        "clients": a.clients,
        "stats": stats,
        "by_kind": kinds,
        "oversized_tokenize": tokenize,
        "health_ms": {"n": len(health_ms), "failed": health_failed[0], "p50": round(q[49], 1),
                      "p99": round(q[98], 1), "max": round(health_ms[-1], 1) if health_ms else None},
        "rss_mb": {"base": round(base_mb, 1), "kv_pool": pool_mb, "peak": peak,
                   "peak_minus_base_and_pool": round(peak - base_mb - (pool_mb or 0), 1)},
        "stalled_connections": stalls,
        "rss_mb_over_time": samples,
        "kv_caches_live_at_end": metric(url, "ferrum_kv_caches_live"),
        "requests_pending_at_end": metric(url, "ferrum_requests_pending"),
        "cancelled_total": metric(url, "ferrum_requests_cancelled_total"),
    }
    proc.terminate()
    proc.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
