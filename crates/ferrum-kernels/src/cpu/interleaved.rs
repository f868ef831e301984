//! Legacy GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the 4-bit
//! codebook ones (IQ4_NL, IQ4_XS, MXFP4) re-laid out at load, sixteen
//! weight rows at a time, for an integer kernel whose vector lanes are
//! those rows.
//!
//! A dot product per 32-value block leaves one integer per weight row,
//! which must be scaled by that row's own block scale. Kept in the file's
//! layout, the lanes of a vector hold one row's partial sums, and every
//! (block, activation row) pair then pays a conversion and an FMA on top of
//! its two multiplies (or a shuffle tree to reduce the lanes). Here the
//! lanes *are* the rows: each `VPDPWSSD` (or `PMADDWD`) multiplies one pair
//! of values of all the rows by one broadcast pair of activation values, so
//! a block's results land in one vector and are converted and scaled once
//! for all rows. Sixteen rows fill a 512-bit vector: where the CPU runs
//! two 512-bit `VPDPWSSD` per cycle (Intel server cores) that is twice the
//! multiplies per instruction of eight rows in 256 bits, and where it
//! splits them in two (Zen 4) it is no slower. CPUs without AVX-512 take
//! each group as two halves of eight rows in 256-bit vectors: both at once
//! for up to four activation rows, where each broadcast activation pair
//! feeds both halves, and so in runs of four for more rows; the 5-bit
//! types, whose unpacking is dearer, take one half at a time for eight
//! rows (eight accumulators). AArch64 takes the sixteen rows as four
//! 128-bit vectors (`arm/interleaved.rs`), with the same integer sums and
//! float steps as x86, so the same bits.
//!
//! Layout of one *group block* (rows `16g..16g+16`, block `b`; groups are
//! stored one after another, each holding its blocks in order, rows past
//! `n` zero). `W_p` (`p` = 0..16) names values `2p` and `2p + 1` of every
//! row, a row's pair to a 32-bit lane, rows 0..8 in the low 256 bits:
//! - bytes 0..32: the sixteen rows' f16 scales `d`;
//! - bytes 32..64 (Q4_1, Q5_1): the sixteen f16 minimums `m`;
//! - Q8_0: the 16 `W_p` as 32 i8 each (`W_p[i]` is value `2p + i % 2` of
//!   row `i / 2`);
//! - the 4- and 5-bit types: four *chunks* of 64 bytes, a little-endian
//!   word per row; chunk `c` holds `W_{4c}..W_{4c+4}`, nibble `j` of the
//!   word's low half value `8c + 2j` and of its high half value
//!   `8c + 2j + 1`. A chunk's `W_{4c+j}` as i16 lanes is then one shift and
//!   one mask of the loaded words (no widening across 128-bit lanes),
//!   faster than a layout of bytes that each needed a zero-extension
//!   (`gemm_quant` bench; `docs/perf-log.md`);
//! - Q5_0, Q5_1: a 64-byte plane of fifth bits, a word per row: bit `p` of
//!   its low half for value `2p`, of its high half for value `2p + 1`, so
//!   `W_p`'s bits sit at bit `p` of their own i16 lanes.
//!
//! A group block is exactly sixteen file blocks long, so the weights take
//! the same memory as in the file.
//!
//! The codebook types take Q4_0's layout with, as each nibble, the *rank*
//! of its index's level among the type's sixteen (`quant::IQ4`,
//! `quant::MX`), and the kernels look each rank up in a table of the
//! levels in rising order less the lowest, `MIN`: one byte shuffle per
//! vector of pairs, whose table entry 0 is 0, so the shuffle's fill of
//! each 16-bit lane's high byte (from index 0) leaves the lane the
//! unsigned value (0..=240). `x = d·(TABLE[q] + MIN)`: the offset `d·MIN`
//! is applied per block through the activation sums, as Q4_0's `−8·d` is.
//! Each 32 values get an f16 scale: IQ4_NL's
//! own; MXFP4's power of two `2^(e−128)`, exact in f16 for `e` in
//! 104..=143 (a tensor with others keeps the file's layout and the
//! dequantizing path); IQ4_XS's `d·(ls−32)` for each 32 of its
//! super-block, rounded to f16. That product of an f16 and a 6-bit integer
//! needs up to 17 significant bits, so it moves by at most 2^-12 of
//! itself: a thirtieth of the 16-bit activations' own rounding step at the
//! block's largest value, and far below the 4-bit codebook's spacing. The
//! layout takes 18 bytes per 32 values against IQ4_XS's 17 (+6%) and
//! MXFP4's 17 (+6%).
//!
//! Every output is computed by one lane through the same instructions for
//! any number of activation rows (the engine's batched == alone guarantee),
//! and by the same instructions in either vector width (Q4_1 takes 8-bit
//! activations, rounded differently from the others' 16-bit ones):
//! per block `acc = fma(float(Σ w·a), d·d_a, acc)`, then for types with an
//! offset `acc = fma(o, d_a·Σa, acc)`.

use ferrum_types::{FerrumError, GgmlType, Result};
use rayon::prelude::*;

use super::act_quant::ActRows;
use super::SyncPtr;
#[cfg(not(target_arch = "x86_64"))]
use super::{act_quant::Outlier, outliers::f16_at};

#[cfg(target_arch = "aarch64")]
#[path = "arm/interleaved.rs"]
mod arm;
#[cfg(target_arch = "x86_64")]
#[path = "x86/interleaved.rs"]
mod x86;

