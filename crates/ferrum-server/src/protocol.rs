//! OpenAI request bodies and their validation into engine parameters.
//!
//! Bodies are parsed from raw bytes here (not by an extractor) so every
//! malformed or out-of-range field becomes a 400 in OpenAI's error shape
//! that names the field.

use std::borrow::Cow;

use ferrum_engine::{EmbedInput, ReasoningBudget, SamplingParams};
use ferrum_formats::sampling::RecommendedSampling;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// `stop`: one string or a list (OpenAI allows up to 4).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and length fields shared by chat and completions.
#[derive(Deserialize, Default)]
pub struct GenFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    /// Chat: a bool; completions: the number of top alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    /// Token id (a decimal string) -> bias in [-100, 100].
    pub logit_bias: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub user: Option<String>,
    /// Structured output (see `structured.rs`): OpenAI's field, llama-server's
    /// GBNF `grammar`, and vLLM's `guided_*` extensions.
    pub response_format: Option<Value>,
    /// vLLM's extension: keep generating past end-of-sequence tokens.
    #[serde(default)]
    pub ignore_eos: bool,
    pub grammar: Option<String>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Variables for the chat template (vLLM's and llama-server's
    /// extension, e.g. `{"enable_thinking": false}` for Qwen3).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// vLLM's: end the prompt with the template's opening of an assistant
    /// turn (default true).
    pub add_generation_prompt: Option<bool>,
    /// vLLM's: the last message (an assistant's) is left open and the
    /// answer continues it: a cut answer goes on, or a prefilled start.
    pub continue_final_message: Option<bool>,
    #[serde(flatten)]
    pub gen: GenFields,
    /// Every other field: refused (see [`reject_unknown`]).
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, Value>,
}

/// How a rendered chat ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ending {
    /// With the opening of a new assistant turn (the usual request).
    #[default]
    NewAnswer,
    /// As the template ends the last message.
    AsIs,
    /// Inside the last message, which the answer continues.
    ContinueLast,
}

impl ChatRequest {
    /// The ending these fields ask for; asking for both a new turn and the
    /// last one continued is an error, as in vLLM.
    pub fn ending(&self) -> Result<Ending, ApiError> {
        match (self.add_generation_prompt, self.continue_final_message) {
            (Some(true), Some(true)) => Err(ApiError::invalid(
                "add_generation_prompt and continue_final_message cannot both be true",
                Some("continue_final_message"),
            )),
            (_, Some(true)) => Ok(Ending::ContinueLast),
            (Some(false), _) => Ok(Ending::AsIs),
            _ => Ok(Ending::NewAnswer),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub gen: GenFields,
    /// Every other field: refused (see [`reject_unknown`]).
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
pub struct EmbeddingRequest {
    /// Checked by hand ([`embedding_inputs`]) for a precise message.
    pub input: Value,
    pub model: Option<String>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
}

/// `prompt` is borrowed from the body where it has no escapes: a 16 MB
/// text is then never copied (the body and the ids are what is held).
#[derive(Deserialize)]
pub struct TokenizeRequest<'a> {
    pub model: Option<String>,
    #[serde(borrow)]
    pub prompt: Option<Text<'a>>,
    pub messages: Option<Vec<ChatMessage>>,
    /// As on chat requests: variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
}

/// A JSON string borrowed from the body unless it has escapes. (serde
/// borrows a `Cow<str>` field only when it is not inside an `Option`;
/// the newtype carries the `borrow` down.)
#[derive(Deserialize)]
#[serde(transparent)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// Parses a JSON body into `T`: a syntax error, a missing field or a wrong
/// type is a 400 whose message says which.
///
/// Straight into `T`, not through a `serde_json::Value` first: a string
/// in a `Value` grows by doubling as it is read, so a 16 MB prompt held
/// up to 48 MB at once (the old and the new buffer) beside the body.
pub fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "invalid request",
            _ => "malformed JSON body",
        };
        ApiError::invalid(format!("{what}: {e}"), None)
    })
}

