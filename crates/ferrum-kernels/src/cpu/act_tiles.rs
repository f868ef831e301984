//! 8-bit activations in tiles of eight rows, the layout the k-quant
//! kernels (`kquant_rows`) read; kept with the activations (`ActRows`
//! holds them) so that neither file depends on the other.

use rayon::prelude::*;

/// Activation rows per kernel call with VNNI, whose 32 vector registers
/// hold eight rows' sums: each group's weights are unpacked once for eight
/// (Qwen2.5-Coder-1.5B Q4_K_M on a Zen 4: batch-8 decode 75-77 tok/s
/// against 61-69 at four rows a call, pp256 +3-10%).
pub(crate) const ACT_ROWS: usize = 8;

/// 8-bit activations regrouped eight rows at a time (a *tile*), so that
/// the kernel reaches all its rows' values and scales from one pointer
/// with constant offsets: row-major, eight rows' addresses did not fit the
/// general registers and were reloaded from the stack for every span
/// (`gemm_quant` Q4_K m = 8 and 64 +15-20%, Q6_K +11-13% on a Zen 4). A
/// single row (decode) is its own tile (`R` = 1), left as it was: read
/// from tiles of eight its spans are 256 bytes apart, and a GEMV lost 15%.
/// For tile `i` (rows `R·i..R·i + R`, rows past `m` unused), span `t`
/// (values `32t..32t + 32`) and row `c` of the tile:
/// - `q[((i·k/32 + t)·R + c)·32 ..][..32]`: the values;
/// - `d`, `s` at `(i·k/32 + t)·R + c`: the scale and `d · Σq`;
/// - `offsets` at `((i·k/32 + t)·2 + h)·R + c`: −32 times the sum of half
///   `h`'s 16 values, the start of a Q6_K half's integer sum (its values'
///   offset of 32 taken off with no work per weight row); an eighth of it
///   starts a Q3_K half's (offset 4), and Q2_K's minimums take the sum.
#[derive(Default)]
pub(crate) struct Tiles {
    /// `R`, rows per tile.
    pub(crate) rows: usize,
    pub(crate) q: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) offsets: Vec<i32>,
}

/// Tiles per parallel task at least: a decode step's one tile is filled
/// inline, not handed to the pool.
const PAR_TILES: usize = 4;

/// Spans per parallel task where fewer than [`PAR_TILES`] tiles are filled
/// (a decode batch's one tile): the copy was serial, and with eight rows
/// it took 3% of a Qwen2.5-Coder-1.5B batch-8 step while the other
/// threads waited (`ferrum bench --profile`).
const FILL_SPANS: usize = 32;

impl Tiles {
    /// Re-fills the tiles from `act`'s row-major 8-bit values (`m` rows of
    /// `k`): in parallel by tiles from [`PAR_TILES`] tiles up, else (but for
    /// one row) each tile by [`FILL_SPANS`] spans.
    pub(crate) fn fill(
        &mut self,
        act_q8: &[i8],
        act_d: &[f32],
        act_s: &[f32],
        stride: usize,
        m: usize,
        k: usize,
    ) {
        let rows = if m == 1 { 1 } else { ACT_ROWS };
        let (spans, tiles) = (k / 32, m.div_ceil(rows));
        self.rows = rows;
        self.q.resize(tiles * rows * k, 0);
        self.d.resize(tiles * rows * spans, 0.0);
        self.s.resize(tiles * rows * spans, 0.0);
        self.offsets.resize(tiles * rows * spans * 2, 0);
        // A lone row (one sequence's decode) is a short copy: inline.
        let per_task = if tiles >= PAR_TILES || m == 1 {
            spans
        } else {
            FILL_SPANS
        };
        // Spans `t0..` of tile `i`: `q`, `d`, `s` and `offsets` are theirs.
        let fill_spans = |i: usize,
                          t0: usize,
                          q: &mut [i8],
                          d: &mut [f32],
                          s: &mut [f32],
                          offsets: &mut [i32]| {
            let n = d.len() / rows;
            for c in 0..rows.min(m - i * rows) {
                let r = i * rows + c;
                let row = &act_q8[r * k + 32 * t0..][..32 * n];
                for (t, values) in row.chunks_exact(32).enumerate() {
                    let at = t * rows + c;
                    q[at * 32..][..32].copy_from_slice(values);
                    d[at] = act_d[r * stride + t0 + t];
                    s[at] = act_s[r * stride + t0 + t];
                    for (h, half) in values.chunks_exact(16).enumerate() {
                        let sum: i32 = half.iter().map(|&v| i32::from(v)).sum();
                        offsets[(2 * t + h) * rows + c] = -32 * sum;
                    }
                }
            }
        };
        let fill_tile = |(i, (((q, d), s), offsets)): TileMut<'_>| {
            q.par_chunks_mut(rows * 32 * per_task)
                .zip(d.par_chunks_mut(rows * per_task))
                .zip(s.par_chunks_mut(rows * per_task))
                .zip(offsets.par_chunks_mut(rows * per_task * 2))
                .enumerate()
                .for_each(|(j, (((q, d), s), o))| fill_spans(i, j * per_task, q, d, s, o));
        };
        self.q
            .par_chunks_mut(rows * k)
            .zip(self.d.par_chunks_mut(rows * spans))
            .zip(self.s.par_chunks_mut(rows * spans))
            .zip(self.offsets.par_chunks_mut(rows * spans * 2))
            .take(tiles)
            .with_min_len(PAR_TILES)
            .enumerate()
            .for_each(fill_tile);
    }
}

/// One tile's buffers and its index, as [`Tiles::fill`] hands them out.
type TileMut<'a> = (
    usize,
    (
        ((&'a mut [i8], &'a mut [f32]), &'a mut [f32]),
        &'a mut [i32],
    ),
);
