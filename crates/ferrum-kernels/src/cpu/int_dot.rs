//! Integer dot products of k-quant weight rows (Q4_K, Q5_K, Q6_K, in the
//! file's layout) with 16-bit activation rows (`crate::quant::act`); the
//! 32-value block types have their own kernels (`super::interleaved`).
//!
//! Weight values are unpacked to i16, multiplied by their integer sub-block
//! scales, and multiplied with the activations in pairs into i32 lanes
//! (`VPDPWSSD` where AVX-512 VNNI exists, else `PMADDWD`: the same
//! integers, as no sum can overflow), so a whole 256-value block
//! accumulates in integers and is converted once.
//!
//! Every output is produced by the same instruction sequence whatever the
//! number of rows it is computed with, so a sequence's logits do not depend
//! on what it is batched with (the engine's batched == alone guarantee).

use ferrum_types::GgmlType;

use super::act_quant::{ActRows, SUM_GROUP};

/// Whether [`dot_rows`] handles `ty` on this CPU.
pub(crate) fn supports(ty: GgmlType) -> bool {
    has_avx2() && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Values per activation scale of these kernels: a k-quant super-block.
pub(crate) const ACT_GROUP: usize = 256;

/// Puts quantized activations (`act.group` = [`ACT_GROUP`]) in the order
/// the kernels read them: in each run of 32 values, 0..8, 16..24, 8..16,
/// 24..32. The kernels widen 32 weight bytes to i16 by unpacking each
/// 128-bit lane against zero (or its signs), which gives values 0..8 with
/// 16..24 and 8..16 with 24..32; matching the activations once per GEMM
/// saves a lane-crossing extract and two lane-crossing widenings per 32
/// weights per row. Sums and scales do not change; which products share an
/// i32 lane does, so results move by float rounding from the unordered
/// kernel (Gemma-3's perplexity by 2e-5 relative).
pub(crate) fn order_activations(act: &mut ActRows, m: usize) {
    for run in act.qs[..m * act.k].chunks_exact_mut(32) {
        let (first, rest) = run.split_at_mut(16);
        first[8..].swap_with_slice(&mut rest[..8]);
    }
}

use super::features::{has_avx2, has_vnni};

/// `dots[j][c] = act[r0 + c] · dequant(row j)` for the consecutive weight
/// rows in `rows` (one per element of `dots`) and `m ≤ 8` activation rows.
/// Each row holds exactly the blocks of `act.k` values. The caller checks
/// [`supports`]. Taking a task's
/// rows in one call keeps dispatch and set-up out of the per-row cost, which
/// matters at decode shapes (a 896-wide row is 28 blocks).
pub(crate) fn dot_rows(
    ty: GgmlType,
    rows: &[u8],
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let row_bytes = act.k / ty.block_size() * ty.block_bytes();
        assert!(supports(ty) && act.group == ACT_GROUP && (1..=8).contains(&m));
        assert!(!dots.is_empty() && rows.len() == dots.len() * row_bytes);
        assert!(act.qs.len() >= (r0 + m) * act.k);
        // SAFETY: `supports` checked AVX2/FMA/F16C (and `has_vnni` the VNNI
        // entry's features); the extents asserted above are what they read.
        unsafe {
            if has_vnni() {
                x86::dot_rows_vnni(ty, rows.as_ptr(), row_bytes, act, r0, m, dots)
            } else {
                x86::dot_rows_avx2(ty, rows.as_ptr(), row_bytes, act, r0, m, dots)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, rows, act, r0, m, dots);
        unreachable!("supports() is false off x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "x86/int_dot.rs"]
pub(super) mod x86;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use ferrum_types::GgmlType;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::{has_vnni, supports, x86, ActRows, ACT_GROUP};
    use crate::quant::random_blocks;

    /// The VNNI and the plain AVX2 kernels give the same bits for every
    /// type and row count (their integer sums cannot differ).
    #[test]
    fn vnni_and_avx2_kernels_agree_bitwise() {
        if !has_vnni() || !supports(GgmlType::Q4_K) {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(4);
        for (seed, ty) in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
            .into_iter()
            .enumerate()
        {
            let k = 512;
            let row = random_blocks(ty, 2 * k / 256, seed as u64).unwrap_or_default();
            let a: Vec<f32> = (0..8 * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let mut act = ActRows::default();
            act.quantize(&a, 8, k, ACT_GROUP);
            super::order_activations(&mut act, 8);
            let rb = row.len() / 2;
            for m in 1..=8 {
                let (mut x, mut y) = ([[0f32; 8]; 2], [[0f32; 8]; 2]);
                // SAFETY: both entries' features were detected above.
                unsafe {
                    x86::dot_rows_avx2(ty, row.as_ptr(), rb, &act, 0, m, &mut x);
                    x86::dot_rows_vnni(ty, row.as_ptr(), rb, &act, 0, m, &mut y);
                }
                assert_eq!(x, y, "{ty} m{m}");
            }
        }
    }
}