/// Weight rows per group: the lanes of a 512-bit vector of i32.
pub(crate) const ROWS: usize = 16;

/// Groups per parallel task: enough work to amortise the task, few enough
/// that a decode-sized GEMM still splits over every core.
const GROUPS_PER_TASK: usize = 1;

/// Activation rows per kernel call: one accumulator register each.
const ACT_ROWS: usize = 8;

/// Bytes of one `W_p` of Q8_0, and of the sixteen f16 scales (or minimums).
const LANE_BYTES: usize = 2 * ROWS;

/// Bytes of one nibble chunk (or one fifth-bit plane): a word per row.
const CHUNK_BYTES: usize = 4 * ROWS;

/// How a format's constant term is formed (`x = d·q + o`).
#[derive(PartialEq)]
enum Offset {
    /// None (Q8_0's values are signed).
    No,
    /// The f16 minimums after the scales.
    Min,
    /// `o = d·c`: Q4_0's −8 and Q5_0's −16, cheaper applied once per block
    /// through the activation sums than subtracted from every value.
    Scaled(f32),
}

/// Where a format's parts sit in a group block, for the kernels of every
/// CPU (each unpacks them its own way).
trait Layout {
    const GROUP: usize;
    const OFFSET: Offset;
}

/// The 4- and 5-bit formats: nibbles after the scales (and the minimums,
/// when `MIN`), then the fifth-bit plane when `FIFTH`; without minimums the
/// offset is −8·d (Q4_0) or −16·d (Q5_0).
struct Nibbles<const MIN: bool, const FIFTH: bool>;
impl<const MIN: bool, const FIFTH: bool> Nibbles<MIN, FIFTH> {
    /// Where the nibbles start.
    const QS: usize = if MIN { 2 * LANE_BYTES } else { LANE_BYTES };
    /// Where the fifth-bit plane starts.
    const QH: usize = Self::QS + 4 * CHUNK_BYTES;
}
impl<const MIN: bool, const FIFTH: bool> Layout for Nibbles<MIN, FIFTH> {
    const GROUP: usize = Self::QH + if FIFTH { CHUNK_BYTES } else { 0 };
    const OFFSET: Offset = match (MIN, FIFTH) {
        (true, _) => Offset::Min,
        (false, false) => Offset::Scaled(-8.0),
        (false, true) => Offset::Scaled(-16.0),
    };
}

/// The codebook types: Q4_0's layout with the ranks of IQ4_NL's levels
/// (also IQ4_XS's) or, with `MX`, MXFP4's (see the module comment).
struct Levels<const MX: bool>;
impl<const MX: bool> Levels<MX> {
    const LEVELS: [i8; 16] = if MX {
        crate::quant::MX
    } else {
        crate::quant::IQ4
    };
    /// The lowest level.
    const MIN: i8 = Self::RANKED.0;
    /// Each index's rank among the levels (ties by index).
    const RANK: [u8; 16] = Self::RANKED.1;
    /// The levels in rising order, less `MIN`: the byte-shuffle table.
    const TABLE: [u8; 16] = Self::RANKED.2;
    const RANKED: (i8, [u8; 16], [u8; 16]) = ranked(Self::LEVELS);
}
impl<const MX: bool> Layout for Levels<MX> {
    const GROUP: usize = Q40::GROUP;
    const OFFSET: Offset = Offset::Scaled(Self::MIN as f32);
}

/// `(MIN, RANK, TABLE)` of [`Levels`] for `levels`.
const fn ranked(levels: [i8; 16]) -> (i8, [u8; 16], [u8; 16]) {
    let (mut min, mut rank, mut table) = (i8::MAX, [0u8; 16], [0u8; 16]);
    let mut i = 0;
    while i < 16 {
        if levels[i] < min {
            min = levels[i];
        }
        i += 1;
    }
    i = 0;
    while i < 16 {
        let mut r = 0;
        let mut j = 0;
        while j < 16 {
            if levels[j] < levels[i] || (levels[j] == levels[i] && j < i) {
                r += 1;
            }
            j += 1;
        }
        rank[i] = r as u8;
        table[r] = (levels[i] as i16 - min as i16) as u8;
        i += 1;
    }
    (min, rank, table)
}

type Q40 = Nibbles<false, false>;
type Q41 = Nibbles<true, false>;
type Q50 = Nibbles<false, true>;
type Q51 = Nibbles<true, true>;

/// Q8_0: the scales, then the sixteen `W_p`.
struct Q80;
impl Layout for Q80 {
    const GROUP: usize = LANE_BYTES + 16 * LANE_BYTES;
    const OFFSET: Offset = Offset::No;
}

/// Whether weights of type `ty` are interleaved (and computed by this
/// module's kernels) on this CPU.
pub(crate) fn supports(ty: GgmlType) -> bool {
    (legacy(ty) || codebook(ty)) && (super::features::has_avx2() || super::features::has_neon())
}

/// Whether `ty` may take 8-bit activations ([`ActRows::quantize8`]): Q4_1
/// (see `quant_gemm::gemm_gguf`), through `PMADDUBSW` on AVX2 and
/// `VPDPBUSD` with AVX-512 VNNI (twice the multiplies per instruction of
/// 16-bit `VPDPWSSD`), and `SDOT` on Arm.
///
/// And Q8_0 (the language-model head of most GGUF files): through
/// `VPDPBUSD` with AVX-512 VNNI, its signed values made unsigned by +128
/// and the offset taken back off with the activations' integer sums;
/// elsewhere the 8-bit values widened to 16 bits (`ActRows::widen8`) go
/// through the 16-bit kernels. Both give the exact `Σ w·q`, so the same
/// bits on every CPU.
pub(crate) fn takes_act8(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0) && supports(ty)
}

