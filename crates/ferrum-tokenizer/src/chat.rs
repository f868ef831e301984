//! Chat templates: the model's own Jinja template, rendered with minijinja
//! and Python-compatible string methods (`minijinja-contrib`'s pycompat).

use ferrum_types::{FerrumError, Result};
use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;

/// One chat message. `content` is plain text; `tool_calls` and the other
/// OpenAI fields travel as free-form JSON so templates can use them.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            extra: serde_json::Map::new(),
        }
    }
}

/// What a template is rendered with besides the messages.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions<'a> {
    pub add_generation_prompt: bool,
    /// OpenAI-style tool definitions, passed to the template as `tools`.
    pub tools: Option<&'a serde_json::Value>,
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// More variables for the template (a request's
    /// `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`), as
    /// transformers' `apply_chat_template(**kwargs)` passes them. The
    /// variables above win over one of the same name.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// `tojson` as Hugging Face defines it for chat templates: Python's
/// `json.dumps(x, ensure_ascii=False, indent=indent)`, so tool definitions
/// reach the model byte-for-byte as they would under transformers.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    py_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Serialises like Python's `json.dumps` with `ensure_ascii=False`.
fn py_json(v: &serde_json::Value, indent: Option<usize>, level: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 => {
                out.push_str(&format!("{f:.1}"))
            }
            (_, _, Some(f)) => out.push_str(&f.to_string()),
            _ => out.push_str("null"),
        },
        J::String(s) => py_str(s, out),
        J::Array(a) if a.is_empty() => out.push_str("[]"),
        J::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                py_json(x, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(m) if m.is_empty() => out.push_str("{}"),
        J::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                py_str(k, out);
                out.push_str(": ");
                py_json(x, indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

fn py_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

/// Instructions one render may run. A chat template is a loop over the
/// messages and the tools: tens to thousands of instructions for a real
/// conversation; a template that loops without end (from a model file)
/// stops here, in well under a second, instead of holding a thread.
const TEMPLATE_FUEL: u64 = 10_000_000;

/// Bytes one render may write: a prompt past this (16 MiB, millions of
/// tokens) can only come from a runaway template.
const TEMPLATE_OUTPUT_LIMIT: usize = 16 << 20;

/// Bytes that refuse to grow past [`TEMPLATE_OUTPUT_LIMIT`].
#[derive(Default)]
struct Bounded {
    out: Vec<u8>,
    full: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > TEMPLATE_OUTPUT_LIMIT {
            self.full = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; errors name what is wrong with the template.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        // Templates often end with a newline that is not meant to be output.
        env.set_keep_trailing_newline(false);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| FerrumError::invalid(format!("chat template does not compile: {e}")))?;
        Ok(Self { env })
    }

    /// Renders a conversation into the model's prompt format.
    pub fn render(&self, messages: &[Message], opts: &ChatOptions<'_>) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| FerrumError::invalid(format!("chat template: {e}")))?;
        let mut out = Bounded::default();
        let ctx = context! {
            messages => messages,
            add_generation_prompt => opts.add_generation_prompt,
            tools => opts.tools,
            bos_token => opts.bos_token,
            eos_token => opts.eos_token,
            ..Value::from_serialize(opts.kwargs)
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            // minijinja writes its strings whole: the bytes are UTF-8.
            Ok(_) => Ok(String::from_utf8_lossy(&out.out).into_owned()),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(FerrumError::invalid(format!(
                "chat template ran past {TEMPLATE_FUEL} steps (does it loop without end?)"
            ))),
            Err(_) if out.full => Err(FerrumError::invalid(format!(
                "chat template wrote over {} MiB",
                TEMPLATE_OUTPUT_LIMIT >> 20
            ))),
            Err(e) => Err(FerrumError::invalid(format!("chat template failed: {e}"))),
        }
    }
}
