//! Model architectures for Ferrum and the interfaces they are driven
//! through: [`PagedLlm`] (the engine's, with block tables it plans) and
//! [`DecoderOnlyLLM`] (the seed's per-sequence API, from [`KvManaged`]).

pub mod bert;
mod encoder;
pub mod llama;
mod llm;
mod managed;
mod paged;
pub mod registry;
pub mod rope;

pub use encoder::{Encoder, EncoderInput};
pub use ferrum_kernels::KvDtype;
pub use ferrum_kv::{BlockCopy, BlockManager, KvEvent};
pub use llm::{
    kv_capacity_env, DecoderOnlyLLM, KvPoolConfig, LlmRuntimeConfig, LoadProgress,
    KV_CACHE_TOKENS_ENV, KV_CAPACITY_ENV,
};
pub use managed::{KvManaged, PagedDecodeBackend, Segment};
pub use paged::{with_items, BatchItem, KvPool, LogitsWanted, PagedLlm};
