//! Sentence-transformers pooling over an encoder's last hidden state.

use ferrum_types::{FerrumError, Result};

/// How token vectors become one sentence vector (`1_Pooling/config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Average over the real tokens: sentence-transformers' default.
    Mean,
    /// The `[CLS]` token's vector.
    Cls,
    /// Element-wise maximum over the tokens.
    Max,
}

impl Pooling {
    /// Pools `hidden` (`[tokens, dim]` row-major, padding already excluded).
    pub fn pool(self, hidden: &[f32], dim: usize) -> Result<Vec<f32>> {
        if dim == 0 || hidden.is_empty() || !hidden.len().is_multiple_of(dim) {
            return Err(FerrumError::invalid(format!(
                "cannot pool {} values in rows of {dim}",
                hidden.len()
            )));
        }
        let rows = hidden.chunks_exact(dim);
        Ok(match self {
            Pooling::Cls => hidden[..dim].to_vec(),
            Pooling::Mean => {
                let n = rows.len() as f32;
                let mut acc = vec![0f32; dim];
                for r in rows {
                    acc.iter_mut().zip(r).for_each(|(a, x)| *a += x);
                }
                acc.iter_mut().for_each(|a| *a /= n);
                acc
            }
            Pooling::Max => {
                let mut acc = vec![f32::NEG_INFINITY; dim];
                for r in rows {
                    acc.iter_mut().zip(r).for_each(|(a, x)| *a = a.max(*x));
                }
                acc
            }
        })
    }
}

/// Scales `v` to unit Euclidean length (left as is when it is all zeros),
/// with sentence-transformers' `Normalize` semantics.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}
