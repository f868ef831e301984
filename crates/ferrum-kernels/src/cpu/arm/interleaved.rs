//! The interleaved kernels for AArch64 NEON (the parent module describes
//! the layout). A group's sixteen rows are four 128-bit vectors of four
//! rows each:
//!
//! - 16-bit activations: a `W_p` is four vectors of i16 pairs, one pair per
//!   row. `SMLAL`/`SMLAL2` multiply them by the broadcast activation pair
//!   and keep both products of a row in their own i32 lanes over the block
//!   (at most 16 · 128 · 32,767 each: no overflow); one `ADDP` per four
//!   rows then adds a row's two lanes. Two activation rows per call.
//! - Q4_1's 8-bit activations: a row's word masked to its low (or high)
//!   nibbles is four bytes in one i32 lane, the activation bytes stored in
//!   the matching order ([`ActRows::quantize8`]), so one `SDOT` (dotprod)
//!   adds a lane's four products, as `VPDPBUSD` does on x86; without
//!   dotprod, `SMULL` + `ADDP` + `SADALP` give the same sums; with i8mm
//!   and several activation rows, `SMMLA` takes two weight rows' eight
//!   values against two activation rows' ([`mmla_chunk`]). Four
//!   activation rows per call.
//!
//! The integer sums are exact and each block's float steps are x86's, in
//! x86's order (`d·d_a`, then `fma(float(Σ), ·, acc)`, then the offset's
//! `fma`), so Arm and x86 give the same bits, and the same perplexity.
//!
//! Expected cost per 32-value block and activation row, for sixteen weight
//! rows (no Arm CPU was at hand to measure): 128 `SMLAL` with 16-bit
//! activations (four multiplies each) plus about 100 unpacking steps shared
//! by every activation row of the call; 32 `SDOT` (sixteen multiplies
//! each) plus 24 for Q4_1 with 8-bit activations, or 16 `SMMLA` (32
//! multiplies each) plus 32 for two activation rows.

use std::arch::aarch64::*;

use ferrum_types::GgmlType;

use super::{Layout, Levels, Nibbles, Offset, Q40, Q41, Q50, Q51, Q80};
use super::{ACT_ROWS, CHUNK_BYTES, LANE_BYTES, ROWS};
use crate::cpu::act_quant::{ActRows, Outlier};
use crate::cpu::int_dot::{act_pair, dot4, f16x8, row_pairs, smmla, unpair};
use crate::cpu::int_dot::{DOTPROD, I8MM, NEON};
use crate::cpu::outliers::f16_at;

/// Activation rows per 16-bit call: eight i32 accumulators each.
const ROWS16: usize = 2;

/// Activation rows per 8-bit call: four i32 accumulators each.
const ROWS8: usize = 4;

/// One interleaved block format's unpacking.
trait Format: Layout {
    /// What chunk `c` (the pairs `W_{4c}..W_{4c+4}`) is unpacked from,
    /// loaded once for its four pairs.
    type Chunk: Copy;
    unsafe fn chunk(g: *const u8, c: usize) -> Self::Chunk;
    /// `W_{4c+j}` of the sixteen rows, four rows per vector.
    unsafe fn pair(chunk: Self::Chunk, c: usize, j: usize) -> [int16x8_t; 4];
}

impl<const MIN: bool, const FIFTH: bool> Format for Nibbles<MIN, FIFTH> {
    /// The chunk's words and the plane's words, as 16-bit halves.
    type Chunk = ([uint16x8_t; 4], [uint16x8_t; 4]);
    #[inline(always)]
    unsafe fn chunk(g: *const u8, c: usize) -> Self::Chunk {
        let load = |at: usize| std::array::from_fn(|v| vld1q_u16(g.add(at + 16 * v).cast()));
        let plane = if FIFTH {
            load(Self::QH)
        } else {
            [vdupq_n_u16(0); 4]
        };
        (load(Self::QS + CHUNK_BYTES * c), plane)
    }
    #[inline(always)]
    unsafe fn pair((x, plane): Self::Chunk, c: usize, j: usize) -> [int16x8_t; 4] {
        // Nibble j of each half word: value 8c + 2j (low half) and
        // 8c + 2j + 1 (high half) of the row.
        let shift = vdupq_n_s16(-4 * j as i16);
        let low4 = vdupq_n_u16(0x0F);
        // The plane's bit p = 4c + j moved to bit 4.
        let fifth = vdupq_n_s16(4 - (4 * c + j) as i16);
        let sixteen = vdupq_n_u16(16);
        std::array::from_fn(|v| {
            let mut w = vandq_u16(vshlq_u16(x[v], shift), low4);
            if FIFTH {
                w = vorrq_u16(w, vandq_u16(vshlq_u16(plane[v], fifth), sixteen));
            }
            vreinterpretq_s16_u16(w)
        })
    }
}

