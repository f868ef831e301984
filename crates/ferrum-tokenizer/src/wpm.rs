//! WordPiece over a GGUF (BERT) vocabulary, where word-initial pieces carry
//! a `▁` prefix and continuations are bare (llama.cpp's conversion).

use std::sync::OnceLock;

use fancy_regex::Regex;
use unicode_normalization::UnicodeNormalization;

use crate::vocab::Vocab;

struct Classes {
    punct: Regex,
    symbol: Regex,
    control: Regex,
    mark: Regex,
}

fn classes() -> &'static Classes {
    static C: OnceLock<Classes> = OnceLock::new();
    C.get_or_init(|| {
        // These literal patterns are valid; a failure would be a bug here.
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| panic!("wpm class {p}: {e}"));
        Classes {
            punct: re(r"^\p{P}$"),
            symbol: re(r"^\p{S}$"),
            control: re(r"^[\p{Cc}\p{Cf}]$"),
            mark: re(r"^\p{Mn}$"),
        }
    })
}

fn is(re: &Regex, c: char) -> bool {
    re.is_match(c.encode_utf8(&mut [0; 4])).unwrap_or(false)
}

fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// BERT's basic tokenizer: clean, optionally lowercase and strip accents,
/// split on whitespace, and make punctuation and CJK characters single words.
fn words(text: &str, lowercase: bool) -> Vec<String> {
    let c = classes();
    let chars: Vec<char> = if lowercase {
        text.nfd().collect()
    } else {
        text.chars().collect()
    };
    let mut words = vec![String::new()];
    for ch in chars {
        if ch.is_whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if ch == '\0' || ch == '\u{FFFD}' || is(&c.control, ch) || (lowercase && is(&c.mark, ch)) {
            continue;
        }
        let s: String = if lowercase {
            ch.to_lowercase().collect()
        } else {
            ch.to_string()
        };
        if is(&c.punct, ch) || ((ch as u32) < 0x7F && is(&c.symbol, ch)) || is_chinese(ch) {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            if let Some(w) = words.last_mut() {
                *w = s;
            }
            words.push(String::new());
        } else if let Some(w) = words.last_mut() {
            w.push_str(&s);
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    for word in words(text, vocab.lowercase) {
        let w = format!("\u{2581}{word}");
        let start_len = out.len();
        let mut i = 0;
        while i < w.len() {
            let mut j = (i + vocab.max_token_len).min(w.len());
            let mut found = None;
            while j > i {
                if w.is_char_boundary(j) {
                    if let Some(id) = vocab.id(&w[i..j]) {
                        found = Some((id, j));
                        break;
                    }
                }
                j -= 1;
            }
            match found {
                Some((id, end)) => {
                    out.push(id);
                    i = end;
                }
                None => {
                    out.truncate(start_len);
                    break;
                }
            }
        }
        if out.len() == start_len {
            out.extend(vocab.unk);
        }
    }
}
