"""The Vercel AI SDK (npm `ai` with `@ai-sdk/openai`, tests/aisdk/package.json) against the real
`ferrum serve`: generateText, streamText, generateObject with a zod schema, and a zod tool. The SDK's
default OpenAI provider speaks the Responses API; each answer must equal the chat endpoint's answer
to the same request through the official `openai` package. Skips where `node` or the packages
(`npm ci --prefix tests/aisdk`) are missing."""
import json
import re
import shutil
import urllib.request
import subprocess
from pathlib import Path

import openai
import pytest

HERE = Path(__file__).resolve().parent
QWEN = "qwen2.5-coder:0.5b"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (HERE / "node_modules" / "ai").is_dir(),
    reason="node or the AI SDK packages are missing (npm ci --prefix tests/aisdk)")


def chat(server, prompt, **kw):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    return c.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": prompt}],
                                     temperature=0, **kw)


def responses_calls(server):
    """How many `POST /v1/responses` the server answered with 200."""
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    return sum(float(v) for v in re.findall(
        r'^ferrum_http_requests_total\{(?=[^}]*path="/v1/responses")(?=[^}]*method="POST")'
        r'(?=[^}]*status="200")[^}]*\} (\S+)$', text, re.M))


@pytest.fixture(scope="module")
def sdk(qwen_server):
    before = responses_calls(qwen_server)
    out = subprocess.run(["node", HERE / "calls.mjs", qwen_server.url + "/v1", QWEN], cwd=HERE,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # The SDK's default provider went through the Responses API, once per call.
    assert responses_calls(qwen_server) - before == 4
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_generate_text_and_stream_text(sdk, qwen_server):
    ref = chat(qwen_server, "Name three colors.", max_tokens=20)
    assert sdk["text"] == sdk["streamed"] == ref.choices[0].message.content
    assert sdk["finishReason"] == {"stop": "stop", "length": "length"}[ref.choices[0].finish_reason]
    assert sdk["usage"] == {"input": ref.usage.prompt_tokens, "output": ref.usage.completion_tokens}


def test_generate_object_follows_the_zod_schema(sdk, qwen_server):
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"],
              "additionalProperties": False}
    ref = chat(qwen_server, "Pick a color.", response_format={
        "type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": True}})
    assert sdk["object"] == json.loads(ref.choices[0].message.content)
    assert isinstance(sdk["object"]["color"], str) and sdk["object"]["color"]


def test_a_required_tool_call(sdk, qwen_server):
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}}
    ref = chat(qwen_server, "What is the weather in Paris?", tools=[tool], tool_choice="required")
    calls = [{"name": c.function.name, "input": json.loads(c.function.arguments)}
             for c in ref.choices[0].message.tool_calls]
    assert sdk["toolCalls"] == calls
    assert calls[0]["name"] == "get_weather" and calls[0]["input"]["city"]
