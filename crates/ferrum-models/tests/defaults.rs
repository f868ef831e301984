//! The provided methods of `DecoderOnlyLLM`, exercised through a toy model
//! whose logits record what it was asked to do.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::collections::HashMap;

use ferrum_models::{DecoderOnlyLLM, KvPoolConfig, LlmRuntimeConfig, KV_CAPACITY_ENV};

/// Logits are `[token, pos, kv_len_before, 0]`; the cache stores tokens.
struct Echo {
    cfg: LlmRuntimeConfig,
    caches: HashMap<String, Vec<u32>>,
}

impl Echo {
    fn new(max_seq_len: usize) -> Self {
        Self {
            cfg: LlmRuntimeConfig {
                hidden_size: 8,
                num_layers: 1,
                num_kv_heads: 1,
                head_dim: 8,
                vocab_size: 4,
                max_seq_len,
            },
            caches: HashMap::new(),
        }
    }
}

impl DecoderOnlyLLM for Echo {
    fn config(&self) -> &LlmRuntimeConfig {
        &self.cfg
    }
    fn prefill(&mut self, cache_id: &str, tokens: &[u32]) -> Vec<f32> {
        let c = self.caches.entry(cache_id.to_string()).or_default();
        let before = c.len();
        c.extend_from_slice(tokens);
        vec![
            *tokens.last().unwrap_or(&0) as f32,
            (c.len() - 1) as f32,
            before as f32,
            0.0,
        ]
    }
    fn decode(&mut self, cache_id: &str, token: u32, pos: u32) -> Vec<f32> {
        let c = self.caches.entry(cache_id.to_string()).or_default();
        let before = c.len();
        c.push(token);
        vec![token as f32, pos as f32, before as f32, 0.0]
    }
    fn release(&mut self, cache_id: &str) {
        self.caches.remove(cache_id);
    }
    fn kv_len(&self, cache_id: &str) -> usize {
        self.caches.get(cache_id).map_or(0, Vec::len)
    }
}

#[test]
fn decode_batch_keeps_order_and_routes_each_entry() {
    let mut m = Echo::new(64);
    m.prefill("a", &[1, 2]);
    m.prefill("b", &[5]);
    let out = m.decode_batch(&[("b".into(), 7, 1), ("a".into(), 9, 2)]);
    assert_eq!(
        out,
        vec![vec![7.0, 1.0, 1.0, 0.0], vec![9.0, 2.0, 2.0, 0.0]]
    );
    assert_eq!((m.kv_len("a"), m.kv_len("b")), (3, 2));
}

#[test]
fn forward_verify_continues_from_the_cache_end() {
    let mut m = Echo::new(64);
    m.prefill("s", &[1, 2, 3]);
    let out = m.forward_verify("s", &[10, 11]);
    // Two rows of vocab_size, positions 3 and 4.
    assert_eq!(out, vec![10.0, 3.0, 3.0, 0.0, 11.0, 4.0, 4.0, 0.0]);
    assert_eq!(m.kv_len("s"), 5);
    m.release("s");
    assert_eq!(m.kv_len("s"), 0);
}

#[test]
fn unified_forward_defaults_to_unsupported() {
    let mut m = Echo::new(64);
    let err = m
        .unified_forward(&[("s".into(), vec![1], 0, true)])
        .unwrap_err();
    assert!(err.is_unsupported());
}

#[test]
#[should_panic(expected = "truncate_kv")]
fn truncate_kv_default_refuses_loudly() {
    let mut m = Echo::new(64);
    m.truncate_kv("s", 0);
}

#[test]
fn kv_capacity_honours_env_and_ctx_and_refuses_a_bad_env() {
    // The only test touching this variable, so no other test races it.
    let m = Echo::new(2048);
    std::env::remove_var(KV_CAPACITY_ENV);
    assert_eq!(m.kv_capacity(), 2048);
    let pool = KvPoolConfig::default();
    assert_eq!(pool.sequence_capacity(2048, 4096).unwrap(), 2048);
    assert_eq!(pool.sequence_capacity(8192, 4096).unwrap(), 4096);
    std::env::set_var(KV_CAPACITY_ENV, "512");
    assert_eq!(m.kv_capacity(), 512);
    assert_eq!(pool.sequence_capacity(8192, 4096).unwrap(), 512);
    // `--ctx` wins over the variable; neither goes past the trained length.
    let ctx = |n| KvPoolConfig {
        context: Some(n),
        ..KvPoolConfig::default()
    };
    assert_eq!(ctx(1000).sequence_capacity(8192, 4096).unwrap(), 1000);
    assert_eq!(ctx(100_000).sequence_capacity(8192, 4096).unwrap(), 8192);
    assert!(ctx(0).sequence_capacity(8192, 4096).is_err());
    std::env::set_var(KV_CAPACITY_ENV, "100000");
    assert_eq!(m.kv_capacity(), 2048);
    for bad in ["0", "-3", "lots", "4k"] {
        std::env::set_var(KV_CAPACITY_ENV, bad);
        let err = pool.sequence_capacity(8192, 4096).unwrap_err().to_string();
        assert!(
            err.contains("FERRUM_KV_CAPACITY") && err.contains(bad),
            "{err}"
        );
        // The trait's default cannot fail: it falls back to the model's length.
        assert_eq!(m.kv_capacity(), 2048, "{bad:?}");
        assert_eq!(
            ctx(300).sequence_capacity(8192, 4096).unwrap(),
            300,
            "--ctx wins"
        );
    }
    std::env::set_var(KV_CAPACITY_ENV, " ");
    assert_eq!(
        pool.sequence_capacity(8192, 4096).unwrap(),
        4096,
        "empty is unset"
    );
    std::env::remove_var(KV_CAPACITY_ENV);
}
