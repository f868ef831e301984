//! Tool calling: the formats chat templates teach models to call tools in,
//! the grammars that enforce a call, and the parser that turns a model's
//! output back into OpenAI `tool_calls`.
//!
//! The format is read from the chat template itself (the text it tells the
//! model to produce), never from the model's name, so any fine-tune that
//! keeps its base model's template works.

use ferrum_types::{FerrumError, Result};
use serde_json::{json, Value};

use crate::grammar::{lark_json, GrammarSpec};
use crate::vocab::Grammars;

/// How a template's model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`,
    /// one block per call.
    Hermes,
    /// Llama 3.1+: the whole answer is `{"name": .., "parameters": {..}}`
    /// (optionally after `<|python_tag|>`).
    Llama3Json,
    /// Mistral: `[TOOL_CALLS] [{"name": .., "arguments": {..}}, ...]`.
    Mistral,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolFormat {
    /// The format `template` teaches, if it has a tools branch we know.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains(HERMES_OPEN) {
            Some(Self::Hermes)
        } else if template.contains(MISTRAL_OPEN) {
            Some(Self::Mistral)
        } else if template.contains(PYTHON_TAG)
            || template.contains("\"parameters\": dictionary of argument name")
        {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }

    /// The key that holds a call's arguments.
    fn args_key(self) -> &'static str {
        match self {
            Self::Llama3Json => "parameters",
            Self::Hermes | Self::Mistral => "arguments",
        }
    }
}

/// A function the client offers (`tools[i].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its JSON schema (an object schema; `{}` when the client gave none).
    pub parameters: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// Answer in text; tools are not shown to the model.
    None,
    /// The model decides; a call it starts is enforced.
    Auto,
    /// At least one call, enforced.
    Required,
    /// Exactly this function, enforced.
    Named(String),
}

/// Checks OpenAI `tools`; errors say which entry is wrong and how.
pub fn parse_tools(v: &Value) -> Result<Vec<Tool>> {
    let list = v
        .as_array()
        .ok_or_else(|| FerrumError::invalid("tools must be an array"))?;
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let bad = |m: &str| FerrumError::invalid(format!("tools[{i}]: {m}"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("type must be \"function\""));
        }
        let f = t
            .get("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| bad("function must be an object"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("function.name must be a non-empty string"))?;
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad("function.parameters must be a JSON schema object")),
        };
        if tools.iter().any(|x: &Tool| x.name == name) {
            return Err(bad(&format!("the function name {name:?} is used twice")));
        }
        tools.push(Tool { name: name.to_string(), parameters });
    }
    Ok(tools)
}

/// Checks OpenAI `tool_choice` against the offered `tools` (absent: `auto`
/// when there are tools, as OpenAI defaults).
pub fn parse_tool_choice(v: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice> {
    let bad = |m: String| FerrumError::invalid(m);
    let choice = match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "tool_choice {other:?} is not one of none, auto, required, or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                )))
            }
        },
        Some(o @ Value::Object(_)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad("tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}".into())
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(bad(format!(
                    "tool_choice names the function {name:?}, which is not in tools"
                )));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(other) => return Err(bad(format!("tool_choice is {other}; expected a string or an object"))),
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad("tool_choice requires tools".into()));
    }
    Ok(choice)
}

/// The grammar that enforces calls for `choice`: `None` when nothing is
/// enforced (`none`, or `auto` in a format without a start marker), else
/// the constraint (for `auto`, armed once the model writes the format's
/// start marker; for the others, once the output contains `after`, when
/// given: the end of the reasoning a prompt opened).
pub fn tool_constraint(
    g: &Grammars,
    format: ToolFormat,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    after: Option<&str>,
) -> Result<Option<crate::Constraint>> {
    let callable: Vec<&Tool> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    if callable.is_empty() {
        return Ok(None);
    }
    let call = lark_json(&call_schema(&callable, format.args_key()));
    let more = |rule: &str| {
        if parallel {
            format!("({rule})*")
        } else {
            String::new()
        }
    };
    let auto = *choice == ToolChoice::Auto;
    let (lark, trigger) = match format {
        ToolFormat::Hermes => {
            let (open, close) = (g.lark_literal(HERMES_OPEN), g.lark_literal(HERMES_CLOSE));
            let body = format!("\"\\n\" call \"\\n\" {close}");
            let rest = more(&format!("\"\\n\" {open} {body}"));
            if auto {
                (
                    format!("start: {body} {rest}\ncall: {call}\n"),
                    Some(HERMES_OPEN),
                )
            } else {
                (format!("start: {open} {body} {rest}\ncall: {call}\n"), None)
            }
        }
        ToolFormat::Mistral => {
            let body = format!("\" \"? \"[\" call {} \"]\"", more("\", \" call"));
            if auto {
                (format!("start: {body}\ncall: {call}\n"), Some(MISTRAL_OPEN))
            } else {
                let open = g.lark_literal(MISTRAL_OPEN);
                (format!("start: {open} {body}\ncall: {call}\n"), None)
            }
        }
        // No marker starts a Llama 3 call: `auto` is left free and parsed
        // afterwards.
        ToolFormat::Llama3Json if auto => return Ok(None),
        ToolFormat::Llama3Json => (
            format!("start: call {}\ncall: {call}\n", more("\"; \" call")),
            None,
        ),
    };
    let spec = GrammarSpec::Lark(lark);
    Ok(Some(match trigger.or(after) {
        Some(t) => g.compile_after(t, &spec)?,
        None => g.compile(&spec)?,
    }))
}

