//! K-quant blocks (Q4_K, Q5_K, Q6_K) re-laid out at load so that the lanes
//! of a vector are the block's sub-blocks, for integer dot products with
//! 8-bit activations (`SDOT`, or widening multiplies without dotprod) or
//! 16-bit ones (`SMLAL`): the Arm kernels. x86 had kernels on this layout
//! too (`PMADDUBSW` / `VPDPBUSD`), replaced by the row-grouped layout of
//! `kquant_rows`, which does the per-row work once per eight rows (1.5x
//! the prefill and 1.15x the decode of Qwen2.5-Coder-1.5B Q4_K_M on a
//! Zen 4); the Arm kernels have not been moved to it yet.
//!
//! A super-block of 256 values has one integer scale per sub-block (32
//! values in Q4_K/Q5_K, 16 in Q6_K). In the file, 32 bytes of quants hold
//! one or two whole sub-blocks, so every product must be scaled per
//! sub-block before it is summed with another's. Here each 32-bit lane of a
//! 32-byte vector holds four values of one sub-block, lane `j` of
//! sub-block `j`: the products of a whole super-block then add up in their
//! own lanes (8-bit products first in 16-bit lanes, as far as they cannot
//! overflow), and one multiply by the eight sub-block scales finishes the
//! block. Per 32 products that is one `PMADDUBSW` and one 16-bit add, where
//! the file's layout takes `PMADDUBSW` plus a scaling `PMADDWD` (ggml) or
//! two `PMADDWD` on 16-bit inputs (this crate before).
//!
//! Layout of a repacked super-block: its header (`d`, `dmin`, scales) stays
//! where and as the file has it, so the block keeps its size. Value `v` of
//! the super-block is `32j + 4h + p` (lane `j`, *part* `h` = 0..8, position
//! `p` = 0..4); part `h` of every lane is one 32-byte vector once unpacked,
//! its byte `4j + p`. The low 4 bits of parts `2u` and `2u + 1` are the low
//! and high nibbles of the 32 bytes at `QS + 32u`. Q5_K's fifth bits: bit
//! `h` of byte `4j + p` of its 32-byte plane. Q6_K's top two bits: bits
//! `2i, 2i + 1` of byte `4j + p` of the 32 bytes at `128 + 32u` for part
//! `4u + i`; Q6_K's 16-value sub-blocks are `2j` for parts 0..4 and
//! `2j + 1` for parts 4..8 of lane `j`, and its values stay unsigned
//! (`q + 32`, the offset taken off through activation sums).
//!
//! Activations are put in the same order once per GEMM (an 8 x 8
//! transpose of 4-value words per 256 values), 8-bit ones with one scale
//! per 32 values, which is per lane: a lane's sum is scaled by its own
//! activation scale, so finer activation scales cost nothing over
//! ggml's one per 256 (`Q8_K`).
//!
//! Every output is produced by the same instruction sequence whatever the
//! number of rows it is computed with, so a sequence's logits do not depend
//! on what it is batched with (the engine's batched == alone guarantee);
//! the VNNI and the AVX2 kernels give the same bits.

use ferrum_types::{FerrumError, GgmlType, Result};
use rayon::prelude::*;

use super::act_quant::ActRows;
use super::features::has_neon;
use super::outliers::f16_at;
use crate::quant::{file_quants, scale_min_k4};

/// Whether weights of type `ty` are repacked here (and computed by this
/// module's kernels) on this CPU.
pub(crate) fn supports(ty: GgmlType) -> bool {
    has_neon() && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Values per activation scale of the 16-bit kernels: a super-block.
pub(crate) const ACT_GROUP: usize = 256;

/// Where a type's 4-bit planes start in a block.
fn quants_at(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K => 16,
        GgmlType::Q5_K => 48,
        _ => 0,
    }
}

/// Byte `4j + p` of part `h`'s plane position for value `v`: `(h, 4j + p)`.
fn part_of(v: usize) -> (usize, usize) {
    let (j, t) = (v / 32, v % 32);
    (t / 4, 4 * j + t % 4)
}

