//! Model architectures for Ferrum and the interface the engine drives them
//! through ([`DecoderOnlyLLM`]).

mod llm;

pub use llm::{kv_capacity_from_env, DecoderOnlyLLM, LlmRuntimeConfig, KV_CAPACITY_ENV};
