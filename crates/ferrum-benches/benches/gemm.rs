//! Dense and GGUF-quantized GEMM at LLM shapes. Throughput is reported in
//! FLOP/s (criterion's "elements" are flops: 2·m·n·k per call); for m = 1 the
//! quantized group also reports weight bytes per second (the memory wall).
//!
//! `cargo bench -p ferrum-benches --bench gemm [-- gemm_quant]`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrum_kernels::{Backend, CpuBackend, Gemm, GgufQuantType, QuantKind, QuantWeights};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn bench_gemm(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_f32");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut rng = StdRng::seed_from_u64(0);
    // (n, k): Qwen2.5-0.5B's attention/output projection, MLP up and down.
    for &m in &[1usize, 16, 512] {
        for &(n, k) in &[(896usize, 896usize), (4864, 896), (896, 4864)] {
            let a = CpuBackend::from_slice(
                &(0..m * k)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect::<Vec<_>>(),
            );
            let b = CpuBackend::from_slice(
                &(0..n * k)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect::<Vec<_>>(),
            );
            let mut out = CpuBackend::alloc(m * n);
            group.throughput(Throughput::Elements((2 * m * n * k) as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("m{m}"), format!("n{n}_k{k}")),
                &(),
                |bch, _| bch.iter(|| CpuBackend::gemm(&mut (), &a, &b, &mut out, Gemm { m, n, k })),
            );
        }
    }
    group.finish();
}

/// Random blocks of `t` with small finite f16 scales (offset 0, 80 for
/// Q2_K, 108 for Q3_K and 208 for Q6_K; the second scale of the offset
/// types is random but finite often enough not to matter for timing).
fn random_blocks(rng: &mut StdRng, t: GgufQuantType, rows: usize, k: usize) -> Vec<u8> {
    let ty = t.ggml();
    let bb = ty.block_bytes();
    let mut bytes: Vec<u8> = (0..rows * k / ty.block_size() * bb)
        .map(|_| rng.random())
        .collect();
    let at = match t {
        GgufQuantType::Q6K => 208,
        GgufQuantType::Q3K => 108,
        GgufQuantType::Q2K => 80,
        _ => 0,
    };
    for b in bytes.chunks_mut(bb) {
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
    }
    bytes
}

/// Timed inside a rayon pool, as the engine runs (`cpu::on_pool`): from
/// outside, every call would also pay for waking the pool's threads.
fn bench_gemm_quant(c: &mut Criterion) {
    use GgufQuantType::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("gemm_quant");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let mut rng = StdRng::seed_from_u64(1);
    // Qwen2.5-0.5B Q4_K_M: gate/up (k = 896, legacy types as 896 is not a
    // multiple of 256) and down (k = 4,864, k-quants); Q4_1 and Q8_0 also
    // with 8-bit activations (`int8_activations`, where this CPU takes them).
    for (t, n, k, int8_activations) in [
        (Q4_1, 4864, 896, false),
        (Q4_1, 4864, 896, true),
        (Q5_0, 4864, 896, false),
        (Q8_0, 4864, 896, false),
        (Q8_0, 4864, 896, true),
        (Q2K, 896, 4864, true),
        (Q3K, 896, 4864, true),
        (Q4K, 896, 4864, false),
        (Q4K, 896, 4864, true),
        (Q5K, 896, 4864, true),
        (Q6K, 896, 4864, false),
        (Q6K, 896, 4864, true),
    ] {
        let bytes = random_blocks(&mut rng, t, n, k);
        let qw = CpuBackend::load_gguf(&bytes, t, n, k).unwrap_or_else(|e| panic!("{e}"));
        let weights = QuantWeights::<CpuBackend> {
            qweight: &qw,
            scales: None,
            zeros: None,
            g_idx: None,
        };
        let kind = QuantKind::Gguf { quant_type: t, int8_activations };
        let name = quant_name(t, int8_activations);
        for m in [1usize, 8, 64] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let a = CpuBackend::from_slice(&a);
            let mut out = CpuBackend::alloc(m * n);
            group.throughput(quant_throughput(m, n, k, bytes.len()));
            group.bench_with_input(BenchmarkId::new(&name, m), &m, |b, &m| {
                b.iter_custom(|iters| {
                    timed_on(&pool, iters, |_| {
                        CpuBackend::gemm_quant(
                            &mut (),
                            &a,
                            &weights,
                            &mut out,
                            Gemm { m, n, k },
                            &kind,
                        )
                        .unwrap_or_else(|e| panic!("{e}"))
                    })
                })
            });
        }
    }
    group.finish();
}