/// vLLM's and SGLang's output options that Ferrum does not implement, at
/// the value that means what Ferrum does anyway. Routers in front of those
/// servers (vllm-router, sglang-router) write them into every request they
/// pass on; at these values they ask for nothing, so they are accepted.
const DEFAULT_ONLY: &[(&str, bool)] = &[
    ("skip_special_tokens", true),
    ("spaces_between_special_tokens", true),
    ("include_stop_str_in_output", false),
    ("no_stop_trim", false),
    ("return_hidden_states", false),
];

/// Refuses fields the server does not implement, naming them: a client that
/// asks for something (`best_of`, `suffix`, the legacy `functions` ...)
/// must not silently get something else.
pub fn reject_unknown(unknown: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let asks = |(name, value): &(&String, &Value)| {
        !DEFAULT_ONLY
            .iter()
            .any(|(n, default)| n == name && value.as_bool() == Some(*default))
    };
    let names: Vec<&str> = unknown
        .iter()
        .filter(asks)
        .map(|(k, _)| k.as_str())
        .collect();
    let Some(first) = names.first().copied() else {
        return Ok(());
    };
    Err(ApiError {
        param: Some(first.to_string().into()),
        ..ApiError::invalid(
            format!(
                "unsupported request field{} {}: ferrum does not implement {}; remove {}",
                if names.len() > 1 { "s" } else { "" },
                names.join(", "),
                if names.len() > 1 { "them" } else { "it" },
                if names.len() > 1 { "them" } else { "it" },
            ),
            None,
        )
    })
}

/// Like [`reject_unknown`], but fields named in `no_effect` (accepted for
/// clients' sake, with no effect on a local server) pass.
pub fn reject_unknown_except(
    unknown: &mut serde_json::Map<String, Value>,
    no_effect: &[&str],
) -> Result<(), ApiError> {
    unknown.retain(|k, _| !no_effect.contains(&k.as_str()));
    reject_unknown(unknown)
}

/// A chat request's function tool, its keys in the order OpenAI's clients
/// write them (name, description, parameters): templates print tools as
/// JSON, keys in order, so another order is another prompt.
pub fn function_tool(
    name: &Value,
    description: Option<&Value>,
    parameters: Option<&Value>,
) -> Value {
    let mut f = serde_json::Map::new();
    f.insert("name".into(), name.clone());
    if let Some(d) = description {
        f.insert("description".into(), d.clone());
    }
    if let Some(p) = parameters {
        f.insert("parameters".into(), p.clone());
    }
    serde_json::json!({"type": "function", "function": f})
}

/// What generation needs from a request, validated.
pub struct GenParams {
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub n: usize,
    /// Top alternatives per token to report; `None` when logprobs are off.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Set for chat requests to a thinking model (see `prepare_chat`).
    pub reasoning_budget: Option<ReasoningBudget>,
}

fn range(
    v: Option<f32>,
    name: &'static str,
    lo: f32,
    hi: f32,
    default: f32,
) -> Result<f32, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        Some(x) => Err(ApiError::invalid(
            format!("{name} is {x}; it must be between {lo} and {hi}"),
            Some(name),
        )),
    }
}

/// OpenAI's `logit_bias`: an object from token ids (decimal strings) to
/// numbers in [-100, 100]. Whether the ids are in the vocabulary is checked
/// where the tokenizer is known.
fn logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("logit_bias"));
    let map = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(bad(
                "logit_bias must be an object from token ids to numbers".into(),
            ))
        }
    };
    map.iter()
        .map(|(k, b)| {
            let id = k
                .trim()
                .parse::<u32>()
                .map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
            match b.as_f64() {
                Some(x) if (-100.0..=100.0).contains(&x) => Ok((id, x as f32)),
                _ => Err(bad(format!(
                    "logit_bias of token {id} is {b}; it must be a number between -100 and 100"
                ))),
            }
        })
        .collect()
}

