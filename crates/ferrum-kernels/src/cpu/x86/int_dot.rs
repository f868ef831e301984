//! Integer vector steps shared by the x86 quantized kernels (`kquant_rows`,
//! `interleaved`).

use std::arch::x86_64::*;

/// `x` shifted left by `s` bits in 16-bit lanes (right for negative `s`);
/// masked per byte afterwards, bits stay within their byte where needed.
#[inline(always)]
pub(crate) unsafe fn shift16(x: __m256i, s: i32) -> __m256i {
    match s.cmp(&0) {
        std::cmp::Ordering::Greater => _mm256_sll_epi16(x, _mm_cvtsi32_si128(s)),
        std::cmp::Ordering::Less => _mm256_srl_epi16(x, _mm_cvtsi32_si128(-s)),
        std::cmp::Ordering::Equal => x,
    }
}

/// `VPDPBUSD`: unsigned `w` bytes times the four signed activation bytes
/// at `a + OFF`, broadcast from memory by the instruction itself (EVEX
/// `{1to8}`), four products per i32 lane added to `acc`. Inline assembly:
/// from the intrinsics, LLVM's generic tuning splits the instruction back
/// into two and never folds the broadcast. Folded, the eight-row k-quant
/// kernel runs one instruction per multiply, not two (and with Q6_K's
/// halves folded one at a time, its integer sums fit the registers):
/// `gemm_quant` Q6_K m = 64 +43%, Q5_K +20% on a Zen 4. Only reached from
/// the VNNI entry point, whose target features let it inline.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn dpbusd_at<const OFF: usize>(
    acc: __m256i,
    w: __m256i,
    a: *const i8,
) -> __m256i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpbusd {d:y}, {w:y}, dword ptr [{a} + {off}]{{1to8}}",
        d = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(reg) a,
        off = const OFF,
        options(pure, readonly, nostack, preserves_flags),
    );
    acc
}

/// [`dpbusd_at`] on 512-bit vectors (sixteen i32 lanes, `{1to16}`).
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) unsafe fn dpbusd512_at<const OFF: usize>(
    acc: __m512i,
    w: __m512i,
    a: *const i8,
) -> __m512i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpbusd {d}, {w}, dword ptr [{a} + {off}]{{1to16}}",
        d = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(reg) a,
        off = const OFF,
        options(pure, readonly, nostack, preserves_flags),
    );
    acc
}

/// `VPDPWSSD` (i16 pairs times i16 pairs into i32 lanes), likewise.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn dpwssd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpwssd {d:y}, {w:y}, {a:y}",
        d = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(zmm_reg) a,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}
