//! One module per subcommand, `repl` (`run`'s interactive chat) and
//! `thinking` (how `run` shows a model's reasoning).

pub mod bench;
pub mod bench_serve;
pub mod cache;
pub mod embed;
pub mod inspect;
pub mod perplexity;
mod repl;
pub mod run;
pub mod serve;
mod thinking;
pub mod tokenize;

/// A count that must be at least 1 (`-n`), with an error that says so for
/// `-5` or `0`, where the number parser would only say "invalid digit".
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => usize::try_from(n).map_err(|e| e.to_string()),
        Ok(n) => Err(format!(
            "{n} is not allowed: give a whole number of at least 1"
        )),
        Err(_) => Err(format!(
            "{s:?} is not a whole number (give one of at least 1)"
        )),
    }
}