/// Decode as a model runs it: one activation row against weights that do
/// not fit in the caches (eight copies of a Qwen2.5-1.5B MLP matrix, 60-120
/// MB, taken in turn), so each call streams its weights from memory:
/// weight bytes per second against the machine's bandwidth. Then a decode
/// batch's eight rows, from memory (`/m8`) and against a single copy
/// (`/m8_one_copy`), in FLOP/s as `gemm_quant` reports them.
fn bench_decode_from_memory(c: &mut Criterion) {
    use GgufQuantType::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("gemm_quant_dram");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut rng = StdRng::seed_from_u64(2);
    let (n, k, copies) = (8960, 1536, 8);
    for (t, int8_activations) in [
        (Q4_1, true),
        (Q4K, true),
        (Q6K, true),
        (Q6K, false),
        (Q8_0, true),
        (Q8_0, false),
    ] {
        let bytes = random_blocks(&mut rng, t, n, k);
        let qws: Vec<_> = (0..copies)
            .map(|_| CpuBackend::load_gguf(&bytes, t, n, k).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let kind = QuantKind::Gguf { quant_type: t, int8_activations };
        // One row (decode), eight (a decode batch) from memory, and eight
        // against one copy (7-13 MB, in L3 where it has room) to show what
        // streaming from memory costs the batch.
        for (m, cp, tag) in [
            (1usize, copies, ""),
            (8, copies, "/m8"),
            (8, 1, "/m8_one_copy"),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let a = CpuBackend::from_slice(&a);
            let mut out = CpuBackend::alloc(m * n);
            group.throughput(quant_throughput(m, n, k, bytes.len()));
            let name = format!("{}{tag}", quant_name(t, int8_activations));
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    timed_on(&pool, iters, |i| {
                        let weights = QuantWeights::<CpuBackend> {
                            qweight: &qws[i % cp],
                            scales: None,
                            zeros: None,
                            g_idx: None,
                        };
                        CpuBackend::gemm_quant(
                            &mut (),
                            &a,
                            &weights,
                            &mut out,
                            Gemm { m, n, k },
                            &kind,
                        )
                        .unwrap_or_else(|e| panic!("{e}"))
                    })
                })
            });
        }
    }
    group.finish();
}

/// A quantized kind's bench name: the type, `_int8` with 8-bit activations.
fn quant_name(t: GgufQuantType, int8_activations: bool) -> String {
    format!("{t:?}{}", if int8_activations { "_int8" } else { "" })
}

/// Weight bytes per second for one activation row (the memory wall),
/// FLOP/s for more.
fn quant_throughput(m: usize, n: usize, k: usize, weight_bytes: usize) -> Throughput {
    if m == 1 {
        Throughput::Bytes(weight_bytes as u64)
    } else {
        Throughput::Elements((2 * m * n * k) as u64)
    }
}

/// `iters` calls of `call` (given the call's index) on `pool`'s threads.
fn timed_on(pool: &rayon::ThreadPool, iters: u64, mut call: impl FnMut(usize) + Send) -> Duration {
    pool.install(|| {
        let t = Instant::now();
        for i in 0..iters as usize {
            call(i);
        }
        t.elapsed()
    })
}

criterion_group!(
    benches,
    bench_gemm,
    bench_gemm_quant,
    bench_decode_from_memory
);
criterion_main!(benches);
