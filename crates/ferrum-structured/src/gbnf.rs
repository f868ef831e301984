//! llama.cpp's GBNF grammars, translated into llguidance's Lark dialect so
//! `grammar` requests written for llama-server run on the same engine as
//! everything else.
//!
//! GBNF: `name ::= ...` rules (`root` is the start), `"literals"` with C
//! escapes, `[a-z]` / `[^...]` character classes, `.`, grouping, `|`,
//! `* + ?`, `{m}`, `{m,}`, `{m,n}`, `#` comments, and `<[id]>` token
//! references. A rule runs until the next `name ::=`, which also accepts
//! llama.cpp's line-continuation rules.

use std::collections::{HashMap, HashSet};

use ferrum_types::{FerrumError, Result};

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Define,
    /// Already in Lark form (a literal, a regex, an operator).
    Lark(String),
}

fn err(msg: String) -> FerrumError {
    FerrumError::invalid(format!("GBNF grammar: {msg}"))
}

/// Translates a GBNF grammar into Lark; syntax errors name the problem and
/// the line.
pub fn gbnf_to_lark(src: &str) -> Result<String> {
    let toks = lex(src)?;
    let mut rules: Vec<(String, Vec<Tok>)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (Tok::Name(name), Some(Tok::Define)) = (&toks[i], toks.get(i + 1)) else {
            return Err(err(format!(
                "expected `name ::=` to start a rule, found {:?}",
                toks[i]
            )));
        };
        let start = i + 2;
        let mut end = start;
        while end < toks.len()
            && !(matches!(toks[end], Tok::Name(_)) && toks.get(end + 1) == Some(&Tok::Define))
        {
            end += 1;
        }
        if end == start {
            return Err(err(format!("rule {name} is empty")));
        }
        let body = toks[start..end].iter().map(clone_tok).collect();
        rules.push((name.clone(), body));
        i = end;
    }
    if !rules.iter().any(|r| r.0 == "root") {
        return Err(err("there is no `root` rule".into()));
    }
    let mut names = HashMap::new();
    let mut seen = HashSet::new();
    for (name, _) in &rules {
        let lark = format!("g_{}", name.to_lowercase());
        if names.insert(name.clone(), lark.clone()).is_none() && !seen.insert(lark) {
            return Err(err(format!("rule names differing only in case: {name}")));
        }
    }
    let mut out = String::from("start: g_root\n");
    let mut defined = HashSet::new();
    for (name, body) in &rules {
        if !defined.insert(name.as_str()) {
            return Err(err(format!("rule {name} is defined twice")));
        }
        out.push_str(&names[name]);
        out.push_str(": ");
        for t in body {
            match t {
                Tok::Name(n) => match names.get(n) {
                    Some(l) => out.push_str(l),
                    None => return Err(err(format!("rule {n} is used but never defined"))),
                },
                Tok::Lark(s) => out.push_str(s),
                Tok::Define => {}
            }
            out.push(' ');
        }
        out.push('\n');
    }
    Ok(out)
}

