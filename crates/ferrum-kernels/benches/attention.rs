//! Flash attention over a 4096-token context, decode (q_len 1) and prefill
//! (q_len 512), with Qwen2.5-0.5B's heads (14 query, 2 KV, head_dim 64).
//! Throughput is FLOP/s: 4·heads·head_dim per visible (query, key) pair.
//!
//! `cargo bench -p ferrum-kernels --bench attention`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrum_kernels::{AttnConfig, Backend, CpuBackend};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn bench_attention(c: &mut Criterion) {
    let mut group = c.benchmark_group("flash_attention");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let (nh, nkv, hd, kv_len) = (14usize, 2usize, 64usize, 4096usize);
    let cfg = AttnConfig {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        causal: true,
        scale: 1.0 / (hd as f32).sqrt(),
        kv_seq_stride: 0,
        sliding_window: 0,
    };
    let mut rng = StdRng::seed_from_u64(0);
    let mut rand = |n: usize| {
        CpuBackend::from_slice(
            &(0..n)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect::<Vec<_>>(),
        )
    };
    let k = rand(nkv * kv_len * hd);
    let v = rand(nkv * kv_len * hd);
    for &q_len in &[1usize, 512] {
        let q = rand(nh * q_len * hd);
        let mut out = CpuBackend::alloc(nh * q_len * hd);
        let pos_offset = kv_len - q_len;
        // Causal: query i sees pos_offset + i + 1 keys.
        let pairs: usize = (0..q_len).map(|i| pos_offset + i + 1).sum();
        group.throughput(Throughput::Elements((4 * nh * hd * pairs) as u64));
        group.bench_with_input(
            BenchmarkId::new("kv4096", format!("q{q_len}")),
            &(),
            |b, _| {
                b.iter(|| {
                    CpuBackend::flash_attention(
                        &mut (),
                        &q,
                        &k,
                        &v,
                        &mut out,
                        1,
                        q_len,
                        kv_len,
                        pos_offset,
                        &cfg,
                    )
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_attention);
criterion_main!(benches);