/// The JSON schema of one call to any of `tools`: `{"name": <const>, key:
/// <its parameters>}`.
///
/// A tool's parameters are a whole schema, and their references (`$ref`
/// pointers such as pydantic's `#/$defs/Item`) are relative to that
/// schema's root. Nested under the call's `properties`, they would point at
/// nothing, so a tool whose parameters refer to anything moves to
/// `$defs/tool<i>` of the call's schema and every `#...` pointer in it gains
/// that prefix (`#/$defs/Item` -> `#/$defs/tool0/$defs/Item`, `#` ->
/// `#/$defs/tool0`). Each tool keeps its own definitions, so two tools may
/// both name one `Item`. Tools without references stay inline.
fn call_schema(tools: &[&Tool], key: &str) -> Value {
    let mut defs = serde_json::Map::new();
    let alts: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut params = t.parameters.clone();
            let params = if has_ref(&params) {
                let at = format!("#/$defs/tool{i}");
                prefix_refs(&mut params, &at);
                defs.insert(format!("tool{i}"), params);
                json!({ "$ref": at })
            } else {
                params
            };
            json!({"type": "object",
                   "properties": {"name": {"const": t.name}, key: params},
                   "required": ["name", key], "additionalProperties": false})
        })
        .collect();
    let mut schema = if alts.len() == 1 {
        alts.into_iter().next().unwrap_or_default()
    } else {
        json!({ "anyOf": alts })
    };
    if let (false, Value::Object(m)) = (defs.is_empty(), &mut schema) {
        m.insert("$defs".into(), Value::Object(defs));
    }
    schema
}

/// Keywords whose values are data, not schemas: a `"$ref"` key inside them
/// is not a reference.
const DATA_KEYWORDS: [&str; 4] = ["const", "enum", "default", "examples"];

/// Whether `schema` holds a reference anywhere.
fn has_ref(schema: &Value) -> bool {
    match schema {
        Value::Object(m) => m.iter().any(|(k, v)| {
            (k == "$ref" && v.is_string()) || (!DATA_KEYWORDS.contains(&k.as_str()) && has_ref(v))
        }),
        Value::Array(a) => a.iter().any(has_ref),
        _ => false,
    }
}

/// Puts `at` in front of every same-document reference (`#...`) in
/// `schema`.
fn prefix_refs(schema: &mut Value, at: &str) {
    match schema {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    Value::String(r) if k == "$ref" && r.starts_with('#') => {
                        *r = format!("{at}{}", &r[1..]);
                    }
                    _ if DATA_KEYWORDS.contains(&k.as_str()) => {}
                    _ => prefix_refs(v, at),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| prefix_refs(v, at)),
        _ => {}
    }
}

/// A call found in the output: the function and its arguments as a JSON
/// string (OpenAI's `function.arguments`).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What a piece of streamed output turned out to be.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Content(String),
    Call(ParsedCall),
}

/// Splits a model's streamed output into content and tool calls. Text that
/// may be the start of a call marker is held back until it is known not to
/// be one; calls come out whole, as soon as each is complete.
pub struct ToolParser {
    format: ToolFormat,
    /// Output not yet released.
    held: String,
    /// A call marker was seen: the rest is calls.
    in_calls: bool,
    /// Nothing but whitespace has come out yet (Llama 3 decides here).
    at_start: bool,
    /// With [`ToolParser::lenient`]: the declared functions, whose calls
    /// are also recognised in fenced JSON blocks.
    fenced_names: Option<Vec<String>>,
    pub calls: usize,
}

/// A Markdown code fence.
const FENCE: &str = "```";