/// Completes Q8_0's 8-bit activations (quantized in value order) for this
/// CPU's kernel: the sums for `VPDPBUSD`, and the values widened to 16
/// bits only where the 16-bit kernels run them (no AVX-512 VNNI).
pub(crate) fn prepare_q8_0(act: &mut ActRows, m: usize) {
    act.widen8(m, !super::features::has_vnni());
}

fn legacy(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

fn codebook(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ4_NL | GgmlType::IQ4_XS | GgmlType::MXFP4)
}

/// Bytes of one group block of `ty` (32 values of sixteen rows).
fn group_bytes(ty: GgmlType) -> usize {
    if codebook(ty) {
        Q40::GROUP
    } else {
        ROWS * ty.block_bytes()
    }
}

/// Whether `bytes` of `ty` can be interleaved: every type, except MXFP4
/// with a scale outside f16's range (see the module comment).
pub(crate) fn repackable(bytes: &[u8], ty: GgmlType) -> bool {
    ty != GgmlType::MXFP4
        || bytes
            .chunks_exact(ty.block_bytes())
            .all(|b| (104..=143).contains(&b[0]))
}

/// A codebook type's blocks as IQ4_NL-shaped blocks (an f16 scale and 16
/// bytes of 4-bit quants per 32 values; see the module comment for the
/// scales) with each index replaced by its level's rank: MXFP4's differ
/// from its indices, IQ4's levels rise with their indices already.
fn as_ranked(bytes: &[u8], ty: GgmlType) -> Vec<u8> {
    let mut blocks = as_iq4_nl(bytes, ty);
    if ty == GgmlType::MXFP4 {
        let rank = Levels::<true>::RANK;
        for blk in blocks.chunks_exact_mut(18) {
            for q in &mut blk[2..] {
                *q = rank[usize::from(*q & 0xF)] | rank[usize::from(*q >> 4)] << 4;
            }
        }
    }
    blocks
}

/// A codebook type's blocks as IQ4_NL blocks (an f16 scale and 16 bytes of
/// indices per 32 values; see the module comment for the scales).
fn as_iq4_nl(bytes: &[u8], ty: GgmlType) -> Vec<u8> {
    let bb = ty.block_bytes();
    match ty {
        GgmlType::IQ4_XS => bytes
            .chunks_exact(bb)
            .flat_map(|b| {
                let d = crate::quant::f16_at(b, 0);
                let scales = crate::quant::iq4_xs_scales(b);
                (0..8).flat_map(move |s| {
                    let scale = half::f16::from_f32(d * scales[s] as f32).to_le_bytes();
                    scale
                        .into_iter()
                        .chain(b[8 + 16 * s..8 + 16 * (s + 1)].iter().copied())
                })
            })
            .collect(),
        GgmlType::MXFP4 => bytes
            .chunks_exact(bb)
            .flat_map(|b| {
                let scale = half::f16::from_f32(crate::quant::e8m0_half(b[0])).to_le_bytes();
                scale.into_iter().chain(b[1..17].iter().copied())
            })
            .collect(),
        _ => bytes.to_vec(),
    }
}

/// Bytes of `n` rows of `k` values of `ty` once interleaved (rows padded to
/// whole groups).
pub(crate) fn weight_bytes(ty: GgmlType, n: usize, k: usize) -> usize {
    n.div_ceil(ROWS) * (k / 32) * group_bytes(ty)
}

/// The interleaved form of `n` rows of `k` values in `ty` blocks (`bytes`
/// in the file's layout), as f32 words for a [`super::CpuBuffer`].
pub(crate) fn repack(bytes: &[u8], ty: GgmlType, n: usize, k: usize) -> Result<Vec<f32>> {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let fits = k.is_multiple_of(bs) && bytes.len() == n * (k / bs) * bb;
    if !(legacy(ty) || codebook(ty)) || !fits || !repackable(bytes, ty) {
        return Err(FerrumError::invalid(format!(
            "cannot interleave {} bytes as {n} x {k} {ty} weights",
            bytes.len()
        )));
    }
    // The codebook types are packed as ranked blocks, in Q4_0's layout.
    let nl = codebook(ty).then(|| as_ranked(bytes, ty));
    let (bytes, ty) = match &nl {
        Some(nl) => (&nl[..], GgmlType::Q4_0),
        None => (bytes, ty),
    };
    let bb = ty.block_bytes();
    let nb = k / 32;
    let gb = group_bytes(ty);
    let groups = n.div_ceil(ROWS);
    let mut words = vec![0f32; weight_bytes(ty, n, k).div_ceil(4)];
    // SAFETY: f32 words have no invalid bit patterns, and the byte view
    // covers exactly the words' memory.
    let out =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 4) };
    out.par_chunks_mut(nb * gb)
        .take(groups)
        .enumerate()
        .for_each(|(g, dst)| {
            for (b, dst) in dst.chunks_exact_mut(gb).enumerate() {
                let mut q = [[0u8; 32]; ROWS];
                for (r, q) in q.iter_mut().enumerate() {
                    let row = g * ROWS + r;
                    if row < n {
                        let src = &bytes[(row * nb + b) * bb..][..bb];
                        pack_block(ty, src, r, q, dst);
                    }
                }
                pack_quants(ty, &q, dst);
            }
        });
    Ok(words)
}

