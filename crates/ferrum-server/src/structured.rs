//! Structured output over HTTP: the request fields that constrain output
//! (`response_format`, `grammar`, `guided_*`, `tools` + `tool_choice`)
//! turned into one engine constraint, and tool calls turned back into
//! OpenAI's `tool_calls`.

use std::sync::Arc;

use ferrum_structured::tools::{
    parse_tool_choice, parse_tools, tool_constraint, ParsedCall, Tool, ToolChoice, ToolFormat,
    ToolParser,
};
use ferrum_structured::{Constraint, GrammarSpec, Grammars};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::protocol::{ChatMessage, GenFields};

/// The output-format fields of a request, at most one of which may be set.
pub fn output_spec(g: &GenFields) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    let mut found: Vec<(GrammarSpec, &'static str)> = Vec::new();
    if let Some(rf) = &g.response_format {
        if let Some(spec) = response_format(rf)? {
            found.push((spec, "response_format"));
        }
    }
    if let Some(src) = &g.grammar {
        found.push((GrammarSpec::Gbnf(src.clone()), "grammar"));
    }
    if let Some(v) = &g.guided_json {
        // vLLM takes the schema as an object or as a JSON string.
        let schema = match v {
            Value::String(s) => serde_json::from_str(s).map_err(|e| {
                ApiError::invalid(format!("guided_json is not JSON: {e}"), Some("guided_json"))
            })?,
            other => other.clone(),
        };
        found.push((GrammarSpec::JsonSchema(schema), "guided_json"));
    }
    if let Some(r) = &g.guided_regex {
        found.push((GrammarSpec::Regex(r.clone()), "guided_regex"));
    }
    if let Some(c) = &g.guided_choice {
        found.push((GrammarSpec::Choice(c.clone()), "guided_choice"));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.1).collect();
        return Err(ApiError::invalid(
            format!(
                "{} each constrain the output; give only one",
                names.join(", ")
            ),
            Some(names[1]),
        ));
    }
    let found = found.pop();
    if let Some((spec, field)) = &found {
        spec.validate()
            .map_err(|e| ApiError::invalid(format!("{field}: {e}"), Some(field)))?;
    }
    Ok(found)
}

/// OpenAI's `response_format`: `text`, `json_object`, or `json_schema`
/// with `{"name", "schema", "strict"}` (the schema is always enforced).
fn response_format(v: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: &str| ApiError::invalid(format!("response_format: {m}"), Some("response_format"));
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("must be an object with a \"type\""))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .filter(|j| j.is_object())
                .ok_or_else(|| bad("type json_schema needs a \"json_schema\" object"))?;
            let schema = js
                .get("schema")
                .ok_or_else(|| bad("json_schema needs a \"schema\""))?;
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        other => Err(bad(&format!(
            "type {other:?} is not one of text, json_object, json_schema"
        ))),
    }
}

/// A chat request's tools, when the model is to see them.
pub struct ToolSetup {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    pub format: ToolFormat,
    /// Fenced calls are taken too (`--tool-call-parser lenient`).
    pub lenient: bool,
}

