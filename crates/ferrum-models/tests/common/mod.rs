//! Helpers shared by the model test binaries.

use ferrum_models::llama::{preset, LlamaConfig, Scoring};
use ferrum_models::DecoderOnlyLLM;

/// Qwen3-30B-A3B's layout at toy size: 16 experts of width 256, 4 active.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn small_moe() -> LlamaConfig {
    let mut cfg = preset("qwen3-30b-a3b").unwrap();
    (cfg.hidden, cfg.intermediate, cfg.layers) = (256, 512, 2);
    (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.rotary_dims) = (4, 2, 64, 64);
    cfg.vocab = 1000;
    cfg.sliding = vec![false; 2];
    let moe = cfg.moe.as_mut().unwrap();
    (moe.experts, moe.top_k, moe.intermediate) = (16, 4, 256);
    moe.sparse = vec![true; 2];
    cfg
}

/// [`small_moe`] with a shared expert and DeepSeek V3's sigmoid router
/// keeping 2 of 4 expert groups.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn small_moe_shared_groups() -> LlamaConfig {
    let mut cfg = small_moe();
    let moe = cfg.moe.as_mut().unwrap();
    moe.shared_intermediate = Some(256);
    moe.scoring = Scoring::Sigmoid;
    moe.groups = Some((4, 2));
    cfg
}

/// A 12-token prompt inside [`small_moe`]'s vocabulary.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn moe_prompt() -> Vec<u32> {
    (0..12).map(|i| (37 * i + 11) % 1000).collect()
}

/// Each batched sequence's logits within 1e-4 of the largest of its logits
/// alone: the f32 router GEMM rounds differently for different row counts,
/// while a wrong expert, row or weight moves logits by far more (dropping
/// one expert's output moved them by 2% of the largest).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn assert_batch_equals_alone(what: &str, alone: &[Vec<f32>], together: &[Vec<f32>]) {
    for (i, (x, y)) in together.iter().zip(alone).enumerate() {
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            worst <= 1e-4 * scale,
            "{what}: sequence {i} batched differs by {worst} (largest {scale})"
        );
    }
}

/// Prints how far batched logits are from alone ones (relative to the
/// largest logit alone), for tests that bound them otherwise.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn report_batch_difference(what: &str, alone: &[Vec<f32>], together: &[Vec<f32>]) {
    let worst = together
        .iter()
        .zip(alone)
        .map(|(x, y)| {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
        })
        .fold(0f32, f32::max);
    eprintln!("{what}: batched within {worst:.2e} of the largest logit alone");
}

/// Decodes one token for each of `n` sequences (prompt prefixes of lengths
/// 1, 2, ... cycling, each then given its own token) first one sequence at
/// a time, then all in one `decode_batch` on a reset model: the logits of
/// both, in sequence order.
pub fn decode_alone_and_batched<M: DecoderOnlyLLM>(
    m: &mut M,
    prompt: &[u32],
    n: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let seqs: Vec<(String, usize, u32)> = (0..n)
        .map(|i| (format!("s{i}"), 1 + i % prompt.len(), (3 * i + 1) as u32))
        .collect();
    let mut alone = Vec::new();
    for (id, len, tok) in &seqs {
        m.prefill(id, &prompt[..*len]);
        alone.push(m.decode(id, *tok, *len as u32));
    }
    m.reset();
    for (id, len, _) in &seqs {
        m.prefill(id, &prompt[..*len]);
    }
    let batch: Vec<(String, u32, u32)> = seqs
        .iter()
        .map(|(id, len, tok)| (id.clone(), *tok, *len as u32))
        .collect();
    let together = m.decode_batch(&batch);
    assert_eq!(together.len(), alone.len());
    (alone, together)
}