/// Writes quants `q` (as [`file_quants`] gives them) into block `dst` in
/// the repacked layout; the header bytes are copied by the caller.
fn put_quants(ty: GgmlType, q: &[u8; 256], dst: &mut [u8]) {
    let qs = quants_at(ty);
    dst[qs..qs + 128].fill(0);
    match ty {
        GgmlType::Q5_K => dst[16..48].fill(0),
        GgmlType::Q6_K => dst[128..192].fill(0),
        _ => {}
    }
    for (v, &x) in q.iter().enumerate() {
        let (h, byte) = part_of(v);
        dst[qs + 32 * (h / 2) + byte] |= (x & 0x0F) << (4 * (h % 2));
        match ty {
            GgmlType::Q5_K => dst[16 + byte] |= (x >> 4) << h,
            GgmlType::Q6_K => dst[128 + 32 * (h / 4) + byte] |= (x >> 4) << (2 * (h % 4)),
            _ => {}
        }
    }
}

/// The repacked form of `n` rows of `k` values in `ty` blocks (`bytes` in
/// the file's layout), as f32 words for a [`super::CpuBuffer`]: the same
/// size as the file's.
pub(crate) fn repack(bytes: &[u8], ty: GgmlType, n: usize, k: usize) -> Result<Vec<f32>> {
    let bb = ty.block_bytes();
    if !matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
        || !k.is_multiple_of(256)
        || bytes.len() != n * (k / 256) * bb
    {
        return Err(FerrumError::invalid(format!(
            "cannot repack {} bytes as {n} x {k} {ty} weights",
            bytes.len()
        )));
    }
    let mut words = vec![0f32; bytes.len().div_ceil(4)];
    // SAFETY: f32 words have no invalid bit patterns, and the byte view
    // covers exactly the words' memory.
    let out =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 4) };
    out[..bytes.len()]
        .par_chunks_mut(bb * 64)
        .zip(bytes.par_chunks(bb * 64))
        .for_each(|(dst, src)| {
            for (dst, src) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(bb)) {
                dst.copy_from_slice(src);
                put_quants(ty, &file_quants(ty, src), dst);
            }
        });
    Ok(words)
}

/// Value `v` (0..256) of repacked block `b`, dequantized with the
/// products rounded as ggml's dequantization rounds them: how the outliers
/// of 8-bit activations meet their weights.
#[inline(always)]
fn value(ty: GgmlType, b: &[u8], v: usize) -> f32 {
    let q = quant(ty, b, v) as f32;
    if ty == GgmlType::Q6_K {
        f16_at(b, 208) * f32::from(b[192 + v / 16] as i8) * q
    } else {
        let (sc, mn) = scale_min_k4(v / 32, &b[4..16]);
        f16_at(b, 0) * f32::from(sc) * q - f16_at(b, 2) * f32::from(mn)
    }
}

/// The integer quant of value `v` (0..256) of repacked block `b` (Q6_K's
/// made signed).
#[inline(always)]
fn quant(ty: GgmlType, b: &[u8], v: usize) -> i32 {
    let (h, byte) = part_of(v);
    let low = (b[quants_at(ty) + 32 * (h / 2) + byte] >> (4 * (h % 2))) & 0x0F;
    match ty {
        GgmlType::Q6_K => {
            let high = (b[128 + 32 * (h / 4) + byte] >> (2 * (h % 4))) & 3;
            i32::from(low | high << 4) - 32
        }
        GgmlType::Q5_K => i32::from(low | ((b[16 + byte] >> h) & 1) << 4),
        _ => i32::from(low),
    }
}

/// Weight row `j`'s value at position `at` of repacked weights `w` (rows
/// of `k` values of `ty`), for the outlier pass ([`super::outliers`]).
pub(crate) fn value_at(
    w: &[u8],
    ty: GgmlType,
    k: usize,
) -> impl Fn(usize, usize) -> f32 + Sync + '_ {
    let (bb, row_bytes) = (ty.block_bytes(), k / 256 * ty.block_bytes());
    move |j, at| value(ty, &w[j * row_bytes + at / 256 * bb..][..bb], at % 256)
}

