//! The BERT encoder against Hugging Face transformers on
//! `fixtures/hf-tiny/bert`: a batch of two, the second padded
//! (7 real tokens + 5 pads), with token-type ids. We feed each sequence
//! without its padding, which is what the attention mask makes transformers
//! compute, and compare the real positions' last hidden state, the
//! mean-pooled vectors and the pooler output.
//!
//! Tolerance 1e-5 absolute (the bar): values are O(1) after
//! LayerNorm and the model is f32 end to end, so only summation order
//! separates the two engines (observed max difference is printed).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_kernels::CpuBackend;
use ferrum_models::bert::{BertModel, EncoderInput, Pooling};
use serde_json::Value;

const TOL: f32 = 1e-5;

fn rows(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f64]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - *y as f32).abs())
        .fold(0.0, f32::max)
}

#[test]
fn bert_matches_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny/bert");
    if !dir.is_dir() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let model = BertModel::<CpuBackend>::from_hf_dir(&dir).unwrap();
    let h = model.config().hidden;
    let ids = rows(&r["input_ids"]);
    let mask = rows(&r["attention_mask"]);
    let types = rows(&r["token_type_ids"]);
    let seqs: Vec<(Vec<u32>, Vec<u32>)> = (0..ids.len())
        .map(|b| {
            let n = mask[b].iter().filter(|&&m| m > 0.5).count();
            (
                ids[b][..n].iter().map(|&x| x as u32).collect(),
                types[b][..n].iter().map(|&x| x as u32).collect(),
            )
        })
        .collect();
    assert!(seqs[0].1.contains(&1), "fixture exercises token types");
    assert!(
        seqs[1].0.len() < seqs[0].0.len(),
        "fixture exercises padding"
    );
    let inputs: Vec<EncoderInput> = seqs
        .iter()
        .map(|(i, t)| EncoderInput { ids: i, type_ids: Some(t) })
        .collect();
    let hidden = model.forward(&inputs).unwrap();

    let last = r["last_hidden_state"].as_array().unwrap();
    let mean = rows(&r["mean_pooled"]);
    let pooler = rows(&r["pooler_output"]);
    let mut worst = 0f32;
    for (b, hs) in hidden.iter().enumerate() {
        let want: Vec<f64> = rows(&last[b])
            .into_iter()
            .take(seqs[b].0.len())
            .flatten()
            .collect();
        worst = worst.max(max_diff(hs, &want));
        let pooled = Pooling::Mean.pool(hs, h).unwrap();
        worst = worst.max(max_diff(&pooled, &mean[b]));
        let p = model.pool_cls(&hs[..h]).unwrap();
        worst = worst.max(max_diff(&p, &pooler[b]));
    }
    eprintln!("max |ferrum - transformers| = {worst:e}");
    assert!(worst <= TOL, "max difference {worst} > {TOL}");

    // Batching must not change anything: each sequence alone gives the
    // same vectors up to GEMM summation order (attention never looks
    // across sequences, so a leak would show as an O(1) difference).
    for (b, inp) in inputs.iter().enumerate() {
        let alone = model.forward(std::slice::from_ref(inp)).unwrap();
        let d = alone[0]
            .iter()
            .zip(&hidden[b])
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(d <= TOL, "sequence {b} alone differs by {d}");
    }
}

#[test]
fn bert_rejects_bad_inputs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny/bert");
    if !dir.is_dir() {
        return;
    }
    let model = BertModel::<CpuBackend>::from_hf_dir(&dir).unwrap();
    let long = vec![1u32; model.config().max_positions + 1];
    for (ids, types) in [
        (vec![], None),
        (vec![1, 100_000], None),
        (long, None),
        (vec![1, 2], Some(vec![0u32])),
        (vec![1, 2], Some(vec![0u32, 7])),
    ] {
        let inp = EncoderInput { ids: &ids, type_ids: types.as_deref() };
        assert!(model.forward(&[inp]).is_err(), "accepted {ids:?} {types:?}");
    }
}

#[test]
fn pooling_modes() {
    let hs = [1.0, -2.0, 3.0, 4.0, 0.0, -1.0];
    assert_eq!(
        Pooling::Mean.pool(&hs, 2).unwrap(),
        vec![4.0 / 3.0, 1.0 / 3.0]
    );
    assert_eq!(Pooling::Cls.pool(&hs, 2).unwrap(), vec![1.0, -2.0]);
    assert_eq!(Pooling::Max.pool(&hs, 2).unwrap(), vec![3.0, 4.0]);
    assert!(Pooling::Mean.pool(&hs, 4).is_err());
    let mut v = vec![3.0, 4.0];
    ferrum_models::bert::l2_normalize(&mut v);
    assert_eq!(v, vec![0.6, 0.8]);
}

/// Embeddings get their encoder from the registry like generation gets its
/// decoder: the BERT fixture loads through it and encodes exactly as the
/// family's own loader does, and a decoder folder is refused by name.
#[test]
fn encoders_load_through_the_registry() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny");
    if !fixtures.join("bert").is_dir() {
        return;
    }
    let encoder =
        ferrum_models::registry::load_encoder::<CpuBackend>(&fixtures.join("bert")).unwrap();
    let direct = BertModel::<CpuBackend>::from_hf_dir(&fixtures.join("bert")).unwrap();
    assert_eq!(encoder.hidden(), direct.config().hidden);
    assert_eq!(encoder.max_positions(), direct.config().max_positions);
    let inp = EncoderInput { ids: &[1, 5, 9, 2], type_ids: None };
    assert_eq!(
        encoder.encode(&[inp]).unwrap(),
        direct.forward(&[inp]).unwrap()
    );
    let err = ferrum_models::registry::load_encoder::<CpuBackend>(&fixtures.join("llama"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("'llama' is a decoder"), "{err}");
}