/// Copies one file block's scale (and minimum) into row `r`'s place and
/// its 32 quants, as unsigned 5-bit values or Q8_0's bytes, into `q`.
fn pack_block(ty: GgmlType, src: &[u8], r: usize, q: &mut [u8; 32], dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
    let nibbles = |q: &mut [u8; 32], qs: &[u8]| {
        for (i, &byte) in qs[..16].iter().enumerate() {
            q[i] = byte & 0x0F;
            q[i + 16] = byte >> 4;
        }
    };
    let fifth = |q: &mut [u8; 32], qh: &[u8]| {
        let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for (i, v) in q.iter_mut().enumerate() {
            *v |= (((bits >> i) & 1) as u8) << 4;
        }
    };
    match ty {
        GgmlType::Q4_0 => nibbles(q, &src[2..]),
        GgmlType::Q4_1 => {
            dst[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&src[2..4]);
            nibbles(q, &src[4..]);
        }
        GgmlType::Q5_0 => {
            nibbles(q, &src[6..]);
            fifth(q, &src[2..6]);
        }
        GgmlType::Q5_1 => {
            dst[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&src[2..4]);
            nibbles(q, &src[8..]);
            fifth(q, &src[4..8]);
        }
        _ => q.copy_from_slice(&src[2..34]),
    }
}

/// Writes the sixteen rows' quants `q` in the `W_p` order after the scales.
fn pack_quants(ty: GgmlType, q: &[[u8; 32]; ROWS], dst: &mut [u8]) {
    const LANES: usize = 2 * ROWS;
    let w = |p: usize, i: usize| q[i / 2][2 * p + i % 2];
    match ty {
        GgmlType::Q8_0 => {
            for p in 0..16 {
                for i in 0..LANES {
                    dst[32 + LANES * p + i] = w(p, i);
                }
            }
        }
        _ => {
            let qs = quants_at(ty);
            for (r, q) in q.iter().enumerate() {
                for c in 0..4 {
                    let word = (0..4).fold(0u32, |x, j| {
                        let (even, odd) = (q[8 * c + 2 * j] & 0x0F, q[8 * c + 2 * j + 1] & 0x0F);
                        x | u32::from(even) << (4 * j) | u32::from(odd) << (16 + 4 * j)
                    });
                    dst[qs + 64 * c + 4 * r..][..4].copy_from_slice(&word.to_le_bytes());
                }
                if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
                    let plane = (0..32).fold(0u32, |x, i| {
                        x | u32::from(q[i] >> 4) << (16 * (i % 2) + i / 2)
                    });
                    dst[qs + 256 + 4 * r..][..4].copy_from_slice(&plane.to_le_bytes());
                }
            }
        }
    }
}

/// Where a group block's quants start: after the scales, and the minimums
/// of the types that have them.
fn quants_at(ty: GgmlType) -> usize {
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        64
    } else {
        32
    }
}

/// `out[m, n] = a · dequant(w)ᵀ` for interleaved weights `w` (`n` rows of
/// `k` values in `ty`) and activations already quantized in `act`
/// (32-value groups). The caller has checked the buffers' sizes.
pub(crate) fn gemm(act: &ActRows, w: &[u8], ty: GgmlType, out: &mut [f32], m: usize, n: usize) {
    assert!(supports(ty) && act.group == 32);
    assert!(w.len() >= weight_bytes(ty, n, act.k) && out.len() >= m * n);
    // Checked once here for every group's `add_outliers`.
    assert!(!act.a8 || (0..m).all(|r| act.row_outliers(r).iter().all(|o| (o.at as usize) < act.k)));
    let ptr = SyncPtr(out.as_mut_ptr());
    let tasks = n.div_ceil(ROWS).div_ceil(GROUPS_PER_TASK);
    for block in act.blocks(m) {
        (0..tasks).into_par_iter().for_each(|t| {
            group_task(act, w, ty, ptr, &block, t, n);
        });
    }
}

/// Task `t`'s groups against the activation rows `block`.
fn group_task(
    act: &ActRows,
    w: &[u8],
    ty: GgmlType,
    ptr: SyncPtr,
    block: &std::ops::Range<usize>,
    t: usize,
    n: usize,
) {
    let nb = act.k / 32;
    let gb = group_bytes(ty);
    let groups = n.div_ceil(ROWS);
    let mut res = [[0f32; ROWS]; ACT_ROWS];
    for g in t * GROUPS_PER_TASK..((t + 1) * GROUPS_PER_TASK).min(groups) {
        let gw = &w[g * nb * gb..(g + 1) * nb * gb];
        let (j0, valid) = (g * ROWS, ROWS.min(n - g * ROWS));
        for r0 in block.clone().step_by(ACT_ROWS) {
            let rows = ACT_ROWS.min(block.end - r0);
            dot_group(ty, gw, act, r0, rows, &mut res);
            if act.a8 {
                for (c, res) in res[..rows].iter_mut().enumerate() {
                    add_outliers(ty, gw, act, r0 + c, res);
                }
            }
            for (c, res) in res[..rows].iter().enumerate() {
                // SAFETY: row r0 + c < m and columns j0..j0 + valid ≤ n of
                // `out` ([m, n], checked by the caller); only this task
                // writes group g's columns.
                unsafe {
                    let dst = ptr.get().add((r0 + c) * n + j0);
                    // A whole group is a fixed-size copy (two vector
                    // moves); the count-taking copy is a `memcpy` call.
                    if valid == ROWS {
                        dst.cast::<[f32; ROWS]>().write_unaligned(*res);
                    } else {
                        std::ptr::copy_nonoverlapping(res.as_ptr(), dst, valid);
                    }
                };
            }
        }
    }
}

