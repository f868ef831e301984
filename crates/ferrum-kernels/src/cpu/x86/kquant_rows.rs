//! The grouped k-quant kernels for x86-64: AVX2 (`PMADDUBSW` / `PMADDWD`),
//! AVX-512 VNNI's `VPDPBUSD` / `VPDPWSSD` on 256-bit vectors, and the same
//! instructions VEX-encoded (AVX-VNNI: Intel's client cores from Alder
//! Lake, which lack AVX-512) with sixteen registers and no broadcast from
//! memory. All compute the same integers, so the same results.

use std::arch::x86_64::*;

use ferrum_types::GgmlType;

use super::{span_at, ActRows, ACT_ROWS, ROWS};
use crate::cpu::int_dot::{dpbusd512_at, dpbusd_at, dpwssd, shift16};

/// Which integer dot products a kernel uses (the `ISA` parameter).
const AVX2: u8 = 0;
/// AVX-512 VNNI on 256-bit vectors: 32 registers, broadcasts folded.
const VNNI512: u8 = 1;
/// AVX-VNNI: 16 registers, so at most [`super::AVX2_ROWS`] rows a call.
const AVX_VNNI: u8 = 2;

/// How far ahead [`prefetch`] reads.
const PREFETCH: usize = 4096;

/// One grouped format (the parent module describes the layout).
trait Rows {
    const BYTES: usize;
    /// Q6_K, Q3_K: a signed scale per half, unsigned values offset by
    /// [`Rows::OFFSET`], no minimums.
    const SIXTEENS: bool;
    /// The offset of a `SIXTEENS` type's values: 32 for Q6_K, 4 for Q3_K,
    /// 0 for Q2_K.
    const OFFSET: i16 = 32;
    /// Q2_K: `SIXTEENS` with an unsigned 4-bit scale and minimum per half
    /// (packed in one byte) instead of a signed scale.
    const MINS16: bool = false;
    /// Parts whose `PMADDUBSW` results fit one 16-bit sum.
    const RUN: usize;
    /// The four parts (unsigned bytes, lane = row) of half `h` of span `j`
    /// of the group block at `g`.
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [__m256i; 4];
}

/// The 4-bit values of half `h` of the span at `at`.
#[inline(always)]
unsafe fn nibbles(at: *const u8, h: usize) -> [__m256i; 4] {
    let mask = _mm256_set1_epi8(0x0F);
    let mut out = [_mm256_setzero_si256(); 4];
    for (u, out) in out.iter_mut().enumerate() {
        let x = _mm256_loadu_si256(at.add(32 * u).cast());
        *out = _mm256_and_si256(if h == 0 { x } else { _mm256_srli_epi16(x, 4) }, mask);
    }
    out
}

/// A half's integer sum's start for `SIXTEENS` types, from the tile's
/// `−32 · Σa` (a multiple of 32): `−OFFSET · Σa`.
#[inline(always)]
fn offset_start<F: Rows>(minus32_sum: i32) -> i32 {
    if F::OFFSET == 32 {
        minus32_sum
    } else {
        minus32_sum / 32 * i32::from(F::OFFSET)
    }
}

/// The 2-bit fields of half `h` at `at`, bits `2u, 2u + 1` to part `u`.
/// Written out with immediate shifts: as a loop over `u`, LLVM kept the
/// loop and shifted by run-time counts (Q3_K's decode GEMV ran at a third
/// of Q4_K's speed per value).
#[inline(always)]
unsafe fn fields2(at: *const u8, h: usize) -> [__m256i; 4] {
    let fields = _mm256_loadu_si256(at.add(32 * h).cast());
    let low = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(fields, low),
        _mm256_and_si256(_mm256_srli_epi16::<2>(fields), low),
        _mm256_and_si256(_mm256_srli_epi16::<4>(fields), low),
        _mm256_and_si256(_mm256_srli_epi16::<6>(fields), low),
    ]
}

struct Q2K;
impl Rows for Q2K {
    const BYTES: usize = 672;
    const SIXTEENS: bool = true;
    const OFFSET: i16 = 0;
    const MINS16: bool = true;
    /// Four `PMADDUBSW` sums of at most 2 · 3 · 127 fit i16.
    const RUN: usize = 4;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [__m256i; 4] {
        fields2(g.add(span_at(GgmlType::Q2_K, j)), h)
    }
}

