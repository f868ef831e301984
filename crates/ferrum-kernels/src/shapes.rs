//! The shapes [`crate::Backend`] ops take, as named fields.
//!
//! The seed passes them as loose `usize`s (`gemm(.., m, n, k)`,
//! `rms_norm(.., tokens, dim)`), where two swapped arguments compile and
//! compute garbage, and eight-argument signatures are read by position. A
//! call now says what each number is (`Gemm { m: rows, n: vocab, k: hidden
//! }`), and a backend reads it the same way. (In the spirit of candle's
//! `Layout`; the values and their meanings are the seed's.)

/// `out[m, n] = a[m, k] · w[n, k]ᵀ`: a linear layer (`n` outputs of `k`
/// inputs) applied to `m` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// A row-major `[rows, cols]` matrix that a row-wise op walks: a norm's
/// tokens × hidden size, a bias's rows × width, a gated activation's tokens
/// × intermediate size (its input is `[rows, 2 · cols]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
}

impl Mat {
    /// Values in the matrix.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which keys a run of queries attends to: `q_len` queries at absolute
/// positions `pos_offset..pos_offset + q_len`, against keys `0..kv_len`
/// (with a causal mask, query `i` sees keys up to `pos_offset + i`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub q_len: usize,
    pub kv_len: usize,
    pub pos_offset: usize,
}

/// Per-token heads: `[tokens, heads, head_dim]` token-major, or
/// `[heads, tokens, head_dim]` head-major, as the op says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
}
