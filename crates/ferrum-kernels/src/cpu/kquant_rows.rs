//! K-quant blocks (Q2_K to Q6_K) re-laid out at load eight weight rows
//! at a time, for integer kernels whose vector lanes are those rows
//! (ggml's `block_q4_Kx8` idea, in a layout of our own), on x86 (AVX2 and
//! up, `x86/kquant_rows.rs`) and AArch64 (NEON, `arm/kquant_rows.rs`).
//!
//! Why rows in lanes: a layout with one row's sub-blocks in a vector (this
//! crate's before, retired) makes every row pay its own header
//! decode, scaling, float finish and horizontal sum. At one activation row
//! (decode) that overhead was most of the work: Qwen2.5-Coder-1.5B decoded
//! at half llama.cpp's speed per core on a Zen 4. Here a `VPDPBUSD` (or
//! `PMADDUBSW`) multiplies four values of eight rows by the same four
//! activation bytes, broadcast, so a 32-value span's results land in one
//! vector, one lane per row, and are converted, scaled and summed once for
//! all eight; there is no horizontal sum at all.
//!
//! Layout of one *group block* (rows `8g..8g+8`, super-block `b`; groups
//! are stored one after another, each holding its super-blocks in order,
//! rows past `n` zero). A *span* `j` (0..8) is values `32j..32j+32`; its
//! quants are four 32-byte vectors `V_{j,u}` (`u` = 0..4) whose byte
//! `4r + p` holds value `32j + 4u + p` of row `r` in its low nibble and value
//! `32j + 16 + 4u + p` in its high nibble: the *low* and *high half* of the
//! span (a Q6_K sub-block each).
//! - Q4_K, Q5_K: bytes 0..16 the rows' f16 `d`, 16..32 their `dmin`,
//!   32..96 the 6-bit sub-block scales unpacked to a byte each (`8j + r`),
//!   96..160 the minimums likewise; then the spans, each its four `V_{j,u}`
//!   and, for Q5_K, a 32-byte plane whose byte `4r + p` has in bit `u` the
//!   fifth bit of the low half's value and in bit `4 + u` the high half's.
//!   1,184 and 1,440 bytes for eight file blocks of 1,152 and 1,408 (+2.8%,
//!   +2.3%): the unpacked scales save a six-bit decode per row and
//!   super-block.
//! - Q6_K: bytes 0..16 the rows' f16 `d`, 16..144 the sixteen signed
//!   scales per row (`8s + r`); then the spans, each its four `V_{j,u}`
//!   (the low four bits) and two vectors of top bits, the half `h`'s
//!   second: bits `2u, 2u + 1` of byte `4r + p` are those of value
//!   `32j + 16h + 4u + p`. Values stay unsigned (`q + 32`; the offset
//!   comes off through activation sums). Exactly eight file blocks.
//! - Q3_K: Q6_K's header (its scales unpacked from six bits); then the
//!   spans, each two vectors of 2-bit fields, the half `h`'s second
//!   (bits `2u, 2u + 1` of byte `4r + p` hold the low bits of value
//!   `32j + 16h + 4u + p`), and a plane of third bits (bit `4h + u` of
//!   byte `4r + p`, as Q5_K's). Values stay unsigned (`q + 4`, the offset
//!   off through the activation sums as Q6_K's). 912 bytes for eight file
//!   blocks of 880 (+3.6%).
//! - Q2_K: bytes 0..16 the rows' f16 `d`, 16..32 their `dmin`, 32..160 the
//!   file's scale bytes (a 4-bit scale and a 4-bit minimum per 16 values,
//!   `8s + r`); then the spans, each Q3_K's two vectors of 2-bit fields.
//!   Exactly eight file blocks.
//!
//! A span's bytes are contiguous, so a group block is read strictly in
//! order: with Q6_K's top bits in a plane of their own after the nibbles,
//! two interleaved streams per block, decode from memory ran at half the
//! bandwidth (`gemm_quant_dram` bench, `docs/perf-log.md`).
//!
//! Activations: 8-bit ones in value order, a scale per 32 ([`ActRows::
//! quantize8`]), so a span's integer sum is scaled by its own activation
//! scale; 16-bit ones with a scale per 32 as well, each run of four values
//! stored 0, 2, 1, 3 so that a broadcast pair lines up with the even or the
//! odd values of a weight word split into 16-bit lanes.
//!
//! Every output is one lane of the same instruction sequence for any
//! number of activation rows (the engine's batched == alone guarantee),
//! and the AVX2 and VNNI kernels compute the same integers (no 16-bit sum
//! can overflow), so the same bits.

use ferrum_types::{FerrumError, GgmlType, Result};
use rayon::prelude::*;

use super::act_quant::ActRows;
use super::act_tiles::ACT_ROWS;
use super::SyncPtr;
use crate::quant::{file_quants, q3_k_scales, scale_min_k4};

/// Weight rows per group: the i32 lanes of a 256-bit vector.
pub(crate) const ROWS: usize = 8;

/// Activation rows per call on AVX2 (16 registers).
const AVX2_ROWS: usize = 4;

