//! Generation on top of [`ferrum_models::DecoderOnlyLLM`]: sampling, stop
//! conditions and the per-sequence generation loop that `ferrum run` uses.

pub mod decode_executor;
pub mod embedding;
pub mod generate;
pub mod sampler;
pub mod stop;

pub use decode_executor::GenericDecodeExecutor;
pub use embedding::{EmbedInput, Embedder, Embedding, Prepared};
pub use generate::{generate, FinishReason, GenerateOutput, GenerateRequest};
pub use sampler::{Sampled, Sampler, SamplingParams};
pub use stop::StopStrings;