fn clone_tok(t: &Tok) -> Tok {
    match t {
        Tok::Name(n) => Tok::Name(n.clone()),
        Tok::Define => Tok::Define,
        Tok::Lark(s) => Tok::Lark(s.clone()),
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

fn lex(src: &str) -> Result<Vec<Tok>> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        let at = |m: &str| err(format!("line {line}: {m}"));
        match c {
            c if c.is_whitespace() => {
                line += usize::from(c == '\n');
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                toks.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(at("unterminated string")),
                        Some('"') => break,
                        Some('\\') => {
                            let (ch, n) = escape(&chars[i..]).ok_or_else(|| at("bad escape"))?;
                            s.push(ch);
                            i += n;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
                toks.push(Tok::Lark(lark_string(&s)));
            }
            '[' => {
                let mut class = String::from("[");
                i += 1;
                if chars.get(i) == Some(&'^') {
                    class.push('^');
                    i += 1;
                }
                loop {
                    let ch = match chars.get(i) {
                        None => return Err(at("unterminated character class")),
                        Some(']') => break,
                        Some('\\') => {
                            let (ch, n) = escape(&chars[i..]).ok_or_else(|| at("bad escape"))?;
                            i += n;
                            ch
                        }
                        Some(&ch) => {
                            i += 1;
                            ch
                        }
                    };
                    class.push_str(&class_char(ch));
                    // A range `a-z` (a `-` before `]` is literal).
                    if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|&c| c != ']') {
                        class.push('-');
                        i += 1;
                    }
                }
                i += 1;
                class.push(']');
                toks.push(Tok::Lark(format!("/{class}/")));
            }
            '.' => {
                toks.push(Tok::Lark("/(?s:.)/".into()));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                toks.push(Tok::Lark(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| at("unterminated {m,n}"))?;
                let inner: String = chars[i + 1..i + end]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                let ok = !inner.is_empty()
                    && inner.split(',').count() <= 2
                    && inner.split(',').enumerate().all(|(k, p)| {
                        p.chars().all(|c| c.is_ascii_digit()) && (k == 1 || !p.is_empty())
                    });
                if !ok {
                    return Err(at(&format!("bad repetition {{{inner}}}")));
                }
                toks.push(Tok::Lark(format!("{{{inner}}}")));
                i += end + 1;
            }
            '<' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '>')
                    .ok_or_else(|| at("unterminated <token>"))?;
                toks.push(Tok::Lark(chars[i..=i + end].iter().collect()));
                i += end + 1;
            }
            c if is_name_char(c) => {
                let start = i;
                while i < chars.len() && is_name_char(chars[i]) {
                    i += 1;
                }
                toks.push(Tok::Name(chars[start..i].iter().collect()));
            }
            c => return Err(at(&format!("unexpected character {c:?}"))),
        }
    }
    Ok(toks)
}

/// Decodes the escape at the start of `s` (which begins with `\`): the
/// character and how many chars it took.
fn escape(s: &[char]) -> Option<(char, usize)> {
    let hex = |n: usize| -> Option<(char, usize)> {
        let digits: String = s.get(2..2 + n)?.iter().collect();
        let v = u32::from_str_radix(&digits, 16).ok()?;
        Some((char::from_u32(v)?, 2 + n))
    };
    match s.get(1)? {
        'n' => Some(('\n', 2)),
        'r' => Some(('\r', 2)),
        't' => Some(('\t', 2)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        &c @ ('\\' | '"' | '[' | ']' | '-' | '^' | '.' | '/') => Some((c, 2)),
        _ => None,
    }
}

/// One character inside a regex class, escaped unless alphanumeric.
fn class_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\x{{{:X}}}", c as u32)
    }
}

/// A Lark string literal (JSON escapes are valid Lark escapes).
pub(crate) fn lark_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn translates_llama_cpp_syntax() {
        let g = r#"
# a comment
root ::= greeting ( ", " name )? [.!]{1,3}
greeting ::= "hi" | "hello\x21"
name ::=
    [A-Z] [a-z-]* # trailing comment
    | "\"" [^"\\]+ "\""
"#;
        let lark = gbnf_to_lark(g).unwrap();
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(lines[0], "start: g_root");
        assert_eq!(
            lines[1],
            r#"g_root: g_greeting ( ", " g_name ) ? /[\x{2E}\x{21}]/ {1,3} "#
        );
        assert_eq!(lines[2], r#"g_greeting: "hi" | "hello!" "#);
        assert_eq!(
            lines[3],
            r#"g_name: /[A-Z]/ /[a-z\x{2D}]/ * | "\"" /[^\x{22}\x{5C}]/ + "\"" "#
        );
    }

    #[test]
    fn errors_name_the_problem() {
        for (g, want) in [
            ("root ::= foo", "foo is used but never defined"),
            ("start ::= \"a\"", "no `root` rule"),
            ("root ::= \"a", "unterminated string"),
            ("root ::= [a-", "unterminated character class"),
            ("root ::= \"a\" {x}", "bad repetition"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("\"a\"", "expected `name ::=`"),
            ("root ::= \"a\" @", "unexpected character"),
        ] {
            let e = gbnf_to_lark(g).unwrap_err().to_string();
            assert!(e.contains(want), "{g}: {e}");
        }
    }
}
