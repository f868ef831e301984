//! Reasoning output: a thinking model (Qwen3, DeepSeek-R1 and their
//! fine-tunes) writes its reasoning between `<think>` and `</think>`, then
//! its answer. The parser splits streamed output into the two, as vLLM's
//! reasoning parsers and llama-server's `--reasoning-format deepseek` do, so
//! the API returns the answer as `content` and the reasoning as
//! `reasoning_content`.

/// A stretch of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a `<think>` may still open.
    Before,
    /// In the reasoning, until `</think>`.
    Inside,
    /// Just past `</think>`: the whitespace that follows it is dropped.
    Closed,
    /// In the answer.
    After,
}

/// Splits one sequence's streamed output into reasoning and answer. Text
/// that may be the start of a tag is held back until it is known.
pub struct ReasoningParser {
    state: State,
    held: String,
    /// Some reasoning text went out (whitespace before it is dropped).
    started: bool,
}

/// The longest tail of `text` that is a proper prefix of `tag`.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

impl ReasoningParser {
    /// The text that opens the reasoning.
    pub const OPEN: &'static str = "<think>";
    /// The text that ends the reasoning.
    pub const CLOSE: &'static str = "</think>";

    /// `inside`: the prompt already opened the reasoning (DeepSeek-R1's
    /// template, and Qwen3's thinking variants, end the generation prompt
    /// with `<think>`), so the output starts in it and only `</think>`
    /// comes.
    pub fn new(inside: bool) -> Self {
        Self {
            state: if inside { State::Inside } else { State::Before },
            held: String::new(),
            started: false,
        }
    }

    /// Whether a rendered prompt opened the reasoning for the model.
    pub fn prompt_opens(prompt: &str) -> bool {
        prompt.trim_end().ends_with(Self::OPEN)
    }

    /// Adds streamed text; returns what can be released now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Before => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(Self::OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Inside;
                    } else if Self::OPEN.starts_with(t) {
                        return out;
                    } else {
                        self.state = State::After;
                    }
                }
                State::Inside => match self.held.find(Self::CLOSE) {
                    Some(at) => {
                        let reasoning: String = self.held.drain(..at + Self::CLOSE.len()).collect();
                        let reasoning = &reasoning[..at];
                        let reasoning = if self.started {
                            reasoning.trim_end()
                        } else {
                            reasoning.trim()
                        };
                        if !reasoning.is_empty() {
                            out.push(Part::Reasoning(reasoning.to_string()));
                        }
                        self.state = State::Closed;
                    }
                    None => {
                        if !self.started {
                            self.held = self.held.trim_start().to_string();
                        }
                        // Whitespace that may end the reasoning waits for
                        // what follows it, so streamed and whole agree.
                        let body = self.held.len() - partial_tag(&self.held, Self::CLOSE);
                        let split = self.held[..body].trim_end().len();
                        if split > 0 {
                            out.push(Part::Reasoning(self.held.drain(..split).collect()));
                            self.started = true;
                        }
                        return out;
                    }
                },
                State::Closed => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = t.to_string();
                    self.state = State::After;
                }
                State::After => {
                    if !self.held.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the output: what is held is released (an unterminated
    /// reasoning stays reasoning, as the length limit cut it).
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.held);
        let part = match self.state {
            State::Inside => Part::Reasoning(rest.trim_end().to_string()),
            State::Before | State::After => Part::Content(rest),
            State::Closed => return Vec::new(),
        };
        match &part {
            Part::Reasoning(t) | Part::Content(t) if t.is_empty() => Vec::new(),
            _ => vec![part],
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `text` streamed in pieces of `step` bytes, parts merged.
    fn run(inside: bool, text: &str, step: usize) -> Vec<Part> {
        let mut p = ReasoningParser::new(inside);
        let mut out = Vec::new();
        for c in text.as_bytes().chunks(step) {
            out.extend(p.push(std::str::from_utf8(c).unwrap()));
        }
        out.extend(p.finish());
        let mut merged: Vec<Part> = Vec::new();
        for x in out {
            match (merged.last_mut(), x) {
                (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
                (Some(Part::Content(a)), Part::Content(b)) => a.push_str(&b),
                (_, x) => merged.push(x),
            }
        }
        merged
    }

    fn both(r: &str, c: &str) -> Vec<Part> {
        vec![Part::Reasoning(r.into()), Part::Content(c.into())]
    }

    #[test]
    fn reasoning_and_answer_split_anywhere() {
        for step in [1, 2, 3, 7, 100] {
            // Qwen3: the model opens the reasoning itself.
            let q = "<think>\nThe user greets.\nReply kindly.\n</think>\n\nHello!";
            assert_eq!(
                run(false, q, step),
                both("The user greets.\nReply kindly.", "Hello!")
            );
            // DeepSeek-R1: the prompt opened it.
            let r = "Think < hard </thi nk> ok.\n</think>\n\nThe answer is 4.";
            assert_eq!(
                run(true, r, step),
                both("Think < hard </thi nk> ok.", "The answer is 4.")
            );
            // No reasoning at all, or an empty one (enable_thinking false).
            assert_eq!(
                run(false, "  Hi <there>", step),
                vec![Part::Content("  Hi <there>".into())]
            );
            let empty = "<think>\n\n</think>\n\nHi";
            assert_eq!(run(false, empty, step), vec![Part::Content("Hi".into())]);
            // Cut by the length limit while reasoning.
            assert_eq!(
                run(true, "step one\nstep tw", step),
                vec![Part::Reasoning("step one\nstep tw".into())]
            );
        }
        assert!(ReasoningParser::prompt_opens("<|Assistant|><think>\n"));
        assert!(!ReasoningParser::prompt_opens("<|im_start|>assistant\n"));
    }
}
