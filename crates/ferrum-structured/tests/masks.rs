//! Grammar masks on real vocabularies (SmolLM2's 49K and Qwen2.5's 151K
//! tokens; skipped when not fetched), checked by brute force against an
//! oracle that knows nothing of llguidance: for grammars whose sentences can
//! be listed, a token is allowed exactly when the output so far plus its
//! bytes is a prefix of some sentence, and EOS exactly when the output is a
//! whole sentence.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::sync::Arc;

use ferrum_formats::gguf::GgufFile;
use ferrum_structured::{GrammarSpec, Grammars};
use ferrum_tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

fn tokenizer(file: &str) -> Option<Arc<Tokenizer>> {
    let path = ferrum_formats::cached_model(file)?;
    let g = GgufFile::open(&path).unwrap();
    Some(Arc::new(Tokenizer::from_gguf(&g).unwrap()))
}

/// Grammars with the complete list of their sentences.
fn cases() -> Vec<(GrammarSpec, Vec<String>)> {
    let choices = ["yes", "no", "not sure", "naïve café", "{\"k\": 1}"];
    let colors = ["red", "green light", "blue-ish"];
    let mut regex_sentences = Vec::new();
    for head in ["ab", "cd"] {
        for n in 1..=3 {
            regex_sentences.push(format!("{head}{}", "e".repeat(n)));
        }
    }
    vec![
        (
            GrammarSpec::Choice(choices.iter().map(|s| s.to_string()).collect()),
            choices.iter().map(|s| s.to_string()).collect(),
        ),
        (
            GrammarSpec::JsonSchema(json!({"enum": colors})),
            colors.iter().map(|c| format!("\"{c}\"")).collect(),
        ),
        (
            GrammarSpec::JsonSchema(json!({"type": "boolean"})),
            vec!["true".into(), "false".into()],
        ),
        (GrammarSpec::Regex("(ab|cd)e{1,3}".into()), regex_sentences),
        (
            GrammarSpec::Gbnf("root ::= \"[\" item (\", \" item)? \"]\"\nitem ::= [0-2]\n".into()),
            {
                let mut v = Vec::new();
                for a in 0..3 {
                    v.push(format!("[{a}]"));
                    for b in 0..3 {
                        v.push(format!("[{a}, {b}]"));
                    }
                }
                v
            },
        ),
    ]
}

fn check_vocabulary(tok: Arc<Tokenizer>) {
    let vocab = tok.vocab_size();
    let grammars = Grammars::new(tok.clone(), vocab).unwrap();
    let eos = grammars.eos();
    let bytes: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|t| {
            if tok.is_control(t) {
                Vec::new()
            } else {
                tok.token_bytes(t)
            }
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(7);
    let mut logits = vec![0f32; vocab];
    for (spec, sentences) in cases() {
        let fresh = grammars.compile(&spec).unwrap();
        for walk in 0..4 {
            let mut c = fresh.clone();
            let mut out: Vec<u8> = Vec::new();
            for _step in 0..64 {
                logits.fill(0.0);
                c.apply(&mut logits, &[eos]).unwrap();
                let allowed: Vec<u32> = (0..vocab as u32)
                    .filter(|&t| logits[t as usize] == 0.0)
                    .collect();
                // The oracle, token by token.
                for t in 0..vocab as u32 {
                    let want = if t == eos {
                        sentences.iter().any(|s| s.as_bytes() == out.as_slice())
                    } else {
                        let b = &bytes[t as usize];
                        !b.is_empty()
                            && sentences.iter().any(|s| {
                                let s = s.as_bytes();
                                s.len() >= out.len() + b.len()
                                    && s.starts_with(&out)
                                    && &s[out.len()..out.len() + b.len()] == b.as_slice()
                            })
                    };
                    let got = logits[t as usize] == 0.0;
                    assert_eq!(
                        got,
                        want,
                        "{spec:?} after {:?}: token {t} ({:?}) allowed={got}",
                        String::from_utf8_lossy(&out),
                        String::from_utf8_lossy(&bytes[t as usize]),
                    );
                }
                // Walk on through a random allowed token.
                let t = allowed[rng.random_range(0..allowed.len())];
                if t == eos {
                    break;
                }
                c.commit(t, || bytes[t as usize].clone()).unwrap();
                out.extend_from_slice(&bytes[t as usize]);
                if c.is_finished() {
                    assert!(
                        sentences.iter().any(|s| s.as_bytes() == out.as_slice()),
                        "finished on {:?}",
                        String::from_utf8_lossy(&out)
                    );
                    break;
                }
            }
            let _ = walk;
        }
    }
}

#[test]
fn masks_match_the_oracle_on_smollm2() {
    if let Some(tok) = tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf") {
        check_vocabulary(tok);
    }
}

#[test]
fn masks_match_the_oracle_on_qwen2() {
    if let Some(tok) = tokenizer("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") {
        check_vocabulary(tok);
    }
}