/// Puts each 256 values of `m` activation rows (`u8` or `i16` words of
/// `W` bytes: 4 values) in the repacked order: value `32j + 4h + p` to
/// `32h + 4j + p`, an 8 x 8 transpose of 4-value words.
fn transpose_words<const W: usize>(bytes: &mut [u8]) {
    for sb in bytes.chunks_exact_mut(64 * W) {
        let mut t = [[0u8; W]; 64];
        for (i, w) in sb.chunks_exact(W).enumerate() {
            t[8 * (i % 8) + i / 8].copy_from_slice(w);
        }
        sb.copy_from_slice(t.as_flattened());
    }
}

/// Orders 8-bit activations ([`ActRows::quantize8`] in natural order) for
/// these kernels, after noting their sums per 16 values (`sums16`, for
/// Q6_K's offset).
pub(crate) fn order8(act: &mut ActRows, m: usize) {
    let k = act.k;
    act.sums16.resize(m * k / 16, 0);
    for (q, s) in act.q8[..m * k].chunks_exact(16).zip(act.sums16.iter_mut()) {
        *s = q.iter().map(|&v| i16::from(v)).sum();
    }
    // SAFETY: i8 and u8 have the same layout.
    let bytes = unsafe { std::slice::from_raw_parts_mut(act.q8.as_mut_ptr().cast(), m * k) };
    transpose_words::<4>(bytes);
    super::outliers::index(act, m);
}

/// Orders 16-bit activations ([`ActRows::quantize`], groups of
/// [`ACT_GROUP`]) for these kernels: the repacked order, then in each run
/// of 32 values 0..8, 16..24, 8..16, 24..32 (a part's lanes 0-1 and 4-5,
/// then 2-3 and 6-7: how unpacking bytes to 16 bits splits a vector).
pub(crate) fn order16(act: &mut ActRows, m: usize) {
    let k = act.k;
    // SAFETY: i16 values viewed as their bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(act.qs.as_mut_ptr().cast(), 2 * m * k) };
    transpose_words::<8>(bytes);
    for run in act.qs[..m * k].chunks_exact_mut(32) {
        let (first, rest) = run.split_at_mut(16);
        first[8..].swap_with_slice(&mut rest[..8]);
    }
}

