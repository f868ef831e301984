//! What this CPU's vector units can do at most, for the quantized GEMM's
//! inner loops: eight independent accumulators, operands in registers,
//! nothing else in the loop. Throughput is multiply-adds per second, so a
//! `gemm_quant` figure (FLOP/s, two per multiply-add) divided by twice
//! these says how close a kernel runs to the instructions it is built on.
//!
//! - `pmaddwd`: the 16-bit multiply alone (16 multiply-adds each);
//! - `pmaddwd_paddd`: with the i32 accumulation the kernels need after
//!   each one (the AVX2 integer kernels' inner loop: 16-bit activations);
//! - `pmaddubsw_paddw`: the 8-bit form with i16 accumulation (32 each;
//!   what 8-bit activations would run on);
//! - `fma_f32`: f32 FMA (8 each);
//! - `vpdpbusd_zmm`: 512-bit `VPDPBUSD` (64 each; where the CPU has
//!   AVX-512 VNNI), and `vpdpbusd_zmm_finish` with the float finish the
//!   k-quant kernels give each row and 32-value span: on a Zen 4 both
//!   take the same two pipes, so the finish costs dot-product cycles.
//!
//! `cargo bench -p ferrum-benches --bench ceiling`

use criterion::{criterion_group, criterion_main, Criterion};

/// Loop trips per timed call: 8 instructions of the measured kind each.
#[cfg(target_arch = "x86_64")]
const TRIPS: usize = 100_000;

#[cfg(target_arch = "x86_64")]
mod loops {
    use std::arch::asm;

    /// Eight `$op` on ymm12/13 × ymm14/15 per trip, `n` trips; with
    /// `$acc`, each result is then added into one of eight accumulators.
    macro_rules! unit_loop {
        ($name:ident, $op:literal) => {
            /// # Safety
            /// The CPU must have AVX2 and FMA.
            pub unsafe fn $name(n: usize) {
                // SAFETY: register-only instructions on clobbered registers.
                unsafe {
                    asm!(
                        "2:",
                        concat!($op, " ymm0, ymm12, ymm14"),
                        concat!($op, " ymm1, ymm13, ymm14"),
                        concat!($op, " ymm2, ymm12, ymm15"),
                        concat!($op, " ymm3, ymm13, ymm15"),
                        concat!($op, " ymm4, ymm12, ymm14"),
                        concat!($op, " ymm5, ymm13, ymm14"),
                        concat!($op, " ymm6, ymm12, ymm15"),
                        concat!($op, " ymm7, ymm13, ymm15"),
                        "dec {n}",
                        "jnz 2b",
                        n = inout(reg) n.max(1) => _,
                        out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                        out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                        options(nomem, nostack),
                    );
                }
            }
        };
        ($name:ident, $op:literal, $acc:literal) => {
            /// # Safety
            /// The CPU must have AVX2.
            pub unsafe fn $name(n: usize) {
                // SAFETY: register-only instructions on clobbered registers.
                unsafe {
                    asm!(
                        "2:",
                        concat!($op, " ymm8, ymm12, ymm14"), concat!($acc, " ymm0, ymm0, ymm8"),
                        concat!($op, " ymm9, ymm13, ymm14"), concat!($acc, " ymm1, ymm1, ymm9"),
                        concat!($op, " ymm10, ymm12, ymm15"), concat!($acc, " ymm2, ymm2, ymm10"),
                        concat!($op, " ymm11, ymm13, ymm15"), concat!($acc, " ymm3, ymm3, ymm11"),
                        concat!($op, " ymm8, ymm12, ymm14"), concat!($acc, " ymm4, ymm4, ymm8"),
                        concat!($op, " ymm9, ymm13, ymm14"), concat!($acc, " ymm5, ymm5, ymm9"),
                        concat!($op, " ymm10, ymm12, ymm15"), concat!($acc, " ymm6, ymm6, ymm10"),
                        concat!($op, " ymm11, ymm13, ymm15"), concat!($acc, " ymm7, ymm7, ymm11"),
                        "dec {n}",
                        "jnz 2b",
                        n = inout(reg) n.max(1) => _,
                        out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                        out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                        out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                        options(nomem, nostack),
                    );
                }
            }
        };
    }

