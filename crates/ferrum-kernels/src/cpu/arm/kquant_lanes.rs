//! The repacked k-quant kernels for AArch64 NEON. A 32-byte part of the
//! layout (the parent module) is two 16-byte registers, lanes 0..4 and
//! 4..8, so the x86 kernels' lane arithmetic carries over register half by
//! register half:
//!
//! - 8-bit activations: `SDOT` (dotprod) adds four byte products to each
//!   i32 lane, exactly what `VPDPBUSD` does per lane. Without dotprod,
//!   `SMULL` + `ADDP` + `SADALP` compute the same sums (each product is at
//!   most 63 · 127, a pair of them fits i16). Per super-block and activation
//!   row: 16 `SDOT` (or 48 instructions without), then x86's per-lane
//!   scaling and float steps in x86's order; SDOT and plain NEON give the
//!   same bits (tested).
//! - 16-bit activations: `SMLAL` on the parts widened once per block; each
//!   lane's four products per part accumulate in their own i32 lanes, scaled
//!   by the sub-block scale before they meet another sub-block's.
//!
//! Expected cost per 256-value super-block and activation row (no Arm CPU
//! was at hand to measure): 16 `SDOT` + ~12 for scales, against ~24 for
//! AVX2's `PMADDUBSW` route on half-as-wide registers; SMMLA (i8mm) is not
//! used yet: its 8-byte rows span two of this layout's lanes.

use std::arch::aarch64::*;

use ferrum_types::GgmlType;

use super::ActRows;
use crate::cpu::int_dot::dot4;
use crate::quant::scale_min_k4;

/// One repacked format (the parent module describes the layout).
trait Lanes {
    const BYTES: usize;
    /// Q6_K: 16-value sub-blocks, `2j` in parts 0..4 and `2j + 1` in parts
    /// 4..8 of lane `j`, and unsigned values offset by 32.
    const SIXTEENS: bool;
    /// The eight parts as unsigned bytes, lanes 0..4 then 4..8.
    unsafe fn parts(b: *const u8, out: &mut [[uint8x16_t; 2]; 8]);
}

/// Part `2u` and `2u + 1`'s low four bits from the 32 bytes at `p`.
#[inline(always)]
unsafe fn nibble_parts(p: *const u8, out: &mut [[uint8x16_t; 2]; 8]) {
    let mask = vdupq_n_u8(0x0F);
    for u in 0..4 {
        let x = [0, 1].map(|half| vld1q_u8(p.add(32 * u + 16 * half)));
        out[2 * u] = x.map(|x| vandq_u8(x, mask));
        out[2 * u + 1] = x.map(|x| vshrq_n_u8::<4>(x));
    }
}

/// `x` shifted left by `s` bits (right for negative `s`), then masked.
#[inline(always)]
unsafe fn bits(x: uint8x16_t, s: i8, mask: u8) -> uint8x16_t {
    vandq_u8(vshlq_u8(x, vdupq_n_s8(s)), vdupq_n_u8(mask))
}

struct Q4K;
impl Lanes for Q4K {
    const BYTES: usize = 144;
    const SIXTEENS: bool = false;
    #[inline(always)]
    unsafe fn parts(b: *const u8, out: &mut [[uint8x16_t; 2]; 8]) {
        nibble_parts(b.add(16), out);
    }
}

struct Q5K;
impl Lanes for Q5K {
    const BYTES: usize = 176;
    const SIXTEENS: bool = false;
    #[inline(always)]
    unsafe fn parts(b: *const u8, out: &mut [[uint8x16_t; 2]; 8]) {
        nibble_parts(b.add(48), out);
        // Bit h of the plane's bytes moves to bit 4.
        for half in 0..2 {
            let qh = vld1q_u8(b.add(16 + 16 * half));
            for (h, part) in out.iter_mut().enumerate() {
                part[half] = vorrq_u8(part[half], bits(qh, 4 - h as i8, 0x10));
            }
        }
    }
}

struct Q6K;
impl Lanes for Q6K {
    const BYTES: usize = 210;
    const SIXTEENS: bool = true;
    #[inline(always)]
    unsafe fn parts(b: *const u8, out: &mut [[uint8x16_t; 2]; 8]) {
        nibble_parts(b, out);
        // Bits 2i, 2i + 1 of plane u's bytes move to bits 4, 5 of part 4u + i.
        for u in 0..2 {
            let qh = [0, 1].map(|half| vld1q_u8(b.add(128 + 32 * u + 16 * half)));
            for i in 0..4 {
                for (part, &qh) in out[4 * u + i].iter_mut().zip(&qh) {
                    *part = vorrq_u8(*part, bits(qh, 4 - 2 * i as i8, 0x30));
                }
            }
        }
    }
}

/// A super-block's factors: `d`; Q4_K/Q5_K's `dmin · m` per lane (f32) and
/// scale per lane (`sc[0]`, also `sc[1]`); Q6_K's scales of parts 0..4
/// (`sc[0]`, sub-block `2j` in lane `j`) and 4..8 (`sc[1]`), and all sixteen
/// as i16 in their order (`nat`, for the offset of 32).
struct Header {
    d: f32,
    minsd: [float32x4_t; 2],
    sc: [[int32x4_t; 2]; 2],
    nat: [int16x8_t; 2],
    /// `sc` as integers.
    scales: [[i32; 8]; 2],
}

