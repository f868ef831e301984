"""Structured output and tool calls through the official `openai` package (and LangChain
when it is installed), on Qwen2.5-Coder-0.5B-Instruct: output that must parse does."""
import json
import re
from typing import List, Literal

import openai
import pytest
from pydantic import BaseModel

MODEL = "qwen2.5-coder:0.5b"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


class Pet(BaseModel):
    name: str
    kind: Literal["cat", "dog", "fish"]
    age: int


class Household(BaseModel):
    city: str
    pets: List[Pet]


def test_parse_returns_a_pydantic_object(qwen_server):
    r = client(qwen_server).chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Invent a household in Oslo with two pets."}],
        response_format=Household, temperature=0.7, seed=3, max_tokens=200)
    h = r.choices[0].message.parsed
    assert isinstance(h, Household), r.choices[0].message.content
    assert all(p.kind in ("cat", "dog", "fish") for p in h.pets)


def test_json_object_and_schema_on_both_endpoints(qwen_server):
    c = client(qwen_server)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "List three colors."}],
                                  response_format={"type": "json_object"}, temperature=1.0, seed=1, max_tokens=120)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
                                                "word": {"type": "string", "maxLength": 12}},
              "required": ["n", "word"], "additionalProperties": False}
    r = c.completions.create(model=MODEL, prompt="A number and a word:", max_tokens=60, temperature=1.0, seed=2,
                             extra_body={"response_format": {"type": "json_schema",
                                                             "json_schema": {"name": "nw", "schema": schema}}})
    v = json.loads(r.choices[0].text)
    assert set(v) == {"n", "word"} and 1 <= v["n"] <= 9 and len(v["word"]) <= 12


def test_vllm_and_llama_server_extensions(qwen_server):
    c = client(qwen_server)
    ask = [{"role": "user", "content": "Is the sky blue?"}]
    r = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=10,
                                  extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].message.content in ("yes", "no")
    r = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=20,
                                  extra_body={"guided_regex": "[A-Z][a-z]{2,6}, [0-9]{3}"})
    assert re.fullmatch("[A-Z][a-z]{2,6}, [0-9]{3}", r.choices[0].message.content)
    r = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=20, temperature=1.2,
                                  extra_body={"grammar": 'root ::= answer " (" [0-9] "/10)"\nanswer ::= "Yes" | "No"\n'})
    assert re.fullmatch(r"(Yes|No) \([0-9]/10\)", r.choices[0].message.content)
    r = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=30,
                                  extra_body={"guided_json": {"type": "array", "items": {"type": "boolean"},
                                                              "minItems": 2, "maxItems": 2}})
    assert [type(x) for x in json.loads(r.choices[0].message.content)] == [bool, bool]


def check_weather_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    return args


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_enforced_tool_calls(qwen_server, choice):
    r = client(qwen_server).chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=120)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.tool_calls and ch.message.content is None
    for call in ch.message.tool_calls:
        if choice != "required" or call.function.name == "get_weather":
            check_weather_call(call)


def test_auto_tool_choice_calls_or_answers(qwen_server):
    r = client(qwen_server).chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=120)
    ch = r.choices[0]
    if ch.finish_reason == "tool_calls":
        check_weather_call(ch.message.tool_calls[0])
    else:
        assert ch.message.content and not ch.message.tool_calls


def test_tool_round_trip(qwen_server):
    c = client(qwen_server)
    r = c.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                  temperature=0, max_tokens=120)
    msg = r.choices[0].message
    call = msg.tool_calls[0]
    check_weather_call(call)
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 18, "sky": "cloudy"})}]
    r = c.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                  temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length") and not ch.message.tool_calls
    assert ch.message.content.strip()


def test_streamed_tool_calls_reassemble(qwen_server):
    stream = client(qwen_server).chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=120,
        stream=True)
    calls, finish = {}, None
    for chunk in stream:
        ch = chunk.choices[0]
        for d in ch.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = d.id or entry["id"]
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
        finish = ch.finish_reason or finish
    assert finish == "tool_calls" and calls
    first = calls[0]
    assert first["id"].startswith("call_") and first["name"] == "get_weather"
    assert set(json.loads(first["arguments"])) == {"city", "unit"}


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "not an object"}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"grammar": "root ::= \"unterminated"}, "grammar"),
    ({"guided_regex": "(a"}, "guided_regex"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_malformed_constraints_are_400_and_the_server_keeps_serving(qwen_server, extra, param):
    c = client(qwen_server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body
    assert e.value.body["type"] == "invalid_request_error"
    r = c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3)
    assert r.choices[0].message.content is not None


def test_langchain_tools_and_structured_output(qwen_server):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(model=MODEL, base_url=qwen_server.url + "/v1", api_key="none", temperature=0,
                        max_tokens=120)
    msg = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Rome?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert set(msg.tool_calls[0]["args"]) == {"city", "unit"}
    pet = llm.with_structured_output(Pet, method="json_schema").invoke("Invent a pet.")
    assert isinstance(pet, Pet)


class Address(BaseModel):
    street: str
    city: str


class Item(BaseModel):
    name: str
    quantity: int


class Order(BaseModel):
    customer: str
    address: Address
    items: List[Item]


def test_nested_pydantic_tools_parse(qwen_server):
    """`pydantic_function_tool` puts nested models under `$defs`; the call grammar must
    resolve `#/$defs/...` (it was a 400 "Pointer '/$defs/Address' does not exist")."""
    r = client(qwen_server).chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Ann at 1 Main St, Oslo orders two pens and a pad."}],
        tools=[openai.pydantic_function_tool(Order)], tool_choice="required", temperature=0, max_tokens=200)
    call = r.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Order), call.function.arguments