impl ToolSetup {
    /// The parser for one choice's output.
    pub fn parser(&self) -> ToolParser {
        let parser = ToolParser::new(self.format);
        if self.lenient {
            parser.lenient(self.tools.iter().map(|t| t.name.clone()).collect())
        } else {
            parser
        }
    }
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls` against the
/// model's template. `None`: no tools offered, or `tool_choice: "none"`
/// (the model answers in text and is not shown the tools).
pub fn tool_setup(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
    template: Option<&str>,
    lenient: bool,
) -> Result<Option<ToolSetup>, ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => parse_tools(v).map_err(|e| ApiError::invalid(e.to_string(), Some("tools")))?,
    };
    let choice = parse_tool_choice(choice, &tools)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("tool_choice")))?;
    if tools.is_empty() || choice == ToolChoice::None {
        return Ok(None);
    }
    let format = template.and_then(ToolFormat::detect).ok_or_else(|| {
        ApiError::invalid(
            "this model's chat template has no tool-call format (Hermes <tool_call>, Llama 3 JSON or Mistral [TOOL_CALLS]); call it without tools",
            Some("tools"),
        )
    })?;
    Ok(Some(ToolSetup {
        tools,
        choice,
        parallel: parallel.unwrap_or(true),
        format,
        lenient,
    }))
}

/// The request's one constraint: its output format or its tool calls,
/// from the first token, or (`after`) from where the output first
/// contains that text.
pub fn constraint(
    grammars: &Result<Arc<Grammars>, String>,
    spec: Option<(GrammarSpec, &'static str)>,
    tools: Option<&ToolSetup>,
    after: Option<&str>,
) -> Result<Option<Constraint>, ApiError> {
    if spec.is_none() && tools.is_none() {
        return Ok(None);
    }
    let field = spec.as_ref().map_or("tools", |s| s.1);
    let g = grammars.as_ref().map_err(|e| {
        ApiError::invalid(
            format!("this model cannot constrain its output: {e}"),
            Some(field),
        )
    })?;
    match (spec, tools) {
        (Some((_, field)), Some(_)) => Err(ApiError::invalid(
            format!(
                "{field} cannot be combined with tools; use tool_choice \"none\" or drop {field}"
            ),
            Some(field),
        )),
        (Some((spec, field)), None) => match after {
            Some(a) => g.compile_after(a, &spec),
            None => g.compile(&spec),
        }
        .map(Some)
        .map_err(|e| ApiError::invalid(format!("{field}: {e}"), Some(field))),
        (None, Some(t)) => tool_constraint(g, t.format, &t.tools, &t.choice, t.parallel, after)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("tools"))),
        (None, None) => Ok(None),
    }
}

/// OpenAI's `tool_calls` entries; ids are `call_<request>_<n>`.
pub fn tool_calls_json(calls: &[ParsedCall], id: &str, first: usize) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            json!({"id": call_id(id, first + k), "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

pub fn call_id(request: &str, n: usize) -> String {
    let tail = request.rsplit('-').next().unwrap_or(request);
    format!("call_{tail}_{n}")
}

/// History messages for the template: an assistant's `tool_calls` carry
/// `function.arguments` as a JSON string in OpenAI's API, but templates
/// (Qwen's, Llama's) write them with `tojson` and expect an object, as
/// vLLM and transformers users pass them.
pub fn template_extra(m: &ChatMessage) -> serde_json::Map<String, Value> {
    let mut extra = m.extra.clone();
    if let Some(Value::Array(calls)) = extra.get_mut("tool_calls") {
        for c in calls {
            if let Some(args) = c.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                if let Some(parsed) = args
                    .as_str()
                    .and_then(|s| serde_json::from_str::<Value>(s).ok())
                {
                    *args = parsed;
                }
            }
        }
    }
    extra
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::protocol::parse;

    fn spec(body: &str) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
        output_spec(&parse::<GenFields>(body.as_bytes()).unwrap())
    }

    #[test]
    fn output_fields_map_to_specs() {
        assert!(spec("{}").unwrap().is_none());
        assert!(spec(r#"{"response_format": {"type": "text"}}"#)
            .unwrap()
            .is_none());
        assert_eq!(
            spec(r#"{"response_format": {"type": "json_object"}}"#)
                .unwrap()
                .unwrap()
                .0,
            GrammarSpec::JsonObject
        );
        let (s, f) = spec(
            r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (s, f),
            (
                GrammarSpec::JsonSchema(json!({"type": "integer"})),
                "response_format"
            )
        );
        let (s, _) = spec(r#"{"guided_json": "{\"type\": \"string\"}"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(s, GrammarSpec::JsonSchema(json!({"type": "string"})));
        assert_eq!(
            spec(r#"{"guided_choice": ["a", "b"]}"#).unwrap().unwrap().0,
            GrammarSpec::Choice(vec!["a".into(), "b".into()])
        );
        for (body, field) in [
            (r#"{"response_format": {"type": "xml"}}"#, "response_format"),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                "response_format",
            ),
            (r#"{"response_format": "json"}"#, "response_format"),
            (r#"{"guided_choice": []}"#, "guided_choice"),
            (r#"{"guided_json": "{"}"#, "guided_json"),
            (
                r#"{"grammar": "root ::= \"a\"", "guided_regex": "a"}"#,
                "guided_regex",
            ),
        ] {
            let e = spec(body).err().unwrap();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
        }
    }

    #[test]
    fn tools_need_a_template_format() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let hermes = Some("{{ '<tool_call>' }}");
        assert!(tool_setup(None, None, None, hermes, false)
            .unwrap()
            .is_none());
        assert!(
            tool_setup(Some(&tools), Some(&json!("none")), None, hermes, false)
                .unwrap()
                .is_none()
        );
        let t = tool_setup(Some(&tools), None, None, hermes, false)
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.choice, t.parallel, t.format),
            (ToolChoice::Auto, true, ToolFormat::Hermes)
        );
        let e = tool_setup(Some(&tools), None, None, Some("{{ messages }}"), false)
            .err()
            .unwrap();
        assert_eq!(e.param.as_deref(), Some("tools"));
        let e = tool_setup(
            Some(&tools),
            Some(&json!({"type": "function", "function": {"name": "g"}})),
            None,
            hermes,
            false,
        )
        .err()
        .unwrap();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }
}
