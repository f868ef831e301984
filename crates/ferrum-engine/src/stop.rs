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

    /// Adds `delta`; returns the text now safe to emit and the stop string
    /// reached, if one was (the returned text then ends right before it;
    /// of two that start there, the one listed first).
    pub fn push(&mut self, delta: &str) -> (String, Option<String>) {
        self.held.push_str(delta);
        let first = self
            .stops
            .iter()
            .filter_map(|s| Some((self.held.find(s.as_str())?, s)))
            .min_by_key(|m| m.0);
        if let Some((pos, stop)) = first {
            let (out, stop) = (self.held[..pos].to_string(), stop.clone());
            self.held.clear();
            return (out, Some(stop));
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
        (out, None)
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
        let mut stopped = None;
        for piece in ["Hello", " wor", "ld</", "en", "d> tail"] {
            let (t, stop) = s.push(piece);
            out.push_str(&t);
            if stop.is_some() {
                stopped = stop;
                break;
            }
        }
        assert_eq!(stopped.as_deref(), Some("</end>"));
        assert_eq!(out, "Hello world");

        let mut s = StopStrings::new(["ab".to_string()]);
        assert_eq!(s.push("xa"), ("x".to_string(), None), "'a' may start 'ab'");
        assert_eq!(s.push("c"), ("ac".to_string(), None));
        assert_eq!(s.push("a"), (String::new(), None));
        assert_eq!(s.finish(), "a");
        let mut s = StopStrings::new(["é!".to_string(), String::new()]);
        assert_eq!(s.push("café"), ("caf".to_string(), None));
        assert_eq!(
            s.push("!"),
            (String::new(), Some("é!".to_string())),
            "the held é belongs to the stop string"
        );
        let mut s = StopStrings::new(["b".to_string(), "ab".to_string(), "a".to_string()]);
        assert_eq!(
            s.push("xab"),
            ("x".to_string(), Some("ab".to_string())),
            "the earliest match wins; at one place, the first listed"
        );
    }
}
