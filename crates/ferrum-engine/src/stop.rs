//! Stop strings over streamed text.

/// Watches generated text for stop strings. Text that might be the start of
/// a stop string is held back until it is known not to be, so a stop string
/// split across tokens is never partly emitted.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds `delta`; returns the text now safe to emit and whether a stop
    /// string was reached (the returned text then ends right before it).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.held.push_str(delta);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(pos) = first {
            let out = self.held[..pos].to_string();
            self.held.clear();
            return (out, true);
        }
        // Longest suffix of `held` that is a proper prefix of a stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| s.char_indices().skip(1).map(move |(i, _)| &s[..i]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let split = self.held.len() - keep;
        let out = self.held[..split].to_string();
        self.held.drain(..split);
        (out, false)
    }

    /// Releases held text at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_across_token_boundaries_without_leaking() {
        let mut s = StopStrings::new(["</end>".to_string(), "\n\n".to_string()]);
        let mut out = String::new();
        let mut stopped = false;
        for piece in ["Hello", " wor", "ld</", "en", "d> tail"] {
            let (t, stop) = s.push(piece);
            out.push_str(&t);
            if stop {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert_eq!(out, "Hello world");

        let mut s = StopStrings::new(["ab".to_string()]);
        assert_eq!(s.push("xa"), ("x".to_string(), false), "'a' may start 'ab'");
        assert_eq!(s.push("c"), ("ac".to_string(), false));
        assert_eq!(s.push("a"), (String::new(), false));
        assert_eq!(s.finish(), "a");
        let mut s = StopStrings::new(["é!".to_string(), String::new()]);
        assert_eq!(s.push("café"), ("caf".to_string(), false));
        assert_eq!(
            s.push("!"),
            (String::new(), true),
            "the held é belongs to the stop string"
        );
    }
}
