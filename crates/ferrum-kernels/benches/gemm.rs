//! Dense GEMM at LLM shapes. Throughput is reported in FLOP/s (criterion's
//! "elements" are flops: 2·m·n·k per call).
//!
//! `cargo bench -p ferrum-kernels --bench gemm`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrum_kernels::{Backend, CpuBackend};
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
                |bch, _| bch.iter(|| CpuBackend::gemm(&mut (), &a, &b, &mut out, m, n, k)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_gemm);
criterion_main!(benches);