impl ToolParser {
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            held: String::new(),
            in_calls: false,
            at_start: true,
            fenced_names: None,
            calls: 0,
        }
    }

    /// Also takes a call written as a fenced JSON block (```` ```json
    /// {"name": .., "arguments": {..}} ``` ````) when its name is one of
    /// `names`: small models (Qwen2.5-Coder 0.5B/1.5B) often write that
    /// instead of their template's marker. Other fenced blocks stay
    /// content, but come out only once closed, so it is off by default
    /// (vLLM's and llama-server's parsers do not take them either).
    /// Formats with a marker only: a Llama 3 call is bare JSON already.
    pub fn lenient(mut self, names: Vec<String>) -> Self {
        if self.format != ToolFormat::Llama3Json {
            self.fenced_names = Some(names);
        }
        self
    }

    /// Adds streamed text; returns what can be released now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        if !self.in_calls {
            self.find_start(&mut out);
        }
        if self.in_calls && self.format == ToolFormat::Hermes {
            while let Some(call) = self.take_hermes_block() {
                self.emit_call(call, &mut out);
            }
        }
        out
    }

    /// The end of the output: whatever is held is parsed, and what is not a
    /// valid call is released as content.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.held);
        if !self.in_calls {
            // A fenced call the length limit cut before its closing fence.
            let cut = rest.strip_prefix(FENCE).and_then(|b| self.fenced_call(b));
            if let Some(call) = cut {
                self.emit_call(call, &mut out);
            } else if !rest.is_empty() {
                out.push(Piece::Content(rest));
            }
            return out;
        }
        let calls = match self.format {
            // A bare call object, or an unterminated last block (max_tokens
            // cut it).
            ToolFormat::Hermes => {
                let body = rest.trim_start();
                let body = body.strip_prefix(HERMES_OPEN).unwrap_or(body);
                parse_call(body, self.format).map(|c| vec![c])
            }
            ToolFormat::Llama3Json => {
                let body = rest.trim().trim_start_matches(PYTHON_TAG);
                body.split(';')
                    .map(|c| parse_call(c, self.format))
                    .collect::<Option<Vec<_>>>()
            }
            ToolFormat::Mistral => {
                let body = rest.trim_start().trim_start_matches(MISTRAL_OPEN);
                match serde_json::from_str::<Value>(body.trim()) {
                    Ok(Value::Array(a)) => a
                        .iter()
                        .map(|c| call_from_json(c, self.format))
                        .collect::<Option<Vec<_>>>(),
                    _ => None,
                }
            }
        };
        match calls {
            Some(calls) => calls.into_iter().for_each(|c| self.emit_call(c, &mut out)),
            None if !rest.trim().is_empty() => out.push(Piece::Content(rest)),
            None => {}
        }
        out
    }

    fn emit_call(&mut self, c: ParsedCall, out: &mut Vec<Piece>) {
        self.calls += 1;
        out.push(Piece::Call(c));
    }

    /// Releases content up to a call marker (switching to calls), keeping
    /// back a tail that could still become one.
    fn find_start(&mut self, out: &mut Vec<Piece>) {
        // Small Hermes-trained models often drop the tags and answer with
        // the bare call object: an answer that starts with `{` is held to
        // the end and parsed as one (released as content if it is not).
        if self.format == ToolFormat::Hermes && self.at_start {
            let t = self.held.trim_start();
            if t.is_empty() {
                return;
            }
            self.at_start = false;
            if t.starts_with('{') {
                self.in_calls = true;
                return;
            }
        }
        let marker = match self.format {
            ToolFormat::Hermes => HERMES_OPEN,
            ToolFormat::Mistral => MISTRAL_OPEN,
            ToolFormat::Llama3Json => {
                // A call is the whole answer: decided by its first
                // non-space character.
                if self.at_start {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    self.at_start = false;
                    if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                        self.in_calls = true;
                        return;
                    }
                    if PYTHON_TAG.starts_with(t) {
                        self.at_start = true;
                        return;
                    }
                }
                out.push(Piece::Content(std::mem::take(&mut self.held)));
                return;
            }
        };
        while let Some(fence) = self.fence_before(marker) {
            if !self.take_fenced(fence, out) {
                return;
            }
        }
        if let Some(at) = self.held.find(marker) {
            let before = self.held[..at].trim_end().to_string();
            if !before.is_empty() {
                out.push(Piece::Content(before));
            }
            self.held.drain(..at);
            self.in_calls = true;
            return;
        }
        let fence = if self.fenced_names.is_some() {
            FENCE
        } else {
            ""
        };
        let keep = (1..marker.len().max(fence.len()))
            .rev()
            .find(|&k| {
                [marker, fence]
                    .iter()
                    .any(|m| k < m.len() && self.held.ends_with(&m[..k]))
            })
            .unwrap_or(0);
        // Whitespace before a marker is not content either: hold it too.
        let split = self.held[..self.held.len() - keep].trim_end().len();
        if split > 0 {
            out.push(Piece::Content(self.held[..split].to_string()));
            self.held.drain(..split);
        }
    }

    /// Where a fence opens in the held text ahead of any call marker, when
    /// fenced calls are taken.
    fn fence_before(&self, marker: &str) -> Option<usize> {
        self.fenced_names.as_ref()?;
        let fence = self.held.find(FENCE)?;
        match self.held.find(marker) {
            Some(m) if m < fence => None,
            _ => Some(fence),
        }
    }

    /// Releases the content before the fence at `at` and, once the block is
    /// closed, the block itself: as a call if it is one to a declared
    /// function, else as content. `false` while the block is still open.
    fn take_fenced(&mut self, at: usize, out: &mut Vec<Piece>) -> bool {
        if at > 0 {
            out.push(Piece::Content(self.held[..at].to_string()));
            self.held.drain(..at);
        }
        let Some(close) = self.held[FENCE.len()..].find(FENCE) else {
            return false;
        };
        let end = FENCE.len() + close + FENCE.len();
        let block: String = self.held.drain(..end).collect();
        match self.fenced_call(&block[FENCE.len()..close + FENCE.len()]) {
            Some(call) => self.emit_call(call, out),
            None => out.push(Piece::Content(block)),
        }
        true
    }

    /// The call in a fenced block's body (after an optional language tag
    /// such as `json`), if it calls a declared function.
    fn fenced_call(&self, body: &str) -> Option<ParsedCall> {
        let body = body.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
        let call = parse_call(body, self.format)?;
        let names = self.fenced_names.as_ref()?;
        names.contains(&call.name).then_some(call)
    }

    /// Takes one complete `<tool_call>...</tool_call>` block off the front.
    fn take_hermes_block(&mut self) -> Option<ParsedCall> {
        let start = self.held.find(HERMES_OPEN)?;
        let end = self.held[start..].find(HERMES_CLOSE)? + start;
        let call = parse_call(&self.held[start + HERMES_OPEN.len()..end], self.format);
        self.held.drain(..end + HERMES_CLOSE.len());
        call
    }
}

