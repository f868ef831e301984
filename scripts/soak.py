"""Soak test for `ferrum serve`: N concurrent streaming clients for a while,
a third of them hanging up mid-stream. Reports status counts (5xx must be
0), the server's resident memory over time, and the KV caches and queued
requests left at the end (both must be 0).

    python scripts/soak.py --bin target/release/ferrum --minutes 10 --clients 16
"""
import argparse
import json
import random
import re
import subprocess
import threading
import time
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
    a = ap.parse_args()
    url = f"http://127.0.0.1:{a.port}"
    proc = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", str(a.port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            if urllib.request.urlopen(url + "/health").status == 200:
                break
        except Exception:
            time.sleep(0.2)
    stats = {"ok": 0, "disconnected": 0, "4xx": 0, "5xx": 0, "other": 0, "tokens": 0}
    lock = threading.Lock()
    end = time.time() + a.minutes * 60

    def client(i):
        rng = random.Random(i)
        while time.time() < end:
            hang_up = i % 3 == 0 and rng.random() < 0.9
            body = {"model": a.model, "stream": True, "max_tokens": rng.randint(8, 96),
                    "temperature": rng.choice([0, 0.7, 1.0]),
                    "messages": [{"role": "user", "content": f"Tell me fact number {rng.randint(1, 1000)} about space."}]}
            req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            key = "other"
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    n = 0
                    for line in r:
                        if line.startswith(b"data: {"):
                            n += 1
                        if hang_up and n >= rng.randint(2, 6):
                            key = "disconnected"
                            break
                        if line.strip() == b"data: [DONE]":
                            key = "ok"
                    with lock:
                        stats["tokens"] += n
            except urllib.error.HTTPError as e:
                key = "5xx" if e.code >= 500 else "4xx"
            except Exception:
                key = "other"
            with lock:
                stats[key] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append((round(time.time() - end + a.minutes * 60), round(rss_mb(proc.pid), 1)))
        time.sleep(30)
    for t in threads:
        t.join()
    time.sleep(1)
    result = {
        "stats": stats,
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
