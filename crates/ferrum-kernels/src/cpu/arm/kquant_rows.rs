//! The row-grouped k-quant kernels (Q2_K to Q6_K) for AArch64 NEON (the
//! parent module describes the layout). A part's 32 bytes are two vectors
//! of four rows each.
//!
//! - 8-bit activations: `SDOT` (or `SMULL` + `ADDP` + `SADALP`) adds a
//!   row's four products to its lane, as `VPDPBUSD` does on x86; with
//!   i8mm and several activation rows, `SMMLA` multiplies two weight rows'
//!   eight values by two activation rows' at once ([`mmla_sums`]).
//! - 16-bit activations: the part's bytes widened to i16, the offset taken
//!   off, and `SMLAL` / `SMLAL2` keep each (row, position) product in its
//!   own lane over a half; two `ADDP` per four rows then add a row's four
//!   lanes.
//!
//! Integer sums are exact and the float steps per half or span are x86's,
//! in x86's order, so both CPUs give the same bits (the kernel tests hold
//! both to one scalar statement).
//!
//! Expected cost per 16-value half, eight weight rows and activation row
//! (no Arm CPU was at hand to measure): 4 `SMMLA` (i8mm, two or more
//! rows), 8 `SDOT` (8-bit) or 16 `SMLAL` (16-bit), plus about 20
//! unpacking steps shared by the activation rows (and 8 `ZIP` for
//! `SMMLA`) and 8 float steps.

use std::arch::aarch64::*;

use ferrum_types::GgmlType;

use super::{span_at, ActRows, ACT_ROWS, ROWS};
use crate::cpu::int_dot::{act_pair, dot4, f16x8, row_pairs, smmla, unpair};
use crate::cpu::int_dot::{DOTPROD, I8MM, NEON};

/// Activation rows per 16-bit call: eight i32 accumulators each.
const ROWS16: usize = 2;

/// Activation rows per 8-bit call.
const ROWS8: usize = 4;

/// One grouped format (the parent module describes the layout).
trait Rows {
    const BYTES: usize;
    /// Q2_K, Q3_K, Q6_K: a scale per 16 values (half), so each half's sum
    /// is scaled on its own; Q4_K, Q5_K: one per span.
    const SIXTEENS: bool;
    /// The values' offset, taken off through the activation sums.
    const OFFSET: i16 = 0;
    /// Q2_K: an unsigned 4-bit scale and minimum per half, in one byte
    /// after `dmin`; else a signed scale byte after `d`.
    const MINS16: bool = false;
    /// The four parts (unsigned bytes, lane = row) of half `h` of span `j`
    /// of the group block at `g`, rows 0..4 then 4..8.
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [[uint8x16_t; 2]; 4];
}

/// The 2-bit fields of half `h` at `at`, bits `2u, 2u + 1` to part `u`.
#[inline(always)]
unsafe fn fields2(at: *const u8, h: usize) -> [[uint8x16_t; 2]; 4] {
    let x = [0, 1].map(|v| vld1q_u8(at.add(32 * h + 16 * v)));
    let low = vdupq_n_u8(3);
    [
        x.map(|x| vandq_u8(x, low)),
        x.map(|x| vandq_u8(vshrq_n_u8::<2>(x), low)),
        x.map(|x| vandq_u8(vshrq_n_u8::<4>(x), low)),
        x.map(|x| vshrq_n_u8::<6>(x)),
    ]
}

/// The 4-bit values of half `h` of the span at `at`.
#[inline(always)]
unsafe fn nibbles(at: *const u8, h: usize) -> [[uint8x16_t; 2]; 4] {
    let mask = vdupq_n_u8(0x0F);
    let mut out = [[vdupq_n_u8(0); 2]; 4];
    for (u, part) in out.iter_mut().enumerate() {
        for (v, p) in part.iter_mut().enumerate() {
            let x = vld1q_u8(at.add(32 * u + 16 * v));
            *p = if h == 0 {
                vandq_u8(x, mask)
            } else {
                vshrq_n_u8::<4>(x)
            };
        }
    }
    out
}