def test_json_object_takes_the_layout_models_write(qwen_server):
    """Without a schema the model may open with `{` and a newline; a compact-only layout
    left `{` + `}` likelier and dropped fields (this sentence gave 3 of its 5)."""
    text = "Kenji Nowak is a 70-year-old baker who lives in Bergen. You can reach Kenji at kenji.nowak@example.com."
    r = client(qwen_server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Extract the information in this text as JSON.\n\n{text}"}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=200)
    v = json.loads(r.choices[0].message.content)
    values = {str(x).lower() for x in v.values()}
    found = [f for f in ("kenji nowak", "70", "bergen", "baker", "kenji.nowak@example.com") if f in values]
    assert len(found) >= 4, r.choices[0].message.content


def test_logprobs_under_a_grammar_are_numbers(qwen_server):
    """Masked tokens are not alternatives: `top_logprobs` never carries null."""
    c = client(qwen_server)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                  max_tokens=5, logprobs=True, top_logprobs=5,
                                  extra_body={"guided_choice": ["yes", "no"]})
    content = r.choices[0].logprobs.content
    assert content and r.choices[0].message.content in ("yes", "no")
    for e in content:
        assert isinstance(e.logprob, float)
        assert e.top_logprobs and all(isinstance(t.logprob, float) for t in e.top_logprobs)
    r = c.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=5, logprobs=5,
                             extra_body={"guided_choice": [" yes", " no"]})
    lp = r.choices[0].logprobs
    assert all(isinstance(x, float) for x in lp.token_logprobs)
    assert all(top and all(isinstance(x, float) for x in top.values()) for top in lp.top_logprobs)


def test_completion_prompts_read_special_tokens(qwen_server):
    """A chat template rendered by the client: `<|im_start|>` is one token, as in llama-server and
    vLLM. The 9 tokens: <|im_start|> user \\n Hi <|im_end|> \\n <|im_start|> assistant \\n."""
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    r = client(qwen_server).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert r.usage.prompt_tokens == 9
    import urllib.request
    req = urllib.request.Request(qwen_server.url + "/tokenize", data=json.dumps({"prompt": prompt}).encode(),
                                 headers={"Content-Type": "application/json"})
    assert json.load(urllib.request.urlopen(req))["count"] == 9


TIME_ZONE = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in an IANA time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_lenient_parser_takes_fenced_calls(qwen_server, qwen_lenient_server, stream):
    """With `auto`, Qwen2.5-Coder 0.5B writes this call as a ```json block, not `<tool_call>`
    (3 of 20 tool prompts end in a call; 20 of 20 with --tool-call-parser lenient)."""
    ask = [{"role": "user", "content": "What time is it in Australia/Sydney?"}]

    def ask_server(server):
        kw = dict(model=MODEL, messages=ask, tools=[TIME_ZONE, WEATHER], temperature=0, max_tokens=120)
        if not stream:
            ch = client(server).chat.completions.create(**kw).choices[0]
            calls = [(t.function.name, t.function.arguments) for t in ch.message.tool_calls or []]
            return ch.finish_reason, calls, ch.message.content
        finish, calls, content = None, {}, ""
        for chunk in client(server).chat.completions.create(stream=True, **kw):
            ch = chunk.choices[0]
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                e = calls.setdefault(d.index, ["", ""])
                e[0] += d.function.name or ""
                e[1] += d.function.arguments or ""
            finish = ch.finish_reason or finish
        return finish, [tuple(v) for v in calls.values()], content or None

    finish, calls, content = ask_server(qwen_server)
    assert finish == "stop" and not calls and "```" in content
    finish, calls, _ = ask_server(qwen_lenient_server)
    assert finish == "tool_calls" and [c[0] for c in calls] == ["get_time"]
    assert json.loads(calls[0][1])["zone"] == "Australia/Sydney"
