//! What the engine needs of an embedding encoder, whatever its family and
//! backend: the encoders' counterpart of [`crate::paged::PagedLlm`], so
//! that embeddings, like generation, get their model from the registry
//! ([`crate::registry::load_encoder`]) on the backend the caller chose.

use ferrum_types::Result;

/// One input sequence: token ids (with `[CLS]`/`[SEP]` already added) and
/// optional segment ids (all 0 when absent).
#[derive(Clone, Copy, Debug)]
pub struct EncoderInput<'a> {
    pub ids: &'a [u32],
    pub type_ids: Option<&'a [u32]>,
}

pub trait Encoder: Send + Sync {
    /// Width of the hidden states.
    fn hidden(&self) -> usize;

    /// The longest input, in tokens, the encoder takes.
    fn max_positions(&self) -> usize;

    /// The last hidden state of every input, `[len_i, hidden]` row-major.
    fn encode(&self, inputs: &[EncoderInput]) -> Result<Vec<Vec<f32>>>;
}