/// `parts` with bits of `plane` (two vectors) ORed in: per part `u`, the
/// plane shifted left by `shift(u)` (right where negative), masked.
#[inline(always)]
unsafe fn with_high(
    mut parts: [[uint8x16_t; 2]; 4],
    plane: *const u8,
    shift: impl Fn(usize) -> i8,
    mask: u8,
) -> [[uint8x16_t; 2]; 4] {
    let plane = [0, 1].map(|v| vld1q_u8(plane.add(16 * v)));
    let mask = vdupq_n_u8(mask);
    for (u, part) in parts.iter_mut().enumerate() {
        let s = vdupq_n_s8(shift(u));
        for (p, plane) in part.iter_mut().zip(plane) {
            *p = vorrq_u8(*p, vandq_u8(vshlq_u8(plane, s), mask));
        }
    }
    parts
}

struct Q2K;
impl Rows for Q2K {
    const BYTES: usize = 672;
    const SIXTEENS: bool = true;
    const MINS16: bool = true;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [[uint8x16_t; 2]; 4] {
        fields2(g.add(span_at(GgmlType::Q2_K, j)), h)
    }
}

struct Q3K;
impl Rows for Q3K {
    const BYTES: usize = 912;
    const SIXTEENS: bool = true;
    const OFFSET: i16 = 4;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [[uint8x16_t; 2]; 4] {
        let at = g.add(span_at(GgmlType::Q3_K, j));
        // The plane's bit 4h + u to bit 2 (byte shifts: no neighbours).
        with_high(fields2(at, h), at.add(64), |u| 2 - (4 * h + u) as i8, 4)
    }
}

struct Q4K;
impl Rows for Q4K {
    const BYTES: usize = 1184;
    const SIXTEENS: bool = false;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [[uint8x16_t; 2]; 4] {
        nibbles(g.add(span_at(GgmlType::Q4_K, j)), h)
    }
}

struct Q5K;
impl Rows for Q5K {
    const BYTES: usize = 1440;
    const SIXTEENS: bool = false;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [[uint8x16_t; 2]; 4] {
        let at = g.add(span_at(GgmlType::Q5_K, j));
        // The plane's bit 4h + u to bit 4.
        with_high(nibbles(at, h), at.add(128), |u| 4 - (4 * h + u) as i8, 0x10)
    }
}

struct Q6K;
impl Rows for Q6K {
    const BYTES: usize = 1680;
    const SIXTEENS: bool = true;
    const OFFSET: i16 = 32;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [[uint8x16_t; 2]; 4] {
        let at = g.add(span_at(GgmlType::Q6_K, j));
        // The half's top-bit vector: bits 2u, 2u + 1 to bits 4, 5.
        let top = at.add(128 + 32 * h);
        with_high(nibbles(at, h), top, |u| 4 - 2 * u as i8, 0x30)
    }
}

/// Eight bytes at `p` as i32 lanes (signed or not), four per vector.
#[inline(always)]
unsafe fn bytes8(p: *const u8, signed: bool) -> [int32x4_t; 2] {
    let w = if signed {
        vmovl_s8(vld1_s8(p.cast()))
    } else {
        vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p)))
    };
    [vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)]
}