struct Q3K;
impl Rows for Q3K {
    const BYTES: usize = 912;
    const SIXTEENS: bool = true;
    const OFFSET: i16 = 4;
    /// Four `PMADDUBSW` sums of at most 2 · 7 · 127 fit i16.
    const RUN: usize = 4;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [__m256i; 4] {
        let at = g.add(span_at(GgmlType::Q3_K, j));
        let [q0, q1, q2, q3] = fields2(at, h);
        // The plane's bit 4h + u to bit 2 (immediate shifts, as in
        // `fields2`, once the half's bits are moved down).
        let plane = _mm256_loadu_si256(at.add(64).cast());
        let plane = _mm256_srl_epi16(plane, _mm_cvtsi32_si128(4 * h as i32));
        let bit = _mm256_set1_epi8(4);
        let third = |x: __m256i| _mm256_and_si256(x, bit);
        [
            _mm256_or_si256(q0, third(_mm256_slli_epi16::<2>(plane))),
            _mm256_or_si256(q1, third(_mm256_slli_epi16::<1>(plane))),
            _mm256_or_si256(q2, third(plane)),
            _mm256_or_si256(q3, third(_mm256_srli_epi16::<1>(plane))),
        ]
    }
}

struct Q4K;
impl Rows for Q4K {
    const BYTES: usize = 1184;
    const SIXTEENS: bool = false;
    const RUN: usize = 4;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [__m256i; 4] {
        nibbles(g.add(span_at(GgmlType::Q4_K, j)), h)
    }
}

struct Q5K;
impl Rows for Q5K {
    const BYTES: usize = 1440;
    const SIXTEENS: bool = false;
    const RUN: usize = 4;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [__m256i; 4] {
        let at = g.add(span_at(GgmlType::Q5_K, j));
        let mut out = nibbles(at, h);
        // Bit 4h + u of the plane's bytes moves to bit 4.
        let plane = _mm256_loadu_si256(at.add(128).cast());
        let bit = _mm256_set1_epi8(0x10);
        for (u, part) in out.iter_mut().enumerate() {
            let high = _mm256_and_si256(shift16(plane, 4 - (4 * h + u) as i32), bit);
            *part = _mm256_or_si256(*part, high);
        }
        out
    }
}

struct Q6K;
impl Rows for Q6K {
    const BYTES: usize = 1680;
    const SIXTEENS: bool = true;
    const RUN: usize = 2;
    #[inline(always)]
    unsafe fn parts(g: *const u8, j: usize, h: usize) -> [__m256i; 4] {
        let at = g.add(span_at(GgmlType::Q6_K, j));
        let mut out = nibbles(at, h);
        // Bits 2u, 2u + 1 move to bits 4, 5.
        let top = _mm256_loadu_si256(at.add(128 + 32 * h).cast());
        let bits = _mm256_set1_epi8(0x30);
        for (u, part) in out.iter_mut().enumerate() {
            let high = _mm256_and_si256(shift16(top, 4 - 2 * u as i32), bits);
            *part = _mm256_or_si256(*part, high);
        }
        out
    }
}