impl<const MX: bool> Format for Levels<MX> {
    /// The chunk's words of ranks, as 16-bit halves.
    type Chunk = [uint16x8_t; 4];
    #[inline(always)]
    unsafe fn chunk(g: *const u8, c: usize) -> Self::Chunk {
        std::array::from_fn(|v| vld1q_u16(g.add(LANE_BYTES + CHUNK_BYTES * c + 16 * v).cast()))
    }
    #[inline(always)]
    unsafe fn pair(x: Self::Chunk, _: usize, j: usize) -> [int16x8_t; 4] {
        // Rank j of each half word, looked up by one `TBL` per vector,
        // whose entry 0 (zero) fills the high byte.
        let shift = vdupq_n_s16(-4 * j as i16);
        let low4 = vdupq_n_u16(0x0F);
        let table = vld1q_u8(Self::TABLE.as_ptr());
        std::array::from_fn(|v| {
            let idx = vandq_u16(vshlq_u16(x[v], shift), low4);
            vreinterpretq_s16_u8(vqtbl1q_u8(table, vreinterpretq_u8_u16(idx)))
        })
    }
}

impl Format for Q80 {
    /// Where the chunk's first `W_p` starts.
    type Chunk = *const u8;
    #[inline(always)]
    unsafe fn chunk(g: *const u8, c: usize) -> Self::Chunk {
        g.add(LANE_BYTES * (1 + 4 * c))
    }
    #[inline(always)]
    unsafe fn pair(p: Self::Chunk, _: usize, j: usize) -> [int16x8_t; 4] {
        let x = [0, 1].map(|h| vld1q_s8(p.add(LANE_BYTES * j + 16 * h).cast()));
        [
            vmovl_s8(vget_low_s8(x[0])),
            vmovl_high_s8(x[0]),
            vmovl_s8(vget_low_s8(x[1])),
            vmovl_high_s8(x[1]),
        ]
    }
}

/// The group's sixteen f16 scales at `p` (or minimums), four rows per
/// vector.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> [float32x4_t; 4] {
    let [a, b] = f16x8(p);
    let [c, d] = f16x8(p.add(16));
    [a, b, c, d]
}

/// Each row lane's block result folded into `acc` in x86's order:
/// `acc = fma(float(dot), d·d_a, acc)`, then `acc = fma(o, s_a, acc)`.
#[inline(always)]
unsafe fn finish<F: Format>(
    acc: &mut [float32x4_t; 4],
    dot: [int32x4_t; 4],
    d: &[float32x4_t; 4],
    o: &[float32x4_t; 4],
    act: &ActRows,
    i: usize,
) {
    let (da, sa) = (*act.d.as_ptr().add(i), *act.s.as_ptr().add(i));
    for v in 0..4 {
        let s = vmulq_n_f32(d[v], da);
        acc[v] = vfmaq_f32(acc[v], vcvtq_f32_s32(dot[v]), s);
        if F::OFFSET != Offset::No {
            acc[v] = vfmaq_f32(acc[v], o[v], vdupq_n_f32(sa));
        }
    }
}

/// The block's offsets `o` of the sixteen rows (see [`Offset`]).
#[inline(always)]
unsafe fn offsets<F: Format>(p: *const u8, d: &[float32x4_t; 4]) -> [float32x4_t; 4] {
    match F::OFFSET {
        Offset::No => [vdupq_n_f32(0.0); 4],
        Offset::Min => f16x16(p.add(LANE_BYTES)),
        Offset::Scaled(c) => d.map(|d| vmulq_n_f32(d, c)),
    }
}