/// Per row lane, `Σ part · a` over a half for `M ≥ 2` rows of 8-bit
/// activations, row `c`'s at `a + 32c` (a tile), by `SMMLA`: each
/// multiplies a pair of weight rows' eight values by a pair of activation
/// rows' into a 2 x 2 block of sums. Parts `2o` and `2o + 1` zipped by
/// words are rows `(2q, 2q + 1)`'s values `8o..8o + 8`; an odd last row is
/// paired with itself. 8 `SMMLA` per pair of activation rows, where `SDOT`
/// takes 16.
#[inline(always)]
unsafe fn mmla_sums<const M: usize>(
    parts: &[[uint8x16_t; 2]; 4],
    a: *const i8,
) -> [[int32x4_t; 2]; M] {
    // w[o][q]: weight rows 2q, 2q + 1, values 8o..8o + 8 of the half.
    let mut w = [[vdupq_n_s8(0); 4]; 2];
    for (o, w) in w.iter_mut().enumerate() {
        for v in 0..2 {
            let (lo, hi) = (parts[2 * o][v], parts[2 * o + 1][v]);
            let [p01, p23] = row_pairs(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
            (w[2 * v], w[2 * v + 1]) = (p01, p23);
        }
    }
    let mut x = [[vdupq_n_s32(0); 2]; M];
    for c in (0..M).step_by(2) {
        let c1 = (c + 1).min(M - 1);
        let mut y = [vdupq_n_s32(0); 4];
        for (o, w) in w.iter().enumerate() {
            let av = act_pair(a.add(32 * c + 8 * o), a.add(32 * c1 + 8 * o));
            for (y, &w) in y.iter_mut().zip(w) {
                *y = smmla(*y, w, av);
            }
        }
        let ([lo_c, lo_c1], [hi_c, hi_c1]) = (unpair(y[0], y[1]), unpair(y[2], y[3]));
        x[c] = [lo_c, hi_c];
        if c1 > c {
            x[c1] = [lo_c1, hi_c1];
        }
    }
    x
}

/// Per row lane, `Σ (part − OFFSET) · a` over half `h` of span `t` for the
/// `M` activation rows from `r0`, 8-bit (tiles) or 16-bit (row-major).
#[inline(always)]
unsafe fn half_sums<F: Rows, const ISA: u8, const M: usize>(
    parts: &[[uint8x16_t; 2]; 4],
    act: &ActRows,
    r0: usize,
    (t, h): (usize, usize),
) -> [[int32x4_t; 2]; M] {
    let mut x = [[vdupq_n_s32(0); 2]; M];
    if act.a8 {
        let (ts, c0) = tile_span(act, r0, t);
        let tile = act.tiles.rows;
        let a = act.tiles.q.as_ptr().add((ts * tile + c0) * 32 + 16 * h);
        let o = act.tiles.offsets.as_ptr().add((2 * ts + h) * tile + c0);
        // The tile's −32·Σa, scaled to this type's offset.
        let start = |c: usize| vdupq_n_s32(*o.add(c) / 32 * i32::from(F::OFFSET));
        if ISA == I8MM && M > 1 {
            let mut x = mmla_sums::<M>(parts, a);
            for (c, x) in x.iter_mut().enumerate() {
                *x = x.map(|x| vaddq_s32(x, start(c)));
            }
            return x;
        }
        for (c, x) in x.iter_mut().enumerate() {
            *x = [start(c); 2];
            for (u, part) in parts.iter().enumerate() {
                let av = a.add(32 * c + 4 * u).cast::<i32>().read_unaligned();
                let av = vreinterpretq_s8_s32(vdupq_n_s32(av));
                for (x, &p) in x.iter_mut().zip(part) {
                    *x = dot4::<ISA>(*x, vreinterpretq_s8_u8(p), av);
                }
            }
        }
        return x;
    }
    // Each row's four positions in their own lanes: rows (0, 1), (2, 3),
    // (4, 5), (6, 7) in two vectors each.
    let mut lanes = [[vdupq_n_s32(0); 8]; M];
    let offset = vdupq_n_s16(F::OFFSET);
    for (u, part) in parts.iter().enumerate() {
        let mut w: [int16x8_t; 4] = [
            vmovl_u8(vget_low_u8(part[0])),
            vmovl_high_u8(part[0]),
            vmovl_u8(vget_low_u8(part[1])),
            vmovl_high_u8(part[1]),
        ]
        .map(|w| vreinterpretq_s16_u16(w));
        if F::OFFSET != 0 {
            w = w.map(|w| vsubq_s16(w, offset));
        }
        for (c, lanes) in lanes.iter_mut().enumerate() {
            // Values 0, 2, 1, 3 of the run of four as stored, in order.
            let at = (r0 + c) * act.k + 32 * t + 16 * h + 4 * u;
            let s = vld1_s16(act.qs.as_ptr().add(at));
            let a = vzip1_s16(s, vext_s16::<2>(s, s));
            let a8 = vcombine_s16(a, a);
            for (v, &w) in w.iter().enumerate() {
                lanes[2 * v] = vmlal_s16(lanes[2 * v], vget_low_s16(w), a);
                lanes[2 * v + 1] = vmlal_high_s16(lanes[2 * v + 1], w, a8);
            }
        }
    }
    for (x, l) in x.iter_mut().zip(&lanes) {
        let rows = [0, 2, 4, 6].map(|i| vpaddq_s32(l[i], l[i + 1]));
        *x = [vpaddq_s32(rows[0], rows[1]), vpaddq_s32(rows[2], rows[3])];
    }
    x
}

/// `r0`'s tile and its row in it, for span `t` (see `Tiles`).
#[inline(always)]
fn tile_span(act: &ActRows, r0: usize, t: usize) -> (usize, usize) {
    let tile = act.tiles.rows;
    (r0 / tile * (act.k / 32) + t, r0 % tile)
}

/// The activation scale `d_a` and `d_a · Σa` over half `h` of span `t` for
/// row `r0 + c`, as x86 forms them.
#[inline(always)]
unsafe fn act_scale(act: &ActRows, r0: usize, c: usize, (t, h): (usize, usize)) -> (f32, f32) {
    if act.a8 {
        let (ts, c0) = tile_span(act, r0, t);
        let tile = act.tiles.rows;
        let da = *act.tiles.d.as_ptr().add(ts * tile + c0 + c);
        let o = *act.tiles.offsets.as_ptr().add((2 * ts + h) * tile + c0 + c);
        (da, (-o / 32) as f32 * da)
    } else {
        let da = *act.d.as_ptr().add((r0 + c) * act.stride + t);
        let at = (r0 + c) * act.k + 32 * t + 16 * h;
        let a = act.qs.as_ptr().add(at);
        let sum = vaddlvq_s16(vld1q_s16(a)) + vaddlvq_s16(vld1q_s16(a.add(8)));
        (da, sum as f32 * da)
    }
}

/// The activation scale `d_a` and `d_a · Σa` of span `t` for row `r0 + c`.
#[inline(always)]
unsafe fn span_scale(act: &ActRows, r0: usize, c: usize, t: usize) -> (f32, f32) {
    if act.a8 {
        let (ts, c0) = tile_span(act, r0, t);
        let at = ts * act.tiles.rows + c0 + c;
        (*act.tiles.d.as_ptr().add(at), *act.tiles.s.as_ptr().add(at))
    } else {
        let at = (r0 + c) * act.stride + t;
        (*act.d.as_ptr().add(at), *act.s.as_ptr().add(at))
    }
}

/// `out[c]` = activation row `r0 + c` against the group's eight rows, in
/// x86's float steps: per half (`SIXTEENS`), `acc = fma(float(Σ)·(d·sc),
/// d_a, acc)` and for Q2_K `acc = acc − (dmin·m)·(d_a·Σa)`, fused; per
/// span (Q4_K, Q5_K: both halves in one integer sum), `acc =
/// fma(float(Σ), (d·sc)·d_a, acc) − (dmin·m)·(d_a·Σa)`, fused.
#[inline(always)]
unsafe fn group<F: Rows, const ISA: u8, const M: usize>(
    g: *const u8,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]],
) {
    let mut acc = [[vdupq_n_f32(0.0); 2]; M];
    for b in 0..act.k / 256 {
        let gb = g.add(b * F::BYTES);
        let d = f16x8(gb);
        let dmin = if F::MINS16 || !F::SIXTEENS {
            f16x8(gb.add(16))
        } else {
            d
        };
        for j in 0..8 {
            let t = 8 * b + j;
            if !F::SIXTEENS {
                let x0 = half_sums::<F, ISA, M>(&F::parts(gb, j, 0), act, r0, (t, 0));
                let x1 = half_sums::<F, ISA, M>(&F::parts(gb, j, 1), act, r0, (t, 1));
                let sc = bytes8(gb.add(32 + 8 * j), false);
                let mn = bytes8(gb.add(96 + 8 * j), false);
                for (c, acc) in acc.iter_mut().enumerate() {
                    let (da, sa) = span_scale(act, r0, c, t);
                    for v in 0..2 {
                        let x = vcvtq_f32_s32(vaddq_s32(x0[c][v], x1[c][v]));
                        let ws = vmulq_f32(d[v], vcvtq_f32_s32(sc[v]));
                        let wm = vmulq_f32(dmin[v], vcvtq_f32_s32(mn[v]));
                        let y = vfmaq_f32(acc[v], x, vmulq_f32(ws, vdupq_n_f32(da)));
                        acc[v] = vfmsq_f32(y, wm, vdupq_n_f32(sa));
                    }
                }
                continue;
            }
            for h in 0..2 {
                let parts = F::parts(gb, j, h);
                let x = half_sums::<F, ISA, M>(&parts, act, r0, (t, h));
                let (sc, mn) = if F::MINS16 {
                    let sm = bytes8(gb.add(32 + 16 * j + 8 * h), false);
                    let mask = vdupq_n_s32(0x0F);
                    (
                        sm.map(|s| vandq_s32(s, mask)),
                        sm.map(|s| vshrq_n_s32::<4>(s)),
                    )
                } else {
                    let sc = bytes8(gb.add(16 + 16 * j + 8 * h), true);
                    (sc, sc)
                };
                for (c, (acc, x)) in acc.iter_mut().zip(&x).enumerate() {
                    let (da, sda) = act_scale(act, r0, c, (t, h));
                    for v in 0..2 {
                        let ds = vmulq_f32(d[v], vcvtq_f32_s32(sc[v]));
                        let w = vmulq_f32(vcvtq_f32_s32(x[v]), ds);
                        acc[v] = vfmaq_f32(acc[v], w, vdupq_n_f32(da));
                        if F::MINS16 {
                            let dm = vmulq_f32(dmin[v], vcvtq_f32_s32(mn[v]));
                            acc[v] = vfmsq_f32(acc[v], dm, vdupq_n_f32(sda));
                        }
                    }
                }
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        vst1q_f32(out.as_mut_ptr(), acc[0]);
        vst1q_f32(out.as_mut_ptr().add(4), acc[1]);
    }
}

/// `out[c][r]` for the `m ≤ 8` activation rows from `r0`, in runs of
/// [`ROWS16`] or [`ROWS8`].
#[inline(always)]
unsafe fn by_type<const ISA: u8>(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    let run = if act.a8 { ROWS8 } else { ROWS16 };
    for at in (0..m).step_by(run) {
        let (rows, out) = (run.min(m - at), &mut out[at..]);
        macro_rules! go {
            ($f:ty) => {
                match rows {
                    1 => group::<$f, ISA, 1>(g, act, r0 + at, out),
                    2 => group::<$f, ISA, 2>(g, act, r0 + at, out),
                    3 => group::<$f, ISA, 3>(g, act, r0 + at, out),
                    _ => group::<$f, ISA, 4>(g, act, r0 + at, out),
                }
            };
        }
        match ty {
            GgmlType::Q2_K => go!(Q2K),
            GgmlType::Q3_K => go!(Q3K),
            GgmlType::Q4_K => go!(Q4K),
            GgmlType::Q5_K => go!(Q5K),
            GgmlType::Q6_K => go!(Q6K),
            _ => unreachable!("Arm row-grouped kernel called for {ty}"),
        }
    }
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_group_neon(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<NEON>(ty, g, act, r0, m, out)
}

#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn dot_group_dotprod(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<DOTPROD>(ty, g, act, r0, m, out)
}

#[target_feature(enable = "neon,dotprod,i8mm")]
pub(super) unsafe fn dot_group_i8mm(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<I8MM>(ty, g, act, r0, m, out)
}