/// One call written as a JSON object.
fn parse_call(text: &str, format: ToolFormat) -> Option<ParsedCall> {
    call_from_json(&serde_json::from_str(text.trim()).ok()?, format)
}

fn call_from_json(v: &Value, format: ToolFormat) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get(format.args_key())
        .or_else(|| v.get("arguments"))
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    // Some models write the arguments as a JSON string already.
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn run(format: ToolFormat, pieces: &[&str]) -> Vec<Piece> {
        run_with(ToolParser::new(format), pieces)
    }

    fn run_with(mut p: ToolParser, pieces: &[&str]) -> Vec<Piece> {
        let mut out: Vec<Piece> = pieces.iter().flat_map(|t| p.push(t)).collect();
        out.extend(p.finish());
        // Merge adjacent content for comparison.
        let mut merged: Vec<Piece> = Vec::new();
        for x in out {
            match (merged.last_mut(), x) {
                (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
                (_, x) => merged.push(x),
            }
        }
        merged
    }

    fn call(name: &str, args: &str) -> Piece {
        Piece::Call(ParsedCall {
            name: name.into(),
            arguments: args.into(),
        })
    }

    #[test]
    fn hermes_blocks_split_anywhere() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let want = vec![
            Piece::Content("Let me check.".into()),
            call("get_weather", r#"{"city":"Paris"}"#),
            call("now", "{}"),
        ];
        for step in [1, 3, 7, text.len()] {
            let pieces: Vec<String> = text
                .as_bytes()
                .chunks(step)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(run(ToolFormat::Hermes, &refs), want, "step {step}");
        }
        // Text that only looks like the start of a marker is released.
        assert_eq!(
            run(ToolFormat::Hermes, &["a <tool", "s> b"]),
            vec![Piece::Content("a <tools> b".into())]
        );
        // A bare call object (no tags); JSON that is not a call is content.
        assert_eq!(
            run(
                ToolFormat::Hermes,
                &[" {\"name\": \"f\", \"argu", "ments\": {}}"]
            ),
            vec![call("f", "{}")]
        );
        assert_eq!(
            run(ToolFormat::Hermes, &["{\"a\": 1}"]),
            vec![Piece::Content("{\"a\": 1}".into())]
        );
        // Not JSON inside: nothing is lost, nothing is a call.
        assert_eq!(
            run(ToolFormat::Hermes, &["<tool_call>oops"]),
            vec![Piece::Content("<tool_call>oops".into())]
        );
    }

    fn run_lenient(pieces: &[&str]) -> Vec<Piece> {
        let names = vec!["get_weather".into()];
        run_with(ToolParser::new(ToolFormat::Hermes).lenient(names), pieces)
    }

    #[test]
    fn lenient_parsing_takes_fenced_calls_to_declared_functions() {
        let text = "Sure.\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```\nDone.";
        let want = vec![
            Piece::Content("Sure.\n".into()),
            call("get_weather", r#"{"city":"Paris"}"#),
            Piece::Content("\nDone.".into()),
        ];
        for step in [1, 2, 5, text.len()] {
            let pieces: Vec<String> = text
                .as_bytes()
                .chunks(step)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(run_lenient(&refs), want, "step {step}");
        }
        // Code, a call to an undeclared function, and an unclosed block
        // are content, unchanged.
        for text in [
            "```python\nprint(1)\n```",
            "```json\n{\"name\": \"launch\", \"arguments\": {}}\n```",
            "a ``` b",
            "```json\n{\"name\": \"get_weather\", ",
        ] {
            assert_eq!(run_lenient(&[text]), vec![Piece::Content(text.into())]);
        }
        // Cut by the length limit before its closing fence: still a call.
        assert_eq!(
            run_lenient(&["```json\n{\"name\": \"get_weather\", \"arguments\": {}}\n"]),
            vec![call("get_weather", "{}")]
        );
        // The template's own marker still works, and without `lenient` a
        // fenced call is content.
        assert_eq!(
            run_lenient(&[
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"
            ]),
            vec![call("get_weather", "{}")]
        );
        let fenced = "```json\n{\"name\": \"get_weather\", \"arguments\": {}}\n```";
        assert_eq!(
            run(ToolFormat::Hermes, &[fenced]),
            vec![Piece::Content(fenced.into())]
        );
    }

    #[test]
    fn llama3_and_mistral_calls() {
        assert_eq!(
            run(
                ToolFormat::Llama3Json,
                &[" {\"name\": \"f\", ", "\"parameters\": {\"x\": 1}}"]
            ),
            vec![call("f", r#"{"x":1}"#)]
        );
        assert_eq!(
            run(
                ToolFormat::Llama3Json,
                &["<|python", "_tag|>{\"name\": \"f\", \"parameters\": {}}"]
            ),
            vec![call("f", "{}")]
        );
        assert_eq!(
            run(ToolFormat::Llama3Json, &["Hello {there}"]),
            vec![Piece::Content("Hello {there}".into())]
        );
        assert_eq!(
            run(
                ToolFormat::Mistral,
                &[
                    "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, ",
                    "{\"name\": \"b\", \"arguments\": {}}]"
                ]
            ),
            vec![call("a", r#"{"q":"x"}"#), call("b", "{}")]
        );
    }

    #[test]
    fn formats_are_read_from_templates() {
        assert_eq!(
            ToolFormat::detect("{{ '<tool_call>\\n' }}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("[TOOL_CALLS] {{ x }}"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::detect("<|python_tag|>"),
            Some(ToolFormat::Llama3Json)
        );
        assert_eq!(ToolFormat::detect("{{ messages }}"), None);
    }

    #[test]
    fn tools_and_choices_are_checked() {
        let tools = parse_tools(&json!([
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "g"}}
        ]))
        .unwrap();
        assert_eq!(tools[1].parameters, json!({"type": "object"}));
        for bad in [
            json!({}),
            json!([{"type": "x", "function": {"name": "f"}}]),
            json!([{"type": "function", "function": {"name": ""}}]),
            json!([{"type": "function", "function": {"name": "f", "parameters": "no"}}]),
            json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]),
        ] {
            assert!(parse_tools(&bad).is_err(), "{bad}");
        }
        assert_eq!(parse_tool_choice(None, &tools).unwrap(), ToolChoice::Auto);
        assert_eq!(
            parse_tool_choice(
                Some(&json!({"type": "function", "function": {"name": "g"}})),
                &tools
            )
            .unwrap(),
            ToolChoice::Named("g".into())
        );
        for bad in [
            json!("sometimes"),
            json!({"type": "function", "function": {"name": "h"}}),
            json!({"function": {"name": "f"}}),
            json!(3),
        ] {
            assert!(parse_tool_choice(Some(&bad), &tools).is_err(), "{bad}");
        }
        assert!(parse_tool_choice(Some(&json!("required")), &[]).is_err());
    }
}