/// The four bytes (or two i16) at `p`, in every lane.
#[inline(always)]
unsafe fn bcast<T>(p: *const T) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Per lane (row), `x` plus Σ part · activation over one half for `M`
/// rows of 8-bit activations, row `c`'s values at `a + 32c` (a tile).
#[inline(always)]
unsafe fn half8<F: Rows, const ISA: u8, const M: usize>(
    parts: &[__m256i; 4],
    a: *const i8,
    mut x: [__m256i; M],
) -> [__m256i; M] {
    let zero = _mm256_setzero_si256();
    if ISA == AVX_VNNI {
        // One row: two chains, as below.
        if M == 1 {
            let y = _mm256_dpbusd_avx_epi32(x[0], parts[0], bcast(a));
            let z = _mm256_dpbusd_avx_epi32(zero, parts[2], bcast(a.add(8)));
            let y = _mm256_dpbusd_avx_epi32(y, parts[1], bcast(a.add(4)));
            let z = _mm256_dpbusd_avx_epi32(z, parts[3], bcast(a.add(12)));
            x[0] = _mm256_add_epi32(y, z);
            return x;
        }
        for (c, x) in x.iter_mut().enumerate() {
            for (u, &p) in parts.iter().enumerate() {
                *x = _mm256_dpbusd_avx_epi32(*x, p, bcast(a.add(32 * c + 4 * u)));
            }
        }
        return x;
    }
    if ISA == VNNI512 && M == 1 {
        // One row: two chains, or the loop waits on the latency.
        let y = dpbusd_at::<0>(x[0], parts[0], a);
        let z = dpbusd_at::<8>(zero, parts[2], a);
        let y = dpbusd_at::<4>(y, parts[1], a);
        let z = dpbusd_at::<12>(z, parts[3], a);
        x[0] = _mm256_add_epi32(y, z);
        return x;
    }
    if ISA == VNNI512 {
        // Rows unrolled by hand: the offsets must be constants.
        macro_rules! rows {
            ($($c:literal)*) => {$(
                if $c < M {
                    x[$c] = dpbusd_at::<{ 32 * $c }>(x[$c], parts[0], a);
                    x[$c] = dpbusd_at::<{ 32 * $c + 4 }>(x[$c], parts[1], a);
                    x[$c] = dpbusd_at::<{ 32 * $c + 8 }>(x[$c], parts[2], a);
                    x[$c] = dpbusd_at::<{ 32 * $c + 12 }>(x[$c], parts[3], a);
                }
            )*};
        }
        rows!(0 1 2 3 4 5 6 7);
        return x;
    }
    let ones = _mm256_set1_epi16(1);
    for (c, x) in x.iter_mut().enumerate() {
        for run in 0..4 / F::RUN {
            let mut s = zero;
            for (i, &p) in parts[F::RUN * run..][..F::RUN].iter().enumerate() {
                let av = bcast(a.add(32 * c + 4 * (F::RUN * run + i)));
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(p, av));
            }
            *x = _mm256_add_epi32(*x, _mm256_madd_epi16(s, ones));
        }
    }
    x
}

/// [`half8`] for 16-bit activations (runs of four stored 0, 2, 1, 3): each
/// part split into its even and odd values as i16 lanes (Q6_K's made
/// signed), each multiplied by a broadcast pair.
#[inline(always)]
unsafe fn half16<F: Rows, const ISA: u8, const M: usize>(
    parts: &[__m256i; 4],
    a: [*const i16; M],
    mut x: [__m256i; M],
) -> [__m256i; M] {
    let low = _mm256_set1_epi16(0x00FF);
    for (u, &p) in parts.iter().enumerate() {
        let (mut even, mut odd) = (_mm256_and_si256(p, low), _mm256_srli_epi16(p, 8));
        if F::SIXTEENS && F::OFFSET != 0 {
            let offset = _mm256_set1_epi16(F::OFFSET);
            (even, odd) = (
                _mm256_sub_epi16(even, offset),
                _mm256_sub_epi16(odd, offset),
            );
        }
        for c in 0..M {
            let (pe, po) = (bcast(a[c].add(4 * u)), bcast(a[c].add(4 * u + 2)));
            x[c] = if ISA == VNNI512 {
                dpwssd(dpwssd(x[c], even, pe), odd, po)
            } else if ISA == AVX_VNNI {
                _mm256_dpwssd_avx_epi32(_mm256_dpwssd_avx_epi32(x[c], even, pe), odd, po)
            } else {
                let y = _mm256_add_epi32(_mm256_madd_epi16(even, pe), _mm256_madd_epi16(odd, po));
                _mm256_add_epi32(x[c], y)
            };
        }
    }
    x
}

/// Where a call's activation rows and their scales are, for span `t`:
/// 8-bit ones in [`crate::cpu::act_tiles::Tiles`] (one pointer each, rows at constant
/// offsets), 16-bit ones row-major.
#[derive(Clone, Copy)]
struct Rows8Or16<const M: usize> {
    k: usize,
    stride: usize,
    r0: usize,
    /// Rows per tile, `r0`'s tile's first span index and `r0`'s row in it.
    tile: usize,
    first: usize,
    c0: usize,
}

impl<const M: usize> Rows8Or16<M> {
    #[inline(always)]
    fn new(act: &ActRows, r0: usize) -> Self {
        // A constant where it can be (a run-time tile size cost 10%):
        // several rows always come in tiles of eight.
        let tile = if M == 1 {
            act.tiles.rows.max(1)
        } else {
            ACT_ROWS
        };
        Self {
            k: act.k,
            stride: act.stride,
            r0,
            tile,
            first: r0 / tile * (act.k / 32),
            c0: r0 % tile,
        }
    }

