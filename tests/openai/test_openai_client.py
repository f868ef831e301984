"""The official `openai` package, unchanged, against `ferrum serve`."""
import base64
import http.client
import json
import re
import struct
import threading
import time
import urllib.parse
import urllib.request

import openai
import pytest

MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "Name three colors."}]


def client(server, key="none"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def post(server, path, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models(chat_server):
    models = client(chat_server).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_plain(chat_server):
    r = client(chat_server).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_plain_with_usage(chat_server):
    c = client(chat_server)
    plain = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0)
    chunks = list(c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_shared_system_prompt_comes_from_the_prefix_cache(chat_server):
    import uuid
    c = client(chat_server)
    system = f"Session {uuid.uuid4()}. " + "You answer questions about colors briefly and politely. " * 8

    def ask(question, **kw):
        return c.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": question}], **kw)

    first = ask("Name a warm color.")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = ask("Name a cold color.")
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Whole 16-token blocks of the shared system prompt, not the question.
    assert 64 <= cached < second.usage.prompt_tokens and cached % 16 == 0
    chunks = list(ask("Name a dark color.", stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= cached


def test_completions(chat_server):
    r = client(chat_server).completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                               temperature=0, logprobs=2)
    assert r.object == "text_completion"
    assert "Paris" in r.choices[0].text
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens == len(lp.token_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)


def test_stop_sequences(chat_server):
    c = client(chat_server)
    full = c.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert " 6" in full, full
    r = c.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6", "zzz"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(" 6")]
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=" 6", stream=True) if ch.choices)
    assert streamed == r.choices[0].text


def test_length_finish(chat_server):
    r = client(chat_server).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_seed_reproducible(chat_server):
    c = client(chat_server)
    a = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=1.0, seed=1234)
    b = c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=1.0, seed=1234)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_n_choices_and_chat_logprobs(chat_server):
    r = client(chat_server).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=1.0,
                                                    seed=7, n=3, logprobs=True, top_logprobs=2)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert len(c.logprobs.content) == 6 or c.finish_reason == "stop"
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)


def test_concurrent_chats_match_alone(chat_server):
    c = client(chat_server)
    prompts = [[{"role": "user", "content": f"Write one sentence about the number {i}."}] for i in range(8)]
    alone = [c.chat.completions.create(model=MODEL, messages=p, max_tokens=24, temperature=0)
             .choices[0].message.content for p in prompts]
    together = [None] * 8

    def run(i):
        together[i] = client(chat_server).chat.completions.create(
            model=MODEL, messages=prompts[i], max_tokens=24, temperature=0).choices[0].message.content

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


MALFORMED = [
    ("/v1/chat/completions", b"{not json", 400),
    ("/v1/chat/completions", b"[1, 2]", 400),
    ("/v1/chat/completions", {"model": MODEL}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"content": "x"}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": -5}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": "ten"}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "temperature": -1}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "top_p": 1.5}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "n": 0}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "top_logprobs": 50, "logprobs": True}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "stop": ["a", "b", "c", "d", "e"]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": QUESTION}, 404),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "word " * 5000}]}, 400),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "chat_template_kwargs": "no"}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": [10 ** 9]}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 3}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 9}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": 42}, 400),
    ("/v1/embeddings", {"model": MODEL, "input": "x"}, 400),
    ("/detokenize", {"model": MODEL, "tokens": [10 ** 9]}, 400),
    ("/v1/nothing-here", {}, 404),
]