/// One group (`nb` group blocks at `g`) against the `M` 16-bit activation
/// rows from `r0`: `out[c][r]`.
#[inline(always)]
unsafe fn group16<F: Format, const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]],
) {
    let (k, stride) = (act.k, act.stride);
    let mut acc = [[vdupq_n_f32(0.0); 4]; M];
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        // Per activation row, per vector of four rows, the lanes of its
        // rows' even and odd products (two vectors).
        let mut dots = [[vdupq_n_s32(0); 8]; M];
        for c in 0..4 {
            let chunk = F::chunk(p, c);
            for j in 0..4 {
                let w = F::pair(chunk, c, j);
                for (r, dots) in dots.iter_mut().enumerate() {
                    let a = act.qs.as_ptr().add((r0 + r) * k + 32 * b + 2 * (4 * c + j));
                    let x = vreinterpretq_s16_s32(vdupq_n_s32(a.cast::<i32>().read_unaligned()));
                    let xl = vget_low_s16(x);
                    for (v, w) in w.iter().enumerate() {
                        dots[2 * v] = vmlal_s16(dots[2 * v], vget_low_s16(*w), xl);
                        dots[2 * v + 1] = vmlal_high_s16(dots[2 * v + 1], *w, x);
                    }
                }
            }
        }
        let d = f16x16(p);
        let o = offsets::<F>(p, &d);
        for (c, (acc, dots)) in acc.iter_mut().zip(&dots).enumerate() {
            let dot = std::array::from_fn(|v| vpaddq_s32(dots[2 * v], dots[2 * v + 1]));
            finish::<F>(acc, dot, &d, &o, act, (r0 + c) * stride + b);
        }
    }
    store(&acc, out);
}

/// Q4_1 against `M` 8-bit activation rows from `r0` ([`ActRows::quantize8`]
/// in its reordered layout): `out[c][r]`.
#[inline(always)]
unsafe fn group8<const ISA: u8, const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]],
) {
    type F = Q41;
    let (k, stride) = (act.k, act.stride);
    let mut acc = [[vdupq_n_f32(0.0); 4]; M];
    let mask = vdupq_n_u8(0x0F);
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        let mut dots = [[vdupq_n_s32(0); 4]; M];
        for c in 0..4 {
            let x: [uint8x16_t; 4] =
                std::array::from_fn(|v| vld1q_u8(p.add(F::QS + CHUNK_BYTES * c + 16 * v)));
            let lo = x.map(|x| vreinterpretq_s8_u8(vandq_u8(x, mask)));
            let hi = x.map(|x| vreinterpretq_s8_u8(vshrq_n_u8::<4>(x)));
            if ISA == I8MM && M > 1 {
                mmla_chunk(
                    &lo,
                    &hi,
                    act.q8.as_ptr().add(32 * b + 8 * c),
                    (r0, k),
                    &mut dots,
                );
                continue;
            }
            for (r, dots) in dots.iter_mut().enumerate() {
                let a = act.q8.as_ptr().add((r0 + r) * k + 32 * b + 8 * c);
                let alo = vreinterpretq_s8_s32(vdupq_n_s32(a.cast::<i32>().read_unaligned()));
                let ahi =
                    vreinterpretq_s8_s32(vdupq_n_s32(a.add(4).cast::<i32>().read_unaligned()));
                for v in 0..4 {
                    dots[v] = dot4::<ISA>(dot4::<ISA>(dots[v], lo[v], alo), hi[v], ahi);
                }
            }
        }
        let d = f16x16(p);
        let o = offsets::<F>(p, &d);
        for (c, (acc, dot)) in acc.iter_mut().zip(dots).enumerate() {
            finish::<F>(acc, dot, &d, &o, act, (r0 + c) * stride + b);
        }
    }
    store(&acc, out);
}

/// Adds one chunk's products (eight values of sixteen rows: a row's low
/// nibbles in `lo`, its high ones in `hi`, four rows per vector) for `M ≥
/// 2` activation rows from `r0` (row `r`'s eight bytes at `a + r·k`) to
/// `dots` by `SMMLA`: a row's low and high word zipped are its eight
/// values in the activations' order, so each `SMMLA` multiplies two
/// weight rows by two activation rows; an odd last row is paired with
/// itself. 8 `SMMLA` per pair of activation rows where `SDOT` takes 16;
/// the same integer sums.
#[inline(always)]
unsafe fn mmla_chunk<const M: usize>(
    lo: &[int8x16_t; 4],
    hi: &[int8x16_t; 4],
    a: *const i8,
    (r0, k): (usize, usize),
    dots: &mut [[int32x4_t; 4]; M],
) {
    let w: [[int8x16_t; 2]; 4] = std::array::from_fn(|v| row_pairs(lo[v], hi[v]));
    for c in (0..M).step_by(2) {
        let c1 = (c + 1).min(M - 1);
        let av = act_pair(a.add((r0 + c) * k), a.add((r0 + c1) * k));
        for (v, [p01, p23]) in w.iter().enumerate() {
            let y01 = smmla(vdupq_n_s32(0), *p01, av);
            let y23 = smmla(vdupq_n_s32(0), *p23, av);
            let [yc, yc1] = unpair(y01, y23);
            dots[c][v] = vaddq_s32(dots[c][v], yc);
            if c1 > c {
                dots[c1][v] = vaddq_s32(dots[c1][v], yc1);
            }
        }
    }
}

