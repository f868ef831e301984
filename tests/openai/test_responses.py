"""OpenAI's Responses API (`client.responses`) with the official `openai` package: answers equal
the chat endpoint's for the same conversation; stored responses continue conversations."""
import json

import openai
import pytest

QWEN = "qwen2.5-coder:0.5b"
ASK = "Name three colors."
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def chat(server, messages, max_tokens, **kw):
    return client(server).chat.completions.create(model=QWEN, messages=messages, max_tokens=max_tokens,
                                                  temperature=0, **kw)


def test_create_matches_chat_and_streams_the_same(qwen_server):
    c = client(qwen_server)
    r = c.responses.create(model=QWEN, input=ASK, instructions="Answer briefly.", max_output_tokens=24,
                           temperature=0)
    ref = chat(qwen_server, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": ASK}], 24)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == ref.choices[0].message.content
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.input_tokens == ref.usage.prompt_tokens
    assert r.usage.output_tokens == ref.usage.completion_tokens
    assert r.status == ("incomplete" if ref.choices[0].finish_reason == "length" else "completed")
    with c.responses.stream(model=QWEN, input=ASK, instructions="Answer briefly.", max_output_tokens=24,
                            temperature=0) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert deltas == final.output_text == r.output_text


def test_previous_response_id_continues_the_conversation(qwen_server):
    c = client(qwen_server)
    first = c.responses.create(model=QWEN, input=ASK, max_output_tokens=20, temperature=0)
    second = c.responses.create(model=QWEN, input="And three animals?", previous_response_id=first.id,
                                max_output_tokens=20, temperature=0)
    ref = chat(qwen_server, [{"role": "user", "content": ASK},
                             {"role": "assistant", "content": first.output_text},
                             {"role": "user", "content": "And three animals?"}], 20)
    assert second.output_text == ref.choices[0].message.content
    assert c.responses.retrieve(first.id).output_text == first.output_text
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=QWEN, input="x", previous_response_id=first.id)
    unstored = c.responses.create(model=QWEN, input=ASK, max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


@pytest.mark.parametrize("stream", [False, True])
def test_function_calls_and_their_outputs(qwen_server, stream):
    c = client(qwen_server)
    kw = dict(model=QWEN, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
              temperature=0)
    if stream:
        with c.responses.stream(**kw) as s:
            r = s.get_final_response()
    else:
        r = c.responses.create(**kw)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] == "Paris"
    follow = c.responses.create(model=QWEN, previous_response_id=r.id, tools=[WEATHER], temperature=0,
                                max_output_tokens=24, input=[{"type": "function_call_output",
                                                              "call_id": call.call_id, "output": "18C"}])
    ref = chat(qwen_server, [{"role": "user", "content": "What is the weather in Paris?"},
                             {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id,
                              "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
                             {"role": "tool", "tool_call_id": call.call_id, "content": "18C"}], 24,
               tools=[{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}])
    assert follow.output_text == (ref.choices[0].message.content or "")


def test_text_format_and_refusals(qwen_server):
    c = client(qwen_server)
    schema = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 10}},
              "required": ["color"], "additionalProperties": False}
    r = c.responses.create(model=QWEN, input="Pick a color.", temperature=0, max_output_tokens=40,
                           text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    assert set(json.loads(r.output_text)) == {"color"}
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=QWEN, input="x", tools=[{"type": "web_search"}])
    assert "function tools" in e.value.message
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model=QWEN, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}])