@pytest.mark.parametrize("path,body,status", MALFORMED)
def test_malformed_requests_are_4xx(chat_server, path, body, status):
    code, resp = post(chat_server, path, body)
    assert code == status, resp
    err = resp["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_oversized_body_is_413(chat_server):
    # Declares a 33 MB body and sends none of it: the server answers on the
    # declared length at once. Sending the whole body raced that early answer
    # and close (the client could see a broken pipe instead of the 413).
    url = urllib.parse.urlsplit(chat_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(33 << 20))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["message"]
    conn.close()


def test_server_still_serves_after_bad_requests(chat_server):
    test_chat_plain(chat_server)


def test_chat_template_kwargs_reach_the_template(chat_server):
    """vLLM's `chat_template_kwargs` are template variables (Qwen3's `enable_thinking`; rendering
    is checked against jinja2 in ferrum-tokenizer's chat_templates.rs). SmolLM2's template reads
    none of these, and the variables the server sets win over a kwarg of the same name."""
    msgs = [{"role": "user", "content": "Hi"}]
    _, plain = post(chat_server, "/tokenize", {"model": MODEL, "messages": msgs})
    code, r = post(chat_server, "/tokenize", {"model": MODEL, "messages": msgs, "chat_template_kwargs": {
        "enable_thinking": False, "add_generation_prompt": False, "messages": []}})
    assert code == 200 and r["tokens"] == plain["tokens"]
    code, _ = post(chat_server, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 2,
                                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert code == 200


def test_tokenize_roundtrip(chat_server):
    code, r = post(chat_server, "/tokenize", {"model": MODEL, "prompt": "Hello world", "add_special_tokens": False})
    assert code == 200 and r["count"] == len(r["tokens"]) > 0
    code, d = post(chat_server, "/detokenize", {"model": MODEL, "tokens": r["tokens"]})
    assert code == 200 and d["prompt"] == "Hello world"


def test_health_and_metrics(chat_server):
    with urllib.request.urlopen(chat_server.url + "/health") as r:
        assert r.status == 200
    text = urllib.request.urlopen(chat_server.url + "/metrics").read().decode()
    assert "ferrum_http_requests_total" in text
    assert "ferrum_time_to_first_token_seconds" in text
    assert chat_server.metric("ferrum_generation_tokens_total") > 0


def test_disconnect_cancels_and_frees(chat_server):
    before = chat_server.metric("ferrum_requests_cancelled_total") or 0
    req = urllib.request.Request(chat_server.url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000,
                                                  "temperature": 0, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req)
    resp.readline()
    resp.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        if (chat_server.metric("ferrum_requests_cancelled_total") or 0) > before:
            break
        time.sleep(0.2)
    assert (chat_server.metric("ferrum_requests_cancelled_total") or 0) > before
    time.sleep(0.5)
    assert chat_server.metric("ferrum_kv_caches_live") == 0
    assert chat_server.metric("ferrum_requests_pending") == 0


def test_api_key(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, key="wrong").models.list()
    assert [m.id for m in client(keyed_server, key="sekret").models.list().data] == [MODEL]
    with urllib.request.urlopen(keyed_server.url + "/health") as r:
        assert r.status == 200


def test_embeddings(embed_server):
    c = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="none", max_retries=0)
    texts = ["A man is playing a guitar.", "Someone is strumming a guitar.", "The stock market fell sharply today."]
    r = c.embeddings.create(model="minilm", input=texts)  # the client asks for base64
    v = [d.embedding for d in r.data]
    assert len(v) == 3 and all(len(x) == 384 for x in v)
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))
    assert all(abs(dot(x, x) - 1) < 1e-4 for x in v)
    assert dot(v[0], v[1]) > dot(v[0], v[2]) + 0.3
    assert r.usage.prompt_tokens > 0
    f = c.embeddings.create(model="minilm", input=texts[0], encoding_format="float")
    assert max(abs(a - b) for a, b in zip(f.data[0].embedding, v[0])) < 1e-6
    code, raw = post(embed_server, "/v1/embeddings", {"model": "minilm", "input": texts[0], "encoding_format": "base64"})
    decoded = struct.unpack("<384f", base64.b64decode(raw["data"][0]["embedding"]))
    assert max(abs(a - b) for a, b in zip(decoded, v[0])) < 1e-6
    long = c.embeddings.create(model="minilm", input="word " * 1000, encoding_format="float")
    assert long.usage.prompt_tokens == 256  # truncated to the model's limit and counted


@pytest.mark.parametrize("body", [
    {"model": "minilm", "input": ""},
    {"model": "minilm", "input": []},
    {"model": "minilm", "input": ["ok", 3]},
    {"model": "minilm", "input": {"text": "x"}},
    {"model": "minilm", "input": "x", "dimensions": 64},
    {"model": "minilm", "input": "x", "encoding_format": "int8"},
    {"model": "minilm", "input": [[999999999]]},
    {"model": "minilm", "messages": QUESTION},
])
def test_bad_embedding_requests(embed_server, body):
    code, resp = post(embed_server, "/v1/embeddings", body)
    assert code == 400, resp
    code, _ = post(embed_server, "/v1/chat/completions", {"model": "minilm", "messages": QUESTION})
    assert code == 400


def test_concurrent_embeddings_batch(embed_server):
    c = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="none", max_retries=0)
    alone = c.embeddings.create(model="minilm", input="the quick brown fox", encoding_format="float").data[0].embedding
    out = [None] * 16

    def run(i):
        out[i] = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="none", max_retries=0).embeddings.create(
            model="minilm", input=["the quick brown fox"] * 8, encoding_format="float").data[3].embedding

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in out:
        assert max(abs(a - b) for a, b in zip(o, alone)) < 1e-5