#[inline(always)]
unsafe fn lanes_i32(v: &[i32; 8]) -> [int32x4_t; 2] {
    [vld1q_s32(v.as_ptr()), vld1q_s32(v.as_ptr().add(4))]
}

#[inline(always)]
unsafe fn header<F: Lanes>(b: *const u8) -> Header {
    let block = std::slice::from_raw_parts(b, F::BYTES);
    if F::SIXTEENS {
        let nat: [i16; 16] = std::array::from_fn(|i| i16::from(block[192 + i] as i8));
        let scales = [0, 1].map(|set| std::array::from_fn(|j| i32::from(nat[2 * j + set])));
        Header {
            d: super::f16_at(block, 208),
            minsd: [vdupq_n_f32(0.0); 2],
            sc: [lanes_i32(&scales[0]), lanes_i32(&scales[1])],
            nat: [vld1q_s16(nat.as_ptr()), vld1q_s16(nat.as_ptr().add(8))],
            scales,
        }
    } else {
        let (mut sc, mut mn) = ([0i32; 8], [0i32; 8]);
        for j in 0..8 {
            let (s, m) = scale_min_k4(j, &block[4..16]);
            (sc[j], mn[j]) = (i32::from(s), i32::from(m));
        }
        let dmin = vdupq_n_f32(super::f16_at(block, 2));
        let mn = lanes_i32(&mn);
        let scv = lanes_i32(&sc);
        Header {
            d: super::f16_at(block, 0),
            minsd: [
                vmulq_f32(vcvtq_f32_s32(mn[0]), dmin),
                vmulq_f32(vcvtq_f32_s32(mn[1]), dmin),
            ],
            sc: [scv, scv],
            nat: [vdupq_n_s16(0); 2],
            scales: [sc, sc],
        }
    }
}

/// Per lane `j`, `32 · (nat[2j]·s[2j] + nat[2j+1]·s[2j+1])`: Q6_K's offset
/// against the activations' sums of 16.
#[inline(always)]
unsafe fn offset(nat: int16x8_t, s: int16x8_t) -> int32x4_t {
    let p = vpaddq_s32(
        vmull_s16(vget_low_s16(nat), vget_low_s16(s)),
        vmull_high_s16(nat, s),
    );
    vshlq_n_s32::<5>(p)
}

/// The sum of eight lanes in x86's `hsum` order: `(s0 + s2) + (s1 + s3)`
/// of `s = lo + hi`.
#[inline(always)]
unsafe fn hsum(acc: [float32x4_t; 2]) -> f32 {
    let s = vaddq_f32(acc[0], acc[1]);
    let t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
}

/// 8-bit activations ([`super::order8`]), one weight row at a time against
/// `M` activation rows.
#[inline(always)]
unsafe fn rows8<F: Lanes, const DOT: bool, const M: usize>(
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    dots: &mut [[f32; 8]],
) {
    let (k, stride) = (act.k, act.stride);
    let zero = vdupq_n_s32(0);
    for (j, dots) in dots.iter_mut().enumerate() {
        let row = w.add(j * row_bytes);
        let mut acc = [[vdupq_n_f32(0.0); 2]; M];
        let mut parts = [[vdupq_n_u8(0); 2]; 8];
        for bi in 0..k / 256 {
            let b = row.add(bi * F::BYTES);
            let hd = header::<F>(b);
            F::parts(b, &mut parts);
            let d = vdupq_n_f32(hd.d);
            for (c, acc) in acc.iter_mut().enumerate() {
                let a = act.q8.as_ptr().add((r0 + c) * k + 256 * bi);
                let mut y = [[zero; 2]; 2];
                for (h, part) in parts.iter().enumerate() {
                    let set = if F::SIXTEENS { h / 4 } else { 0 };
                    for half in 0..2 {
                        let av = vld1q_s8(a.add(32 * h + 16 * half));
                        let wv = vreinterpretq_s8_u8(part[half]);
                        y[set][half] = dot4::<DOT>(y[set][half], wv, av);
                    }
                }
                let at = (r0 + c) * stride + 8 * bi;
                let sums = act.sums16.as_ptr().add((r0 + c) * k / 16 + 16 * bi);
                for half in 0..2 {
                    let mut x = vmulq_s32(y[0][half], hd.sc[0][half]);
                    if F::SIXTEENS {
                        x = vmlaq_s32(x, y[1][half], hd.sc[1][half]);
                        let s16 = vld1q_s16(sums.add(8 * half));
                        x = vsubq_s32(x, offset(hd.nat[half], s16));
                    }
                    let da = vld1q_f32(act.d.as_ptr().add(at + 4 * half));
                    let y = vfmaq_f32(acc[half], vmulq_f32(vcvtq_f32_s32(x), da), d);
                    acc[half] = if F::SIXTEENS {
                        y
                    } else {
                        let sa = vld1q_f32(act.s.as_ptr().add(at + 4 * half));
                        vfmsq_f32(y, hd.minsd[half], sa)
                    };
                }
            }
        }
        for (dot, acc) in dots.iter_mut().zip(&acc) {
            *dot = hsum(*acc);
        }
    }
}

