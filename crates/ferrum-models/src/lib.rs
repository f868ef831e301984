//! Model architectures for Ferrum and the interface the engine drives them
//! through ([`DecoderOnlyLLM`]).

pub mod bert;
pub mod llama;
mod llm;
pub mod rope;

pub use ferrum_kernels::KvDtype;
pub use ferrum_kv::KvUsage;
pub use llm::{
    kv_capacity_from_env, DecoderOnlyLLM, KvPoolConfig, LlmRuntimeConfig, LoadProgress,
    KV_CACHE_TOKENS_ENV, KV_CAPACITY_ENV,
};