    /// The index of (`r0`'s tile, span `t`) and `r0`'s row in that tile.
    #[inline(always)]
    fn tile_span(self, t: usize) -> (usize, usize) {
        (self.first + t, self.c0)
    }
}

/// Lane sums of half `h` of span `j` of super-block `b` for `M` activation
/// rows, added to `start` (Q6_K: from its offsets instead).
#[inline(always)]
unsafe fn half_sums<F: Rows, const ISA: u8, const M: usize>(
    g: *const u8,
    (b, j, h): (usize, usize, usize),
    act: &ActRows,
    at: Rows8Or16<M>,
    mut start: [__m256i; M],
) -> [__m256i; M] {
    let parts = F::parts(g, j, h);
    let t = 8 * b + j;
    if act.a8 {
        let (ts, c0) = at.tile_span(t);
        if F::SIXTEENS && F::OFFSET != 0 {
            let o = act.tiles.offsets.as_ptr().add((2 * ts + h) * at.tile + c0);
            for (c, start) in start.iter_mut().enumerate() {
                *start = _mm256_set1_epi32(offset_start::<F>(*o.add(c)));
            }
        }
        let a = act.tiles.q.as_ptr().add((ts * at.tile + c0) * 32 + 16 * h);
        half8::<F, ISA, M>(&parts, a, start)
    } else {
        let mut a = [act.qs.as_ptr(); M];
        for (c, a) in a.iter_mut().enumerate() {
            *a = a.add((at.r0 + c) * at.k + 32 * t + 16 * h);
        }
        half16::<F, ISA, M>(&parts, a, start)
    }
}

/// `d_a · Σq` over half `h` of span `t` for the call's rows (Q2_K's
/// minimums): the sum from the tile's `−32 · Σq` for 8-bit rows, added up
/// here for 16-bit ones.
#[inline(always)]
unsafe fn half_act_sums<const M: usize>(
    act: &ActRows,
    at: Rows8Or16<M>,
    t: usize,
    h: usize,
) -> [f32; M] {
    let mut out = [0f32; M];
    if act.a8 {
        let (ts, c0) = at.tile_span(t);
        let o = act.tiles.offsets.as_ptr().add((2 * ts + h) * at.tile + c0);
        let d = act.tiles.d.as_ptr().add(ts * at.tile + c0);
        for (c, out) in out.iter_mut().enumerate() {
            *out = (-*o.add(c) / 32) as f32 * *d.add(c);
        }
    } else {
        let ones = _mm256_set1_epi16(1);
        for (c, out) in out.iter_mut().enumerate() {
            let a = act.qs.as_ptr().add((at.r0 + c) * at.k + 32 * t + 16 * h);
            let v = _mm256_madd_epi16(_mm256_loadu_si256(a.cast()), ones);
            let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
            let v = _mm_add_epi32(v, _mm_shuffle_epi32::<1>(v));
            *out = _mm_cvtsi128_si32(v) as f32 * *act.d.as_ptr().add((at.r0 + c) * at.stride + t);
        }
    }
    out
}

/// The activation scales `d` and `d · Σq` of span `t` for the call's rows.
#[inline(always)]
unsafe fn act_scales<const M: usize>(
    act: &ActRows,
    at: Rows8Or16<M>,
    t: usize,
) -> ([__m256; M], [*const f32; M]) {
    let mut da = [_mm256_setzero_ps(); M];
    let mut sa = [std::ptr::null(); M];
    if act.a8 {
        let (ts, c0) = at.tile_span(t);
        let (d, s) = (act.tiles.d.as_ptr(), act.tiles.s.as_ptr());
        for c in 0..M {
            da[c] = _mm256_set1_ps(*d.add(ts * at.tile + c0 + c));
            sa[c] = s.add(ts * at.tile + c0 + c);
        }
    } else {
        for c in 0..M {
            let q = (at.r0 + c) * at.stride + t;
            da[c] = _mm256_set1_ps(*act.d.as_ptr().add(q));
            sa[c] = act.s.as_ptr().add(q);
        }
    }
    (da, sa)
}

