//! What a request may constrain its output to, in the forms clients send
//! (OpenAI's `response_format`, vLLM's `guided_*`, llama-server's GBNF
//! `grammar`), turned into one llguidance grammar.

use ferrum_types::{FerrumError, Result};
use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::gbnf::gbnf_to_lark;

/// A constraint on generated text.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid under this schema (`json_schema`, `guided_json`).
    JsonSchema(Value),
    /// Text matching this regular expression, whole (`guided_regex`).
    Regex(String),
    /// Exactly one of these strings (`guided_choice`).
    Choice(Vec<String>),
    /// A GBNF grammar as llama.cpp takes it (`grammar`).
    Gbnf(String),
    /// A grammar in llguidance's Lark dialect (tool calls are built as one).
    Lark(String),
}

/// How generated JSON is laid out: Python's `json.dumps` separators and no
/// free whitespace. Flexible whitespace lets small models emit newlines
/// forever inside an object that never closes; a fixed layout is still any
/// JSON parser's JSON.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// The layout of `json_object` output, where no schema names the keys: the
/// whitespace models write (a newline and indentation, or spaces), each run
/// at most one newline and 24 spaces or tabs.
///
/// The fixed layout forbade `{` followed by a newline, which is how models
/// like to start an object, and left `{}` the likeliest allowed start
/// (Qwen2.5 0.5B: log-probability -0.73 against -1.67 for `{"`): empty or
/// half-filled objects. The bound keeps the reason for the fixed layout:
/// whitespace cannot run on forever, each run must be followed by JSON.
fn free_json_layout() -> Value {
    json!({"whitespace_flexible": false,
           "whitespace_pattern": r"[\x20\x09]{1,24}|\x0D?\x0A[\x20\x09]{0,24}",
           "item_separator": ",", "key_separator": ":"})
}

/// `schema` with Ferrum's JSON layout, unless it sets its own
/// (`x-guidance` is llguidance's per-schema options key).
pub(crate) fn with_layout(schema: &Value) -> Value {
    with(schema, json_layout)
}

fn with(schema: &Value, layout: fn() -> Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(m) = &mut s {
        m.entry("x-guidance").or_insert_with(layout);
    }
    s
}

impl GrammarSpec {
    /// Checks the shape of the spec itself (a schema must be an object,
    /// choices not empty); whether llguidance can enforce it is found when
    /// it is compiled.
    pub fn validate(&self) -> Result<()> {
        match self {
            Self::JsonSchema(s) if !s.is_object() && !s.is_boolean() => {
                Err(FerrumError::invalid("a JSON schema must be an object"))
            }
            Self::Choice(c) if c.is_empty() => Err(FerrumError::invalid(
                "the list of choices must not be empty",
            )),
            Self::Regex(r) if r.is_empty() => Err(FerrumError::invalid("the regex is empty")),
            Self::Gbnf(g) | Self::Lark(g) if g.trim().is_empty() => {
                Err(FerrumError::invalid("the grammar is empty"))
            }
            _ => Ok(()),
        }
    }

    /// The llguidance grammar; `literal` writes a string as Lark text (the
    /// vocabulary's `Grammars::lark_literal`, which knows control tokens).
    pub(crate) fn to_llguidance(
        &self,
        literal: impl Fn(&str) -> String,
    ) -> Result<TopLevelGrammar> {
        self.validate()?;
        Ok(match self {
            Self::JsonObject => TopLevelGrammar::from_json_schema(with(
                &json!({"type": "object"}),
                free_json_layout,
            )),
            Self::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_layout(s)),
            Self::Regex(r) => TopLevelGrammar::from_regex(r),
            Self::Choice(c) => {
                let alts: Vec<String> = c.iter().map(|s| literal(s)).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            Self::Gbnf(src) => TopLevelGrammar::from_lark(gbnf_to_lark(src)?),
            Self::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        })
    }
}

/// `%json` for embedding `schema` inside a Lark grammar.
pub(crate) fn lark_json(schema: &Value) -> String {
    format!("%json {}", with_layout(schema))
}
