#!/usr/bin/env python3
"""How many of 20 prompts that need a tool end in a valid call (a declared function, arguments
that are a JSON object with its required keys), with `tool_choice` auto or required:

    ferrum serve --model qwen2.5-coder:0.5b --port 8000 [--tool-call-parser lenient] &
    python scripts/tool_call_eval.py --url http://127.0.0.1:8000 [--required]
"""
import argparse
import json

import openai


def fn(name, desc, props, required):
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


S = {"type": "string"}
TOOLS = [
    fn("get_weather", "Current weather in a city", {"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    fn("get_time", "Current local time in an IANA time zone", {"zone": S}, ["zone"]),
    fn("convert_currency", "Convert an amount between currencies",
       {"amount": {"type": "number"}, "source": S, "target": S}, ["amount", "source", "target"]),
    fn("send_email", "Send an email", {"to": S, "subject": S, "body": S}, ["to", "subject", "body"]),
    fn("search_flights", "Find flights between two cities on a date",
       {"origin": S, "destination": S, "date": S}, ["origin", "destination", "date"]),
]
PROMPTS = [
    "What's the weather in Paris right now?",
    "Is it raining in Tokyo at the moment? Use fahrenheit.",
    "How hot is it in Cairo today?",
    "Tell me the current weather for Buenos Aires.",
    "What time is it in America/New_York?",
    "Give me the current time in Asia/Kolkata.",
    "What's the local time in Europe/Berlin right now?",
    "Convert 250 US dollars to euros.",
    "How many Japanese yen is 80 British pounds?",
    "Change 1000 CHF into Swedish kronor.",
    "Email bob@example.com with subject 'Lunch' saying I'll be late.",
    "Send an email to ana@example.org titled 'Report' with the body 'The report is attached.'",
    "Write to team@example.com, subject 'Standup', body 'Standup moves to 10am.'",
    "Find flights from Oslo to Rome on 2025-03-14.",
    "Search flights from Boston to Denver for 2025-07-01.",
    "Are there flights from Lima to Quito on 2025-05-20?",
    "Check the weather in Reykjavik in celsius.",
    "What time is it in Australia/Sydney?",
    "Convert 12.5 euros to US dollars.",
    "Look up flights from Madrid to Lisbon on 2025-09-09.",
]


def valid(call):
    spec = next((t["function"] for t in TOOLS if t["function"]["name"] == call.function.name), None)
    if spec is None:
        return False
    try:
        args = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return False
    return isinstance(args, dict) and all(k in args for k in spec["parameters"]["required"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--required", action="store_true", help="tool_choice: required (default auto)")
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.url + "/v1", api_key="none")
    model = c.models.list().data[0].id
    ok = 0
    for i, p in enumerate(PROMPTS):
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], tools=TOOLS,
                                      tool_choice="required" if a.required else "auto", temperature=0,
                                      max_tokens=200)
        m = r.choices[0].message
        good = bool(m.tool_calls) and all(valid(t) for t in m.tool_calls)
        ok += good
        if not good:
            print(f"prompt {i}: no valid call: {(m.content or '')[:160]!r}")
    print(json.dumps({"valid_calls": f"{ok}/{len(PROMPTS)}", "tool_choice": "required" if a.required else "auto"}))


if __name__ == "__main__":
    main()
