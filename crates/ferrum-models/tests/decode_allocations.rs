//! A decode step allocates nothing on the heap once the model's scratch has
//! grown to the batch: counted by a global allocator over steps of two
//! sequences, for interleaved (Q4_1) and k-quant (Q4_K) weights, and for a
//! mixture of experts (whose routing lists keep their room between steps).
//!
//! The only test in its binary, so no other test allocates while it counts.
//! It drives the model from a worker of a rayon pool, as the CLI and the
//! server do (`cpu::on_pool`): from outside, every parallel op would be
//! injected into the pool's queue, which allocates a block now and then.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrum_kernels::{CpuBackend, GgufQuantType};
use ferrum_models::llama::{preset, LlamaConfig, LlamaModel};
use ferrum_models::{DecoderOnlyLLM, KvManaged, KvPoolConfig, LogitsWanted, Segment};

/// Counts every allocation and reallocation, on any thread.
struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        System.realloc(ptr, layout, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    ferrum_kernels::cpu::on_pool(Some(2), count_allocations).unwrap();
}

/// `name`'s layout at toy size (a mixture keeps 16 experts, 4 active).
fn small(name: &str) -> LlamaConfig {
    let mut cfg = preset(name).unwrap();
    (cfg.hidden, cfg.intermediate, cfg.layers) = (256, 512, 2);
    (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.vocab) = (4, 2, 64, 1000);
    cfg.rotary_dims = 64;
    cfg.sliding = vec![false; 2];
    if let Some(moe) = cfg.moe.as_mut() {
        (moe.experts, moe.top_k, moe.intermediate) = (16, 4, 256);
        moe.sparse = vec![true; 2];
    }
    cfg
}

fn count_allocations() {
    let dense = small("qwen2.5-0.5b");
    for (cfg, ty) in [
        (dense.clone(), GgufQuantType::Q4_1),
        (dense, GgufQuantType::Q4K),
        (small("qwen3-30b-a3b"), GgufQuantType::Q4K),
    ] {
        let mut model = KvManaged::new(
            LlamaModel::<CpuBackend>::random(cfg.clone(), ty, false, 3, &KvPoolConfig::default())
                .unwrap(),
        );
        let ids = ["a", "b"];
        for id in ids {
            model.prepare(id, 128);
            model.try_prefill(id, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
        }
        let mut logits = Vec::new();
        let mut step = |model: &mut KvManaged<LlamaModel<CpuBackend>>, i: usize| {
            let toks = [[(i % 1000) as u32], [(7 * i % 1000) as u32]];
            let segs = [0, 1].map(|s| Segment {
                cache_id: ids[s],
                tokens: &toks[s],
                pos: 7 + i,
                logits: LogitsWanted::Last,
            });
            model.forward_into(&segs, &mut logits).unwrap();
            assert_eq!(logits.len(), 2 * cfg.vocab);
        };
        // Warm-up: the model's buffers grow to the batch in the first step
        // (the pool threads' attention scratch was sized by `on_pool`).
        for i in 0..16 {
            step(&mut model, i);
        }
        let before = ALLOCS.load(Ordering::SeqCst);
        // Crosses several 16-position KV blocks.
        for i in 16..72 {
            step(&mut model, i);
        }
        let during = ALLOCS.load(Ordering::SeqCst) - before;
        assert_eq!(
            during, 0,
            "{:?} {ty:?}: {during} allocations in 56 decode steps",
            cfg.arch
        );
    }
}