/// `dots[j][c] = act[r0 + c] · dequant(row j)` for the consecutive
/// repacked weight rows in `rows` (one per element of `dots`) and `m ≤ 8`
/// activation rows ordered by [`order8`] or [`order16`]. The caller checks
/// [`supports`].
pub(crate) fn dot_rows(
    ty: GgmlType,
    rows: &[u8],
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    let row_bytes = act.k / 256 * ty.block_bytes();
    assert!(supports(ty) && (1..=8).contains(&m));
    assert!(!dots.is_empty() && rows.len() == dots.len() * row_bytes);
    if act.a8 {
        assert!(act.group == 32 && act.q8.len() >= (r0 + m) * act.k);
        assert!(act.sums16.len() >= (r0 + m) * act.k / 16);
    } else {
        assert!(act.group == ACT_GROUP && act.qs.len() >= (r0 + m) * act.k);
    }
    assert!(act.d.len() >= (r0 + m) * act.stride);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `supports` checked NEON (and `has_dotprod` the dotprod
    // entry's feature); the extents asserted above are what they read.
    unsafe {
        if super::features::has_dotprod() {
            arm::dot_rows_dotprod(ty, rows.as_ptr(), row_bytes, act, r0, m, dots)
        } else {
            arm::dot_rows_neon(ty, rows.as_ptr(), row_bytes, act, r0, m, dots)
        }
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = dots;
        unreachable!("supports() is false off AArch64");
    }
}

#[cfg(target_arch = "aarch64")]
#[path = "arm/kquant_lanes.rs"]
mod arm;

#[cfg(test)]
mod tests {
    use ferrum_types::GgmlType;

    use super::{file_quants, put_quants, value};
    use crate::quant::{dequantize, random_blocks};

    /// Every value of a repacked block dequantizes to the file block's.
    #[test]
    fn repacked_blocks_hold_the_files_values() {
        for (seed, ty) in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
            .into_iter()
            .enumerate()
        {
            let blocks = random_blocks(ty, 3, seed as u64).unwrap_or_default();
            let mut want = vec![0f32; 3 * 256];
            dequantize(ty, &blocks, &mut want).unwrap_or_default();
            for (b, src) in blocks.chunks_exact(ty.block_bytes()).enumerate() {
                let mut dst = src.to_vec();
                put_quants(ty, &file_quants(ty, src), &mut dst);
                for v in 0..256 {
                    assert_eq!(
                        value(ty, &dst, v),
                        want[256 * b + v],
                        "{ty} block {b} value {v}"
                    );
                }
            }
        }
    }

    /// The two Arm kernel entries (plain NEON and dotprod) give the same
    /// bits for every type, row count and activation width: their integer
    /// sums cannot differ, and the float steps are shared.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn both_kernel_entries_agree_bitwise() {
        use rand::{rngs::StdRng, Rng, SeedableRng};

        use super::super::act_quant::ActRows;
        use super::{order16, order8, repack, ACT_GROUP};

        type Entry = unsafe fn(GgmlType, *const u8, usize, &ActRows, usize, usize, &mut [[f32; 8]]);
        let (plain, wide, ok): (Entry, Entry, bool) = (
            super::arm::dot_rows_neon,
            super::arm::dot_rows_dotprod,
            super::super::features::has_dotprod(),
        );
        if !ok {
            eprintln!("skipped: this CPU lacks dotprod");
            return;
        }
        let mut rng = StdRng::seed_from_u64(4);
        for (seed, ty) in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
            .into_iter()
            .enumerate()
        {
            let k = 512;
            let file = random_blocks(ty, 2 * k / 256, seed as u64).unwrap_or_default();
            let words = repack(&file, ty, 2, k).unwrap_or_default();
            // SAFETY: the words' bytes.
            let row =
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), file.len()) };
            let a: Vec<f32> = (0..8 * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            for a8 in [false, true] {
                let mut act = ActRows::default();
                if a8 {
                    act.quantize8(&a, 8, k, true);
                    order8(&mut act, 8);
                } else {
                    act.quantize(&a, 8, k, ACT_GROUP);
                    order16(&mut act, 8);
                }
                let rb = row.len() / 2;
                for m in 1..=8 {
                    let (mut x, mut y) = ([[0f32; 8]; 2], [[0f32; 8]; 2]);
                    // SAFETY: both entries' features were detected above;
                    // two rows of `k` and `m` activation rows.
                    unsafe {
                        plain(ty, row.as_ptr(), rb, &act, 0, m, &mut x);
                        wide(ty, row.as_ptr(), rb, &act, 0, m, &mut y);
                    }
                    assert_eq!(x, y, "{ty} m{m} 8-bit {a8}");
                }
            }
        }
    }

    /// The bit-moving f16 conversion agrees with the `half` crate's on
    /// every bit pattern.
    #[test]
    fn f16_conversion_is_exact() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = crate::cpu::outliers::f16_at(&h.to_le_bytes(), 0);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#x}"
            );
        }
    }

    /// The transpose sends value `32j + 4h + p` to `32h + 4j + p`.
    #[test]
    fn activation_order_is_the_parts_order() {
        let mut bytes: Vec<u8> = (0..=255).collect();
        super::transpose_words::<4>(&mut bytes);
        for j in 0..8 {
            for h in 0..8 {
                for p in 0..4 {
                    assert_eq!(bytes[32 * h + 4 * j + p] as usize, 32 * j + 4 * h + p);
                }
            }
        }
    }
}
