"""The official `ollama` package, unchanged, against `ferrum serve`'s Ollama API (`/api/*`):
answers equal the OpenAI endpoints' for the same request."""
import json

import ollama
import openai
import pytest

SMOL = "smollm2"
QWEN = "qwen2.5-coder:0.5b"
ASK = [{"role": "user", "content": "Write a long poem about the sea."}]
GREEDY = {"temperature": 0, "num_predict": 16}


def client(server, **kw):
    return ollama.Client(host=server.url, **kw)


def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_the_model_is_listed_loaded_and_shown(chat_server):
    c = client(chat_server)
    (m,) = c.list().models
    assert m.model == "smollm2:latest" and m.size > 50_000_000
    assert (m.details.format, m.details.family, m.details.parameter_size) == ("gguf", "llama", "135M")
    assert m.details.quantization_level == "Q4_1"
    (p,) = c.ps().models
    assert p.model == "smollm2:latest" and p.context_length > 0
    show = c.show("smollm2")
    assert "completion" in show.capabilities and "{%" in show.template
    assert show.modelinfo["general.architecture"] == "llama"


def test_chat_matches_the_openai_endpoint(chat_server):
    r = client(chat_server).chat(model=SMOL, messages=ASK, options=GREEDY, stream=False)
    ref = oai(chat_server).chat.completions.create(model=SMOL, messages=ASK, max_tokens=16, temperature=0)
    assert r.message.role == "assistant" and r.message.content == ref.choices[0].message.content
    assert r.done and r.done_reason == "length"
    assert (r.eval_count, r.prompt_eval_count) == (16, ref.usage.prompt_tokens)
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration
    assert r.prompt_eval_duration > 0 and r.eval_duration > 0


def test_chat_streams_by_default_and_ends_with_counts(chat_server):
    c = client(chat_server)
    whole = c.chat(model="smollm2:latest", messages=ASK, options=GREEDY, stream=False)
    parts = list(c.chat(model="smollm2:latest", messages=ASK, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == 16 and parts[-1].done_reason == "length"
    assert parts[-1].prompt_eval_count == whole.prompt_eval_count


def test_generate_templated_and_raw(chat_server):
    c = client(chat_server)
    r = c.generate(model=SMOL, prompt="Write a long poem about the sea.", options=GREEDY)
    assert r.response == c.chat(model=SMOL, messages=ASK, options=GREEDY).message.content
    prompt = "The capital of France is"
    raw = c.generate(model=SMOL, prompt=prompt, raw=True, options={"temperature": 0, "num_predict": 8})
    ref = oai(chat_server).completions.create(model=SMOL, prompt=prompt, max_tokens=8, temperature=0)
    assert raw.response == ref.choices[0].text and raw.eval_count == 8
    streamed = "".join(p.response for p in c.generate(model=SMOL, prompt=prompt, raw=True, stream=True,
                                                       options={"temperature": 0, "num_predict": 8}))
    assert streamed == raw.response
    assert c.generate(model=SMOL, prompt="").done_reason == "load"


def test_format_schema_is_enforced(qwen_server):
    schema = {"type": "object", "additionalProperties": False, "required": ["color", "count"], "properties": {
        "color": {"type": "string", "maxLength": 12}, "count": {"type": "integer", "minimum": 1, "maximum": 9}}}
    ask = [{"role": "user", "content": "Pick a color and a small number."}]
    options = {"temperature": 0, "num_predict": 60}
    r = client(qwen_server).chat(model=QWEN, messages=ask, format=schema, options=options)
    v = json.loads(r.message.content)
    assert set(v) == {"color", "count"} and 1 <= v["count"] <= 9
    r = client(qwen_server).chat(model=QWEN, messages=ask, format="json", options=options)
    assert isinstance(json.loads(r.message.content), dict)


def get_time(zone: str) -> str:
    """Current time in a time zone

    Args:
      zone: an IANA time zone name, like Europe/Paris
    """
    return "10:30"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_and_their_results(qwen_lenient_server, stream):
    """Qwen2.5-Coder 0.5B calls this tool as a fenced block, which the lenient parser takes."""
    c = client(qwen_lenient_server)
    ask = [{"role": "user", "content": "What time is it in Australia/Sydney?"}]
    kw = dict(model=QWEN, messages=ask, tools=[get_time], options={"temperature": 0, "num_predict": 120})
    if stream:
        calls = [t for p in c.chat(stream=True, **kw) for t in p.message.tool_calls or []]
    else:
        calls = list(c.chat(**kw).message.tool_calls or [])
    assert [t.function.name for t in calls] == ["get_time"]
    assert calls[0].function.arguments == {"zone": "Australia/Sydney"}
    history = ask + [{"role": "assistant", "content": "", "tool_calls": calls},
                     {"role": "tool", "content": get_time(**calls[0].function.arguments), "tool_name": "get_time"}]
    r = c.chat(model=QWEN, messages=history, options={"temperature": 0, "num_predict": 40})
    assert "10:30" in r.message.content


def test_embed_matches_the_openai_endpoint(embed_server):
    c = client(embed_server)
    r = c.embed(model="minilm", input=["a cat", "a dog"])
    ref = oai(embed_server).embeddings.create(model="minilm", input=["a cat", "a dog"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384
    for got, want in zip(r.embeddings, ref.data):
        assert got == pytest.approx(want.embedding, abs=1e-6)
    assert r.prompt_eval_count == ref.usage.prompt_tokens
    assert c.embeddings(model="minilm", prompt="a cat").embedding == pytest.approx(r.embeddings[0], abs=1e-6)


def test_errors_come_in_ollamas_shape(chat_server):
    c = client(chat_server)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="llama3.2", messages=ASK)
    assert e.value.status_code == 404 and "llama3.2" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model=SMOL, messages=[{"role": "user", "content": "hi", "images": [b"\x89PNG"]}])
    assert e.value.status_code == 400 and "text only" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model=SMOL, messages=ASK, options={"mirostat": 2})
    assert e.value.status_code == 400 and "mirostat" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.embed(model=SMOL, input="x")
    assert e.value.status_code == 400


def test_a_keyed_server_takes_a_bearer_key(keyed_server):
    ok = client(keyed_server, headers={"Authorization": "Bearer sekret"})
    assert ok.chat(model=SMOL, messages=ASK, options={"num_predict": 2}).eval_count == 2
    with pytest.raises(ollama.ResponseError) as e:
        client(keyed_server).chat(model=SMOL, messages=ASK)
    assert e.value.status_code == 401