/// Groups per parallel task.
const GROUPS_PER_TASK: usize = 4;

/// Up to this many activation rows, their 8-bit outliers are added per
/// group, eight rows' weights dequantized at once while the group is in
/// cache; for more, the shared outlier pass dequantizes each distinct
/// position once (`super::outliers`). Both add the same products in the
/// same order.
const GROUP_OUTLIERS_MAX_M: usize = 8;

/// Values per activation scale, for either width.
pub(crate) const ACT_GROUP: usize = 32;

/// Whether weights of type `ty` are laid out here (and computed by this
/// module's kernels) on this CPU.
pub(crate) fn supports(ty: GgmlType) -> bool {
    let x86 = cfg!(target_arch = "x86_64") && super::features::has_avx2();
    kquant(ty) && (x86 || super::features::has_neon())
}

/// The types this layout holds.
fn kquant(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
    )
}

/// Bytes of one group block of `ty`.
pub(crate) fn group_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q2_K => 672,
        GgmlType::Q3_K => 912,
        GgmlType::Q4_K => 1184,
        GgmlType::Q5_K => 1440,
        _ => 1680,
    }
}

/// Where span `j` of a group block starts: after the header, spans of
/// four nibble vectors plus Q5_K's plane or Q6_K's two top-bit vectors,
/// or Q3_K's two vectors of 2-bit fields and its plane (Q2_K's: no plane).
pub(crate) fn span_at(ty: GgmlType, j: usize) -> usize {
    match ty {
        GgmlType::Q2_K => 160 + 64 * j,
        GgmlType::Q3_K => 144 + 96 * j,
        GgmlType::Q4_K => 160 + 128 * j,
        GgmlType::Q5_K => 160 + 160 * j,
        _ => 144 + 192 * j,
    }
}

/// Bytes of `n` rows of `k` values of `ty` in this layout (rows padded to
/// whole groups).
pub(crate) fn weight_bytes(ty: GgmlType, n: usize, k: usize) -> usize {
    n.div_ceil(ROWS) * (k / 256) * group_bytes(ty)
}

/// Where value `v` (0..256) of row `r` sits in a group block of `ty`: the
/// byte of its nibble, the byte of its high bits (Q5_K, Q6_K), its half
/// and chunk `u`: the layout's rule per value, which [`put_row`] follows
/// span by span and the tests read back with.
#[cfg(any(test, target_arch = "aarch64"))]
fn place(ty: GgmlType, r: usize, v: usize) -> (usize, usize, usize, usize) {
    let (j, t) = (v / 32, v % 32);
    let (half, u, byte) = (t / 16, t % 16 / 4, 4 * r + t % 4);
    let at = span_at(ty, j);
    if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K) {
        return (at + 32 * half + byte, at + 64 + byte, half, u);
    }
    let high = match ty {
        GgmlType::Q6_K => at + 128 + 32 * half + byte,
        _ => at + 128 + byte,
    };
    (at + 32 * u + byte, high, half, u)
}

/// Writes file block `src` as row `r` of group block `dst`.
fn put_row(ty: GgmlType, src: &[u8], r: usize, dst: &mut [u8]) {
    if ty == GgmlType::Q6_K {
        dst[2 * r..2 * r + 2].copy_from_slice(&src[208..210]);
        for s in 0..16 {
            dst[16 + 8 * s + r] = src[192 + s];
        }
    } else if ty == GgmlType::Q3_K {
        dst[2 * r..2 * r + 2].copy_from_slice(&src[108..110]);
        for (s, &sc) in q3_k_scales(src).iter().enumerate() {
            dst[16 + 8 * s + r] = sc as u8;
        }
    } else if ty == GgmlType::Q2_K {
        dst[2 * r..2 * r + 2].copy_from_slice(&src[80..82]);
        dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[82..84]);
        for (s, &sc) in src[..16].iter().enumerate() {
            dst[32 + 8 * s + r] = sc;
        }
    } else {
        dst[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
        dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
        for j in 0..8 {
            let (sc, mn) = scale_min_k4(j, &src[4..16]);
            dst[32 + 8 * j + r] = sc;
            dst[96 + 8 * j + r] = mn;
        }
    }
    // Span by span, each nibble byte written whole from its two values
    // (the layout's rule, as `place` states it per value): this runs at
    // load over every weight, a value at a time it took most of a large
    // MoE file's load.
    let q = file_quants(ty, src);
    let span_len = span_at(ty, 1) - span_at(ty, 0);
    for (j, q) in q.chunks_exact(32).enumerate() {
        let span = &mut dst[span_at(ty, j)..][..span_len];
        let (lo, hi) = q.split_at(16);
        for (t, (&a, &b)) in lo.iter().zip(hi).enumerate() {
            let (u, byte) = (t / 4, 4 * r + t % 4);
            if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K) {
                span[byte] |= (a & 3) << (2 * u);
                span[32 + byte] |= (b & 3) << (2 * u);
                if ty == GgmlType::Q3_K {
                    span[64 + byte] |= (a >> 2) << u | (b >> 2) << (4 + u);
                }
                continue;
            }
            span[32 * u + byte] = (a & 0x0F) | (b & 0x0F) << 4;
            match ty {
                GgmlType::Q5_K => span[128 + byte] |= (a >> 4) << u | (b >> 4) << (4 + u),
                GgmlType::Q6_K => {
                    span[128 + byte] |= (a >> 4) << (2 * u);
                    span[160 + byte] |= (b >> 4) << (2 * u);
                }
                _ => {}
            }
        }
    }
}

