//! Flash attention over a 4096-token context, decode (q_len 1) and prefill
//! (q_len 512), with Qwen2.5-0.5B's heads (14 query, 2 KV, head_dim 64).
//! Throughput is FLOP/s: 4·heads·head_dim per visible (query, key) pair.
//!
//! Then one decode step's attention over paged pools of f32 and f16 values:
//! SmolLM2-135M's shapes (30 layers of 9 query heads on 3 KV heads,
//! head_dim 64) at 2,048 positions (94 MB of f32 K/V, more than the
//! last-level cache, as a decode step at depth reads them) and at 512
//! (within it), and Gemma-3-270m's three global layers (4 query heads on one
//! KV head of 256) at 2,048. Throughput is pool bytes.
//!
//! Last, a batched decode step's attention: eight SmolLM2 sequences at 128
//! and 512 keys, in FLOP/s.
//!
//! `cargo bench -p ferrum-benches --bench attention`

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use ferrum_kernels::{AttnConfig, AttnSegment, Backend, CpuBackend, KvDtype, PagedKv, Span};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Causal attention of `nh` query heads on `nkv` KV heads of `hd`.
fn causal(nh: usize, nkv: usize, hd: usize) -> AttnConfig {
    AttnConfig {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        causal: true,
        scale: 1.0 / (hd as f32).sqrt(),
        kv_seq_stride: 0,
        sliding_window: 0,
        softcap: 0.0,
    }
}

/// Ten samples of three seconds each.
fn short(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
}

fn bench_attention(c: &mut Criterion) {
    let mut group = c.benchmark_group("flash_attention");
    short(&mut group);
    let (nh, nkv, hd, kv_len) = (14usize, 2usize, 64usize, 4096usize);
    let cfg = causal(nh, nkv, hd);
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
                        [&k, &v],
                        &mut out,
                        1,
                        Span { q_len, kv_len, pos_offset },
                        &cfg,
                    )
                })
            },
        );
    }
    group.finish();
}

fn bench_paged_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("paged_decode");
    short(&mut group);
    let bs = 16;
    // (name, layers, query heads, KV heads, head_dim, keys)
    for (name, layers, nh, nkv, hd, kv_len) in [
        ("smollm2_kv2048", 30, 9, 3, 64, 2048usize),
        ("smollm2_kv512", 30, 9, 3, 64, 512),
        ("gemma3_kv2048", 3, 4, 1, 256, 2048),
    ] {
        let cfg = causal(nh, nkv, hd);
        let table: Vec<u32> = (0..(kv_len / bs) as u32).collect();
        let pages = PagedKv { block_table: &table, block_size: bs };
        let len = table.len() * pages.block_len(nkv, hd);
        let mut rng = StdRng::seed_from_u64(1);
        let values: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let src = CpuBackend::from_slice(&values);
        let q = CpuBackend::from_slice(&values[..nh * hd]);
        let mut out = CpuBackend::alloc(nh * hd);
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let pool = || {
                let mut p = CpuBackend::alloc_kv(len, dtype);
                CpuBackend::copy_slice(&mut (), &src, 0, &mut p, 0, len);
                p
            };
            let pools: Vec<_> = (0..layers).map(|_| (pool(), pool())).collect();
            let bytes = if dtype == KvDtype::F32 { 4 } else { 2 };
            group.throughput(Throughput::Bytes((2 * layers * len * bytes) as u64));
            group.bench_with_input(BenchmarkId::new(name, dtype), &(), |b, _| {
                b.iter(|| {
                    for (k, v) in &pools {
                        CpuBackend::paged_attention(
                            &mut (),
                            &q,
                            [k, v],
                            &pages,
                            &mut out,
                            Span { q_len: 1, kv_len, pos_offset: kv_len - 1 },
                            &cfg,
                        );
                    }
                })
            });
        }
    }
    group.finish();
}

/// One batched decode step's attention (`paged_attention_segments`) over
/// SmolLM2-135M's 30 layers: eight sequences of `kv_len` keys each in f16
/// pools, the shape of `ferrum bench --batch 8`. At short context the work
/// per task is a few key tiles, so per-task and per-tile overheads show.
fn bench_batch_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_decode");
    short(&mut group);
    let (bs, layers, nh, nkv, hd, seqs) = (16, 30, 9, 3, 64, 8);
    let cfg = causal(nh, nkv, hd);
    for kv_len in [128usize, 512] {
        let per_seq = kv_len / bs;
        let tables: Vec<Vec<u32>> = (0..seqs)
            .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
            .collect();
        let segs: Vec<AttnSegment> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| AttnSegment {
                pages: PagedKv { block_table: t, block_size: bs },
                offset: i * nh * hd,
                q_len: 1,
                kv_len,
                pos_offset: kv_len - 1,
            })
            .collect();
        let len = seqs * per_seq * segs[0].pages.block_len(nkv, hd);
        let mut rng = StdRng::seed_from_u64(2);
        let values: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let src = CpuBackend::from_slice(&values);
        let q = CpuBackend::from_slice(&values[..seqs * nh * hd]);
        let mut out = CpuBackend::alloc(seqs * nh * hd);
        let pool = || {
            let mut p = CpuBackend::alloc_kv(len, KvDtype::F16);
            CpuBackend::copy_slice(&mut (), &src, 0, &mut p, 0, len);
            p
        };
        let pools: Vec<_> = (0..layers).map(|_| (pool(), pool())).collect();
        group.throughput(Throughput::Elements(
            (4 * layers * seqs * nh * hd * kv_len) as u64,
        ));
        group.bench_with_input(
            BenchmarkId::new("smollm2_8seqs", format!("kv{kv_len}")),
            &(),
            |b, _| {
                b.iter(|| {
                    for (k, v) in &pools {
                        CpuBackend::paged_attention_segments(
                            &mut (),
                            &q,
                            [k, v],
                            &segs,
                            &mut out,
                            &cfg,
                        );
                    }
                })
            },
        );
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_attention,
    bench_paged_decode,
    bench_batch_decode
);
criterion_main!(benches);
