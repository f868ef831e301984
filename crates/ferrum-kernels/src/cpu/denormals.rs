//! Subnormal floats flushed to zero on the CPU kernels' threads.
//!
//! Intel cores take a microcode assist (on the order of a hundred cycles)
//! for each vector operation that reads or produces a subnormal f32; AMD's
//! Zen cores mostly do not. Softmax weights of far-below-maximum scores
//! (our `exp` reaches 2^-126 times a factor below one) and the online
//! softmax's rescaling make them in attention, and a model whose activations
//! grow or shrink far makes them everywhere: on the Xeon GPU host, a
//! Qwen2.5-1.5B-shaped Q4_K_M file of random weights prefilled at 62 tok/s
//! (128 tokens; 22 at 512) and at 117-149 with flushing, where a Zen 4 was
//! unaffected (`docs/perf-log.md`, session 30). Values below 1.2e-38 carry
//! nothing a model's output can show, so, as TensorFlow's compute threads
//! do, the pool's threads run with x86's FTZ and DAZ (MXCSR bits 15 and 6) or
//! AArch64's FZ (FPCR bit 24), which flush subnormal inputs and results
//! alike: x86 and Arm keep computing the same bits (they can differ only
//! for results within a rounding of 2^-126, where x86 judges tininess after
//! rounding and Arm before).

/// Sets this thread to flush subnormal f32 inputs and results to zero.
pub(crate) fn flush_on_this_thread() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads and writes this thread's MXCSR; FTZ and DAZ change
    // only how subnormals round (every x86-64 CPU has both bits).
    unsafe {
        let mut csr = 0u32;
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        csr |= 1 << 15 | 1 << 6;
        std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads and writes this thread's FPCR; FZ changes only how
    // subnormals round.
    unsafe {
        let mut fpcr: u64;
        std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack, preserves_flags));
        fpcr |= 1 << 24;
        std::arch::asm!("msr fpcr, {}", in(reg) fpcr, options(nomem, nostack, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    use std::hint::black_box;

    /// On the kernels' pool, a product below 2^-126 is zero and a
    /// subnormal input reads as zero; off it, both are as IEEE says.
    #[test]
    fn pool_threads_flush_subnormals() {
        let tiny = || black_box(f32::MIN_POSITIVE) * black_box(0.25);
        let read = || black_box(f32::from_bits(1)) * black_box(2.0);
        let flushed = super::super::on_pool(Some(2), || rayon::broadcast(|_| (tiny(), read())))
            .unwrap_or_else(|e| panic!("{e}"));
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(
                flushed.iter().all(|&(t, r)| t == 0.0 && r == 0.0),
                "{flushed:?}"
            );
        }
        let ieee = std::thread::spawn(move || (tiny(), read()))
            .join()
            .unwrap_or_else(|_| panic!("thread"));
        assert_eq!(ieee, (f32::MIN_POSITIVE / 4.0, f32::from_bits(2)));
    }
}