/// The grouped form of `n` rows of `k` values in `ty` blocks (`bytes` in
/// the file's layout), as f32 words for a [`super::CpuBuffer`].
pub(crate) fn repack(bytes: &[u8], ty: GgmlType, n: usize, k: usize) -> Result<Vec<f32>> {
    let bb = ty.block_bytes();
    if !kquant(ty) || !k.is_multiple_of(256) || bytes.len() != n * (k / 256) * bb {
        return Err(FerrumError::invalid(format!(
            "cannot repack {} bytes as {n} x {k} {ty} weights",
            bytes.len()
        )));
    }
    let (nb, gb) = (k / 256, group_bytes(ty));
    let mut words = vec![0f32; weight_bytes(ty, n, k).div_ceil(4)];
    // SAFETY: f32 words have no invalid bit patterns, and the byte view
    // covers exactly the words' memory.
    let out =
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 4) };
    out.par_chunks_mut(nb * gb)
        .take(n.div_ceil(ROWS))
        .enumerate()
        .for_each(|(g, dst)| {
            for (b, dst) in dst.chunks_exact_mut(gb).enumerate() {
                for r in 0..ROWS.min(n - g * ROWS) {
                    let row = g * ROWS + r;
                    put_row(ty, &bytes[(row * nb + b) * bb..][..bb], r, dst);
                }
            }
        });
    Ok(words)
}

/// Value `v` (0..256) of row `r` of group block `b`, dequantized with the
/// products rounded as ggml's dequantization rounds them (how the outliers
/// of 8-bit activations meet their weights): the scalar reference for the
/// layout and for the kernels' eight-row dequantization (`x86::values8`);
/// Arm's outliers meet their weights through it.
#[cfg(any(test, target_arch = "aarch64"))]
fn value(ty: GgmlType, b: &[u8], r: usize, v: usize) -> f32 {
    use super::outliers::f16_at;
    let (at, high, half, u) = place(ty, r, v);
    if ty == GgmlType::Q2_K {
        let q = f32::from((b[at] >> (2 * u)) & 3);
        let sm = b[32 + 8 * (v / 16) + r];
        let (sc, mn) = (f32::from(sm & 0x0F), f32::from(sm >> 4));
        return f16_at(b, 2 * r) * sc * q - f16_at(b, 16 + 2 * r) * mn;
    }
    if ty == GgmlType::Q3_K {
        let q = (b[at] >> (2 * u)) & 3 | ((b[high] >> (4 * half + u)) & 1) << 2;
        let sc = f32::from(b[16 + 8 * (v / 16) + r] as i8);
        return f16_at(b, 2 * r) * sc * (f32::from(q) - 4.0);
    }
    let mut q = (b[at] >> (4 * half)) & 0x0F;
    match ty {
        GgmlType::Q6_K => {
            q |= ((b[high] >> (2 * u)) & 3) << 4;
            let sc = f32::from(b[16 + 8 * (v / 16) + r] as i8);
            f16_at(b, 2 * r) * sc * (f32::from(q) - 32.0)
        }
        _ => {
            if ty == GgmlType::Q5_K {
                q |= ((b[high] >> (4 * half + u)) & 1) << 4;
            }
            let j = v / 32;
            let (sc, mn) = (f32::from(b[32 + 8 * j + r]), f32::from(b[96 + 8 * j + r]));
            f16_at(b, 2 * r) * sc * f32::from(q) - f16_at(b, 16 + 2 * r) * mn
        }
    }
}

