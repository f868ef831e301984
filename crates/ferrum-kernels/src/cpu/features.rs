//! CPU feature detection for the kernels, in one place. Each answer is the
//! standard library's cached flag (one atomic load), so kernels ask at every
//! call rather than caching it themselves.

/// AVX2, FMA and F16C: what every vector kernel needs (every AVX2 CPU made
/// has F16C, which widens half-precision rows).
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// 256-bit `VPDPWSSD`/`VPDPBUSD` (AVX-512 VNNI with VL) and the AVX-512BW
/// lane masks the integer kernels pair with them.
#[inline]
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
