//! Structured output for Ferrum: output that is guaranteed to parse,
//! because tokens the grammar does not allow are masked while sampling.
//!
//! - [`Grammars`] indexes a model's vocabulary once and compiles
//!   [`GrammarSpec`]s (JSON schema, JSON object, regex, choices, GBNF, Lark)
//!   with llguidance, the engine behind structured output in vLLM, SGLang
//!   and llama.cpp.
//! - [`Constraint`] is one sequence's grammar state: the engine applies its
//!   masks before sampling and feeds it every emitted token.
//! - [`tools`] reads a chat template's tool-call format, builds the grammar
//!   that enforces calls, and parses calls out of the output.
//! - [`reasoning`] splits a thinking model's output into its reasoning and
//!   its answer.

mod constraint;
mod gbnf;
mod grammar;
pub mod reasoning;
pub mod tools;
mod vocab;

pub use constraint::Constraint;
pub use gbnf::gbnf_to_lark;
pub use grammar::GrammarSpec;
pub use vocab::Grammars;
