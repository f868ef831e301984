"""The official `anthropic` package, unchanged, against `ferrum serve`'s Messages API
(`/v1/messages`): answers equal the OpenAI endpoint's for the same conversation."""
import json

import anthropic
import openai
import pytest

SMOL = "smollm2"
QWEN = "qwen2.5-coder:0.5b"
ASK = [{"role": "user", "content": "Write a long poem about the sea."}]
GREEDY = {"temperature": 0}
COLORS = [{"role": "user", "content": "Pick a color and a small number."}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "count"], "properties": {
    "color": {"type": "string", "maxLength": 12}, "count": {"type": "integer", "minimum": 1, "maximum": 9}}}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def client(server, key="none"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


def openai_answer(server, model, messages, max_tokens, **kw):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    return c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def test_create_matches_the_openai_endpoint(chat_server):
    m = client(chat_server).messages.create(model=SMOL, max_tokens=16, messages=ASK, extra_body=GREEDY)
    ref = openai_answer(chat_server, SMOL, ASK, 16)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == ref.choices[0].message.content
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 16
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == ref.usage.prompt_tokens


def test_stream_gives_the_same_text_and_usage(chat_server):
    c = client(chat_server)
    whole = c.messages.create(model=SMOL, max_tokens=16, messages=ASK, extra_body=GREEDY)
    with c.messages.stream(model=SMOL, max_tokens=16, messages=ASK, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 16


def test_system_prompt_stop_sequences_and_count_tokens(chat_server):
    c = client(chat_server)
    system = "You answer in lists."
    n = c.messages.count_tokens(model=SMOL, system=system, messages=ASK).input_tokens
    ref = openai_answer(chat_server, SMOL, [{"role": "system", "content": system}, *ASK], 24, stop=["\n"])
    assert n == ref.usage.prompt_tokens
    m = c.messages.create(model=SMOL, max_tokens=24, system=[{"type": "text", "text": system}], messages=ASK,
                          stop_sequences=["\n"], extra_body=GREEDY)
    assert m.content[0].text == ref.choices[0].message.content and "\n" not in m.content[0].text
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "\n")
    assert ref.choices[0].model_extra["stop_reason"] == "\n", "vLLM's extension names the stop string"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip(qwen_server, stream):
    c = client(qwen_server)
    ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    kw = dict(model=QWEN, max_tokens=100, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
              messages=ask, extra_body=GREEDY)
    if stream:
        with c.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = c.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and "paris" in use.input["city"].lower()
    # The result goes back as the OpenAI endpoint would take it: the same prompt, the same answer.
    history = ask + [{"role": "assistant", "content": m.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "18 degrees and sunny"}]}]
    answer = c.messages.create(model=QWEN, max_tokens=24, tools=[WEATHER], messages=history, extra_body=GREEDY)
    call = {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}
    same = ask + [{"role": "assistant", "content": "", "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": use.id, "content": "18 degrees and sunny"}]
    ref = openai_answer(qwen_server, QWEN, same, 24, tools=[{"type": "function", "function": {
        "name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}])
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == ref.usage.prompt_tokens
    assert answer.content[0].type == "text" and answer.content[0].text == ref.choices[0].message.content


def test_output_config_format_is_enforced(qwen_server):
    m = client(qwen_server).messages.create(model=QWEN, max_tokens=60, messages=COLORS, extra_body=GREEDY,
                                            output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    v = json.loads(m.content[0].text)
    assert set(v) == {"color", "count"} and 1 <= v["count"] <= 9


def test_errors_come_in_anthropics_shape(chat_server):
    c = client(chat_server)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="not-this-one", max_tokens=5, messages=ASK)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=SMOL, max_tokens=5, messages=[{"role": "user", "content": [image]}])
    assert "text only" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=SMOL, max_tokens=5, messages=ASK, extra_body={"temperature": 3})
    assert e.value.body["error"]["type"] == "invalid_request_error"


def test_x_api_key_is_an_api_key(keyed_server):
    m = client(keyed_server, "sekret").messages.create(model=SMOL, max_tokens=4, messages=ASK)
    assert m.usage.output_tokens == 4
    with pytest.raises(anthropic.AuthenticationError):
        client(keyed_server, "wrong").messages.create(model=SMOL, max_tokens=4, messages=ASK)


def test_thinking_blocks_and_their_budget(thinking_template_server):
    """The template (`--chat-template`) opens `<think>`, and SmolLM2 never closes it: every token
    is reasoning, a `thinking` block. With `budget_tokens` the close is written for the model after
    that many tokens (the same first tokens), and its answer follows as a `text` block."""
    c = client(thinking_template_server)
    free = c.messages.create(model=SMOL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    assert [b.type for b in free.content] == ["thinking"] and free.stop_reason == "max_tokens"
    m = c.messages.create(model=SMOL, max_tokens=24, messages=ASK, extra_body=GREEDY,
                          thinking={"type": "enabled", "budget_tokens": 6})
    assert [b.type for b in m.content] == ["thinking", "text"], m.content
    assert free.content[0].thinking.startswith(m.content[0].thinking.strip())
    assert len(m.content[0].thinking) < len(free.content[0].thinking)
    with c.messages.stream(model=SMOL, max_tokens=24, messages=ASK, extra_body=GREEDY,
                           thinking={"type": "enabled", "budget_tokens": 6}) as s:
        streamed = s.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content] == \
        [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content]


def test_a_last_assistant_message_is_a_prefill_the_answer_continues(chat_server):
    start = "The capital of France is"
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    m = client(chat_server).messages.create(model=SMOL, max_tokens=8, extra_body=GREEDY,
                                            messages=ask + [{"role": "assistant", "content": start}])
    ref = openai_answer(chat_server, SMOL, ask + [{"role": "assistant", "content": start}], 8,
                        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert m.content[0].text == ref.choices[0].message.content
    # The continuation, not a new turn: no end-of-turn mark or fresh greeting between them.
    assert not m.content[0].text.lstrip().startswith(("The capital", "<|im"))
