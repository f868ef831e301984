//! Integer vector steps shared by the x86 k-quant kernels (`kquant_lanes`,
//! `kquant_rows`).

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

/// `VPDPBUSD` (unsigned `w` bytes times signed `a` bytes, four products
/// per i32 lane) and `VPDPWSSD` in inline assembly: from the intrinsics,
/// LLVM's generic tuning splits them back into two instructions each.
/// Only reached from the VNNI entry point, whose target features let them
/// inline.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
#[inline]
pub(crate) unsafe fn dpbusd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpbusd {d:y}, {w:y}, {a:y}",
        d = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(zmm_reg) a,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

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
