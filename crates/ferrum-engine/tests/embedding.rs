//! all-MiniLM-L6-v2 end to end (skipped when the model is not in the cache:
//! `scripts/fetch-models.sh minilm`). The encoder's arithmetic is checked
//! against transformers in ferrum-models' `bert_fixture`; this checks the
//! pipeline around it: tokenizer, truncation, pooling and normalisation
//! read from the sentence-transformers files, and that the vectors mean
//! something (paraphrases closer than unrelated sentences).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_engine::{EmbedInput, Embedder};
use ferrum_kernels::CpuBackend;
use ferrum_models::bert::Pooling;

fn minilm() -> Option<Embedder> {
    let dir = ferrum_formats::model_cache_dir().join("all-MiniLM-L6-v2");
    if !dir.join("model.safetensors").exists() {
        eprintln!("skipping: {} not found", dir.display());
        return None;
    }
    Some(Embedder::load::<CpuBackend>(&dir).unwrap())
}

fn text(s: &str) -> EmbedInput {
    EmbedInput::Text(s.to_string())
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_vectors_are_unit_length_and_meaningful() {
    let Some(e) = minilm() else { return };
    assert_eq!(e.dim(), 384);
    assert_eq!(e.pooling(), Pooling::Mean);
    assert!(e.normalizes(), "modules.json lists Normalize");
    assert_eq!(
        e.max_tokens(),
        256,
        "sentence_bert_config.json max_seq_length"
    );
    let pairs = [
        (
            "A man is playing a guitar.",
            "Someone is strumming a guitar.",
            "The stock market fell sharply today.",
        ),
        (
            "How do I reset my password?",
            "I forgot my password, how can I change it?",
            "Penguins live in the Southern Hemisphere.",
        ),
        (
            "The cat sits on the mat.",
            "A kitten is resting on a rug.",
            "Interest rates were raised by the central bank.",
        ),
    ];
    for (a, b, c) in pairs {
        let v = e.embed(&[text(a), text(b), text(c)], true).unwrap();
        for x in &v {
            let n = cos(&x.vector, &x.vector).sqrt();
            assert!((n - 1.0).abs() < 1e-5, "norm {n}");
        }
        let close = cos(&v[0].vector, &v[1].vector);
        let far = cos(&v[0].vector, &v[2].vector);
        eprintln!("{a:?}: paraphrase {close:.3}, unrelated {far:.3}");
        assert!(close > far + 0.3, "{a:?}: {close} vs {far}");
    }
}

#[test]
fn minilm_batches_truncation_and_errors() {
    let Some(e) = minilm() else { return };
    // Batching (more than one pass of BATCH) does not change a vector.
    let many: Vec<EmbedInput> = (0..40)
        .map(|i| text(&format!("sentence number {i}")))
        .collect();
    let all = e.embed(&many, true).unwrap();
    let one = e.embed(&many[37..38], true).unwrap();
    let d = all[37]
        .vector
        .iter()
        .zip(&one[0].vector)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(d < 1e-5, "{d}");

    // Too long: cut to 256 tokens (ending in [SEP]) or rejected.
    let long = text(&"word ".repeat(400));
    let t = e.embed(std::slice::from_ref(&long), true).unwrap();
    assert_eq!(t[0].tokens, 256);
    assert!(t[0].truncated);
    assert!(e.embed(std::slice::from_ref(&long), false).is_err());

    // Token arrays are used as given; bad ones are errors, not panics.
    let ids = e.tokenizer().encode("hello world", true, false).unwrap();
    let from_ids = e.embed(&[EmbedInput::Tokens(ids)], true).unwrap();
    let from_text = e.embed(&[text("hello world")], true).unwrap();
    assert_eq!(from_ids[0].vector, from_text[0].vector);
    for bad in [
        vec![],
        vec![text("")],
        vec![EmbedInput::Tokens(vec![])],
        vec![EmbedInput::Tokens(vec![u32::MAX])],
    ] {
        assert!(e.embed(&bad, true).is_err(), "{bad:?}");
    }
}