/// `out[c]` = activation row `r0 + c` against the group's eight rows:
/// per span, `float(Σ)·(d·sc)·d_a`, less Q4_K/Q5_K's `(dmin·m)·(d_a·Σa)`
/// (both halves in one integer sum); Q6_K's per half, each with its own
/// `sc`, folded into the float sums as soon as it is done (with both
/// halves' integer sums live, eight rows ran out of registers).
#[inline(always)]
unsafe fn group<F: Rows, const ISA: u8, const M: usize>(
    g: *const u8,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    let at = Rows8Or16::<M>::new(act, r0);
    let zero = [_mm256_setzero_si256(); M];
    let mut acc = [_mm256_setzero_ps(); M];
    for b in 0..act.k / 256 {
        let gb = g.add(b * F::BYTES);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(gb.cast()));
        let bytes = |o: usize| _mm_loadl_epi64(gb.add(o).cast());
        for j in 0..8 {
            prefetch::<F>(gb, j);
            let (da, sa) = act_scales(act, at, 8 * b + j);
            if F::SIXTEENS {
                for h in 0..2 {
                    let x = half_sums::<F, ISA, M>(gb, (b, j, h), act, at, zero);
                    let (sc, mn) = if F::MINS16 {
                        let sm = _mm256_cvtepu8_epi32(bytes(32 + 16 * j + 8 * h));
                        let sc = _mm256_and_si256(sm, _mm256_set1_epi32(0x0F));
                        (sc, _mm256_srli_epi32(sm, 4))
                    } else {
                        let sc = _mm256_cvtepi8_epi32(bytes(16 + 16 * j + 8 * h));
                        (sc, sc)
                    };
                    let ds = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
                    for c in 0..M {
                        let w = _mm256_mul_ps(_mm256_cvtepi32_ps(x[c]), ds);
                        acc[c] = _mm256_fmadd_ps(w, da[c], acc[c]);
                    }
                    if F::MINS16 {
                        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(16).cast()));
                        let dm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn));
                        let sums = half_act_sums(act, at, 8 * b + j, h);
                        for c in 0..M {
                            acc[c] = _mm256_fnmadd_ps(dm, _mm256_set1_ps(sums[c]), acc[c]);
                        }
                    }
                }
            } else {
                let x0 = half_sums::<F, ISA, M>(gb, (b, j, 0), act, at, zero);
                let x = if M == 1 {
                    let x1 = half_sums::<F, ISA, M>(gb, (b, j, 1), act, at, zero);
                    let mut x = x0;
                    for c in 0..M {
                        x[c] = _mm256_add_epi32(x0[c], x1[c]);
                    }
                    x
                } else {
                    half_sums::<F, ISA, M>(gb, (b, j, 1), act, at, x0)
                };
                // The span's scale vectors, shared by every activation row.
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(16).cast()));
                let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes(32 + 8 * j)));
                let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes(96 + 8 * j)));
                let (ws, wm) = (_mm256_mul_ps(d, sc), _mm256_mul_ps(dmin, mn));
                for c in 0..M {
                    let y =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(x[c]), _mm256_mul_ps(ws, da[c]), acc[c]);
                    acc[c] = _mm256_fnmadd_ps(wm, _mm256_set1_ps(*sa[c]), y);
                }
            }
        }
    }
    for c in 0..M {
        _mm256_storeu_ps(out[c].as_mut_ptr(), acc[c]);
    }
}

/// Two groups' eight-lane vectors as one of sixteen lanes, `lo`'s rows
/// first.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// [`half_sums`] for two groups at once (8-bit activations, VNNI): their
/// parts side by side in 512-bit vectors, so each `VPDPBUSD` multiplies
/// sixteen rows by the broadcast activation bytes.
#[inline(always)]
unsafe fn half_sums_pair<F: Rows, const M: usize>(
    g: [*const u8; 2],
    (b, j, h): (usize, usize, usize),
    act: &ActRows,
    at: Rows8Or16<M>,
    mut x: [__m512i; M],
) -> [__m512i; M] {
    let (lo, hi) = (F::parts(g[0], j, h), F::parts(g[1], j, h));
    let parts: [__m512i; 4] = std::array::from_fn(|u| join(lo[u], hi[u]));
    let (ts, c0) = at.tile_span(8 * b + j);
    if F::SIXTEENS && F::OFFSET != 0 {
        let o = act.tiles.offsets.as_ptr().add((2 * ts + h) * at.tile + c0);
        for (c, x) in x.iter_mut().enumerate() {
            *x = _mm512_set1_epi32(offset_start::<F>(*o.add(c)));
        }
    }
    let a = act.tiles.q.as_ptr().add((ts * at.tile + c0) * 32 + 16 * h);
    macro_rules! rows {
        ($($c:literal)*) => {$(
            if $c < M {
                x[$c] = dpbusd512_at::<{ 32 * $c }>(x[$c], parts[0], a);
                x[$c] = dpbusd512_at::<{ 32 * $c + 4 }>(x[$c], parts[1], a);
                x[$c] = dpbusd512_at::<{ 32 * $c + 8 }>(x[$c], parts[2], a);
                x[$c] = dpbusd512_at::<{ 32 * $c + 12 }>(x[$c], parts[3], a);
            }
        )*};
    }
    rows!(0 1 2 3 4 5 6 7);
    x
}

