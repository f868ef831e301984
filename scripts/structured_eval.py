#!/usr/bin/env python3
"""How often a model's output validates against a requested JSON schema, with and without
`response_format` (Ferrum enforces it while decoding). Needs a running server and the
`openai` and `jsonschema` packages:

    ferrum serve --model qwen2.5-coder:0.5b --port 8000 &
    python scripts/structured_eval.py --url http://127.0.0.1:8000 --n 50

`--extract` instead asks for facts from short texts as a JSON object, with
`response_format: {"type": "json_object"}` and no schema (LangChain's `json_mode`, the AI
SDK's `generateObject`), and counts the fields extracted right: run it against
`ferrum serve` and `llama-server` alike.
"""
import argparse
import json
import random
import re

import jsonschema
import openai


def schema(rng, depth=0):
    kind = rng.randrange(4 if depth >= 2 else 6)
    if kind == 0:
        return {"type": "string", "maxLength": rng.randrange(5, 30)}
    if kind == 1:
        return {"type": "integer", "minimum": 0, "maximum": rng.choice([10, 100, 1000])}
    if kind == 2:
        return {"type": "boolean"}
    if kind == 3:
        return {"enum": rng.sample(["red", "green", "blue", "small", "large", "north", "south"], 3)}
    if kind == 4:
        return {"type": "array", "items": schema(rng, depth + 1), "minItems": 1, "maxItems": 3}
    names = rng.sample(["name", "title", "count", "price", "tags", "color", "size", "owner", "active", "city"],
                       rng.randrange(2, 5))
    props = {n: schema(rng, depth + 1) for n in names}
    return {"type": "object", "properties": props, "required": names, "additionalProperties": False}


def validates(text, s):
    try:
        jsonschema.validate(json.loads(text), s)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


FIRST = ["Maria", "Kenji", "Amara", "Lukas", "Sofia", "Omar", "Ingrid", "Diego", "Priya", "Tomasz"]
LAST = ["Lopez", "Tanaka", "Okafor", "Weber", "Rossi", "Haddad", "Berg", "Silva", "Nair", "Nowak"]
CITIES = ["Lima", "Osaka", "Lagos", "Berlin", "Turin", "Beirut", "Bergen", "Recife", "Kochi", "Gdansk"]
JOBS = ["nurse", "architect", "pilot", "baker", "teacher", "chemist", "carpenter", "lawyer", "dentist",
        "journalist"]


def scalars(v):
    """Every scalar in a JSON value, as lower-case text."""
    if isinstance(v, dict):
        return [s for x in v.values() for s in scalars(x)]
    if isinstance(v, list):
        return [s for x in v for s in scalars(x)]
    return [str(v).strip().lower()]


def extract(c, model, n, rng, fmt):
    """Facts about a person extracted from a sentence, as a JSON object under `fmt`: a fact counts
    when its value is among the object's values, whatever the model named its key (a name may
    come split in first and last)."""
    got = {"objects": 0, "fields": 0}
    for i in range(n):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        want = {"name": name, "age": rng.randrange(19, 80), "city": rng.choice(CITIES),
                "job": rng.choice(JOBS), "email": name.lower().replace(" ", ".") + "@example.com"}
        text = (f"{name} is a {want['age']}-year-old {want['job']} who lives in {want['city']}. "
                f"You can reach {name.split()[0]} at {want['email']}.")
        msgs = [{"role": "user", "content": f"Extract the information in this text as JSON.\n\n{text}"}]
        r = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=200,
                                      response_format=fmt)
        out = r.choices[0].message.content
        try:
            v = json.loads(out)
        except json.JSONDecodeError:
            v = None
        if not isinstance(v, dict):
            print(f"text {i}: not an object ({r.choices[0].finish_reason}): {out[:200]!r}")
            continue
        got["objects"] += 1
        values = scalars(v)
        right = [k for k, x in want.items()
                 if str(x).lower() in values or (k == "name" and all(p.lower() in values for p in name.split()))]
        got["fields"] += len(right)
        if len(right) < len(want):
            print(f"text {i}: {len(right)}/{len(want)}: {out[:200]!r}")
    print(json.dumps({"objects": f"{got['objects']}/{n}", "fields": f"{got['fields']}/{5 * n}"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extract", action="store_true", help="json_object extraction (fields right)")
    ap.add_argument("--object-schema", action="store_true",
                    help="with --extract: ask with the schema {\"type\": \"object\"} instead of json_object")
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.url + "/v1", api_key="none")
    model = c.models.list().data[0].id
    rng = random.Random(a.seed)
    if a.extract:
        fmt = ({"type": "json_schema", "json_schema": {"name": "object", "schema": {"type": "object"}}}
               if a.object_schema else {"type": "json_object"})
        extract(c, model, a.n, rng, fmt)
        return
    counts = {"constrained": 0, "unconstrained": 0, "unconstrained_unfenced": 0}
    for i in range(a.n):
        s = schema(rng)
        s = s if s.get("type") == "object" else {"type": "object", "properties": {"value": s},
                                                  "required": ["value"], "additionalProperties": False}
        msgs = [{"role": "user", "content": "Reply with only a JSON value that matches this JSON schema, "
                 "with made-up content:\n" + json.dumps(s)}]
        free = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=300)
        text = free.choices[0].message.content
        counts["unconstrained"] += validates(text, s)
        m = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
        counts["unconstrained_unfenced"] += validates(m.group(1) if m else text, s)
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s, "strict": True}}
        con = c.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=300,
                                        response_format=fmt)
        ok = validates(con.choices[0].message.content, s)
        counts["constrained"] += ok
        if not ok:
            print(f"schema {i} constrained output did not validate ({con.choices[0].finish_reason}):",
                  con.choices[0].message.content[:200])
    print(json.dumps({k: f"{v}/{a.n}" for k, v in counts.items()}))


if __name__ == "__main__":
    main()
