//! Grammars for what real clients send, on Qwen2.5's vocabulary (skipped
//! when not fetched):
//! - tool calls built from the schemas in `data/client_tool_schemas.json`
//!   (written by `scripts/client_tool_schemas.py` from openai-python,
//!   instructor and pydantic-ai), whose nested models reach their
//!   definitions through `$ref` pointers that must still resolve once a
//!   tool's parameters sit inside the call's schema;
//! - `json_object` (LangChain's `json_mode`, the AI SDK's `generateObject`),
//!   which must take JSON laid out as models write it.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::sync::Arc;

use ferrum_formats::gguf::GgufFile;
use ferrum_structured::tools::{parse_tools, tool_constraint, Tool, ToolChoice, ToolFormat};
use ferrum_structured::{Constraint, GrammarSpec, Grammars};
use ferrum_tokenizer::Tokenizer;
use serde_json::{json, Value};

fn grammars() -> Option<Grammars> {
    let path = ferrum_formats::cached_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")?;
    let tok = Arc::new(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap());
    Some(Grammars::new(tok.clone(), tok.vocab_size()).unwrap())
}

fn client_tools() -> Value {
    serde_json::from_str(include_str!("data/client_tool_schemas.json")).unwrap()
}

/// Whether the grammar for `tools` (a call required) takes `text` whole.
fn accepts(g: &Grammars, tools: &[Tool], choice: &ToolChoice, text: &str) -> bool {
    let c = tool_constraint(g, ToolFormat::Llama3Json, tools, choice, false, None)
        .unwrap()
        .unwrap();
    takes(g, c, text)
}

/// Whether `c` takes `text` whole: every token allowed and the end allowed
/// after the last.
fn takes(g: &Grammars, mut c: Constraint, text: &str) -> bool {
    let toks = g.tokenizer().encode(text, false, false).unwrap();
    if c.valid_prefix(&toks) < toks.len() {
        return false;
    }
    for &t in &toks {
        c.commit(t, Vec::new).unwrap();
    }
    let eos = g.eos();
    let mut logits = vec![0f32; g.tokenizer().vocab_size()];
    c.apply(&mut logits, &[eos]).is_ok() && logits[eos as usize].is_finite()
}

const ORDER: &str = r#"{"customer": "Ann", "address": {"street": "1 Main St", "city": "Oslo"}, "items": [{"name": "pen", "quantity": 2}, {"name": "ink", "quantity": 1}]"#;