/// [`group`] for two groups at once in 512-bit vectors (8-bit activations,
/// VNNI): where a core runs two 512-bit `VPDPBUSD` per cycle (Intel server
/// cores) that is twice the multiplies per cycle of 256 bits, and the
/// float finish is shared by sixteen rows; where it splits them in two
/// (Zen 4) it is no slower. Each lane takes exactly [`group`]'s steps for
/// its row, so the results are the same bits.
#[inline(always)]
unsafe fn group_pair<F: Rows, const M: usize>(
    g: [*const u8; 2],
    act: &ActRows,
    r0: usize,
    out: [&mut [[f32; ROWS]; ACT_ROWS]; 2],
) {
    let at = Rows8Or16::<M>::new(act, r0);
    let zero = [_mm512_setzero_si512(); M];
    let mut acc = [_mm512_setzero_ps(); M];
    let stride = act.k / 256 * F::BYTES;
    for b in 0..act.k / 256 {
        let gb = g.map(|g| g.add(b * F::BYTES));
        let halves = |o: usize| _mm256_loadu2_m128i(gb[1].add(o).cast(), gb[0].add(o).cast());
        let bytes = |o: usize| {
            _mm_unpacklo_epi64(
                _mm_loadl_epi64(gb[0].add(o).cast()),
                _mm_loadl_epi64(gb[1].add(o).cast()),
            )
        };
        let d = _mm512_cvtph_ps(halves(0));
        for j in 0..8 {
            // The pair's two groups are neighbours: a target past the end
            // of its group would land in the other stream's group, read
            // now, and the next pair (two groups on) would start cold.
            // So each target skips one group per group end it crosses and
            // runs on into the group this stream reads next (`gemm_quant_dram`
            // Q4_K int8 at m = 8, k = 1536: 367-414 -> 500-525 Gelem/s on
            // a Zen 4; 540-570 with the weights in L3).
            let skip = (b * F::BYTES + j * F::BYTES / 8 + PREFETCH) / stride * stride;
            prefetch::<F>(gb[0].wrapping_add(skip), j);
            prefetch::<F>(gb[1].wrapping_add(skip), j);
            let (ts, c0) = at.tile_span(8 * b + j);
            let at_row = ts * at.tile + c0;
            let da: [__m512; M] =
                std::array::from_fn(|c| _mm512_set1_ps(*act.tiles.d.as_ptr().add(at_row + c)));
            let sa = act.tiles.s.as_ptr().add(at_row);
            if F::SIXTEENS {
                for h in 0..2 {
                    let x = half_sums_pair::<F, M>(gb, (b, j, h), act, at, zero);
                    let (sc, mn) = if F::MINS16 {
                        let sm = _mm512_cvtepu8_epi32(bytes(32 + 16 * j + 8 * h));
                        let sc = _mm512_and_si512(sm, _mm512_set1_epi32(0x0F));
                        (sc, _mm512_srli_epi32(sm, 4))
                    } else {
                        let sc = _mm512_cvtepi8_epi32(bytes(16 + 16 * j + 8 * h));
                        (sc, sc)
                    };
                    let ds = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
                    for c in 0..M {
                        let w = _mm512_mul_ps(_mm512_cvtepi32_ps(x[c]), ds);
                        acc[c] = _mm512_fmadd_ps(w, da[c], acc[c]);
                    }
                    if F::MINS16 {
                        let dm = _mm512_mul_ps(_mm512_cvtph_ps(halves(16)), _mm512_cvtepi32_ps(mn));
                        let sums = half_act_sums(act, at, 8 * b + j, h);
                        for c in 0..M {
                            acc[c] = _mm512_fnmadd_ps(dm, _mm512_set1_ps(sums[c]), acc[c]);
                        }
                    }
                }
            } else {
                let x0 = half_sums_pair::<F, M>(gb, (b, j, 0), act, at, zero);
                let x = half_sums_pair::<F, M>(gb, (b, j, 1), act, at, x0);
                let dmin = _mm512_cvtph_ps(halves(16));
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes(32 + 8 * j)));
                let mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes(96 + 8 * j)));
                let (ws, wm) = (_mm512_mul_ps(d, sc), _mm512_mul_ps(dmin, mn));
                for c in 0..M {
                    let y =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(x[c]), _mm512_mul_ps(ws, da[c]), acc[c]);
                    acc[c] = _mm512_fnmadd_ps(wm, _mm512_set1_ps(*sa.add(c)), y);
                }
            }
        }
    }
    let [lo, hi] = out;
    for c in 0..M {
        let mut both = [0f32; 2 * ROWS];
        _mm512_storeu_ps(both.as_mut_ptr(), acc[c]);
        lo[c].copy_from_slice(&both[..ROWS]);
        hi[c].copy_from_slice(&both[ROWS..]);
    }
}