impl GenFields {
    /// `chat` selects the chat flavour of `logprobs` (a bool plus
    /// `top_logprobs`) over the completions one (an integer).
    /// The request's parameters, checked; values it leaves out are the
    /// model's recommendation (`model`) where there is one, else OpenAI's
    /// defaults.
    pub fn validate(&self, chat: bool, model: &RecommendedSampling) -> Result<GenParams, ApiError> {
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => None,
            Some(m) if m >= 1 => Some(m as usize),
            Some(m) => {
                return Err(ApiError::invalid(
                    format!("max_tokens is {m}; it must be at least 1"),
                    Some("max_tokens"),
                ))
            }
        };
        let n = match self.n {
            None => 1,
            Some(n) if (1..=16).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    format!("n is {n}; it must be between 1 and 16"),
                    Some("n"),
                ))
            }
        };
        let top_k = match self.top_k {
            None => model.top_k.unwrap_or(0),
            Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("top_k is {k}; it must be -1 (off) or positive"),
                    Some("top_k"),
                ))
            }
        };
        // OpenAI seeds are signed 64-bit; any value is a valid seed.
        let seed = self.seed.map(|s| s as u64);
        let logprobs = if chat {
            let on = match &self.logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "logprobs must be a boolean",
                        Some("logprobs"),
                    ))
                }
            };
            match (on, self.top_logprobs) {
                (_, Some(t)) if !(0..=20).contains(&t) => {
                    return Err(ApiError::invalid(
                        format!("top_logprobs is {t}; it must be between 0 and 20"),
                        Some("top_logprobs"),
                    ))
                }
                (false, Some(t)) if t > 0 => {
                    return Err(ApiError::invalid(
                        "top_logprobs requires logprobs to be true",
                        Some("top_logprobs"),
                    ))
                }
                (true, t) => Some(t.unwrap_or(0) as usize),
                (false, _) => None,
            }
        } else {
            match &self.logprobs {
                None | Some(Value::Null) => None,
                Some(v) => match v.as_i64() {
                    Some(k) if (0..=5).contains(&k) => Some(k as usize),
                    _ => {
                        return Err(ApiError::invalid(
                            "logprobs must be an integer between 0 and 5",
                            Some("logprobs"),
                        ))
                    }
                },
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
            Some(Stop::Many(_)) => {
                return Err(ApiError::invalid(
                    "stop takes at most 4 sequences",
                    Some("stop"),
                ))
            }
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop sequences must not be empty",
                Some("stop"),
            ));
        }
        let sampling = SamplingParams {
            temperature: range(
                self.temperature,
                "temperature",
                0.0,
                2.0,
                model.temperature.unwrap_or(1.0),
            )?,
            top_k,
            top_p: range(self.top_p, "top_p", 0.0, 1.0, model.top_p.unwrap_or(1.0))?,
            min_p: range(self.min_p, "min_p", 0.0, 1.0, model.min_p.unwrap_or(0.0))?,
            repetition_penalty: range(
                self.repetition_penalty,
                "repetition_penalty",
                0.01,
                10.0,
                model.repeat_penalty.unwrap_or(1.0),
            )?,
            presence_penalty: range(self.presence_penalty, "presence_penalty", -2.0, 2.0, 0.0)?,
            frequency_penalty: range(self.frequency_penalty, "frequency_penalty", -2.0, 2.0, 0.0)?,
            seed,
            // The sampler reports at least the chosen token's logprob when
            // asked for alternatives; 1 gets us that token's own logprob.
            top_logprobs: logprobs.map_or(0, |k| k.max(1)),
            logit_bias: logit_bias(self.logit_bias.as_ref())?,
        };
        if sampling.top_p == 0.0 {
            return Err(ApiError::invalid(
                "top_p must be greater than 0",
                Some("top_p"),
            ));
        }
        sampling
            .validate()
            .map_err(|e| ApiError::invalid(e.to_string(), None))?;
        Ok(GenParams {
            max_tokens,
            sampling,
            stop,
            n,
            logprobs,
            stream: self.stream,
            ignore_eos: self.ignore_eos,
            reasoning_budget: None,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        })
    }
}