    /// Eight 512-bit `VPDPBUSD` per trip (64 multiply-adds each: the
    /// k-quant kernels' with AVX-512 VNNI), eight accumulators; with
    /// `float`, also a row's float finish of a span in those kernels (a
    /// conversion, a multiply and two FMAs), to see whether it issues
    /// beside the dot products or takes their cycles.
    macro_rules! vnni_loop {
        ($name:ident $(, $float:literal)*) => {
            /// # Safety
            /// The CPU must have AVX-512 F and VNNI.
            #[target_feature(enable = "avx512f,avx512vnni")]
            pub unsafe fn $name(n: usize) {
                // SAFETY: register-only instructions on clobbered registers.
                unsafe {
                    asm!(
                        // The finish's float operands: zeros, never
                        // subnormals (whose assists would be timed too).
                        "vpxord zmm16, zmm16, zmm16", "vpxord zmm17, zmm17, zmm17",
                        "vpxord zmm18, zmm18, zmm18", "vpxord zmm19, zmm19, zmm19",
                        "2:",
                        "vpdpbusd zmm0, zmm12, zmm14", "vpdpbusd zmm1, zmm13, zmm14",
                        "vpdpbusd zmm2, zmm12, zmm15", "vpdpbusd zmm3, zmm13, zmm15",
                        "vpdpbusd zmm4, zmm12, zmm14", "vpdpbusd zmm5, zmm13, zmm14",
                        "vpdpbusd zmm6, zmm12, zmm15", "vpdpbusd zmm7, zmm13, zmm15",
                        $($float,)*
                        "dec {n}",
                        "jnz 2b",
                        n = inout(reg) n.max(1) => _,
                        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                        out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                        out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                        options(nomem, nostack),
                    );
                }
            }
        };
    }

    vnni_loop!(vpdpbusd_zmm);
    vnni_loop!(
        vpdpbusd_zmm_finish,
        "vcvtdq2ps zmm8, zmm0",
        "vmulps zmm9, zmm16, zmm17",
        "vfmadd231ps zmm10, zmm8, zmm9",
        "vfnmadd231ps zmm11, zmm18, zmm19"
    );
    unit_loop!(pmaddwd, "vpmaddwd");
    unit_loop!(pmaddwd_paddd, "vpmaddwd", "vpaddd");
    unit_loop!(pmaddubsw_paddw, "vpmaddubsw", "vpaddw");
    unit_loop!(fma_f32, "vfmadd231ps");
}

#[cfg(target_arch = "x86_64")]
fn bench_ceiling(c: &mut Criterion) {
    use criterion::Throughput;
    use std::time::Duration;

    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    let mut group = c.benchmark_group("ceiling");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    /// Name, loop, multiply-adds per instruction of the measured kind.
    type Case = (&'static str, unsafe fn(usize), u64);
    let cases: [Case; 4] = [
        ("pmaddwd", loops::pmaddwd, 16),
        ("pmaddwd_paddd", loops::pmaddwd_paddd, 16),
        ("pmaddubsw_paddw", loops::pmaddubsw_paddw, 32),
        ("fma_f32", loops::fma_f32, 8),
    ];
    for (name, run, per) in cases {
        group.throughput(Throughput::Elements(8 * per * TRIPS as u64));
        // SAFETY: AVX2 and FMA were detected above.
        group.bench_function(name, |b| b.iter(|| unsafe { run(TRIPS) }));
    }
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni") {
        let vnni: [Case; 2] = [
            ("vpdpbusd_zmm", loops::vpdpbusd_zmm, 64),
            ("vpdpbusd_zmm_finish", loops::vpdpbusd_zmm_finish, 64),
        ];
        for (name, run, per) in vnni {
            group.throughput(Throughput::Elements(8 * per * TRIPS as u64));
            // SAFETY: AVX-512 F and VNNI were detected just above.
            group.bench_function(name, |b| b.iter(|| unsafe { run(TRIPS) }));
        }
    } else {
        eprintln!("skipped the VPDPBUSD loops: this CPU lacks AVX-512 VNNI");
    }
    group.finish();
}

#[cfg(not(target_arch = "x86_64"))]
fn bench_ceiling(_: &mut Criterion) {
    eprintln!("skipped: the ceiling loops are x86-64 assembly");
}

criterion_group!(benches, bench_ceiling);
criterion_main!(benches);