#[inline(always)]
unsafe fn store<const M: usize>(acc: &[[float32x4_t; 4]; M], out: &mut [[f32; ROWS]]) {
    for (out, acc) in out.iter_mut().zip(acc) {
        for (v, acc) in acc.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(4 * v), *acc);
        }
    }
}

/// Calls `$e` with the const `$M` = `$m` (1..=4).
macro_rules! by_m4 {
    ($m:expr, $M:ident => $e:expr) => {{
        match $m {
            1 => { const $M: usize = 1; $e }
            2 => { const $M: usize = 2; $e }
            3 => { const $M: usize = 3; $e }
            _ => { const $M: usize = 4; $e }
        }
    }};
}

/// `out[c][r]` for the `m ≤ 8` activation rows from `r0`, in runs of
/// [`ROWS16`] or [`ROWS8`] rows.
#[inline(always)]
unsafe fn by_type<const ISA: u8>(
    ty: GgmlType,
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    // Q8_0's 8-bit values come widened to 16 bits (`ActRows::widen8`).
    let a8 = act.a8 && ty == GgmlType::Q4_1;
    let run = if a8 { ROWS8 } else { ROWS16 };
    for at in (0..m).step_by(run) {
        let (rows, out) = (run.min(m - at), &mut out[at..]);
        let r = r0 + at;
        macro_rules! group16 {
            ($f:ty) => {
                by_m4!(rows, M => group16::<$f, M>(g, nb, act, r, out))
            };
        }
        match ty {
            _ if a8 => by_m4!(rows, M => group8::<ISA, M>(g, nb, act, r, out)),
            GgmlType::Q4_0 => group16!(Q40),
            GgmlType::Q4_1 => group16!(Q41),
            GgmlType::Q5_0 => group16!(Q50),
            GgmlType::Q5_1 => group16!(Q51),
            GgmlType::Q8_0 => group16!(Q80),
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => group16!(Levels<false>),
            GgmlType::MXFP4 => group16!(Levels<true>),
            _ => unreachable!("interleaved kernel called for {ty}"),
        }
    }
}

#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_group_neon(
    ty: GgmlType,
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<NEON>(ty, g, nb, act, r0, m, out)
}

/// Q4_1 with 8-bit activations on `SDOT`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn dot_group_a8_dotprod(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<DOTPROD>(GgmlType::Q4_1, g, nb, act, r0, m, out)
}

/// Q4_1 with 8-bit activations on `SMMLA` (and `SDOT` for one row).
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(super) unsafe fn dot_group_a8_i8mm(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<I8MM>(GgmlType::Q4_1, g, nb, act, r0, m, out)
}

/// Adds `x · w[r][at]` for each outlier to the group's sixteen results
/// `out[r]` (`gw`: the group's Q4_1 blocks, each outlier's among them):
/// the values the 8-bit activations left out, each against its column
/// `fma(d, q, m)`, with x86's roundings.
pub(super) fn add_outliers_q41(gw: &[u8], outliers: &[Outlier], out: &mut [f32; ROWS]) {
    type F = Q41;
    for o in outliers {
        let (b, i) = (o.at as usize / 32, o.at as usize % 32);
        let block = &gw[b * F::GROUP..][..F::GROUP];
        // Value i is nibble i % 8 / 2 of the low (even i) or high half of
        // each row's word in chunk i / 8.
        let shift = 16 * (i % 2) + 4 * (i % 8 / 2);
        let words = &block[F::QS + CHUNK_BYTES * (i / 8)..][..CHUNK_BYTES];
        for (r, (out, word)) in out.iter_mut().zip(words.chunks_exact(4)).enumerate() {
            let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            let q = ((word >> shift) & 0x0F) as f32;
            let w = f16_at(block, 2 * r).mul_add(q, f16_at(block, LANE_BYTES + 2 * r));
            *out = o.x.mul_add(w, *out);
        }
    }
}
