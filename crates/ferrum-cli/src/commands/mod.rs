//! One module per subcommand, and `thinking` (how `run` shows a model's
//! reasoning).

pub mod bench;
pub mod bench_serve;
pub mod cache;
pub mod embed;
pub mod inspect;
pub mod perplexity;
pub mod run;
pub mod serve;
mod thinking;
pub mod tokenize;
