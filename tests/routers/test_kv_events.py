"""vLLM's KV-cache events from `ferrum serve --kv-events-endpoint` (issue #67,
part 3): subscribed with pyzmq and decoded with msgspec into structs shaped
as vLLM's own (`vllm/distributed/kv_events.py`), strictly, so a field of the
wrong name, place or type fails. The events must describe the cache: the prompt's
full 16-token blocks stored with its ids in order, a hit storing nothing
again, evictions removing only what was stored, sequence numbers from 0."""
import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import Server, free_port  # noqa: E402

MODEL = "smollm2"
TOPIC = "kv@ferrum"


# vLLM's event classes, restated: the batch an array, each event a map
# tagged by its class name under "type".
class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def post(server, path, body):
    """POST to `server` (anything with a `url`, or a URL)."""
    base = server if isinstance(server, str) else server.url
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def events_server():
    port = free_port()
    # 8 blocks of 16: a few long prompts evict earlier ones.
    s = Server("--model", MODEL, "--kv-events-endpoint", f"tcp://*:{port}", "--kv-events-topic", TOPIC,
               "--kv-cache-tokens", "128")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)  # the subscription reaches the publisher
    yield s, sub
    sub.close(0)
    ctx.term()
    s.stop()


def drain(sub, quiet=0.5):
    """Every message until none comes for `quiet` seconds."""
    got = []
    while sub.poll(int(quiet * 1000)):
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode()
        got.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    return got


def prompt(n, start=0):
    """`n` numbered words; prompts with other `start`s share no prefix."""
    words = "river stone cloud lantern meadow copper whistle harbor".split()
    return " ".join(words[i % len(words)] + str(i) for i in range(start, start + n))


def test_events_describe_the_prefix_cache(events_server):
    server, sub = events_server
    text = prompt(20)
    ids = post(server, "/tokenize", {"model": MODEL, "prompt": text})["tokens"]
    assert len(ids) >= 34, len(ids)
    post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1})
    got = drain(sub)
    assert got, "no KV events"
    assert [s for s, _ in got] == list(range(got[0][0], got[0][0] + len(got)))
    assert got[0][0] == 0, "the first batch is number 0"
    stored = [e for _, b in got for e in b.events if isinstance(e, BlockStored)]
    # The prompt's full blocks, its ids in order, chained from the start.
    # (The last prompt token and the answer's fill no further block here.)
    full = (len(ids) // 16) * 16
    assert [t for e in stored for t in e.token_ids][:full] == ids[:full]
    assert stored[0].parent_block_hash is None and stored[0].block_size == 16
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == len(set(hashes)) and len(hashes) * 16 == sum(len(e.token_ids) for e in stored)
    for a, b in zip(stored, stored[1:]):
        assert b.parent_block_hash == a.block_hashes[-1]
    assert all(b.ts > 1e9 and b.data_parallel_rank == 0 for _, b in got)

    # The same prompt again hits the cache: nothing of it is stored again.
    post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1})
    again = drain(sub)
    restored = {h for _, b in again for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes}
    assert not restored & set(hashes[: full // 16 - 1])

    # Other long prompts need the pool's blocks: cached ones are evicted,
    # and every removal names a block that was stored.
    known = set(hashes) | restored
    removed = []
    for start in (100, 200, 300):
        post(server, "/v1/completions", {"model": MODEL, "prompt": prompt(20, start), "max_tokens": 1})
        for _, b in drain(sub):
            for e in b.events:
                if isinstance(e, BlockStored):
                    known.update(e.block_hashes)
                elif isinstance(e, BlockRemoved):
                    assert set(e.block_hashes) <= known, "removed a block never stored"
                    removed.extend(e.block_hashes)
    assert set(hashes) & set(removed), "the first prompt's blocks were never evicted"


def test_vllm_routers_kv_aware_policy_routes_on_the_events():
    """vllm-router's `kv_aware` policy, fed only by two replicas' events,
    sends each repeated prompt to the replica that cached it: every repeat
    finds all of its full blocks cached."""
    import shutil
    import subprocess
    exe = shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or shutil.which("vllm-router")
    if exe is None:
        pytest.skip("vllm-router is not installed")
    ports = [free_port(), free_port()]
    replicas = [Server("--model", MODEL, "--kv-events-endpoint", f"tcp://*:{p}", env={"RAYON_NUM_THREADS": "1"})
                for p in ports]
    port = free_port()
    log = open(f"/tmp/vllm-router-kv-{port}.log", "w")
    router = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
         "--worker-urls", *[r.url for r in replicas], "--policy", "kv_aware", "--kv-event-block-size", "16",
         "--kv-event-model", MODEL,
         *[a for r, p in zip(replicas, ports) for a in ("--kv-event-source", f"{r.url}=tcp://127.0.0.1:{p}")]],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except Exception:
                assert time.time() < deadline and router.poll() is None, f"vllm-router did not start ({log.name})"
                time.sleep(0.2)
        time.sleep(1)  # its subscribers connect

        def hits():
            total = 0.0
            for r in replicas:
                text = urllib.request.urlopen(r.url + "/metrics").read().decode()
                for line in text.splitlines():
                    if line.startswith("vllm:prefix_cache_hits_total"):
                        total += float(line.rsplit(" ", 1)[1])
            return total

        for start in range(0, 400, 100):
            text = prompt(16, start)
            n = len(post(replicas[0], "/tokenize", {"model": MODEL, "prompt": text})["tokens"])
            post(url, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1})
            time.sleep(0.5)  # the events reach the router
            before = hits()
            post(url, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1})
            want = (n - 1) // 16 * 16
            assert hits() - before == want, f"prompt {start}: the repeat found {hits() - before} of {want} cached"
    finally:
        router.terminate()
        router.wait(timeout=10)
        log.close()
        for r in replicas:
            r.stop()