def test_full_queue_is_429(tiny_queue_server):
    s = tiny_queue_server
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    first = urllib.request.urlopen(req)
    first.readline()  # the first request is running and holds the only slot
    req = urllib.request.Request(s.url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req)
    assert refused.value.code == 429 and refused.value.headers["Retry-After"] == "1"
    assert json.loads(refused.value.read())["error"]["type"] == "rate_limit_error"
    first.close()
    deadline = time.time() + 30
    while time.time() < deadline and s.metric("ferrum_requests_pending") != 0:
        time.sleep(0.2)
    code, _ = post(s, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert code == 200


def test_graceful_shutdown_finishes_in_flight():
    from conftest import Server
    s = Server("--model", "smollm2")
    out = {}

    def run():
        out["r"] = post(s, "/v1/completions", {"model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 48,
                                                "temperature": 0})

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    s.proc.send_signal(15)  # SIGTERM while the request runs
    t.join(timeout=60)
    assert out["r"][0] == 200 and out["r"][1]["choices"][0]["text"]
    assert s.proc.wait(timeout=60) == 0
    s.log.close()


def test_shutdown_deadline_ends_streams_with_an_error():
    """A stream still running when --shutdown-timeout passes ends with an
    error event (it was cut off without one), and the server exits non-zero
    (it exited 0)."""
    from conftest import Server
    s = Server("--model", "smollm2", "--shutdown-timeout", "1")
    req = urllib.request.Request(
        s.url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 4000, "stream": True,
                         "temperature": 0, "ignore_eos": True}).encode())
    events = []
    with urllib.request.urlopen(req, timeout=60) as r:
        s.proc.send_signal(15)
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
    assert events and events[-1] != "[DONE]", events[-3:]
    last = json.loads(events[-1])
    assert "shutting down" in last["error"]["message"], last
    assert s.proc.wait(timeout=60) != 0
    s.log.close()


# A reasoning model's output shape, forced by a regex on SmolLM2 (no thinking model is fetched).
THOUGHT = r"<think>\n[a-z]{2,8}( [a-z]{2,8}){2,5}\n</think>\n\n[A-Z][a-z]{2,8}( [a-z]{2,8}){1,3}\."


def test_reasoning_comes_back_as_reasoning_content(reasoning_server, chat_server):
    """`<think>...</think>` goes to `reasoning_content` (streamed as `delta.reasoning_content`),
    the rest to `content`, as vLLM's reasoning parsers return it; a server without
    --reasoning-format (SmolLM2's template writes no <think>) leaves it in content."""
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=60, temperature=0.8, seed=5,
              extra_body={"guided_regex": THOUGHT})
    m = client(reasoning_server).chat.completions.create(**kw).choices[0].message
    thought = m.model_extra.get("reasoning_content")
    assert re.fullmatch(r"[a-z]+( [a-z]+)+", thought or ""), m
    assert re.fullmatch(r"[A-Z][a-z]+( [a-z]+)+\.", m.content), m
    streamed = {"reasoning_content": "", "content": ""}
    for chunk in client(reasoning_server).chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta if chunk.choices else None
        for k in streamed:
            streamed[k] += (d.model_extra.get(k) if k == "reasoning_content" else d.content) or "" if d else ""
    assert streamed == {"reasoning_content": thought, "content": m.content}
    plain = client(chat_server).chat.completions.create(**kw).choices[0].message
    assert plain.content == f"<think>\n{thought}\n</think>\n\n{m.content}"


def test_a_model_that_opens_its_own_reasoning_keeps_it_under_a_grammar(thinking_template_server):
    """As Qwen3 by default: the prompt leaves `<think>` to the model (the template's
    `model_opens_reasoning` switch), and a few-shot history shows it thinking first. Under a
    grammar the model may still open its reasoning, which stays free; the grammar applies after
    `</think>`. Applied from the first token, it would have forbidden the `<` of `<think>`."""
    c = client(thinking_template_server)
    shots = [
        {"role": "user", "content": "Is the sky blue? Answer yes or no."},
        {"role": "assistant", "content": "<think>\nThe sky looks blue in daytime.\n</think>\n\nyes"},
        {"role": "user", "content": "Is fire cold? Answer yes or no."},
        {"role": "assistant", "content": "<think>\nFire is hot, not cold.\n</think>\n\nno"},
        {"role": "user", "content": "Is snow white? Answer yes or no."},
    ]
    kw = dict(model=MODEL, messages=shots, max_tokens=60, temperature=0)
    free = {"chat_template_kwargs": {"model_opens_reasoning": True}}
    m = c.chat.completions.create(**kw, extra_body=free).choices[0].message
    assert m.model_extra["reasoning_content"], "the few-shot history makes SmolLM2 think first"
    r = c.chat.completions.create(**kw, extra_body={**free, "guided_choice": ["yes", "no"]})
    g = r.choices[0].message
    assert g.content in ("yes", "no") and r.choices[0].finish_reason == "stop"
    assert g.model_extra["reasoning_content"] == m.model_extra["reasoning_content"]


def test_a_prompt_that_opens_the_reasoning_leaves_it_free(thinking_template_server):
    """The template (`--chat-template`) ends its prompt with `<think>`: the output is reasoning
    until `</think>`, and an output grammar applies only after it. SmolLM2 never closes the
    reasoning, so the grammar never starts: all 12 tokens are free reasoning, where a grammar
    applied from the first token would have ended the answer at "yes" or "no"."""
    c = client(thinking_template_server)
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] and not m.content
    r = c.chat.completions.create(**kw, extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    assert r.choices[0].message.model_extra["reasoning_content"] not in ("yes", "no")
