//! One module per subcommand.

pub mod bench;
pub mod bench_serve;
pub mod cache;
pub mod embed;
pub mod inspect;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod tokenize;
