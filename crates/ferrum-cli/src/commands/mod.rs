//! One module per subcommand, `repl` (`run`'s interactive chat) and
//! `thinking` (how `run` shows a model's reasoning).

pub mod bench;
pub mod bench_serve;
pub mod cache;
pub mod embed;
pub mod inspect;
pub mod perplexity;
pub mod ps;
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

/// "1.2 GB", "96.1 MB", "512 B" (decimal units, as download pages give).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1000.0;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_read_like_download_pages() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(96_100_000), "96.1 MB");
        assert_eq!(human_bytes(1_234_000_000), "1.2 GB");
    }
}
