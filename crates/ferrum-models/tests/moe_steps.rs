//! A mixture-of-experts decode batch gives each sequence what decoding it
//! alone gives, on quantized experts (Q4_K, as MoE checkpoints ship): the
//! tokens of a batch are grouped per expert, so a wrong row, expert or
//! weight in that grouping shows here. Also with a shared expert and
//! DeepSeek V3's sigmoid router with groups.
//!
//! Tolerance: 1e-4 of the largest logit, as `hf_fixtures.rs` allows (the
//! helper is shared with the GPU check, whose router GEMM rounds
//! differently for different row counts; the CPU's streams routers, and
//! its batch matches alone exactly, measured 0); a wrong
//! expert, row or weight moves logits by far more (dropping one expert's
//! output moved them by 2% of the largest).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_kernels::{CpuBackend, GgufQuantType};
use ferrum_models::llama::{LlamaConfig, LlamaModel};
use ferrum_models::{KvManaged, KvPoolConfig};

mod common;

fn batch_equals_alone(cfg: LlamaConfig) {
    let mut m = KvManaged::new(
        LlamaModel::<CpuBackend>::random(
            cfg,
            GgufQuantType::Q4K,
            false,
            5,
            &KvPoolConfig::default(),
        )
        .unwrap(),
    );
    let (alone, together) = common::decode_alone_and_batched(&mut m, &common::moe_prompt(), 40);
    common::assert_batch_equals_alone("CPU", &alone, &together);
}

#[test]
fn a_moe_decode_batch_equals_its_sequences_alone() {
    batch_equals_alone(common::small_moe());
}

#[test]
fn shared_experts_and_sigmoid_groups_too() {
    batch_equals_alone(common::small_moe_shared_groups());
}
