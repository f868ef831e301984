#!/usr/bin/env python3
"""Writes crates/ferrum-tokenizer/tests/fixtures/chat.json: chat templates of the
fetched models rendered by Python's jinja2 the way Hugging Face transformers'
apply_chat_template does (sandboxed environment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson, raise_exception). Ferrum's minijinja rendering is
tested against these strings.

    /tmp/gg/bin/pip install gguf jinja2
    /tmp/gg/bin/python scripts/make_chat_fixtures.py [MODELS_DIR]
"""
import json, os, sys
import gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols

models = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
    "FERRUM_MODELS", os.path.expanduser("~/.cache/ferrum/models"))

def gguf_template(name):
    r = gguf.GGUFReader(os.path.join(models, name))
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode()

def hf_config(name):
    with open(os.path.join(models, "tokenizers", name, "tokenizer_config.json")) as fh:
        c = json.load(fh)
    tok = lambda v: v if isinstance(v, str) or v is None else v.get("content")
    return c["chat_template"], tok(c.get("bos_token")) or "", tok(c.get("eos_token")) or ""

def raise_exception(msg):
    raise ValueError(msg)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city <now>",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Name, e.g. Zürich"}},
                         "required": ["city"]}}}]
conversations = {
    "single": [{"role": "user", "content": "What is the capital of France?"}],
    "system_multi": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. What do you need?"},
        {"role": "user", "content": "  A haiku about rust, please.\n"},
    ],
    "tool_call": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp_c\": 21}"},
    ],
}
templates = {
    "smollm2": (gguf_template("SmolLM2-135M-Instruct.Q4_1.gguf"), "", ""),
    "qwen2.5": (gguf_template("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), "", "<|im_end|>"),
    "llama3": hf_config("llama3"),
    "qwen3": hf_config("qwen3"),
    "gemma3": hf_config("gemma3"),
}
cases = []
for tname, (source, bos, eos) in templates.items():
    for cname, messages in conversations.items():
        for use_tools in (False, True):
            if use_tools and tname not in ("qwen2.5", "qwen3"):
                continue
            if cname == "tool_call" and not use_tools:
                continue
            for agp in (True, False):
                try:
                    text = env.from_string(source).render(messages=messages, add_generation_prompt=agp,
                                                          tools=tools if use_tools else None,
                                                          bos_token=bos, eos_token=eos)
                    err = None
                except Exception as e:
                    text, err = None, str(e)
                cases.append({"template": tname, "conversation": cname, "tools": use_tools,
                              "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos,
                              "expected": text, "error": err})
# A request's chat_template_kwargs, passed as apply_chat_template(**kwargs) passes them.
for kwargs in ({"enable_thinking": False}, {"enable_thinking": True}):
    source, bos, eos = templates["qwen3"]
    text = env.from_string(source).render(messages=conversations["single"], add_generation_prompt=True,
                                          tools=None, bos_token=bos, eos_token=eos, **kwargs)
    cases.append({"template": "qwen3", "conversation": "single", "tools": False, "add_generation_prompt": True,
                  "bos_token": bos, "eos_token": eos, "kwargs": kwargs, "expected": text, "error": None})
dest = os.path.join(os.path.dirname(__file__), "..", "crates", "ferrum-tokenizer", "tests", "fixtures", "chat.json")
with open(dest, "w") as fh:
    json.dump({"generator": "scripts/make_chat_fixtures.py", "templates": {k: v[0] for k, v in templates.items()},
               "tools": tools, "conversations": conversations, "cases": cases}, fh, indent=1, ensure_ascii=False)
print(len(cases), "cases;", sum(c["error"] is not None for c in cases), "raise errors; wrote", os.path.normpath(dest))
