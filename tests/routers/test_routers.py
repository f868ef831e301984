"""Ferrum replicas behind vLLM's and SGLang's routers (issue #67, part 2).

Three `ferrum serve` replicas of SmolLM2 run behind `vllm-router` and
`sglang-router` (both from PyPI, unchanged), on loopback. `ferrum bench serve
--dataset shared-prefix` runs through each router with its `cache_aware`
and `round_robin` policies; the replicas' own `vllm:prefix_cache_*`
counters give each run's prefix-cache hit rate, which must be higher with
`cache_aware`. Then a replica is killed mid-run: only the requests it held
may fail, the router sends the rest elsewhere, and the replica gets
requests again once restarted.

Each run's figures are printed (`-s`, or the test log) and, with
FERRUM_ARTIFACTS set, written to routers.json there.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import BIN, Server, free_port  # noqa: E402

MODEL = "smollm2"
VENV_BIN = Path(sys.executable).parent
# Each replica computes on one core: three share the machine's cores.
ONE_THREAD = {"RAYON_NUM_THREADS": "1"}
BENCH = ["--dataset", "shared-prefix", "--num-prefixes", "4", "--input-len", "96",
         "--output-len", "2", "--num-prompts", "18", "--concurrency", "3"]


def router_command(name, port, workers, policy):
    exe = shutil.which(name, path=str(VENV_BIN)) or shutil.which(name)
    if exe is None:
        return None
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
              "--policy", policy, "--prometheus-port", str(free_port()),
              "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
              "--health-success-threshold", "1"]
    if name == "sglang-router":
        return [exe, "launch", *common]
    return [exe, *common]


class Router:
    def __init__(self, name, workers, policy):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = router_command(name, self.port, workers, policy)
        if cmd is None:
            pytest.skip(f"{name} is not installed (pip install {name})")
        self.log = open(f"/tmp/{name}-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not start; see {self.log.name}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def counter(server, name):
    """A counter's value on a replica, summed over its series (0 before it
    exists)."""
    text = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def totals(replicas):
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:request_success_total")
    return [{n: counter(r, n) for n in names} for r in replicas]


def bench(url, seed):
    """A shared-prefix run; each seed draws other prefixes, so no run finds
    the replicas' caches warmed by an earlier one."""
    out = subprocess.run([BIN, "bench", "serve", "--url", url, "--model", MODEL, *BENCH,
                          "--seed", str(seed), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def replicas():
    servers = [Server("--model", MODEL, env=ONE_THREAD) for _ in range(3)]
    yield servers
    for s in servers:
        s.stop()


RESULTS = {}


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if RESULTS:
        text = json.dumps(RESULTS, indent=2)
        print("\nrouter runs:\n" + text)
        if os.environ.get("FERRUM_ARTIFACTS"):
            Path(os.environ["FERRUM_ARTIFACTS"]).mkdir(parents=True, exist_ok=True)
            (Path(os.environ["FERRUM_ARTIFACTS"]) / "routers.json").write_text(text)


def run_policy(name, replicas, policy):
    router = Router(name, [r.url for r in replicas], policy)
    try:
        before = totals(replicas)
        summary = bench(router.url, seed=len(RESULTS))
        after = totals(replicas)
    finally:
        router.stop()
    queries = sum(a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
                  for a, b in zip(after, before))
    hits = sum(a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
               for a, b in zip(after, before))
    per_replica = [a["vllm:request_success_total"] - b["vllm:request_success_total"]
                   for a, b in zip(after, before)]
    result = {
        "hit_rate": round(hits / queries, 3) if queries else 0.0,
        "requests_per_replica": per_replica,
        "ttft_p50_ms": round(summary["ttft"]["p50_ms"], 1),
        "ttft_p99_ms": round(summary["ttft"]["p99_ms"], 1),
        "requests_per_s": round(summary["requests_per_s"], 2),
        "errors": summary["errors"],
    }
    RESULTS[f"{name} {policy}"] = result
    return result


@pytest.mark.parametrize("name", ["vllm-router", "sglang-router"])
def test_cache_aware_routing_hits_the_cache_more(name, replicas):
    round_robin = run_policy(name, replicas, "round_robin")
    cache_aware = run_policy(name, replicas, "cache_aware")
    for r in (round_robin, cache_aware):
        assert r["errors"] == 0, r
        assert sum(r["requests_per_replica"]) == 18, r
    # Round-robin spreads requests evenly.
    assert min(round_robin["requests_per_replica"]) >= 5, round_robin
    assert cache_aware["hit_rate"] > round_robin["hit_rate"], (cache_aware, round_robin)


def test_a_killed_replica_is_routed_around_and_rejoins(replicas):
    """vllm-router, round-robin: kill replica 2 while requests run."""
    victim = replicas[2]
    router = Router("vllm-router", [r.url for r in replicas], "round_robin")
    results, lock = [], threading.Lock()

    def client(stop):
        while not stop.is_set():
            body = {"model": MODEL, "prompt": "The sea is", "max_tokens": 8, "temperature": 0}
            req = urllib.request.Request(router.url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    ok = r.status == 200 and json.loads(r.read())["choices"]
            except Exception:
                ok = False
            with lock:
                results.append((time.time(), bool(ok)))

    try:
        stop = threading.Event()
        clients = [threading.Thread(target=client, args=(stop,)) for _ in range(3)]
        for c in clients:
            c.start()
        time.sleep(3)
        killed = time.time()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        time.sleep(6)
        stop.set()
        for c in clients:
            c.join()
        after_kill = [ok for t, ok in results if t > killed]
        failed = after_kill.count(False)
        # At most the requests that were on the replica (one per client),
        # plus those sent before the router's health check saw it go.
        assert failed <= 3, f"{failed} failures after the kill"
        late = [ok for t, ok in results if t > killed + 3]
        assert late and all(late), "requests still fail 3 s after the kill"

        # Restarted on its port, it is sent requests again.
        replicas[2] = Server("--model", MODEL, port=victim.port, env=ONE_THREAD)
        deadline = time.time() + 30
        while time.time() < deadline:
            body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
            req = urllib.request.Request(router.url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=60).read()
            if counter(replicas[2], "vllm:request_success_total"):
                break
            time.sleep(0.5)
        assert counter(replicas[2], "vllm:request_success_total") > 0, "the restarted replica got no request"
        RESULTS["vllm-router failover"] = {"failed_after_kill": failed, "requests_after_kill": len(after_kill)}
    finally:
        router.stop()