impl ChatMessage {
    /// The text content: a string, or the concatenated text parts.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(s)) => Ok(s.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!(
                                    "content part of type {kind:?} is not supported (only text)"
                                ),
                                Some("messages"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// OpenAI's `input`: a string, a list of strings, a list of token ids, or a
/// list of token-id lists.
pub fn embedding_inputs(v: &Value) -> Result<Vec<EmbedInput>, ApiError> {
    let bad = |m: String| ApiError::invalid(m, Some("input"));
    let ids = |v: &Value, i: usize| -> Result<Vec<u32>, ApiError> {
        let arr = v.as_array().ok_or_else(|| {
            bad(format!(
                "input[{i}] must be a string or an array of token ids"
            ))
        })?;
        arr.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| bad(format!("input[{i}] holds {t}, which is not a token id")))
            })
            .collect()
    };
    match v {
        Value::String(s) => Ok(vec![EmbedInput::Text(s.clone())]),
        Value::Array(a) if a.is_empty() => Err(bad("input must not be an empty list".into())),
        Value::Array(a) if a.iter().all(Value::is_number) => {
            Ok(vec![EmbedInput::Tokens(ids(v, 0)?)])
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                Value::Array(_) => Ok(EmbedInput::Tokens(ids(x, i)?)),
                other => Err(bad(format!(
                    "input[{i}] is {other}; expected a string or an array of token ids"
                ))),
            })
            .collect(),
        other => Err(bad(format!(
            "input is {other}; expected a string or an array"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gen(body: &str) -> Result<GenParams, ApiError> {
        parse::<GenFields>(body.as_bytes())?.validate(true, &RecommendedSampling::default())
    }

    #[test]
    fn a_models_recommendation_fills_what_a_request_leaves_out() {
        let model = RecommendedSampling {
            temperature: Some(0.7),
            top_k: Some(20),
            top_p: Some(0.8),
            min_p: None,
            repeat_penalty: Some(1.1),
        };
        let with = |body: &str| {
            parse::<GenFields>(body.as_bytes())
                .and_then(|g| g.validate(true, &model))
                .map(|p| p.sampling)
        };
        let s = with("{}").unwrap();
        assert_eq!(
            (
                s.temperature,
                s.top_k,
                s.top_p,
                s.min_p,
                s.repetition_penalty
            ),
            (0.7, 20, 0.8, 0.0, 1.1)
        );
        // What the request sets wins, a -1 or 0 top_k included.
        let s = with(r#"{"temperature": 0, "top_k": -1, "top_p": 1, "repetition_penalty": 1}"#)
            .unwrap();
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.repetition_penalty),
            (0.0, 0, 1.0, 1.0)
        );
    }

    #[test]
    fn defaults_follow_openai() {
        let p = gen("{}").unwrap();
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.sampling.top_p, 1.0);
        assert_eq!((p.n, p.max_tokens, p.logprobs), (1, None, None));
        let p = gen(r#"{"max_tokens": 5, "max_completion_tokens": 7, "stop": "x", "seed": 3}"#)
            .unwrap();
        assert_eq!(p.max_tokens, Some(7), "max_completion_tokens wins");
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert_eq!(p.sampling.seed, Some(3));
    }

    #[test]
    fn bodies_that_are_not_requests_say_why() {
        let msg = |b: &[u8]| match parse::<TokenizeRequest>(b) {
            Ok(_) => "ok".to_string(),
            Err(e) => e.message,
        };
        for (body, starts) in [
            (&b"[1, 2]"[..], "the request body must be a JSON object"),
            (b" \n\"text\"", "the request body must be a JSON object"),
            (b"", "malformed JSON body"),
            (b"{\"prompt\": \"a", "malformed JSON body"),
            (b"{\"prompt\": 5}", "invalid request"),
            (b"{\"prompt\": \"a\\u00e9\"}", "ok"),
        ] {
            let got = msg(body);
            assert!(got.starts_with(starts), "{body:?}: {got}");
        }
        let big = format!("{{\"prompt\": \"{}\"}}", "word ".repeat(1000));
        let req: TokenizeRequest = parse(big.as_bytes()).unwrap();
        // Borrowed from the body, not copied.
        assert!(matches!(&req.prompt, Some(Text(Cow::Borrowed(p))) if p.len() == 5000));
        let escaped: TokenizeRequest = parse(br#"{"prompt": "a\u00e9"}"#).unwrap();
        assert!(matches!(escaped.prompt, Some(Text(Cow::Owned(p))) if p == "a\u{e9}"));
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let req: ChatRequest =
            parse(br#"{"messages": [], "temperature": 0, "functions": [], "best_of": 2}"#).unwrap();
        let e = reject_unknown(&req.unknown).unwrap_err();
        assert!(e.message.contains("functions") && e.message.contains("best_of"));
        assert!(e.param.is_some());
        let req: CompletionRequest = parse(
            br#"{"prompt": "x", "echo": true, "user": "u", "seed": 1, "logit_bias": {"3": 1}, "stream_options": {"include_usage": true}}"#,
        )
        .unwrap();
        assert!(reject_unknown(&req.unknown).is_ok(), "{:?}", req.unknown);
        // What vllm-router adds to every request: defaults, accepted.
        let req: CompletionRequest = parse(
            br#"{"prompt": "x", "no_stop_trim": false, "skip_special_tokens": true, "return_hidden_states": false}"#,
        )
        .unwrap();
        assert!(reject_unknown(&req.unknown).is_ok(), "{:?}", req.unknown);
        // Asking for what they do is refused, by name.
        let req: CompletionRequest =
            parse(br#"{"prompt": "x", "skip_special_tokens": false, "no_stop_trim": false}"#)
                .unwrap();
        let e = reject_unknown(&req.unknown).unwrap_err();
        assert!(e.message.contains("skip_special_tokens") && !e.message.contains("no_stop_trim"));
        assert_eq!(e.param.as_deref(), Some("skip_special_tokens"));
    }

    #[test]
    fn logit_bias_is_parsed_and_checked() {
        let mut p = gen(r#"{"logit_bias": {"5": -100, "7": 2.5}}"#).unwrap();
        p.sampling.logit_bias.sort_by_key(|b| b.0);
        assert_eq!(p.sampling.logit_bias, vec![(5, -100.0), (7, 2.5)]);
        for body in [
            r#"{"logit_bias": {"5": 101}}"#,
            r#"{"logit_bias": {"x": 1}}"#,
            r#"{"logit_bias": {"5": "big"}}"#,
            r#"{"logit_bias": [5]}"#,
        ] {
            let e = gen(body).err().unwrap();
            assert_eq!(e.param.as_deref(), Some("logit_bias"), "{body}");
        }
    }

    #[test]
    fn out_of_range_fields_are_named() {
        for (body, field) in [
            (r#"{"temperature": 2.5}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"n": 17}"#, "n"),
            (r#"{"top_k": -3}"#, "top_k"),
            (r#"{"logprobs": 3}"#, "logprobs"),
            (r#"{"top_logprobs": 2}"#, "top_logprobs"),
            (r#"{"stop": ["a", ""]}"#, "stop"),
        ] {
            let e = gen(body).err().unwrap();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
        }
        for body in ["{", "[]", r#"{"temperature": "hot"}"#, r#"{"stream": 1}"#] {
            assert!(gen(body).is_err(), "{body}");
        }
    }

    #[test]
    fn embedding_input_shapes() {
        let v = |s: &str| embedding_inputs(&serde_json::from_str(s).unwrap());
        assert_eq!(v(r#""a""#).unwrap(), vec![EmbedInput::Text("a".into())]);
        assert_eq!(v("[1, 2]").unwrap(), vec![EmbedInput::Tokens(vec![1, 2])]);
        assert_eq!(
            v(r#"["a", [3]]"#).unwrap(),
            vec![EmbedInput::Text("a".into()), EmbedInput::Tokens(vec![3])]
        );
        for bad in ["[]", "3", r#"["a", 3]"#, "[[-1]]", r#"{"a": 1}"#, "[[1.5]]"] {
            assert!(v(bad).is_err(), "{bad}");
        }
    }
}
