//! Vector steps shared by the AArch64 quantized kernels (`kquant_rows`,
//! `interleaved`).

use std::arch::aarch64::*;

/// Which integer dot products a kernel uses (its `ISA` parameter): plain
/// NEON (`SMULL` + `SADALP`).
pub(crate) const NEON: u8 = 0;
/// `SDOT` (dotprod).
pub(crate) const DOTPROD: u8 = 1;
/// `SMMLA` (i8mm) for two or more 8-bit activation rows, `SDOT` for one.
pub(crate) const I8MM: u8 = 2;

/// `SDOT`: per i32 lane, `acc` plus the four products of its bytes.
/// Inline assembly: the intrinsic is not stable in Rust.
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(crate) unsafe fn sdot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!(
        "sdot {d:v}.4s, {w:v}.16b, {a:v}.16b",
        d = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `SMMLA`: `acc` plus the 2 x 2 products of `w`'s and `a`'s two rows of
/// eight bytes each: lanes (w0·a0, w0·a1, w1·a0, w1·a1). Inline assembly:
/// the intrinsic is not stable in Rust.
#[target_feature(enable = "neon,i8mm")]
#[inline]
pub(crate) unsafe fn smmla(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    std::arch::asm!(
        "smmla {d:v}.4s, {w:v}.16b, {a:v}.16b",
        d = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `lo` and `hi` (four rows of four bytes each, a row per i32 lane) as
/// [`smmla`]'s weight operands: rows 0, 1 and rows 2, 3, each row's `lo`
/// bytes then its `hi` bytes.
#[inline(always)]
pub(crate) unsafe fn row_pairs(lo: int8x16_t, hi: int8x16_t) -> [int8x16_t; 2] {
    let (lo, hi) = (vreinterpretq_s32_s8(lo), vreinterpretq_s32_s8(hi));
    [vzip1q_s32(lo, hi), vzip2q_s32(lo, hi)].map(|p| vreinterpretq_s8_s32(p))
}

/// [`smmla`]'s sums for weight rows (0, 1) in `y01` and (2, 3) in `y23`
/// against activation rows a, b: each activation row's four weight rows
/// in lane order, `[a, b]`.
#[inline(always)]
pub(crate) unsafe fn unpair(y01: int32x4_t, y23: int32x4_t) -> [int32x4_t; 2] {
    [vuzp1q_s32(y01, y23), vuzp2q_s32(y01, y23)]
}

/// Eight bytes at `a` and eight at `b` as [`smmla`]'s activation operand.
#[inline(always)]
pub(crate) unsafe fn act_pair(a: *const i8, b: *const i8) -> int8x16_t {
    vcombine_s8(vld1_s8(a), vld1_s8(b))
}

/// [`sdot`] for kernels from [`DOTPROD`] up; on plain NEON what it
/// computes: products widened to i16, adjacent pairs added (at most 2 · 63
/// · 127 for the kernels' 6-bit weights), then pairs of pairs into `acc`. Either way the sums are exact,
/// so both give the same bits.
#[inline(always)]
pub(crate) unsafe fn dot4<const ISA: u8>(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    if ISA >= DOTPROD {
        sdot(acc, w, a)
    } else {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let hi = vmull_high_s8(w, a);
        vpadalq_s16(acc, vpaddq_s16(lo, hi))
    }
}

/// Eight f16 at `p` as f32, four per vector (`FCVTL`, exact; the f16
/// vector type is not stable in Rust).
#[inline(always)]
pub(crate) unsafe fn f16x8(p: *const u8) -> [float32x4_t; 2] {
    let h = vld1q_u16(p.cast());
    let (lo, hi): (float32x4_t, float32x4_t);
    std::arch::asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags),
    );
    [lo, hi]
}