/// 16-bit activations ([`super::order16`]: per part, the i16 values of
/// lanes 0, 1, 4, 5, 2, 3, 6, 7, four each; one scale per super-block):
/// `acc += (float(Σ sc·q·a)·d − float(Σ m·Σa)·dmin) · d_a`.
#[inline(always)]
unsafe fn rows16<F: Lanes, const M: usize>(
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    dots: &mut [[f32; 8]],
) {
    let (k, stride, nsums) = (act.k, act.stride, act.k / 32);
    // Lane `j`'s four activations within a part's 32.
    const AT: [usize; 8] = [0, 4, 16, 20, 8, 12, 24, 28];
    for (j, dots) in dots.iter_mut().enumerate() {
        let row = w.add(j * row_bytes);
        let mut acc = [vdupq_n_f32(0.0); M];
        let mut parts = [[vdupq_n_u8(0); 2]; 8];
        for bi in 0..k / 256 {
            let b = row.add(bi * F::BYTES);
            let hd = header::<F>(b);
            F::parts(b, &mut parts);
            // Each part as i16 (Q6_K's made signed), lanes 0, 1 | 2, 3 |
            // 4, 5 | 6, 7.
            let mut wide = [[vdupq_n_s16(0); 4]; 8];
            for (part, wide) in parts.iter().zip(wide.iter_mut()) {
                for half in 0..2 {
                    let x = if F::SIXTEENS {
                        vsubq_s8(vreinterpretq_s8_u8(part[half]), vdupq_n_s8(32))
                    } else {
                        vreinterpretq_s8_u8(part[half])
                    };
                    wide[2 * half] = vmovl_s8(vget_low_s8(x));
                    wide[2 * half + 1] = vmovl_high_s8(x);
                }
            }
            for (c, acc) in acc.iter_mut().enumerate() {
                let a = act.qs.as_ptr().add((r0 + c) * k + 256 * bi);
                let mut xf = vdupq_n_f32(0.0);
                let sets = if F::SIXTEENS { 2 } else { 1 };
                for (set, scales) in hd.scales.iter().enumerate().take(sets) {
                    let mut lane = [vdupq_n_s32(0); 8];
                    for (h, wide) in wide.iter().enumerate().skip(4 * set).take(8 / sets) {
                        let p = a.add(32 * h);
                        for (l, lane) in lane.iter_mut().enumerate() {
                            let wv = if l % 2 == 0 {
                                vget_low_s16(wide[l / 2])
                            } else {
                                vget_high_s16(wide[l / 2])
                            };
                            *lane = vmlal_s16(*lane, wv, vld1_s16(p.add(AT[l])));
                        }
                    }
                    for (lane, &s) in lane.iter().zip(scales) {
                        xf = vaddq_f32(xf, vcvtq_f32_s32(vmulq_n_s32(*lane, s)));
                    }
                }
                let mut x = vmulq_n_f32(xf, hd.d);
                if !F::SIXTEENS {
                    let sums = act.sums.as_ptr().add((r0 + c) * nsums + 8 * bi);
                    let m = vaddq_f32(
                        vmulq_f32(vcvtq_f32_s32(vld1q_s32(sums)), hd.minsd[0]),
                        vmulq_f32(vcvtq_f32_s32(vld1q_s32(sums.add(4))), hd.minsd[1]),
                    );
                    x = vsubq_f32(x, m);
                }
                let da = *act.d.as_ptr().add((r0 + c) * stride + bi);
                *acc = vfmaq_n_f32(*acc, x, da);
            }
        }
        for (dot, acc) in dots.iter_mut().zip(&acc) {
            *dot = hsum([*acc, vdupq_n_f32(0.0)]);
        }
    }
}

#[inline(always)]
unsafe fn by_type<const DOT: bool>(
    ty: GgmlType,
    w: *const u8,
    rb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    macro_rules! run {
        ($f:ty) => {
            if act.a8 {
                by_m!(m, M => rows8::<$f, DOT, M>(w, rb, act, r0, dots))
            } else {
                by_m!(m, M => rows16::<$f, M>(w, rb, act, r0, dots))
            }
        };
    }
    match ty {
        GgmlType::Q4_K => run!(Q4K),
        GgmlType::Q5_K => run!(Q5K),
        GgmlType::Q6_K => run!(Q6K),
        _ => unreachable!("k-quant dot_rows called for {ty}"),
    }
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_rows_neon(
    ty: GgmlType,
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    by_type::<false>(ty, w, row_bytes, act, r0, m, dots)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn dot_rows_dotprod(
    ty: GgmlType,
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    by_type::<true>(ty, w, row_bytes, act, r0, m, dots)
}
