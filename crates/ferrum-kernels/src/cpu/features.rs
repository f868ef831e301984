//! CPU feature detection for the kernels, in one place. Each answer is the
//! standard library's cached flag (one atomic load), so kernels ask at every
//! call rather than caching it themselves.
//!
//! `FERRUM_CPU_ISA=avx2` or `avx-vnni` caps the x86 kernels below what the
//! CPU has (as `MKL_ENABLE_INSTRUCTIONS` does for MKL): to compare the
//! paths on one machine, or to run a client core's kernels on a server.
//! Any other value, or none, leaves every detected feature in use.

/// The x86 kernel families, in order; `FERRUM_CPU_ISA` names the highest.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Isa {
    Avx2,
    AvxVnni,
    All,
}

/// The cap `FERRUM_CPU_ISA` sets (read once).
#[cfg(target_arch = "x86_64")]
fn cap() -> Isa {
    static CAP: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("FERRUM_CPU_ISA").as_deref() {
        Ok("avx2") => Isa::Avx2,
        Ok("avx-vnni") => Isa::AvxVnni,
        _ => Isa::All,
    })
}

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
        cap() == Isa::All
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX-VNNI: `VPDPBUSD`/`VPDPWSSD` VEX-encoded on 256-bit vectors (Intel
/// client cores from Alder Lake, which lack AVX-512).
#[inline]
pub(crate) fn has_avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        cap() >= Isa::AvxVnni && std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Advanced SIMD (NEON): part of every AArch64 CPU, the base of the Arm
/// kernels.
#[inline]
pub(crate) fn has_neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("neon")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// `SDOT` (Armv8.2 dotprod: four byte products per i32 lane), which the
/// 8-bit Arm kernels use where the CPU has it.
#[inline]
pub(crate) fn has_dotprod() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        has_neon() && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// `SMMLA` (Armv8.6 i8mm: a 2 x 8 by 8 x 2 byte matrix product per
/// instruction), reported by `ferrum system-info`.
#[inline]
pub(crate) fn has_i8mm() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        has_neon() && std::arch::is_aarch64_feature_detected!("i8mm")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}
