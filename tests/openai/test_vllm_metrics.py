"""`/metrics` under vLLM's names, as routers and gateways read them (issue #67,
part 1): parsed by the official `prometheus_client` parser, with vLLM's types,
its `model_name` label and its meaning, checked against what requests did."""
import json
import time
import urllib.request

import pytest

parser = pytest.importorskip("prometheus_client.parser")

MODEL = "smollm2"
LABELS = {"model_name": MODEL, "engine": "0"}

# vLLM's names and types (vllm/v1/metrics/loggers.py). prometheus_client
# names a counter's family without `_total`.
TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}


def scrape(server):
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def value(families, family, sample, **labels):
    """The value of `sample` in `family` whose labels include `labels` (0 if absent)."""
    f = families.get(family)
    for s in f.samples if f else []:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


def idle(server):
    """A scrape once the engine has retired every request (a response can
    arrive before its step ends and the gauges are published)."""
    deadline = time.time() + 10
    while True:
        families = scrape(server)
        running = value(families, "vllm:num_requests_running", "vllm:num_requests_running", **LABELS)
        if running == 0 or time.time() > deadline:
            return families
        time.sleep(0.05)


def chat(server, content, max_tokens):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["usage"]


def test_vllm_names_types_and_meaning(chat_server):
    before = idle(chat_server)
    prompt = "Write one sentence about the sea, the sky and the long road home. " * 4
    first = chat(chat_server, prompt, 6)
    second = chat(chat_server, prompt, 6)
    after = idle(chat_server)

    for name, kind in TYPES.items():
        assert name in after, f"{name} missing from /metrics"
        assert after[name].type == kind, f"{name} is a {after[name].type}, vLLM's is a {kind}"
        assert after[name].documentation, f"{name} has no HELP"
        assert all(s.labels.get("model_name") == MODEL and s.labels.get("engine") == "0"
                   for s in after[name].samples), name

    def delta(family, sample, **labels):
        return value(after, family, sample, **{**LABELS, **labels}) - \
            value(before, family, sample, **{**LABELS, **labels})

    prompt_tokens = first["prompt_tokens"] + second["prompt_tokens"]
    generated = first["completion_tokens"] + second["completion_tokens"]
    assert generated == 12
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == prompt_tokens
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == generated
    assert delta("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 2
    for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_time_per_output_token_seconds", "vllm:request_generation_tokens"):
        assert delta(h, h + "_count") == 2, h
    # One inter-token gap per token after the first.
    assert delta("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 10
    assert delta("vllm:request_generation_tokens", "vllm:request_generation_tokens_sum") == generated
    assert delta("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == prompt_tokens
    # Buckets are cumulative and end in +Inf = count.
    buckets = [s for s in after["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf"
    assert [s.value for s in buckets] == sorted(s.value for s in buckets)
    assert buckets[-1].value == value(after, "vllm:time_to_first_token_seconds",
                                      "vllm:time_to_first_token_seconds_count", **LABELS)
    # The second request found every full 16-token block of its prompt
    # cached by the first (its last token is always computed). Earlier
    # tests may have cached the system prompt's first block too.
    queries = delta("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    hits = delta("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    assert queries >= prompt_tokens - 2, (queries, prompt_tokens)
    assert (second["prompt_tokens"] - 1) // 16 * 16 <= hits <= queries, (hits, queries)
    # Idle: nothing running or waiting; the cache is a fraction.
    assert value(after, "vllm:num_requests_running", "vllm:num_requests_running", **LABELS) == 0
    assert value(after, "vllm:num_requests_waiting", "vllm:num_requests_waiting", **LABELS) == 0
    assert 0 <= value(after, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc", **LABELS) <= 1