/// Asks for span `j` of the group block [`PREFETCH`] bytes ahead of the
/// one at `g` (past a task's last group: harmless, prefetches do not
/// fault). The hardware prefetchers alone fall behind the weight stream:
/// with several activation rows on a Zen 4 (batch-8 decode of
/// Qwen2.5-Coder-1.5B Q4_K_M spent a fifth of its kernel time on the
/// weight loads), and with one row on an Intel Xeon, whose decode GEMVs
/// read at half the memory bandwidth without it. 4 KB ahead rather than 2
/// covers the Xeon's longer memory latency; on the Zen 4 both distances,
/// and none at one row, measured the same (`docs/perf-log.md`).
#[inline(always)]
unsafe fn prefetch<F: Rows>(g: *const u8, j: usize) {
    let at = g.wrapping_add(PREFETCH + j * F::BYTES / 8);
    for line in 0..F::BYTES.div_ceil(8 * 64) {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line).cast());
    }
}

/// The eight rows' values at position `v` (0..256) of the group block at
/// `g`, rounded exactly as [`super::value`] rounds them (the same f32
/// operations in the same order), so that outliers added through either
/// give the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn values8(ty: GgmlType, g: *const u8, v: usize) -> __m256 {
    let (j, t) = (v / 32, v % 32);
    let (half, u, p) = (t / 16, t % 16 / 4, t % 4);
    let at = g.add(span_at(ty, j));
    // Byte p of each row's word, shifted right by `s`, as i32 lanes.
    let field = |o: usize, s: usize, mask: i32| {
        let x = _mm256_loadu_si256(at.add(o).cast());
        let x = _mm256_srl_epi32(x, _mm_cvtsi32_si128((8 * p + s) as i32));
        _mm256_and_si256(x, _mm256_set1_epi32(mask))
    };
    let bytes = |o: usize| _mm_loadl_epi64(g.add(o).cast());
    let d = _mm256_cvtph_ps(_mm_loadu_si128(g.cast()));
    if ty == GgmlType::Q2_K {
        let q = _mm256_cvtepi32_ps(field(32 * half, 2 * u, 3));
        let sm = _mm256_cvtepu8_epi32(bytes(32 + 8 * (v / 16)));
        let sc = _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(0x0F)));
        let mn = _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 4));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(g.add(16).cast()));
        return _mm256_sub_ps(
            _mm256_mul_ps(_mm256_mul_ps(d, sc), q),
            _mm256_mul_ps(dmin, mn),
        );
    }
    if ty == GgmlType::Q3_K {
        let q = _mm256_or_si256(
            field(32 * half, 2 * u, 3),
            _mm256_slli_epi32(field(64, 4 * half + u, 1), 2),
        );
        let sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes(16 + 8 * (v / 16))));
        let q = _mm256_sub_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(4.0));
        return _mm256_mul_ps(_mm256_mul_ps(d, sc), q);
    }
    let mut q = field(32 * u, 4 * half, 0x0F);
    if ty == GgmlType::Q6_K {
        q = _mm256_or_si256(q, _mm256_slli_epi32(field(128 + 32 * half, 2 * u, 3), 4));
        let sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes(16 + 8 * (v / 16))));
        let q = _mm256_sub_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(32.0));
        return _mm256_mul_ps(_mm256_mul_ps(d, sc), q);
    }
    if ty == GgmlType::Q5_K {
        q = _mm256_or_si256(q, _mm256_slli_epi32(field(128, 4 * half + u, 1), 4));
    }
    let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes(32 + 8 * j)));
    let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes(96 + 8 * j)));
    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(g.add(16).cast()));
    let dq = _mm256_mul_ps(_mm256_mul_ps(d, sc), _mm256_cvtepi32_ps(q));
    _mm256_sub_ps(dq, _mm256_mul_ps(dmin, mn))
}

