//! How `ferrum run` shows a thinking model's reasoning (`<think>...</think>`,
//! Qwen3 and DeepSeek-R1 style): dimmed on a terminal, as it is elsewhere,
//! or left out with `--hide-thinking`.

use ferrum_structured::reasoning::{Part, ReasoningParser};

/// ANSI "faint" and "reset".
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Turns an answer's streamed text into what is printed.
pub struct ThinkingView {
    /// `None`: the model does not think (its template never writes
    /// `<think>`): text goes out as it comes.
    parser: Option<ReasoningParser>,
    hide: bool,
    dim: bool,
    /// Inside a dimmed stretch (a reset is owed).
    dimmed: bool,
    /// Reasoning went out: the answer starts on a new line.
    shown: bool,
}

impl ThinkingView {
    /// `thinks`: the chat template writes `<think>`; `prompt` is the
    /// rendered prompt (it may already open the reasoning).
    pub fn new(thinks: bool, prompt: &str, hide: bool, dim: bool) -> Self {
        Self {
            parser: thinks.then(|| ReasoningParser::new(ReasoningParser::prompt_opens(prompt))),
            hide,
            dim,
            dimmed: false,
            shown: false,
        }
    }

    /// What to print for the next piece of the answer.
    pub fn push(&mut self, text: &str) -> String {
        match &mut self.parser {
            None => text.to_string(),
            Some(p) => {
                let parts = p.push(text);
                self.render(parts)
            }
        }
    }

    /// What to print at the end of the answer.
    pub fn finish(&mut self) -> String {
        let parts = self.parser.as_mut().map(ReasoningParser::finish);
        let mut out = self.render(parts.unwrap_or_default());
        if self.dimmed {
            out.push_str(RESET);
            self.dimmed = false;
        }
        out
    }

    fn render(&mut self, parts: Vec<Part>) -> String {
        let mut out = String::new();
        for part in parts {
            match part {
                Part::Reasoning(_) if self.hide => {}
                Part::Reasoning(r) => {
                    if self.dim && !self.dimmed {
                        out.push_str(DIM);
                        self.dimmed = true;
                    }
                    out.push_str(&r);
                    self.shown = true;
                }
                Part::Content(c) => {
                    if self.dimmed {
                        out.push_str(RESET);
                        self.dimmed = false;
                    }
                    if std::mem::take(&mut self.shown) {
                        out.push_str("\n\n");
                    }
                    out.push_str(&c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything printed for `pieces`.
    fn printed(view: &mut ThinkingView, pieces: &[&str]) -> String {
        let mut out: String = pieces.iter().map(|p| view.push(p)).collect();
        out.push_str(&view.finish());
        out
    }

    const PIECES: &[&str] = &[
        "<th",
        "ink>Two plus",
        " two is four.</thi",
        "nk>\n\nIt is ",
        "4.",
    ];

    #[test]
    fn reasoning_is_dimmed_hidden_or_left_alone() {
        let dimmed = printed(&mut ThinkingView::new(true, "", false, true), PIECES);
        assert_eq!(dimmed, "\x1b[2mTwo plus two is four.\x1b[0m\n\nIt is 4.");
        let plain = printed(&mut ThinkingView::new(true, "", false, false), PIECES);
        assert_eq!(plain, "Two plus two is four.\n\nIt is 4.");
        let hidden = printed(&mut ThinkingView::new(true, "", true, true), PIECES);
        assert_eq!(hidden, "It is 4.");
        let other = printed(&mut ThinkingView::new(false, "", true, true), PIECES);
        assert_eq!(
            other,
            PIECES.concat(),
            "a model that does not think prints as is"
        );
    }

    #[test]
    fn a_prompt_that_opens_the_reasoning_and_an_answer_cut_inside_it() {
        let prompt = "<|im_start|>assistant\n<think>\n";
        let hidden = printed(
            &mut ThinkingView::new(true, prompt, true, false),
            &["Hmm, ", "x</think>Yes."],
        );
        assert_eq!(hidden, "Yes.");
        let cut = printed(
            &mut ThinkingView::new(true, prompt, false, true),
            &["Still thinking"],
        );
        assert_eq!(
            cut, "\x1b[2mStill thinking\x1b[0m",
            "the reset comes even when no answer follows"
        );
    }
}
