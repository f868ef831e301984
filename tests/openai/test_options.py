"""Request options that change what is generated: each does what it says."""

import openai
import pytest

MODEL = "smollm2"


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def token_ids(server, text):
    code, r = server.post("/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False})
    assert code == 200
    return r["tokens"]


def test_logit_bias_forces_and_bans_tokens(chat_server):
    c = client(chat_server)
    [blue] = token_ids(chat_server, " blue")
    forced = c.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=4, temperature=0,
                                  logit_bias={str(blue): 100})
    assert forced.choices[0].text == " blue" * 4
    plain = c.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=1, temperature=0)
    first = token_ids(chat_server, plain.choices[0].text)[0]
    banned = c.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=1, temperature=0,
                                  logit_bias={str(first): -100})
    assert banned.choices[0].text != plain.choices[0].text
    assert token_ids(chat_server, banned.choices[0].text)[0] != first
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                     max_tokens=3, temperature=0, logit_bias={str(blue): 100})
    assert chat.choices[0].message.content == " blue" * 3


@pytest.mark.parametrize("bias", [{"999999999": 5}, {"12": 150}, {"12": "high"}, {"abc": 1}, [1, 2]])
def test_bad_logit_bias_is_400(chat_server, bias):
    code, r = chat_server.post("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": bias})
    assert code == 400, r
    assert r["error"]["param"] == "logit_bias" and r["error"]["message"]


def test_streamed_chat_logprobs_come_with_each_token(chat_server):
    c = client(chat_server)
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=12,
                temperature=0, logprobs=True, top_logprobs=2)
    plain = c.chat.completions.create(**args)
    chunks = list(c.chat.completions.create(stream=True, **args))
    streamed = []
    for ch in chunks:
        if not ch.choices:
            continue
        ch = ch.choices[0]
        if ch.delta.content:
            # Each piece of text arrives with the entries of its tokens.
            assert ch.logprobs is not None and ch.logprobs.content, ch
            assert "".join(e.token for e in ch.logprobs.content) == ch.delta.content
        if ch.logprobs is not None:
            streamed.extend(ch.logprobs.content)
    want = plain.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in want]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in want], abs=1e-5)
    assert all(len(e.top_logprobs) == 2 for e in streamed)


@pytest.mark.parametrize("path,extra", [
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}),
    ("/v1/chat/completions", {"modalities": ["audio"]}),
    ("/v1/chat/completions", {"tool_choice": "required"}),
    ("/v1/completions", {"best_of": 3}),
    ("/v1/completions", {"suffix": "}"}),
    ("/v1/completions", {"skip_special_tokens": False}),
])
def test_unimplemented_fields_are_400_naming_them(chat_server, path, extra):
    body = {"model": MODEL, "max_tokens": 2}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
    body.update(extra)
    code, r = chat_server.post(path, body)
    assert code == 400, r
    [name] = extra
    assert r["error"]["param"] == name and name in r["error"]["message"]


def test_ignore_eos_runs_to_max_tokens(chat_server):
    c = client(chat_server)
    ask = [{"role": "user", "content": "Say OK."}]
    short = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=200, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 200
    long = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=200, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 200


def test_continue_final_message_continues_the_answer(chat_server):
    """The last (assistant) message is left open: greedy, its continuation is what a plain completion
    of the same text gives. `add_generation_prompt: false` ends the prompt where the template ends it."""
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    start = "The capital of France is"
    code, r = chat_server.post("/tokenize", {"model": MODEL, "messages": ask})
    assert code == 200
    code, d = chat_server.post("/detokenize", {"model": MODEL, "tokens": r["tokens"]})
    opened = d["prompt"]
    code, plain = chat_server.post("/v1/completions", {"model": MODEL, "prompt": opened + start,
                                                        "max_tokens": 8, "temperature": 0})
    assert code == 200
    code, cont = chat_server.post("/v1/chat/completions", {
        "model": MODEL, "messages": ask + [{"role": "assistant", "content": start}],
        "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 8, "temperature": 0})
    assert code == 200, cont
    assert cont["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
    assert cont["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]

    code, e = chat_server.post("/v1/chat/completions", {
        "model": MODEL, "messages": ask, "continue_final_message": True, "max_tokens": 2})
    assert code == 400 and "last message to be the assistant's" in e["error"]["message"]
    code, e = chat_server.post("/v1/chat/completions", {
        "model": MODEL, "messages": ask + [{"role": "assistant", "content": start}],
        "continue_final_message": True, "add_generation_prompt": True, "max_tokens": 2})
    assert code == 400 and e["error"]["param"] == "continue_final_message"
