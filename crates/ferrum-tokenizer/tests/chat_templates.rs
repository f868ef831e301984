//! Chat templates of real models (SmolLM2, Qwen2.5 with tools, Llama-3,
//! Qwen3, Gemma-3) rendered by minijinja against Python jinja2's rendering
//! with Hugging Face's settings (`tests/fixtures/chat.json`, written by
//! `scripts/make_chat_fixtures.py`), with and without a request's
//! `chat_template_kwargs`.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_tokenizer::chat::{ChatOptions, ChatTemplate, Message};
use serde_json::Value;

fn messages(v: &Value) -> Vec<Message> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut extra = m.as_object().unwrap().clone();
            let role = extra.remove("role").unwrap().as_str().unwrap().to_string();
            let content = extra
                .remove("content")
                .unwrap()
                .as_str()
                .unwrap()
                .to_string();
            Message { role, content, extra }
        })
        .collect()
}

#[test]
fn templates_render_exactly_like_transformers() {
    let fixture: Value = serde_json::from_str(include_str!("fixtures/chat.json")).unwrap();
    let tools = &fixture["tools"];
    let mut checked = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let template = ChatTemplate::new(fixture["templates"][name].as_str().unwrap()).unwrap();
        let conv = case["conversation"].as_str().unwrap();
        let msgs = messages(&fixture["conversations"][conv]);
        let opts = ChatOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case["tools"].as_bool().unwrap().then_some(tools),
            bos_token: case["bos_token"].as_str().unwrap(),
            eos_token: case["eos_token"].as_str().unwrap(),
            // A request's `chat_template_kwargs` (Qwen3's `enable_thinking`).
            kwargs: case.get("kwargs").and_then(Value::as_object),
        };
        let got = template.render(&msgs, &opts);
        match case["expected"].as_str() {
            Some(want) => assert_eq!(got.unwrap(), want, "{name} / {conv} / {opts:?}"),
            None => assert!(got.is_err(), "{name} / {conv} should raise"),
        }
        checked += 1;
    }
    assert_eq!(checked, 34);
}

#[test]
fn template_errors_are_reported_not_panics() {
    assert!(ChatTemplate::new("{% for %}").is_err());
    let t = ChatTemplate::new("{{ raise_exception('only user turns') }}").unwrap();
    let err = t
        .render(&[Message::new("user", "x")], &ChatOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("only user turns"), "{err}");
}

/// A template from a model file cannot hold a thread or the memory: one
/// that loops without end runs out of fuel, one that writes without end
/// hits the output limit, both in well under a second, as errors that say
/// so. (Before: the server froze, and ignored SIGTERM.)
#[test]
fn runaway_templates_stop_with_an_error() {
    let opts = ChatOptions::default();
    let msgs = [Message::new("user", "x")];
    let start = std::time::Instant::now();
    let looping = ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    )
    .unwrap();
    let err = looping.render(&msgs, &opts).unwrap_err().to_string();
    assert!(err.contains("loop without end"), "{err}");
    let writing =
        ChatTemplate::new("{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}").unwrap();
    let err = writing.render(&msgs, &opts).unwrap_err().to_string();
    assert!(err.contains("wrote over"), "{err}");
    assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
    // A long real conversation is far from either bound.
    let many: Vec<Message> = (0..2000)
        .map(|i| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, "hello there"))
        .collect();
    let chatml = ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    )
    .unwrap();
    assert!(chatml.render(&many, &opts).is_ok());
}