#[test]
fn bad_grammars_are_errors_that_say_why() {
    let Some(tok) = tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    for (spec, want) in [
        // A keyword llguidance cannot enforce is refused by name (unknown
        // keywords are annotations, ignored as JSON Schema says).
        (
            GrammarSpec::JsonSchema(json!({"type": "array", "uniqueItems": true})),
            "uniqueItems",
        ),
        (
            GrammarSpec::JsonSchema(json!({"not": {"type": "string"}})),
            "not",
        ),
        (
            GrammarSpec::JsonSchema(json!({"type": "strange"})),
            "strange",
        ),
        (GrammarSpec::JsonSchema(json!(3)), "must be an object"),
        (GrammarSpec::Regex("(ab".into()), "regex"),
        (GrammarSpec::Gbnf("root ::= missing".into()), "missing"),
        (GrammarSpec::Lark("start: foo bar".into()), "grammar"),
        (GrammarSpec::Choice(vec![]), "empty"),
    ] {
        let e = match g.compile(&spec) {
            Ok(_) => panic!("{spec:?} compiled"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{spec:?}: {e}");
    }
}

/// A reasoning model's output format applies once its reasoning ends (the
/// prompt opened `<think>`): the thinking is free text, then only the
/// grammar's sentences may follow `</think>`.
#[test]
fn a_grammar_after_the_reasoning_waits_for_its_end() {
    let Some(tok) = tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    let spec = GrammarSpec::Choice(vec!["yes".into(), "no".into()]);
    let mut c = g.compile_after("</think>", &spec).unwrap();
    let vocab = tok.vocab_size();
    let allowed = |c: &mut ferrum_structured::Constraint| {
        let mut logits = vec![0.0f32; vocab];
        c.apply(&mut logits, &[]).unwrap();
        logits.iter().filter(|l| l.is_finite()).count()
    };
    let thinking = tok
        .encode("Maybe. It could be either </think>", false, false)
        .unwrap();
    for &t in &thinking {
        assert!(!c.active());
        assert_eq!(allowed(&mut c), vocab, "the reasoning is free text");
        c.commit(t, || tok.token_bytes(t)).unwrap();
    }
    assert!(c.active(), "armed by the end of the reasoning");
    let mut logits = vec![0.0f32; vocab];
    c.apply(&mut logits, &[]).unwrap();
    for (text, ok) in [("yes", true), ("no", true), ("Maybe", false), ("{", false)] {
        let id = tok.encode(text, false, false).unwrap()[0];
        assert_eq!(
            logits[id as usize].is_finite(),
            ok,
            "{text:?} after </think>"
        );
    }
}

/// A model that may open its reasoning itself (Qwen3's default): at the
/// start both the grammar and `<think>` may come; once `<think>` begins only
/// it may continue; the reasoning is free; the grammar applies after
/// `</think>`. Without a reasoning block the grammar applies at once.
#[test]
fn a_grammar_lets_the_model_open_its_reasoning_first() {
    let Some(tok) = tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let g = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    let spec = GrammarSpec::Choice(vec!["yes".into(), "no".into()]);
    let fresh = || g.reasoning_first(g.compile(&spec).unwrap(), "<think>", "</think>");
    let vocab = tok.vocab_size();
    let first = |text: &str| tok.encode(text, false, false).unwrap()[0];
    let allows = |c: &mut ferrum_structured::Constraint, text: &str| {
        let mut logits = vec![0.0f32; vocab];
        c.apply(&mut logits, &[]).unwrap();
        logits[first(text) as usize].is_finite()
    };
    let commit_text = |c: &mut ferrum_structured::Constraint, text: &str| {
        for t in tok.encode(text, false, false).unwrap() {
            c.commit(t, || tok.token_bytes(t)).unwrap();
        }
    };

    let mut c = fresh();
    for (text, ok) in [
        ("yes", true),
        ("no", true),
        ("<think>", true),
        ("Maybe", false),
    ] {
        assert_eq!(allows(&mut c, text), ok, "{text:?} at the start");
    }
    let open = tok.encode("<think>", false, false).unwrap();
    assert!(open.len() > 1, "SmolLM2 writes <think> in pieces");
    c.commit(open[0], || tok.token_bytes(open[0])).unwrap();
    let mut logits = vec![0.0f32; vocab];
    c.apply(&mut logits, &[]).unwrap();
    assert!(logits[open[1] as usize].is_finite(), "<think> goes on");
    for text in ["yes", "no", "Maybe"] {
        assert!(
            !logits[first(text) as usize].is_finite(),
            "{text:?} inside <think>"
        );
    }
    for &t in &open[1..] {
        c.commit(t, || tok.token_bytes(t)).unwrap();
    }
    assert!(!c.active(), "the reasoning is free");
    commit_text(&mut c, "Maybe. Could be either.");
    assert!(!c.active());
    commit_text(&mut c, "</think>");
    assert!(c.active(), "armed by the end of the reasoning");
    for (text, ok) in [
        ("yes", true),
        ("no", true),
        ("Maybe", false),
        ("<think>", false),
    ] {
        assert_eq!(allows(&mut c, text), ok, "{text:?} after </think>");
    }

    // No reasoning: the grammar from the first token on.
    let mut c = fresh();
    commit_text(&mut c, "yes");
    let mut logits = vec![0.0f32; vocab];
    c.apply(&mut logits, &[]).unwrap();
    let allowed: Vec<usize> = (0..vocab).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(allowed, [g.eos() as usize], "only the end after \"yes\"");
    assert!(c.is_finished());
}