/// The outlier pass's weights ([`super::outliers::Columns`]) from grouped
/// weights `w` (rows of `k` values of `ty`): a task's rows are one group,
/// whose eight values at a position are dequantized in one vector.
fn columns(w: &[u8], ty: GgmlType, k: usize) -> impl super::outliers::Columns + Sync + '_ {
    const { assert!(super::outliers::OUTLIER_ROWS == ROWS) };
    let (nb, gb) = (k / 256, group_bytes(ty));
    move |rows: std::ops::Range<usize>, union: &[u32], cols: &mut [f32]| {
        let g = rows.start / ROWS;
        assert!(
            rows.start.is_multiple_of(ROWS)
                && rows.len() <= ROWS
                && cols.len() >= ROWS * union.len()
        );
        let gw = &w[g * nb * gb..][..nb * gb];
        #[cfg(target_arch = "x86_64")]
        for (s, &at) in union.iter().enumerate() {
            let at = at as usize;
            assert!(at < k);
            // The group's eight rows (past `n`: zero rows) at once.
            let col = &mut cols[s * ROWS..][..ROWS];
            // SAFETY: `supports` (checked by `gemm`) means AVX2/F16C;
            // super-block `at / 256` lies in the group (asserted); `col`
            // holds eight floats.
            unsafe { x86::store_values8(ty, gw[at / 256 * gb..].as_ptr(), at % 256, col) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (s, &at) in union.iter().enumerate() {
            let at = at as usize;
            assert!(at < k);
            let block = &gw[at / 256 * gb..][..gb];
            for (r, col) in cols[s * ROWS..][..ROWS].iter_mut().enumerate() {
                *col = value(ty, block, r, at % 256);
            }
        }
    }
}

/// Quantizes `a` (`[m, k]`) for these kernels: 8-bit values with their
/// outliers indexed, in [`super::act_tiles::Tiles`], or 16-bit values in runs of four
/// ordered 0, 2, 1, 3.
pub(crate) fn quantize(act: &mut ActRows, a: &[f32], m: usize, k: usize, a8: bool) {
    if a8 {
        act.quantize8(a, m, k, true);
        let mut tiles = std::mem::take(&mut act.tiles);
        tiles.fill(&act.q8, &act.d, &act.s, act.stride, m, k);
        act.tiles = tiles;
        if m > GROUP_OUTLIERS_MAX_M {
            super::outliers::index(act, m);
        }
    } else {
        act.quantize(a, m, k, ACT_GROUP);
        for run in act.qs[..m * k].chunks_exact_mut(4) {
            run.swap(1, 2);
        }
    }
}

/// `out[m, n] = a · dequant(w)ᵀ` for grouped weights `w` (`n` rows of `k`
/// values of `ty`) and activations from [`quantize`]. The caller has
/// checked the buffers' sizes.
pub(crate) fn gemm(act: &ActRows, w: &[u8], ty: GgmlType, out: &mut [f32], m: usize, n: usize) {
    let k = act.k;
    assert!(supports(ty) && act.group == ACT_GROUP && k.is_multiple_of(256));
    assert!(w.len() >= weight_bytes(ty, n, k) && out.len() >= m * n);
    if act.a8 {
        let t = &act.tiles;
        let tiled = m.div_ceil(t.rows.max(1)) * t.rows;
        assert!(t.q.len() >= tiled * k && t.offsets.len() >= tiled * k / 16);
        assert!(t.d.len() >= tiled * k / 32 && t.s.len() >= tiled * k / 32);
    } else {
        assert!(act.qs.len() >= m * k);
        assert!(act.d.len() >= m * act.stride && act.s.len() >= m * act.stride);
    }
    let ptr = SyncPtr(out.as_mut_ptr());
    let gb = k / 256 * group_bytes(ty);
    let groups = n.div_ceil(ROWS);
    let tasks = groups.div_ceil(GROUPS_PER_TASK);
    // Checked once here for every group's outliers.
    assert!(!act.a8 || (0..m).all(|r| act.row_outliers(r).iter().all(|o| (o.at as usize) < k)));
    let step = rows_per_call();
    // Several 8-bit rows on AVX-512 VNNI: two groups per kernel call. A
    // lone row keeps one group a call: the two groups' streams from memory
    // halved a decode GEMV's bandwidth (`gemm_quant_dram` Q4_K int8 40 ->
    // 19 GiB/s on a Zen 4, with two dependency chains per half as `half8`).
    let pairs = act.a8 && m > 1 && super::features::has_vnni();
    for block in act.blocks(m) {
        (0..tasks).into_par_iter().for_each(|t| {
            let mut res = [[[0f32; ROWS]; ACT_ROWS]; 2];
            let end = ((t + 1) * GROUPS_PER_TASK).min(groups);
            let mut g = t * GROUPS_PER_TASK;
            while g < end {
                let count = if pairs && g + 1 < end { 2 } else { 1 };
                for r0 in block.clone().step_by(step) {
                    let rows = step.min(block.end - r0);
                    if count == 2 {
                        let [lo, hi] = &mut res;
                        dot_pair(
                            ty,
                            [&w[g * gb..][..gb], &w[(g + 1) * gb..][..gb]],
                            act,
                            r0,
                            rows,
                            [lo, hi],
                        );
                    } else {
                        dot_group(ty, &w[g * gb..][..gb], act, r0, rows, &mut res[0]);
                    }
                    for (i, res) in res[..count].iter_mut().enumerate() {
                        let gw = &w[(g + i) * gb..][..gb];
                        finish_group(ty, gw, act, (g + i, n), r0, &mut res[..rows], ptr, m);
                    }
                }
                g += count;
            }
        });
    }
    if act.a8 && m > GROUP_OUTLIERS_MAX_M {
        super::outliers::add_outliers(act, columns(w, ty, k), out, m, n);
    }
}

/// Activation rows one [`dot_group`] call takes on this CPU.
fn rows_per_call() -> usize {
    if super::features::has_vnni() {
        ACT_ROWS
    } else {
        AVX2_ROWS
    }
}

/// `out[c][r] = act[r0 + c] · dequant(row r of group gw)` for `m`
/// activation rows: at most [`ACT_ROWS`] with VNNI, [`AVX2_ROWS`] without.
fn dot_group(
    ty: GgmlType,
    gw: &[u8],
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    assert!((1..=rows_per_call()).contains(&m) && gw.len() == act.k / 256 * group_bytes(ty));
    // A call's 8-bit rows lie in one tile: `gemm` steps by 8 or 4 from a
    // multiple of 8, and tiles hold 8 rows, or the one row there is.
    assert!(!act.a8 || (act.tiles.rows > 0 && r0 % act.tiles.rows + m <= act.tiles.rows));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supports` checked AVX2/FMA/F16C (and `has_vnni` or
    // `has_avx_vnni` the VNNI entries' features); `gemm` asserted the
    // activation extents.
    unsafe {
        if super::features::has_vnni() {
            x86::dot_group_vnni(ty, gw.as_ptr(), act, r0, m, out)
        } else if super::features::has_avx_vnni() {
            x86::dot_group_avx_vnni(ty, gw.as_ptr(), act, r0, m, out)
        } else {
            x86::dot_group_avx2(ty, gw.as_ptr(), act, r0, m, out)
        }
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `supports` checked NEON (and `has_dotprod`, `has_i8mm` the
    // `SDOT` and `SMMLA` entries' features); `gemm` asserted the
    // activation extents.
    unsafe {
        if super::features::has_i8mm() && super::features::has_dotprod() {
            arm::dot_group_i8mm(ty, gw.as_ptr(), act, r0, m, out)
        } else if super::features::has_dotprod() {
            arm::dot_group_dotprod(ty, gw.as_ptr(), act, r0, m, out)
        } else {
            arm::dot_group_neon(ty, gw.as_ptr(), act, r0, m, out)
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (ty, gw, act, r0, m, out);
        unreachable!("supports() is false off x86-64 and AArch64");
    }
}

/// Adds the outliers of the rows `r0..r0 + res.len()` to their results
/// for group `g` (of `n` weight rows) and writes them to `out` (`[m, n]`).
#[allow(clippy::too_many_arguments)]
fn finish_group(
    ty: GgmlType,
    gw: &[u8],
    act: &ActRows,
    (g, n): (usize, usize),
    r0: usize,
    res: &mut [[f32; ROWS]],
    out: SyncPtr,
    m: usize,
) {
    let (j0, valid) = (g * ROWS, ROWS.min(n - g * ROWS));
    assert!(r0 + res.len() <= m);
    if act.a8 && m <= GROUP_OUTLIERS_MAX_M {
        for (c, res) in res.iter_mut().enumerate() {
            group_outliers(ty, gw, act, r0 + c, res);
        }
    }
    for (c, res) in res.iter().enumerate() {
        // SAFETY: row r0 + c < m (asserted) and columns j0..j0 + valid ≤ n
        // of `out` ([m, n], asserted by `gemm`); only this task writes
        // group g's columns. A whole group as one array: a copy of
        // run-time length calls `memmove`.
        unsafe {
            let dst = out.get().add((r0 + c) * n + j0);
            if valid == ROWS {
                dst.cast::<[f32; ROWS]>().write_unaligned(*res);
            } else {
                std::ptr::copy_nonoverlapping(res.as_ptr(), dst, valid);
            }
        }
    }
}

/// [`dot_group`] for two groups `gw` at once (8-bit activations on
/// AVX-512 VNNI only): `out[i]` holds group `gw[i]`'s results, the same
/// bits as [`dot_group`] gives.
fn dot_pair(
    ty: GgmlType,
    gw: [&[u8]; 2],
    act: &ActRows,
    r0: usize,
    m: usize,
    out: [&mut [[f32; ROWS]; ACT_ROWS]; 2],
) {
    let bytes = act.k / 256 * group_bytes(ty);
    assert!((1..=ACT_ROWS).contains(&m) && gw.iter().all(|g| g.len() == bytes));
    assert!(act.a8 && act.tiles.rows > 0 && r0 % act.tiles.rows + m <= act.tiles.rows);
    assert!(supports(ty) && super::features::has_vnni());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `has_vnni` checked the entry's features; `gemm` asserted the
    // activation extents, and both groups are whole (asserted).
    unsafe {
        x86::dot_pair_vnni(ty, gw.map(|g| g.as_ptr()), act, r0, m, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (gw, out);
        unreachable!("supports() is false off x86-64");
    }
}

/// Adds activation row `r`'s 8-bit outliers times the group's weights at
/// their positions to `res`.
fn group_outliers(ty: GgmlType, gw: &[u8], act: &ActRows, r: usize, res: &mut [f32; ROWS]) {
    let outliers = act.row_outliers(r);
    if outliers.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `supports` checked AVX2/FMA/F16C; `gemm` checked that every
    // outlier is below `k`, so its super-block lies in `gw` (whose length
    // `dot_group` asserted).
    unsafe {
        x86::add_outliers(ty, gw.as_ptr(), outliers, res)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // `res += x · w`, rounded as x86's vector adds round it.
        let gb = group_bytes(ty);
        for o in outliers {
            let at = o.at as usize;
            let block = &gw[at / 256 * gb..][..gb];
            for (r, res) in res.iter_mut().enumerate() {
                *res += o.x * value(ty, block, r, at % 256);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "x86/kquant_rows.rs"]
mod x86;

#[cfg(target_arch = "aarch64")]
#[path = "arm/kquant_rows.rs"]
mod arm;

#[cfg(test)]
mod tests {
    use ferrum_types::GgmlType;

    use super::{group_bytes, repack, value, ROWS};
    use crate::quant::{dequantize, random_blocks};

    const TYPES: [GgmlType; 5] = [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// Tiles hold every row's values, scales and half sums where the
    /// kernels read them, whether filled whole, by tiles in parallel or
    /// by pieces of spans (widths with a partial last piece too).
    #[test]
    fn tiles_place_every_row_as_laid_out() {
        use super::ACT_ROWS;
        use crate::cpu::act_tiles::Tiles;
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(9);
        for k in [512, 1280, 2048] {
            for m in [1, 3, 8, 20, 33] {
                let (spans, stride) = (k / 32, k / 32 + 3);
                let q8: Vec<i8> = (0..m * k).map(|_| rng.random_range(-127..=127)).collect();
                let d: Vec<f32> = (0..m * stride).map(|_| rng.random()).collect();
                let s: Vec<f32> = (0..m * stride).map(|_| rng.random()).collect();
                let mut t = Tiles::default();
                t.fill(&q8, &d, &s, stride, m, k);
                let rows = if m == 1 { 1 } else { ACT_ROWS };
                assert_eq!(t.rows, rows);
                for r in 0..m {
                    let (tile, c) = (r / rows, r % rows);
                    for span in 0..spans {
                        let at = tile * rows * spans + span * rows + c;
                        let values = &q8[r * k + 32 * span..][..32];
                        let what = format!("k {k} m {m} row {r} span {span}");
                        assert_eq!(&t.q[32 * at..][..32], values, "{what}");
                        assert_eq!(t.d[at], d[r * stride + span], "{what}");
                        assert_eq!(t.s[at], s[r * stride + span], "{what}");
                        for h in 0..2 {
                            let sum: i32 =
                                values[16 * h..][..16].iter().map(|&v| i32::from(v)).sum();
                            let o = tile * rows * spans * 2 + (2 * span + h) * rows + c;
                            assert_eq!(t.offsets[o], -32 * sum, "{what} half {h}");
                        }
                    }
                }
            }
        }
    }

    /// Every value read back from the grouped layout equals the file
    /// block's dequantized value, for a row count that leaves a partial
    /// last group.
    #[test]
    fn grouping_keeps_every_value() {
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let (n, k) = (13, 512);
            let nb = k / 256;
            let bytes = random_blocks(ty, n * nb, seed as u64).unwrap_or_default();
            let mut want = vec![0f32; n * k];
            dequantize(ty, &bytes, &mut want).unwrap_or_else(|e| panic!("{e}"));
            let words = repack(&bytes, ty, n, k).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            let gb = group_bytes(ty);
            assert_eq!(w.len(), n.div_ceil(ROWS) * nb * gb);
            for row in 0..n {
                for v in 0..k {
                    let blk = &w[((row / ROWS) * nb + v / 256) * gb..][..gb];
                    let got = value(ty, blk, row % ROWS, v % 256);
                    assert_eq!(got, want[row * k + v], "{ty} row {row} value {v}");
                }
            }
            assert!(repack(&bytes[1..], ty, n, k).is_err(), "short input");
        }
    }

    /// The kernels, whichever this CPU runs (x86 or Arm), give exactly the
    /// bits of their statement for every type and both activation widths.
    /// Types with a scale per 16 values (Q2_K, Q3_K, Q6_K), per half: the
    /// exact integer `x = Σ (q − offset)·a`, then `acc = fma(float(x)·(d·sc),
    /// d_a, acc)` and for Q2_K `acc = fma(−(dmin·m), Σa·d_a, acc)`. Q4_K and
    /// Q5_K, per span: `acc = fma(float(x), (d·sc)·d_a, acc)`, then `acc =
    /// fma(−(dmin·m), d_a·Σa, acc)`. So x86 and Arm give the same bits.
    #[test]
    fn kernels_give_the_bits_of_their_statement() {
        use rand::{rngs::StdRng, Rng, SeedableRng};

        use super::{dot_group, place, quantize, rows_per_call, supports, ACT_ROWS};
        use crate::cpu::act_quant::ActRows;
        use crate::cpu::outliers::f16_at;
        let mut rng = StdRng::seed_from_u64(8);
        for (seed, ty) in TYPES.into_iter().enumerate() {
            if !supports(ty) {
                eprintln!("skipped {ty}: no kernel on this CPU");
                continue;
            }
            let k = 512;
            let bytes = random_blocks(ty, ROWS * k / 256, seed as u64 + 30).unwrap_or_default();
            let words = repack(&bytes, ty, ROWS, k).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            let gb = group_bytes(ty);
            let a: Vec<f32> = (0..ACT_ROWS * k)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            // The weight's integer value `v` of row `r` in block `blk`, its
            // offset taken off.
            let q = |blk: &[u8], r: usize, v: usize| {
                let (at, high, half, u) = place(ty, r, v);
                let nib = (blk[at] >> (4 * half)) & 0x0F;
                // Q3_K's third bit, Q5_K's fifth (Q4_K has no plane).
                let hb5 = || (blk[high] >> (4 * half + u)) & 1;
                match ty {
                    GgmlType::Q2_K => i32::from((blk[at] >> (2 * u)) & 3),
                    GgmlType::Q3_K => {
                        let lo = (blk[at] >> (2 * u)) & 3;
                        i32::from(lo | hb5() << 2) - 4
                    }
                    GgmlType::Q4_K => i32::from(nib),
                    GgmlType::Q5_K => i32::from(nib | hb5() << 4),
                    _ => i32::from(nib | ((blk[high] >> (2 * u)) & 3) << 4) - 32,
                }
            };
            for a8 in [false, true] {
                let mut act = ActRows::default();
                quantize(&mut act, &a, ACT_ROWS, k, a8);
                // Every row count a call takes (Arm's `SMMLA` pairs rows,
                // an odd last one with itself), the last call's rows
                // checked: each row's bits do not depend on the count.
                let mut got = [[0f32; ROWS]; ACT_ROWS];
                for m in 1..=rows_per_call() {
                    dot_group(ty, w, &act, 0, m, &mut got);
                    let want = got[..m].to_vec();
                    let mut alone = [[0f32; ROWS]; ACT_ROWS];
                    for (c, want) in want.iter().enumerate() {
                        dot_group(ty, w, &act, c, 1, &mut alone);
                        assert_eq!(alone[0], *want, "{ty} 8-bit {a8} row {c} of {m}");
                    }
                }
                let m = rows_per_call();
                for (c, got) in got[..m].iter().enumerate() {
                    // Activation value i of row c, in value order (16-bit
                    // runs of four are stored 0, 2, 1, 3).
                    let av = |i: usize| {
                        if a8 {
                            i32::from(act.q8[c * k + i])
                        } else {
                            i32::from(act.qs[c * k + i / 4 * 4 + [0, 2, 1, 3][i % 4]])
                        }
                    };
                    for (r, &got) in got.iter().enumerate() {
                        let mut acc = 0f32;
                        for t in 0..k / 32 {
                            let blk = &w[t / 8 * gb..][..gb];
                            let (da, sa) = (act.d[c * act.stride + t], act.s[c * act.stride + t]);
                            let d = f16_at(blk, 2 * r);
                            let x = |h: usize| {
                                let (mut x, mut sum) = (0i32, 0i32);
                                for i in 0..16 {
                                    let a = av(32 * t + 16 * h + i);
                                    let v = 32 * (t % 8) + 16 * h + i;
                                    (x, sum) = (x + q(blk, r, v) * a, sum + a);
                                }
                                (x, sum)
                            };
                            if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                                let x = x(0).0 + x(1).0;
                                let j = t % 8;
                                let (sc, mn) = (blk[32 + 8 * j + r], blk[96 + 8 * j + r]);
                                let ws = d * f32::from(sc);
                                let dm = f16_at(blk, 16 + 2 * r) * f32::from(mn);
                                acc = (x as f32).mul_add(ws * da, acc);
                                acc = (-dm).mul_add(sa, acc);
                                continue;
                            }
                            for h in 0..2 {
                                let (x, sum) = x(h);
                                let s = 2 * (t % 8) + h;
                                let (sc, mn) = if ty == GgmlType::Q2_K {
                                    let sm = blk[32 + 8 * s + r];
                                    (f32::from(sm & 0x0F), f32::from(sm >> 4))
                                } else {
                                    (f32::from(blk[16 + 8 * s + r] as i8), 0.0)
                                };
                                acc = (x as f32 * (d * sc)).mul_add(da, acc);
                                if ty == GgmlType::Q2_K {
                                    let dm = f16_at(blk, 16 + 2 * r) * mn;
                                    acc = (-dm).mul_add(sum as f32 * da, acc);
                                }
                            }
                        }
                        let what = format!("{ty} 8-bit {a8} act row {c} weight row {r}");
                        assert_eq!(got.to_bits(), acc.to_bits(), "{what}: {got} vs {acc}");
                    }
                }
            }
        }
    }

    /// The vector dequantization of eight rows at one position (the
    /// decode-sized outlier path) gives the scalar one's bits (the outlier
    /// pass's) at every position of every type.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_rows_dequantize_as_one() {
        if !super::supports(GgmlType::Q4_K) {
            eprintln!("skipped: no AVX2");
            return;
        }
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let bytes = random_blocks(ty, ROWS, seed as u64 + 7).unwrap_or_default();
            let words = repack(&bytes, ty, ROWS, 256).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            for v in 0..256 {
                let mut got = [0f32; ROWS];
                // SAFETY: AVX2 checked; `w` is one group block.
                unsafe {
                    let x = super::x86::values8(ty, w.as_ptr(), v);
                    std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), x);
                }
                for (r, got) in got.iter().enumerate() {
                    assert_eq!(
                        got.to_bits(),
                        value(ty, w, r, v).to_bits(),
                        "{ty} row {r} value {v}"
                    );
                }
            }
        }
    }

    /// The AVX2, AVX-512 VNNI and AVX-VNNI kernels give the same bits for
    /// every type, row count and activation width, and a row's results do
    /// not depend on the rows computed with it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn kernels_agree_bitwise_and_rows_are_independent() {
        use rand::{rngs::StdRng, Rng, SeedableRng};

        use super::{quantize, supports, x86, ACT_ROWS, AVX2_ROWS};
        use crate::cpu::act_quant::ActRows;
        if !supports(GgmlType::Q4_K) {
            eprintln!("skipped: no AVX2");
            return;
        }
        let vnni = crate::cpu::features::has_vnni();
        let avx_vnni = crate::cpu::features::has_avx_vnni();
        if !avx_vnni {
            eprintln!("AVX-VNNI kernel not checked: this CPU lacks it");
        }
        let mut rng = StdRng::seed_from_u64(5);
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let k = 512;
            let bytes = random_blocks(ty, ROWS * k / 256, seed as u64).unwrap_or_default();
            let words = repack(&bytes, ty, ROWS, k).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            let a: Vec<f32> = (0..ACT_ROWS * k)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            for a8 in [false, true] {
                let mut act = ActRows::default();
                quantize(&mut act, &a, ACT_ROWS, k, a8);
                // The reference: each row alone on AVX2.
                let mut all = [[0f32; ROWS]; ACT_ROWS];
                for (r, all) in all.iter_mut().enumerate() {
                    let mut x = [[0f32; ROWS]; ACT_ROWS];
                    // SAFETY: AVX2 checked; one group, row r < ACT_ROWS.
                    unsafe { x86::dot_group_avx2(ty, w.as_ptr(), &act, r, 1, &mut x) };
                    *all = x[0];
                }
                for m in 1..=ACT_ROWS {
                    for r0 in 0..=ACT_ROWS - m {
                        let (mut x, mut y) = ([[0f32; ROWS]; ACT_ROWS], [[0f32; ROWS]; ACT_ROWS]);
                        // SAFETY: as above; AVX2 up to its rows per call,
                        // VNNI only where detected.
                        unsafe {
                            if m <= AVX2_ROWS {
                                x86::dot_group_avx2(ty, w.as_ptr(), &act, r0, m, &mut x);
                                assert_eq!(
                                    x[..m],
                                    all[r0..r0 + m],
                                    "{ty} rows {r0}+{m} 8-bit {a8}"
                                );
                            }
                            if vnni {
                                x86::dot_group_vnni(ty, w.as_ptr(), &act, r0, m, &mut y);
                                assert_eq!(
                                    y[..m],
                                    all[r0..r0 + m],
                                    "{ty} VNNI rows {r0}+{m} 8-bit {a8}"
                                );
                            }
                            if avx_vnni && m <= AVX2_ROWS {
                                x86::dot_group_avx_vnni(ty, w.as_ptr(), &act, r0, m, &mut y);
                                assert_eq!(
                                    y[..m],
                                    all[r0..r0 + m],
                                    "{ty} AVX-VNNI rows {r0}+{m} 8-bit {a8}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Two groups in one 512-bit call give each group's bits from the
    /// 256-bit kernel, for every type and row count.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn pairs_of_groups_equal_single_groups() {
        use rand::{rngs::StdRng, Rng, SeedableRng};

        use super::{dot_group, dot_pair, group_bytes, quantize, ACT_ROWS};
        use crate::cpu::act_quant::ActRows;
        if !crate::cpu::features::has_vnni() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(6);
        for (seed, ty) in TYPES.into_iter().enumerate() {
            let k = 512;
            let bytes = random_blocks(ty, 2 * ROWS * k / 256, seed as u64).unwrap_or_default();
            let words = repack(&bytes, ty, 2 * ROWS, k).unwrap_or_else(|e| panic!("{e}"));
            let w = crate::packed_bytes(&words);
            let gb = k / 256 * group_bytes(ty);
            let (g0, g1) = (&w[..gb], &w[gb..2 * gb]);
            let a: Vec<f32> = (0..ACT_ROWS * k)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            let mut act = ActRows::default();
            quantize(&mut act, &a, ACT_ROWS, k, true);
            for m in 1..=ACT_ROWS {
                for r0 in 0..=ACT_ROWS - m {
                    let mut single = [[[0f32; ROWS]; ACT_ROWS]; 2];
                    dot_group(ty, g0, &act, r0, m, &mut single[0]);
                    dot_group(ty, g1, &act, r0, m, &mut single[1]);
                    let mut pair = [[[0f32; ROWS]; ACT_ROWS]; 2];
                    let [lo, hi] = &mut pair;
                    dot_pair(ty, [g0, g1], &act, r0, m, [lo, hi]);
                    for i in 0..2 {
                        assert_eq!(pair[i][..m], single[i][..m], "{ty} rows {r0}+{m} group {i}");
                    }
                }
            }
        }
    }
}
