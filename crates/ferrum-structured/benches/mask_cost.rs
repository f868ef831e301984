//! What a grammar costs per generated token: the time to compute the next
//! token mask (`prepare`, done beside the forward pass in the engine) and
//! to apply it to the logits, over a walk through a nested JSON schema on a
//! real vocabulary. Prints p50/p99 in microseconds.
//!
//! `cargo bench -p ferrum-structured --bench mask_cost [-- MODEL.gguf SCHEMA.json]`
//! (defaults: Qwen2.5-Coder-0.5B's 151K-token vocabulary, scripts/bench-schema.json).

#![allow(clippy::unwrap_used)] // a benchmark: a failure is the report

use std::sync::Arc;
use std::time::Instant;

use ferrum_formats::gguf::GgufFile;
use ferrum_structured::{GrammarSpec, Grammars};
use ferrum_tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p / 100.0).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let model = args.first().cloned().unwrap_or_else(|| {
        let p = ferrum_formats::model_cache_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
        p.display().to_string()
    });
    let schema_path = args.get(1).cloned().unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/bench-schema.json"
        )
        .to_string()
    });
    if !std::path::Path::new(&model).exists() {
        eprintln!("skipping: {model} not found (run scripts/fetch-models.sh)");
        return;
    }
    let g = GgufFile::open(&model).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&g).unwrap());
    let vocab = tok.vocab_size();
    let t0 = Instant::now();
    let grammars = Grammars::new(tok.clone(), vocab).unwrap();
    println!(
        "vocabulary: {vocab} tokens, indexed in {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let schema = serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    let t0 = Instant::now();
    let fresh = grammars.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    println!(
        "schema compiled in {:.2} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let stops = tok.special().stop.clone();
    let mut rng = StdRng::seed_from_u64(1);
    let mut logits = vec![0f32; vocab];
    let (mut compute, mut apply) = (Vec::new(), Vec::new());
    for _walk in 0..4 {
        let mut c = fresh.clone();
        for _ in 0..400 {
            let t = Instant::now();
            c.prepare(&[]).unwrap();
            compute.push(t.elapsed().as_secs_f64() * 1e6);
            for l in logits.iter_mut() {
                *l = rng.random_range(-4.0..4.0);
            }
            let t = Instant::now();
            c.apply(&mut logits, &stops).unwrap();
            apply.push(t.elapsed().as_secs_f64() * 1e6);
            // Greedy over the masked logits.
            let next = (0..vocab)
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap() as u32;
            if stops.contains(&next) {
                break;
            }
            c.commit(next, || tok.token_bytes(next)).unwrap();
            if c.is_finished() {
                break;
            }
        }
    }
    println!(
        "{} tokens: mask compute p50 {:.0} us, p99 {:.0} us; apply p50 {:.0} us, p99 {:.0} us",
        compute.len(),
        pct(&mut compute, 50.0),
        pct(&mut compute, 99.0),
        pct(&mut apply, 50.0),
        pct(&mut apply, 99.0)
    );
}
