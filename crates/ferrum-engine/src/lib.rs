//! Generation on top of [`ferrum_models::DecoderOnlyLLM`]: sampling, stop
//! conditions, and the batching
//! [`Engine`] that `ferrum run` and `ferrum serve` use.

pub mod budget;
pub mod decode_executor;
pub mod embedding;
pub mod engine;
pub mod finish;
pub mod sampler;
pub mod stop;

pub use budget::ReasoningBudget;
pub use decode_executor::GenericDecodeExecutor;
pub use embedding::{EmbedInput, Embedder, Embedding, Prepared};
pub use engine::{
    Completion, Drafter, Engine, EngineConfig, EngineStats, Event, KvEventBatch, Request,
    Speculation,
};
pub use ferrum_models::KvEvent;
pub use finish::FinishReason;
pub use sampler::{Sampled, Sampler, SamplingParams};
pub use stop::StopStrings;