/// `out[c][r] = act[r0 + c] · dequant(row r of group gw)` for `m ≤ 8`
/// activation rows: 512-bit vectors where AVX-512 VNNI exists, else the
/// group's two halves in 256-bit vectors; 128-bit NEON on Arm.
fn dot_group(
    ty: GgmlType,
    gw: &[u8],
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    let nb = act.k / 32;
    assert!(supports(ty) && gw.len() == nb * group_bytes(ty) && (1..=ACT_ROWS).contains(&m));
    let values = if act.a8 { act.q8.len() } else { act.qs.len() };
    assert!(values >= (r0 + m) * act.k && act.d.len() >= (r0 + m) * act.stride);
    assert!(
        !act.a8 || takes_act8(ty),
        "8-bit activations are for Q4_1 and Q8_0 only"
    );
    let q41_a8 = act.a8 && ty == GgmlType::Q4_1;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supports` checked AVX2/FMA/F16C (and `has_vnni` or
    // `has_avx_vnni` the VNNI kernels' features); the extents asserted
    // above are what they read.
    unsafe {
        if super::features::has_vnni() {
            x86::dot_group_avx512(ty, gw.as_ptr(), nb, act, r0, m, out)
        } else if q41_a8 && super::features::has_avx_vnni() {
            x86::dot_group_a8_avx_vnni(gw.as_ptr(), nb, act, r0, m, out)
        } else {
            x86::dot_group_avx2(ty, gw.as_ptr(), nb, act, r0, m, out)
        }
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `supports` checked NEON (and `has_dotprod`, `has_i8mm` the
    // `SDOT` and `SMMLA` kernels' features); the extents asserted above
    // are what they read.
    unsafe {
        if q41_a8 && super::features::has_i8mm() && super::features::has_dotprod() {
            arm::dot_group_a8_i8mm(gw.as_ptr(), nb, act, r0, m, out)
        } else if q41_a8 && super::features::has_dotprod() {
            arm::dot_group_a8_dotprod(gw.as_ptr(), nb, act, r0, m, out)
        } else {
            arm::dot_group_neon(ty, gw.as_ptr(), nb, act, r0, m, out)
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (ty, out);
        unreachable!("supports() is false off x86-64 and AArch64");
    }
}

/// Adds row `r`'s 8-bit outliers ([`ActRows::row_outliers`]) against the
/// group's Q4_1 or Q8_0 weights `gw` to `out`.
fn add_outliers(ty: GgmlType, gw: &[u8], act: &ActRows, r: usize, out: &mut [f32; ROWS]) {
    let outliers = act.row_outliers(r);
    if outliers.is_empty() {
        return;
    }
    assert!(gw.len() == act.k / 32 * group_bytes(ty));
    if ty == GgmlType::Q8_0 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `dot_group` checked AVX2, FMA and F16C (and AVX-512 with
        // `has_vnni`); `gemm` checked that every outlier is below `k`, so
        // its block lies in `gw`.
        unsafe {
            if super::features::has_vnni() {
                x86::add_outliers_q80_512(gw.as_ptr(), outliers, out)
            } else {
                x86::add_outliers_q80(gw.as_ptr(), outliers, out)
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        add_outliers_q80(gw, outliers, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `dot_group` checked the CPU features and that 8-bit
    // activations come with Q4_1 weights; `gemm` checked that every
    // outlier is below `k`, so its block lies in `gw` (asserted).
    unsafe {
        x86::add_outliers_q41(gw.as_ptr(), outliers, out)
    }
    #[cfg(target_arch = "aarch64")]
    arm::add_outliers_q41(gw, outliers, out);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = out;
        unreachable!("8-bit activations are for x86-64 and AArch64");
    }
}

/// Adds `x · w[r][at]` for each outlier to the group's sixteen results
/// `out[r]`: the values Q8_0's 8-bit activations left out, each against
/// its column `d · q` (ggml's dequantization), one multiply and one fused
/// multiply-add per row, as x86's vector version does them.
#[cfg(not(target_arch = "x86_64"))]
fn add_outliers_q80(gw: &[u8], outliers: &[Outlier], out: &mut [f32; ROWS]) {
    for o in outliers {
        let (b, i) = (o.at as usize / 32, o.at as usize % 32);
        let block = &gw[b * Q80::GROUP..][..Q80::GROUP];
        // Value i of row r is byte 2r + i % 2 of W_{i / 2}.
        let pair = &block[LANE_BYTES * (1 + i / 2)..][..LANE_BYTES];
        for (r, out) in out.iter_mut().enumerate() {
            let w = f16_at(block, 2 * r) * f32::from(pair[2 * r + i % 2] as i8);
            *out = o.x.mul_add(w, *out);
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrum_types::GgmlType;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::{as_iq4_nl, codebook, group_bytes, quants_at, repack, Levels, ROWS};
    use crate::cpu::act_quant::ActRows;
    use crate::quant::{dequantize, random_blocks, IQ4, MX};

    /// A codebook type's `(TABLE, MIN)`.
    fn table(ty: GgmlType) -> ([u8; 16], i8) {
        if ty == GgmlType::MXFP4 {
            (Levels::<true>::TABLE, Levels::<true>::MIN)
        } else {
            (Levels::<false>::TABLE, Levels::<false>::MIN)
        }
    }

    /// Each index's level is its rank's table entry plus `MIN`, and entry 0
    /// is 0 (the kernels' shuffle relies on it).
    #[test]
    fn ranks_and_tables_give_the_levels() {
        fn check<const M: bool>(levels: [i8; 16]) {
            let (rank, table, min) = (Levels::<M>::RANK, Levels::<M>::TABLE, Levels::<M>::MIN);
            assert_eq!(table[0], 0);
            assert!(table.windows(2).all(|w| w[0] <= w[1]), "{table:?}");
            for (i, &l) in levels.iter().enumerate() {
                assert_eq!(
                    i16::from(table[usize::from(rank[i])]) + i16::from(min),
                    i16::from(l)
                );
            }
        }
        check::<false>(IQ4);
        check::<true>(MX);
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
    ];

    /// Reads value `i` of row `r` of block `b` back from the interleaved
    /// layout as `(d, m, q)`: its scale, its minimum (Q4_1, Q5_1; else 0)
    /// and its integer quant (unsigned, but Q8_0's; the codebook types'
    /// table entry, their level less `MIN`).
    fn parts(ty: GgmlType, w: &[u8], nb: usize, row: usize, b: usize, i: usize) -> (f32, f32, i32) {
        let gb = group_bytes(ty);
        let blk = &w[((row / ROWS) * nb + b) * gb..][..gb];
        let r = row % ROWS;
        let f16 = |o: usize| half::f16::from_le_bytes([blk[o], blk[o + 1]]).to_f32();
        let d = f16(2 * r);
        let (p, lane) = (i / 2, 2 * r + i % 2);
        if ty == GgmlType::Q8_0 {
            return (d, 0.0, i32::from(blk[32 + 32 * p + lane] as i8));
        }
        let qs = quants_at(ty);
        let word = |o: usize| u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]);
        let (c, j) = (i / 8, i % 8 / 2);
        let mut q = (word(qs + 64 * c + 4 * r) >> (16 * (i % 2) + 4 * j)) & 0x0F;
        if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
            q |= ((word(qs + 256 + 4 * r) >> (16 * (i % 2) + i / 2)) & 1) << 4;
        }
        if codebook(ty) {
            return (d, 0.0, i32::from(table(ty).0[q as usize]));
        }
        let m = if quants_at(ty) == 64 {
            f16(32 + 2 * r)
        } else {
            0.0
        };
        (d, m, q as i32)
    }

    /// Value `i` of row `r` of block `b`, dequantized from [`parts`].
    fn value(ty: GgmlType, w: &[u8], nb: usize, row: usize, b: usize, i: usize) -> f32 {
        let (d, m, q) = parts(ty, w, nb, row, b, i);
        let q = q as f32;
        match ty {
            GgmlType::Q4_0 => d * (q - 8.0),
            GgmlType::Q5_0 => d * (q - 16.0),
            GgmlType::Q8_0 => d * q,
            _ if codebook(ty) => d * (q + f32::from(table(ty).1)),
            _ => d * q + m,
        }
    }

    /// Every value read back from the interleaved layout equals the file
    /// block's dequantized value (IQ4_XS's with its scales rounded to f16,
    /// [`iq4_xs_scales_round_to_f16`]), for a row count that leaves a
    /// partial last group.
    #[test]
    fn interleaving_keeps_every_value() {
        let mut rng = StdRng::seed_from_u64(21);
        for ty in TYPES {
            let (n, k) = (21, if ty == GgmlType::IQ4_XS { 512 } else { 96 });
            let nb = k / 32;
            let mut bytes: Vec<u8> = (0..n * k / ty.block_size() * ty.block_bytes())
                .map(|_| rng.random())
                .collect();
            if codebook(ty) {
                bytes = random_blocks(ty, n * k / ty.block_size(), 21).unwrap_or_default();
            }
            for blk in bytes.chunks_mut(ty.block_bytes()).filter(|_| !codebook(ty)) {
                for o in [0, 2] {
                    let v = half::f16::from_f32(rng.random_range(-1f32..1.0));
                    blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            let mut want = vec![0f32; n * k];
            // IQ4_XS as stored: its scales rounded (tested below).
            let (read, as_ty) = match ty {
                GgmlType::IQ4_XS => (as_iq4_nl(&bytes, ty), GgmlType::IQ4_NL),
                _ => (bytes.clone(), ty),
            };
            dequantize(as_ty, &read, &mut want).unwrap_or_else(|e| panic!("{e}"));
            let words = repack(&bytes, ty, n, k).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            assert_eq!(w.len(), n.div_ceil(ROWS) * nb * group_bytes(ty));
            for row in 0..n {
                for b in 0..nb {
                    for i in 0..32 {
                        let got = value(ty, w, nb, row, b, i);
                        assert_eq!(
                            got,
                            want[row * k + 32 * b + i],
                            "{ty} row {row} b {b} i {i}"
                        );
                    }
                }
            }
            assert!(repack(&bytes[1..], ty, n, k).is_err(), "short input");
        }
    }

    /// IQ4_XS's `d·(ls−32)` per 32 values, as interleaving stores them:
    /// the f16 nearest the exact scale, so every value within 2^-11 of
    /// itself (half an f16 step) of the file's.
    #[test]
    fn iq4_xs_scales_round_to_f16() {
        let ty = GgmlType::IQ4_XS;
        let bytes = random_blocks(ty, 64, 5).unwrap_or_default();
        let (mut exact, mut stored) = (vec![0f32; 64 * 256], vec![0f32; 64 * 256]);
        dequantize(ty, &bytes, &mut exact).unwrap_or_else(|e| panic!("{e}"));
        let nl = as_iq4_nl(&bytes, ty);
        dequantize(GgmlType::IQ4_NL, &nl, &mut stored).unwrap_or_else(|e| panic!("{e}"));
        let mut moved = 0;
        for (&e, &s) in exact.iter().zip(&stored) {
            assert!((e - s).abs() <= e.abs() / 2048.0, "{e} stored as {s}");
            moved += usize::from(e != s);
        }
        assert!(
            moved > 0,
            "no scale needed rounding: the test checks nothing"
        );
    }

    /// MXFP4 with a scale f16 cannot hold stays in the file's layout.
    #[test]
    fn mxfp4_with_huge_scales_is_not_interleaved() {
        let ty = GgmlType::MXFP4;
        let mut bytes = random_blocks(ty, 16, 9).unwrap_or_default();
        assert!(super::repackable(&bytes, ty));
        bytes[17] = 200;
        assert!(!super::repackable(&bytes, ty));
        assert!(repack(&bytes, ty, 16, 32).is_err());
    }

    /// Values per row of the kernel tests' group.
    const GROUP_K: usize = 256;

    /// One interleaved group of random `ty` blocks (`GROUP_K` values per
    /// row) and eight activation rows quantized each way the kernels take
    /// them: 16-bit, and for Q4_1 8-bit too.
    fn one_group(ty: GgmlType, seed: u64, rng: &mut StdRng) -> (Vec<f32>, Vec<ActRows>) {
        let blocks = ROWS * GROUP_K / ty.block_size();
        let bytes = crate::quant::random_blocks(ty, blocks, seed).unwrap_or_default();
        let words = repack(&bytes, ty, ROWS, GROUP_K).unwrap_or_else(|e| panic!("{e}"));
        let a: Vec<f32> = (0..8 * GROUP_K)
            .map(|_| rng.random_range(-2.0f32..2.0))
            .collect();
        let mut act = ActRows::default();
        act.quantize(&a, 8, GROUP_K, 32);
        let mut acts = vec![act];
        if super::takes_act8(ty) {
            let mut act8 = ActRows::default();
            act8.quantize8(&a, 8, GROUP_K, ty == GgmlType::Q8_0);
            if ty == GgmlType::Q8_0 {
                // Widened too: the tests run the AVX2 kernel beside VNNI's.
                act8.widen8(8, true);
            }
            acts.push(act8);
        }
        (words, acts)
    }

    /// A row's results do not depend on how many activation rows share the
    /// kernel call (decode-sized calls take their own path): the engine's
    /// batched == alone guarantee at the kernel's level.
    #[test]
    fn results_do_not_depend_on_the_row_count() {
        use super::{dot_group, supports};
        if !supports(GgmlType::Q4_0) {
            eprintln!("skipped: no interleaved kernel on this CPU");
            return;
        }
        let mut rng = StdRng::seed_from_u64(23);
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let (words, acts) = one_group(ty, seed as u64, &mut rng);
            let w = crate::packed_bytes(&words);
            for act in &acts {
                let mut all = [[0f32; ROWS]; 8];
                dot_group(ty, w, act, 0, 8, &mut all);
                for m in 1..=7 {
                    for r0 in 0..=8 - m {
                        let mut part = [[0f32; ROWS]; 8];
                        dot_group(ty, w, act, r0, m, &mut part);
                        let rows = format!("{ty} 8-bit {} rows {r0}..{}", act.a8, r0 + m);
                        assert_eq!(part[..m], all[r0..r0 + m], "{rows}");
                    }
                }
            }
        }
    }

    /// Whichever kernel this CPU runs (AVX-512 VNNI, AVX-VNNI, AVX2, NEON
    /// with or without dotprod) gives exactly the bits of its statement:
    /// per block, the exact integer dot product of the quants and the
    /// quantized activations, then `acc = fma(float(dot), d·d_a, acc)` and,
    /// for types with an offset, `acc = fma(o, s_a, acc)` (`o`: the
    /// minimum, or `d·(−8)`, `d·(−16)`). So x86 and Arm give the same bits.
    #[test]
    fn kernels_give_the_bits_of_their_statement() {
        use super::{dot_group, prepare_q8_0, supports};
        if !supports(GgmlType::Q4_0) {
            eprintln!("skipped: no interleaved kernel on this CPU");
            return;
        }
        let nb = GROUP_K / 32;
        let mut rng = StdRng::seed_from_u64(29);
        // 16-bit activations, or 8-bit ones in the kernel's order or in
        // value order.
        let quantized = |a: &[f32], ty: GgmlType, a8: bool, natural: bool| {
            let mut act = ActRows::default();
            if a8 {
                act.quantize8(a, 8, GROUP_K, natural);
                if ty == GgmlType::Q8_0 {
                    prepare_q8_0(&mut act, 8);
                }
            } else {
                act.quantize(a, 8, GROUP_K, 32);
            }
            act
        };
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let bytes =
                crate::quant::random_blocks(ty, ROWS * GROUP_K / ty.block_size(), seed as u64 + 40)
                    .unwrap_or_default();
            let words = repack(&bytes, ty, ROWS, GROUP_K).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            let a: Vec<f32> = (0..8 * GROUP_K)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            for a8 in [false, super::takes_act8(ty)] {
                // Q8_0's kernels take theirs in value order.
                let order = ty == GgmlType::Q8_0;
                let (act, natural) = (quantized(&a, ty, a8, order), quantized(&a, ty, a8, true));
                let mut got = [[0f32; ROWS]; 8];
                dot_group(ty, w, &act, 0, 8, &mut got);
                for (c, got) in got.iter().enumerate() {
                    for (r, &got) in got.iter().enumerate() {
                        let mut acc = 0f32;
                        for b in 0..nb {
                            let mut dot = 0i32;
                            let (mut d, mut m) = (0.0, 0.0);
                            for i in 0..32 {
                                let (dq, mq, q) = parts(ty, w, nb, r, b, i);
                                (d, m) = (dq, mq);
                                let at = c * GROUP_K + 32 * b + i;
                                let a = if act.a8 {
                                    i32::from(natural.q8[at])
                                } else {
                                    i32::from(natural.qs[at])
                                };
                                dot += q * a;
                            }
                            let at = c * act.stride + b;
                            acc = (dot as f32).mul_add(d * act.d[at], acc);
                            let o = match ty {
                                GgmlType::Q4_0 => d * -8.0,
                                GgmlType::Q5_0 => d * -16.0,
                                GgmlType::Q8_0 => continue,
                                _ if codebook(ty) => d * f32::from(table(ty).1),
                                _ => m,
                            };
                            acc = o.mul_add(act.s[at], acc);
                        }
                        let what = format!("{ty} 8-bit {} act row {c} weight row {r}", act.a8);
                        assert_eq!(got.to_bits(), acc.to_bits(), "{what}: {got} vs {acc}");
                    }
                }
            }
        }
    }

    /// The AVX-512 and the plain AVX2 kernels give the same bits for every
    /// type and row count, and for Q4_1 and Q8_0 with 8-bit activations
    /// too (Q8_0's on AVX2 widened to 16 bits), as does
    /// the AVX-VNNI one where the CPU has it (their
    /// integer sums cannot differ, and the float steps are the same
    /// instructions).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_and_avx2_kernels_agree_bitwise() {
        use super::{
            super::features::{has_avx_vnni, has_vnni},
            supports, x86,
        };
        let (vnni, avx_vnni) = (has_vnni(), has_avx_vnni());
        if !supports(GgmlType::Q4_0) || !(vnni || avx_vnni) {
            eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX-VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(22);
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let (words, acts) = one_group(ty, seed as u64, &mut rng);
            let w = crate::packed_bytes(&words);
            for (m, act) in (1..=8).flat_map(|m| acts.iter().map(move |a| (m, a))) {
                let (mut x, mut y) = ([[0f32; ROWS]; 8], [[0f32; ROWS]; 8]);
                // SAFETY: each entry's features were detected above; `w`
                // holds one group of `nb` blocks and `act` eight rows.
                unsafe {
                    x86::dot_group_avx2(ty, w.as_ptr(), GROUP_K / 32, act, 0, m, &mut x);
                    if vnni {
                        x86::dot_group_avx512(ty, w.as_ptr(), GROUP_K / 32, act, 0, m, &mut y);
                        assert_eq!(x[..m], y[..m], "{ty} m{m} 8-bit {}", act.a8);
                    }
                    if avx_vnni && act.a8 && ty == GgmlType::Q4_1 {
                        x86::dot_group_a8_avx_vnni(w.as_ptr(), GROUP_K / 32, act, 0, m, &mut y);
                        assert_eq!(x[..m], y[..m], "{ty} m{m} AVX-VNNI");
                    }
                }
            }
        }
    }

    /// Q8_0's outlier passes (AVX2, AVX-512) give the bits of their
    /// statement, `out = fma(x, d · q, out)` per outlier in order, which is
    /// also what other CPUs' plain version computes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q8_0_outliers_give_the_bits_of_their_statement() {
        use super::{super::act_quant::Outlier, super::features::has_vnni, supports, x86};
        let ty = GgmlType::Q8_0;
        if !supports(ty) {
            eprintln!("skipped: no interleaved kernel on this CPU");
            return;
        }
        let nb = GROUP_K / 32;
        let bytes = crate::quant::random_blocks(ty, ROWS * nb, 77).unwrap_or_default();
        let words = repack(&bytes, ty, ROWS, GROUP_K).unwrap_or_else(|e| panic!("{e}"));
        let w = crate::packed_bytes(&words);
        let mut rng = StdRng::seed_from_u64(78);
        let outliers: Vec<Outlier> = (0..9)
            .map(|_| Outlier {
                at: rng.random_range(0..GROUP_K as u32),
                x: rng.random_range(-30.0f32..30.0),
            })
            .collect();
        let start: [f32; ROWS] = std::array::from_fn(|_| rng.random_range(-5.0f32..5.0));
        let mut want = start;
        for o in &outliers {
            let (b, i) = (o.at as usize / 32, o.at as usize % 32);
            for (r, want) in want.iter_mut().enumerate() {
                let (d, _, q) = parts(ty, w, nb, r, b, i);
                *want = o.x.mul_add(d * q as f32, *want);
            }
        }
        let (mut x, mut y) = (start, start);
        // SAFETY: `supports` checked AVX2, FMA and F16C, `has_vnni`
        // AVX-512; every outlier is inside the group's blocks.
        unsafe {
            x86::add_outliers_q80(w.as_ptr(), &outliers, &mut x);
            assert_eq!(x.map(f32::to_bits), want.map(f32::to_bits), "AVX2");
            if has_vnni() {
                x86::add_outliers_q80_512(w.as_ptr(), &outliers, &mut y);
                assert_eq!(y.map(f32::to_bits), want.map(f32::to_bits), "AVX-512");
            }
        }
    }
}