/// [`values8`] stored to `out` (at least eight floats).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store_values8(ty: GgmlType, g: *const u8, v: usize, out: &mut [f32]) {
    assert!(out.len() >= ROWS);
    _mm256_storeu_ps(out.as_mut_ptr(), values8(ty, g, v));
}

/// Adds `outliers` (one activation row's) times the group's values at
/// their positions to `res`, in order: `res += x · w` per outlier, as the
/// outlier pass adds them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_outliers(
    ty: GgmlType,
    g: *const u8,
    outliers: &[crate::cpu::act_quant::Outlier],
    res: &mut [f32; ROWS],
) {
    let mut acc = _mm256_loadu_ps(res.as_ptr());
    let gb = super::group_bytes(ty);
    for o in outliers {
        let at = o.at as usize;
        let w = values8(ty, g.add(at / 256 * gb), at % 256);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(o.x), w));
    }
    _mm256_storeu_ps(res.as_mut_ptr(), acc);
}

#[inline(always)]
unsafe fn by_type<const ISA: u8>(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    macro_rules! run {
        ($f:ty) => {
            match m {
                1 => group::<$f, ISA, 1>(g, act, r0, out),
                2 => group::<$f, ISA, 2>(g, act, r0, out),
                3 => group::<$f, ISA, 3>(g, act, r0, out),
                4 => group::<$f, ISA, 4>(g, act, r0, out),
                5 if ISA == VNNI512 => group::<$f, ISA, 5>(g, act, r0, out),
                6 if ISA == VNNI512 => group::<$f, ISA, 6>(g, act, r0, out),
                7 if ISA == VNNI512 => group::<$f, ISA, 7>(g, act, r0, out),
                _ if ISA == VNNI512 => group::<$f, ISA, 8>(g, act, r0, out),
                _ => unreachable!("16-register kernel called for {m} rows"),
            }
        };
    }
    match ty {
        GgmlType::Q2_K => run!(Q2K),
        GgmlType::Q3_K => run!(Q3K),
        GgmlType::Q4_K => run!(Q4K),
        GgmlType::Q5_K => run!(Q5K),
        GgmlType::Q6_K => run!(Q6K),
        _ => unreachable!("k-quant dot_group called for {ty}"),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_group_avx2(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<AVX2>(ty, g, act, r0, m, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_group_vnni(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<VNNI512>(ty, g, act, r0, m, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn dot_group_avx_vnni(
    ty: GgmlType,
    g: *const u8,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    by_type::<AVX_VNNI>(ty, g, act, r0, m, out)
}

/// Two groups (`g0`'s rows, then `g1`'s) against `m` activation rows of
/// 8-bit values ([`group_pair`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_pair_vnni(
    ty: GgmlType,
    g: [*const u8; 2],
    act: &ActRows,
    r0: usize,
    m: usize,
    out: [&mut [[f32; ROWS]; ACT_ROWS]; 2],
) {
    macro_rules! run {
        ($f:ty) => {
            by_m!(m, M => group_pair::<$f, M>(g, act, r0, out))
        };
    }
    match ty {
        GgmlType::Q2_K => run!(Q2K),
        GgmlType::Q3_K => run!(Q3K),
        GgmlType::Q4_K => run!(Q4K),
        GgmlType::Q5_K => run!(Q5K),
        GgmlType::Q6_K => run!(Q6K),
        _ => unreachable!("k-quant dot_pair called for {ty}"),
    }
}
