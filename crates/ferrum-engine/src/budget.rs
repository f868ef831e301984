//! A reasoning budget: a thinking model's reasoning (`<think>...</think>`)
//! ends after a set number of tokens, by forcing the tokens that close it,
//! one per step (llama-server's `--reasoning-budget`, Anthropic's
//! `thinking.budget_tokens`). A model that closes its reasoning in time,
//! or never opens one, is left alone.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How much a request may think.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningBudget {
    /// Reasoning tokens allowed (0: the reasoning closes at once).
    pub tokens: usize,
    /// The tokens that end the reasoning (`\n</think>\n\n` in the model's
    /// vocabulary).
    pub close: Vec<u32>,
    /// The prompt opened the reasoning; otherwise it starts when the output
    /// writes `<think>`.
    pub inside: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Before,
    Inside,
    /// Forcing `close[i]` next.
    Closing(usize),
    Done,
}

/// One sequence's reasoning against its budget.
#[derive(Debug)]
pub struct BudgetState {
    budget: ReasoningBudget,
    phase: Phase,
    used: usize,
    /// The output's last few bytes, where a tag may be forming.
    tail: String,
}

impl BudgetState {
    pub fn new(budget: ReasoningBudget) -> Self {
        let mut s = Self {
            phase: Phase::Before,
            used: 0,
            tail: String::new(),
            budget,
        };
        if s.budget.inside {
            s.enter();
        }
        s
    }

    fn enter(&mut self) {
        self.phase = match (self.budget.tokens, self.budget.close.is_empty()) {
            (_, true) => Phase::Done,
            (0, false) => Phase::Closing(0),
            _ => Phase::Inside,
        };
    }

    /// The token the next step must produce: the budget is spent and the
    /// reasoning is being closed.
    pub fn forced(&self) -> Option<u32> {
        match self.phase {
            Phase::Closing(i) => self.budget.close.get(i).copied(),
            _ => None,
        }
    }

    /// Accounts for one emitted token and the text it completed.
    pub fn observe(&mut self, text: &str) {
        match self.phase {
            Phase::Closing(i) => {
                self.phase = if i + 1 >= self.budget.close.len() {
                    Phase::Done
                } else {
                    Phase::Closing(i + 1)
                };
            }
            Phase::Done => {}
            Phase::Before => {
                if self.saw(text, OPEN) {
                    self.enter();
                }
            }
            Phase::Inside => {
                if self.saw(text, CLOSE) {
                    self.phase = Phase::Done;
                } else {
                    self.used += 1;
                    if self.used >= self.budget.tokens {
                        self.phase = Phase::Closing(0);
                    }
                }
            }
        }
    }

    /// Adds `text` to the tail; whether `tag` is in it (the tail restarts
    /// after a tag).
    fn saw(&mut self, text: &str, tag: &str) -> bool {
        self.tail.push_str(text);
        if self.tail.contains(tag) {
            self.tail.clear();
            return true;
        }
        // Keep what could still be the start of a tag.
        let keep = self.tail.len().saturating_sub(CLOSE.len());
        let cut = (keep..=self.tail.len())
            .find(|&i| self.tail.is_char_boundary(i))
            .unwrap_or(self.tail.len());
        self.tail.drain(..cut);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forced tokens at each step, for the outputs in `texts` (a step
    /// whose token is forced takes the forced token instead).
    fn run(budget: ReasoningBudget, texts: &[&str]) -> Vec<Option<u32>> {
        let mut s = BudgetState::new(budget);
        let mut out = Vec::new();
        for t in texts {
            let forced = s.forced();
            out.push(forced);
            s.observe(if forced.is_some() { "" } else { t });
        }
        out.push(s.forced());
        out
    }

    fn budget(tokens: usize, inside: bool) -> ReasoningBudget {
        ReasoningBudget { tokens, close: vec![7, 8], inside }
    }

    #[test]
    fn the_close_is_forced_once_the_budget_is_spent() {
        let steps = run(budget(2, true), &["a", "b", "c", "d", "e"]);
        assert_eq!(steps, [None, None, Some(7), Some(8), None, None]);
    }

    #[test]
    fn a_model_that_closes_in_time_or_never_thinks_is_left_alone() {
        assert_eq!(
            run(budget(3, true), &["a", "</th", "ink>", "x", "y"]),
            [None; 6]
        );
        assert_eq!(run(budget(1, false), &["Hello", " there", "!"]), [None; 4]);
    }

    #[test]
    fn reasoning_opened_by_the_output_counts_from_there_and_zero_closes_at_once() {
        let steps = run(budget(1, false), &["<thi", "nk>", "a", "b", "c", "d"]);
        assert_eq!(steps, [None, None, None, Some(7), Some(8), None, None]);
        assert_eq!(
            run(budget(0, true), &["a", "b", "c"]),
            [Some(7), Some(8), None, None]
        );
    }
}
