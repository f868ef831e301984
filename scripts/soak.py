"""Soak test for `ferrum serve`: N concurrent streaming clients for a while,
a third of them hanging up mid-stream, plus a few clients that stall (they
send half a request's headers or body and then nothing) and must be cut off
by the server's read timeout. Reports status counts (5xx must be 0), how
long stalled connections were held, the server's resident memory over time,
and the KV caches and queued requests left at the end (both must be 0).

    python scripts/soak.py --bin target/release/ferrum --minutes 30 --clients 32 --stalled 4
"""
import argparse
import json
import random
import re
import socket
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
    ap.add_argument("--stalled", type=int, default=4, help="clients that stall mid-request, over and over")
    ap.add_argument("--read-timeout", type=int, default=5, help="the server's --read-timeout (s)")
    a = ap.parse_args()
    url = f"http://127.0.0.1:{a.port}"
    proc = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", str(a.port),
                             "--read-timeout", str(a.read_timeout)],
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
