"""vLLM's `/v1/completions/render` and `/v1/chat/completions/render` (what
vllm-router's cache-aware policy tokenizes routed requests with): the ids
generation would run on, checked against `/tokenize` and the usage counts."""
MODEL = "smollm2"


def test_completion_render_is_the_prompt_generation_sees(chat_server):
    code, rendered = chat_server.post("/v1/completions/render",
                                      {"model": MODEL, "prompt": ["Hello world", "<|im_start|>user"]})
    assert code == 200 and len(rendered) == 2
    for item, text in zip(rendered, ["Hello world", "<|im_start|>user"]):
        _, tok = chat_server.post("/tokenize", {"model": MODEL, "prompt": text})
        assert item["token_ids"] == tok["tokens"] and item["model"] == MODEL
        assert text in item["prompt"]
    # Special-token text is the special token, as in generation.
    assert len(rendered[1]["token_ids"]) == 2
    _, done = chat_server.post("/v1/completions", {"model": MODEL, "prompt": "Hello world", "max_tokens": 1})
    assert done["usage"]["prompt_tokens"] == len(rendered[0]["token_ids"])


def test_chat_render_is_the_prompt_generation_sees(chat_server):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "How are you?"}]
    code, rendered = chat_server.post("/v1/chat/completions/render",
                                      {"model": MODEL, "messages": messages, "stream": True})
    assert code == 200, rendered
    _, tok = chat_server.post("/tokenize", {"model": MODEL, "messages": messages})
    assert rendered["token_ids"] == tok["tokens"]
    _, done = chat_server.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
    assert done["usage"]["prompt_tokens"] == len(rendered["token_ids"])


def test_render_refuses_what_generation_refuses(chat_server):
    code, r = chat_server.post("/v1/chat/completions/render", {"model": "other", "messages": []})
    assert code == 404 and "error" in r
    code, r = chat_server.post("/v1/completions/render", {"model": MODEL, "prompt": "x", "best_of": 2})
    assert code == 400 and r["error"]["param"] == "best_of"