#[test]
fn nested_pydantic_tools_resolve_their_definitions() {
    let Some(g) = grammars() else { return };
    let all = client_tools();
    for (client, tool) in all.as_object().unwrap() {
        if client == "openai_recursive" {
            continue;
        }
        let tools = parse_tools(&json!([tool])).unwrap();
        let name = &tools[0].name;
        // openai's strict schemas require `note`; the others leave it out.
        let required_note = tool["function"]["parameters"]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("note"));
        let tail = if required_note {
            r#", "note": null}"#
        } else {
            "}"
        };
        let good = format!(r#"{{"name": "{name}", "parameters": {ORDER}{tail}}}"#);
        assert!(
            accepts(&g, &tools, &ToolChoice::Required, &good),
            "{client}: {good}"
        );
        // What the definitions forbid is refused: a count that is a string,
        // an address without its city.
        let bad_count = good.replace(r#""quantity": 2"#, r#""quantity": "2""#);
        let bad_address = good.replace(r#", "city": "Oslo""#, "");
        for bad in [bad_count, bad_address] {
            assert!(
                !accepts(&g, &tools, &ToolChoice::Required, &bad),
                "{client}: {bad}"
            );
        }
    }
}

#[test]
fn recursive_and_clashing_definitions_stay_per_tool() {
    let Some(g) = grammars() else { return };
    let all = client_tools();
    // Two tools whose parameters both define `Item`, differently, and a
    // recursive one: each reference finds its own tool's definition.
    let mut other = all["openai_pydantic_function_tool"].clone();
    other["function"]["name"] = json!("Other");
    other["function"]["parameters"]["$defs"]["Item"] = json!({"type": "object", "properties": {"sku": {"type": "integer"}},
               "required": ["sku"], "additionalProperties": false});
    let tools = parse_tools(&json!([
        all["openai_pydantic_function_tool"],
        other,
        all["openai_recursive"]
    ]))
    .unwrap();
    let order = format!(r#"{{"name": "Order", "parameters": {ORDER}, "note": null}}}}"#);
    let other_call = r#"{"name": "Other", "parameters": {"customer": "B", "address": {"street": "s", "city": "c"}, "items": [{"sku": 7}], "note": null}}"#;
    let tree = r#"{"name": "Node", "parameters": {"label": "a", "children": [{"label": "b", "children": [{"label": "c", "children": []}]}]}}"#;
    for good in [order.as_str(), other_call, tree] {
        assert!(accepts(&g, &tools, &ToolChoice::Required, good), "{good}");
    }
    // Order's items are not Other's, nor the other way round.
    let swapped = other_call.replace("Other", "Order");
    let crossed = order.replace("\"Order\"", "\"Other\"");
    for bad in [swapped.as_str(), crossed.as_str()] {
        assert!(!accepts(&g, &tools, &ToolChoice::Required, bad), "{bad}");
    }
    // Naming one tool restricts the call to it.
    let named = ToolChoice::Named("Node".into());
    assert!(accepts(&g, &tools, &named, tree));
    assert!(!accepts(&g, &tools, &named, &order));
}

#[test]
fn json_object_takes_the_layout_models_write() {
    let Some(g) = grammars() else { return };
    let object = g.compile(&GrammarSpec::JsonObject).unwrap();
    let pretty = "{\n  \"name\": \"Maria\",\n  \"age\": 31,\n  \"tags\": [\n    \"a\",\n    \"b\"\n  ],\n  \"home\": {\"city\": \"Lima\"}\n}";
    for good in [
        pretty,
        "{\"name\": \"Maria\", \"age\": 31}",
        "{\"name\":\"Maria\"}",
        "{\r\n\t\"a\": [1, 2]\r\n}",
        "{}",
    ] {
        assert!(takes(&g, object.clone(), good), "{good:?}");
    }
    // Whitespace runs are bounded: one newline and 24 spaces at most.
    let deep = format!("{{\n{}\"a\": 1}}", " ".repeat(24));
    assert!(takes(&g, object.clone(), &deep));
    for bad in [
        "{\n\n  \"a\": 1}".to_string(),
        format!("{{\n{}\"a\": 1}}", " ".repeat(25)),
        format!("{{{}\"a\": 1}}", " ".repeat(25)),
        "[1, 2]".to_string(),
        "{\"a\": 1,}".to_string(),
    ] {
        assert!(!takes(&g, object.clone(), &bad), "{bad:?}");
    }
    // So a model cannot loop on whitespace: taking only whitespace tokens
    // after `{`, the grammar soon allows none.
    let vocab = g.tokenizer().vocab_size();
    let blank: Vec<u32> = (0..vocab as u32)
        .filter(|&t| {
            let b = g.tokenizer().token_bytes(t);
            !g.tokenizer().is_control(t)
                && !b.is_empty()
                && b.iter().all(|c| b" \t\r\n".contains(c))
        })
        .collect();
    let mut c = object.clone();
    let open = g.tokenizer().encode("{", false, false).unwrap();
    c.commit(open[0], Vec::new).unwrap();
    let mut taken = 0;
    let mut logits = vec![0f32; vocab];
    loop {
        logits.fill(0.0);
        c.apply(&mut logits, &[]).unwrap();
        let Some(&t) = blank.iter().find(|&&t| logits[t as usize].is_finite()) else {
            break;
        };
        c.commit(t, Vec::new).unwrap();
        taken += 1;
        assert!(taken <= 25, "whitespace goes on after {taken} tokens");
    }
}
