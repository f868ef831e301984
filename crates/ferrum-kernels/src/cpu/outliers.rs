//! The exact outliers of 8-bit activations ([`ActRows::quantize8`] leaves
//! them out of the integer dot products) added back, against weights
//! dequantized at their positions, for the k-quant kernels (`kquant_rows`
//! passes how to dequantize a group's rows at the outlier positions: a
//! [`Columns`] filler).

use rayon::prelude::*;

use super::act_quant::ActRows;
use super::SyncPtr;

/// Weight rows per outlier task: their values at every outlier position
/// stay in L1 while each activation row's outliers are added. (A task's
/// rows are one group of `kquant_rows`.)
pub(crate) const OUTLIER_ROWS: usize = 8;

/// Fills `cols[s · stride(rows.len()) + i]` with weight row
/// `rows.start + i`'s value at position `union[s]`, rounded as ggml's
/// dequantization rounds it: slot-major, so that the pass adds one
/// outlier to eight outputs in one vector.
pub(crate) trait Columns: Fn(std::ops::Range<usize>, &[u32], &mut [f32]) {}
impl<F: Fn(std::ops::Range<usize>, &[u32], &mut [f32])> Columns for F {}

/// Floats per outlier position in a [`Columns`] buffer for `rows` weight
/// rows: whole vectors of [`OUTLIER_ROWS`].
pub(crate) fn stride(rows: usize) -> usize {
    rows.div_ceil(OUTLIER_ROWS) * OUTLIER_ROWS
}

thread_local! {
    static COLUMNS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The f16 at `b[at..at + 2]`: normal numbers by moving bits (this runs
/// per outlier per weight row in the outlier passes, where a library call per conversion showed
/// in profiles), the rest by the `half` crate.
#[cfg(any(test, target_arch = "aarch64"))]
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    let exp = (h >> 10) & 0x1F;
    if exp == 0 || exp == 0x1F {
        return half::f16::from_bits(h).to_f32();
    }
    let bits = (u32::from(h & 0x8000) << 16) | ((u32::from(h & 0x7FFF) << 13) + (112 << 23));
    f32::from_bits(bits)
}

/// Orders the outlier positions of `m` rows of 8-bit activations: their
/// sorted, distinct positions (`outlier_union`) and each outlier's index in
/// it (`outlier_slot`), for [`add_row_outliers`].
pub(crate) fn index(act: &mut ActRows, m: usize) {
    let mut union = std::mem::take(&mut act.outlier_union);
    union.clear();
    for r in 0..m {
        union.extend(act.row_outliers(r).iter().map(|o| o.at));
    }
    union.sort_unstable();
    union.dedup();
    act.outlier_slot.resize(act.outliers.len(), 0);
    let groups = act.k / 32;
    for r in 0..m {
        let count = act.outlier_count[r];
        let (outliers, slots) = (
            &act.outliers[r * groups..],
            &mut act.outlier_slot[r * groups..],
        );
        for (o, slot) in outliers[..count].iter().zip(&mut slots[..count]) {
            *slot = union.partition_point(|&u| u < o.at) as u32;
        }
    }
    act.outlier_union = union;
}

/// Adds each activation row's outliers times their weights to `out`
/// (`[m, n]`, the kernels' results), in value order: a pass of its own
/// after a prompt-sized GEMM, the weights read through `fill`. The same
/// channels spike in most tokens, so the weights are dequantized once per
/// distinct outlier position (see [`index`]) rather than once per outlier:
/// for a 512-token prompt through Qwen2.5-1.5B's down projection, ~1,250
/// positions for ~5,400 outliers.
pub(crate) fn add_outliers<C: Columns + Sync>(
    act: &ActRows,
    fill: C,
    out: &mut [f32],
    m: usize,
    n: usize,
) {
    let ptr = SyncPtr(out.as_mut_ptr());
    assert!(out.len() >= m * n);
    (0..n.div_ceil(OUTLIER_ROWS)).into_par_iter().for_each(|t| {
        let rows = t * OUTLIER_ROWS..((t + 1) * OUTLIER_ROWS).min(n);
        // SAFETY: `out` holds `[m, n]`; each task has its own columns.
        unsafe { add_row_outliers(act, &fill, rows, ptr, m, n) }
    });
}

/// [`add_outliers`] for the weight rows `rows` only: what a decode-sized
/// GEMM runs at the end of each task, while those rows are still in cache
/// (a pass of its own re-read them from memory, 10% of a Qwen2.5-1.5B
/// decode step). Each output's sum is the same either way, and whatever
/// the other rows.
///
/// # Safety
/// `out` must point to `[m, n]` floats whose columns `rows` no other
/// thread touches meanwhile.
pub(crate) unsafe fn add_row_outliers<C: Columns>(
    act: &ActRows,
    fill: &C,
    rows: std::ops::Range<usize>,
    out: SyncPtr,
    m: usize,
    n: usize,
) {
    let union = &act.outlier_union;
    if union.is_empty() || rows.is_empty() {
        return;
    }
    assert!(rows.end <= n && act.outlier_count.len() >= m);
    assert!(union.iter().all(|&at| (at as usize) < act.k));
    let groups = act.k / 32;
    let st = stride(rows.len());
    COLUMNS.with(|cols| {
        let mut cols = cols.borrow_mut();
        // Padding lanes keep whatever they held: their sums are dropped.
        cols.resize(st * union.len(), 0.0);
        fill(rows.clone(), union, &mut cols);
        for c in 0..m {
            let count = act.outlier_count[c];
            if count == 0 {
                continue;
            }
            let outliers = &act.outliers[c * groups..][..count];
            let slots = &act.outlier_slot[c * groups..][..count];
            assert!(slots.iter().all(|&s| (s as usize) < union.len()));
            for i0 in (0..rows.len()).step_by(OUTLIER_ROWS) {
                let live = (rows.len() - i0).min(OUTLIER_ROWS);
                // SAFETY: c < m and every column rows.start + i0 + i < n
                // (asserted above); the caller leaves them to this call.
                let dots = unsafe { out.get().add(c * n + rows.start + i0) };
                // Each output's sum in a register, its outliers in order
                // (through memory each add waited on the last one's
                // store: 8% of a 512-token prefill), eight outputs a
                // vector.
                // Whole vectors where all eight are live: a copy of a
                // run-time length was a `memmove` call per output row.
                let mut sums = [0f32; OUTLIER_ROWS];
                if live == OUTLIER_ROWS {
                    // SAFETY: as above, eight live columns.
                    sums = unsafe { dots.cast::<[f32; OUTLIER_ROWS]>().read_unaligned() };
                } else {
                    for (i, sum) in sums[..live].iter_mut().enumerate() {
                        // SAFETY: as above.
                        *sum = unsafe { *dots.add(i) };
                    }
                }
                for (o, &slot) in outliers.iter().zip(slots) {
                    let col = &cols[slot as usize * st + i0..][..OUTLIER_ROWS];
                    for (sum, &w) in sums.iter_mut().zip(col) {
                        *sum += o.x * w;
                    }
                }
                if live == OUTLIER_ROWS {
                    // SAFETY: as above, eight live columns.
                    unsafe { dots.cast::<[f32; OUTLIER_ROWS]>().write_unaligned(sums) };
                } else {
                    for (i, sum) in sums[..live].iter().enumerate() {
                        // SAFETY: as above.
                        unsafe { *dots.add(i) = *sum };
                    }
                }
            }
        }
    });
}
