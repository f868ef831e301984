//! Helpers shared by the model test binaries.

use ferrum_models::DecoderOnlyLLM;

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
