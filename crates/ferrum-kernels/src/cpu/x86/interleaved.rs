//! The interleaved kernels for x86-64: AVX-512 VNNI on 512-bit vectors (a
//! group's sixteen rows at once) and AVX2 + FMA (its two halves in turn).
//!
//! `VPDPWSSD` is written in inline assembly with its activation pair
//! broadcast straight from memory (`{1to16}`): from the intrinsic, LLVM's
//! generic tuning splits it back into `VPMADDWD` + `VPADDD` (two
//! instructions where one does), and a separate broadcast would add a
//! third.

use std::arch::asm;
use std::arch::x86_64::*;

use ferrum_types::GgmlType;

use super::{Layout, Levels, Nibbles, Offset, Q40, Q41, Q50, Q51, Q80};
use super::{ACT_ROWS, CHUNK_BYTES, LANE_BYTES, ROWS};
use crate::cpu::act_quant::{ActRows, Outlier};
use crate::cpu::int_dot::dpbusd512_at;
use crate::cpu::simd::prefetch_ahead;

/// One interleaved block format's unpacking (see the parent module for
/// the layout).
trait Format: Layout {
    /// What chunk `c` (the pairs `W_{4c}..W_{4c+4}`) of rows `8u..8u + 8`
    /// is unpacked from, loaded once for its four pairs.
    type Chunk: Copy;
    /// `W_{8h}..W_{8h+8}` of all sixteen rows as pairs of i16.
    unsafe fn half512(g: *const u8, h: usize) -> [__m512i; 8];
    /// Chunk `c` of rows `8u..8u + 8`.
    unsafe fn chunk256(g: *const u8, c: usize, u: usize) -> Self::Chunk;
    /// `W_{4c+j}` of the chunk's rows.
    unsafe fn pair256(chunk: Self::Chunk, c: usize, j: usize) -> __m256i;
    /// `W_{8h}..W_{8h+8}` of rows `8u..8u + 8`.
    #[inline(always)]
    unsafe fn half256(g: *const u8, h: usize, u: usize) -> [__m256i; 8] {
        let mut w = [_mm256_setzero_si256(); 8];
        for t in 0..2 {
            let c = 2 * h + t;
            let chunk = Self::chunk256(g, c, u);
            for j in 0..4 {
                w[4 * t + j] = Self::pair256(chunk, c, j);
            }
        }
        w
    }
}

/// Nibble `j` of each 16-bit lane of `x` (the 32-bit lanes' pair `j`).
#[inline(always)]
unsafe fn nibble256(x: __m256i, j: usize) -> __m256i {
    let mask = _mm256_set1_epi16(0x0F);
    match j {
        0 => _mm256_and_si256(x, mask),
        1 => _mm256_and_si256(_mm256_srli_epi16(x, 4), mask),
        2 => _mm256_and_si256(_mm256_srli_epi16(x, 8), mask),
        _ => _mm256_srli_epi16(x, 12),
    }
}

/// [`nibble256`] in 512 bits.
#[inline(always)]
unsafe fn nibble512(x: __m512i, j: usize) -> __m512i {
    let mask = _mm512_set1_epi16(0x0F);
    match j {
        0 => _mm512_and_si512(x, mask),
        1 => _mm512_and_si512(_mm512_srli_epi16(x, 4), mask),
        2 => _mm512_and_si512(_mm512_srli_epi16(x, 8), mask),
        _ => _mm512_srli_epi16(x, 12),
    }
}

/// Adds 16 to the lanes of `w` (`W_{8h}..W_{8h+8}`) whose fifth bit is
/// set: a test of the plane's bit `8h + j` into a mask register, then one
/// masked add each.
#[inline(always)]
unsafe fn add_fifth512(w: &mut [__m512i; 8], qh: *const u8, h: usize) {
    let plane = _mm512_loadu_si512(qh.cast());
    let sixteen = _mm512_set1_epi16(16);
    for (j, w) in w.iter_mut().enumerate() {
        let bit = _mm512_set1_epi16((1u16 << (8 * h + j)) as i16);
        let hit = _mm512_test_epi16_mask(plane, bit);
        *w = _mm512_mask_add_epi16(*w, hit, *w, sixteen);
    }
}

/// [`add_fifth512`] for `W_p` of rows `8u..8u + 8`, without mask
/// registers: the plane's bit `p` is shifted to bit 4 and or-ed in (the
/// nibbles leave bit 4 clear).
#[inline(always)]
unsafe fn add_fifth256(w: __m256i, plane: __m256i, p: usize) -> __m256i {
    let bit = match p {
        0 => _mm256_slli_epi16(plane, 4),
        1 => _mm256_slli_epi16(plane, 3),
        2 => _mm256_slli_epi16(plane, 2),
        3 => _mm256_slli_epi16(plane, 1),
        4 => plane,
        5 => _mm256_srli_epi16(plane, 1),
        6 => _mm256_srli_epi16(plane, 2),
        7 => _mm256_srli_epi16(plane, 3),
        8 => _mm256_srli_epi16(plane, 4),
        9 => _mm256_srli_epi16(plane, 5),
        10 => _mm256_srli_epi16(plane, 6),
        11 => _mm256_srli_epi16(plane, 7),
        12 => _mm256_srli_epi16(plane, 8),
        13 => _mm256_srli_epi16(plane, 9),
        14 => _mm256_srli_epi16(plane, 10),
        _ => _mm256_srli_epi16(plane, 11),
    };
    _mm256_or_si256(w, _mm256_and_si256(bit, _mm256_set1_epi16(16)))
}

impl<const MIN: bool, const FIFTH: bool> Format for Nibbles<MIN, FIFTH> {
    /// The chunk's words and the plane's words of the same rows.
    type Chunk = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn half512(g: *const u8, h: usize) -> [__m512i; 8] {
        let mut w = [_mm512_setzero_si512(); 8];
        for t in 0..2 {
            let x = _mm512_loadu_si512(g.add(Self::QS + CHUNK_BYTES * (2 * h + t)).cast());
            for j in 0..4 {
                w[4 * t + j] = nibble512(x, j);
            }
        }
        if FIFTH {
            add_fifth512(&mut w, g.add(Self::QH), h);
        }
        w
    }
    #[inline(always)]
    unsafe fn chunk256(g: *const u8, c: usize, u: usize) -> Self::Chunk {
        let x = _mm256_loadu_si256(g.add(Self::QS + CHUNK_BYTES * c + 32 * u).cast());
        let plane = if FIFTH {
            _mm256_loadu_si256(g.add(Self::QH + 32 * u).cast())
        } else {
            _mm256_setzero_si256()
        };
        (x, plane)
    }
    #[inline(always)]
    unsafe fn pair256((x, plane): Self::Chunk, c: usize, j: usize) -> __m256i {
        let w = nibble256(x, j);
        if FIFTH {
            add_fifth256(w, plane, 4 * c + j)
        } else {
            w
        }
    }
}

/// The codebook types: each i16 lane's rank (0..16) looked up in the
/// table by one byte shuffle, whose entry 0 (zero) fills the high byte.
impl<const MX: bool> Format for Levels<MX> {
    /// The chunk's words of ranks.
    type Chunk = __m256i;
    #[inline(always)]
    unsafe fn half512(g: *const u8, h: usize) -> [__m512i; 8] {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(Self::TABLE.as_ptr().cast()));
        let mut w = [_mm512_setzero_si512(); 8];
        for t in 0..2 {
            let x = _mm512_loadu_si512(g.add(LANE_BYTES + CHUNK_BYTES * (2 * h + t)).cast());
            for j in 0..4 {
                w[4 * t + j] = _mm512_shuffle_epi8(table, nibble512(x, j));
            }
        }
        w
    }
    #[inline(always)]
    unsafe fn chunk256(g: *const u8, c: usize, u: usize) -> Self::Chunk {
        _mm256_loadu_si256(g.add(LANE_BYTES + CHUNK_BYTES * c + 32 * u).cast())
    }
    #[inline(always)]
    unsafe fn pair256(x: Self::Chunk, _: usize, j: usize) -> __m256i {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(Self::TABLE.as_ptr().cast()));
        _mm256_shuffle_epi8(table, nibble256(x, j))
    }
}

impl Format for Q80 {
    /// Where the chunk's first `W_p` of the half starts.
    type Chunk = *const u8;
    #[inline(always)]
    unsafe fn half512(g: *const u8, h: usize) -> [__m512i; 8] {
        std::array::from_fn(|j| {
            let p = g.add(LANE_BYTES * (1 + 8 * h + j));
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.cast()))
        })
    }
    #[inline(always)]
    unsafe fn chunk256(g: *const u8, c: usize, u: usize) -> Self::Chunk {
        g.add(LANE_BYTES * (1 + 4 * c) + 16 * u)
    }
    #[inline(always)]
    unsafe fn pair256(p: Self::Chunk, _: usize, j: usize) -> __m256i {
        _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(LANE_BYTES * j).cast()))
    }
}

/// `dot` plus, per row lane, `Σ_j w[j] · (a[2j], a[2j + 1])`: eight pairs of
/// activation values against the eight rows' pairs, without VNNI. The
/// pairs are loaded four at a time into both 128-bit lanes and spread by
/// `VPSHUFD`: a load plus a shuffle per pair beats a `VPBROADCASTD` from
/// memory on Zen 3, and LLVM must not fold the shuffles back into
/// broadcasts (`docs/perf-log.md`). Its own target feature lets the barrier name `ymm` registers;
/// the AVX2 entry point inlines it.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot8_256(dot: __m256i, w: &[__m256i; 8], a: *const i16) -> __m256i {
    let mut dot = dot;
    let mut lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(a.cast()));
    let mut hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(a.add(8).cast()));
    // SAFETY: empty; it only hides the loads from LLVM, which would
    // otherwise fold each shuffle of them back into a broadcast load.
    asm!("/* {0} {1} */", inout(ymm_reg) lo, inout(ymm_reg) hi, options(pure, nomem, nostack, preserves_flags));
    let pairs = [
        _mm256_shuffle_epi32(lo, 0x00),
        _mm256_shuffle_epi32(lo, 0x55),
        _mm256_shuffle_epi32(lo, 0xAA),
        _mm256_shuffle_epi32(lo, 0xFF),
        _mm256_shuffle_epi32(hi, 0x00),
        _mm256_shuffle_epi32(hi, 0x55),
        _mm256_shuffle_epi32(hi, 0xAA),
        _mm256_shuffle_epi32(hi, 0xFF),
    ];
    for (&w, pair) in w.iter().zip(pairs) {
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(w, pair));
    }
    dot
}

/// The same for sixteen rows: eight `VPDPWSSD`s. Only reached from the
/// AVX-512 entry point, whose target features let it inline this.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dot8_512(dot: __m512i, w: &[__m512i; 8], a: *const i16) -> __m512i {
    let mut dot = dot;
    // SAFETY (caller): `a` points at 16 readable i16.
    asm!(
        "vpdpwssd {d}, {w0}, dword ptr [{a}]{{1to16}}",
        "vpdpwssd {d}, {w1}, dword ptr [{a} + 4]{{1to16}}",
        "vpdpwssd {d}, {w2}, dword ptr [{a} + 8]{{1to16}}",
        "vpdpwssd {d}, {w3}, dword ptr [{a} + 12]{{1to16}}",
        "vpdpwssd {d}, {w4}, dword ptr [{a} + 16]{{1to16}}",
        "vpdpwssd {d}, {w5}, dword ptr [{a} + 20]{{1to16}}",
        "vpdpwssd {d}, {w6}, dword ptr [{a} + 24]{{1to16}}",
        "vpdpwssd {d}, {w7}, dword ptr [{a} + 28]{{1to16}}",
        d = inout(zmm_reg) dot,
        w0 = in(zmm_reg) w[0],
        w1 = in(zmm_reg) w[1],
        w2 = in(zmm_reg) w[2],
        w3 = in(zmm_reg) w[3],
        w4 = in(zmm_reg) w[4],
        w5 = in(zmm_reg) w[5],
        w6 = in(zmm_reg) w[6],
        w7 = in(zmm_reg) w[7],
        a = in(reg) a,
        options(pure, readonly, nostack, preserves_flags),
    );
    dot
}

/// One group of sixteen weight rows (`nb` group blocks at `g`) against the
/// `M` activation rows from `r0`: `out[c][r]`.
#[inline(always)]
unsafe fn group512<F: Format, const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    let (k, stride) = (act.k, act.stride);
    let mut acc = [_mm512_setzero_ps(); M];
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        prefetch_ahead(p, F::GROUP);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        let o = match F::OFFSET {
            Offset::No => _mm512_setzero_ps(),
            Offset::Min => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(LANE_BYTES).cast())),
            Offset::Scaled(c) => _mm512_mul_ps(d, _mm512_set1_ps(c)),
        };
        let mut dots = [_mm512_setzero_si512(); M];
        for h in 0..2 {
            let w = F::half512(p, h);
            for (c, dot) in dots.iter_mut().enumerate() {
                let a = act.qs.as_ptr().add((r0 + c) * k + 32 * b + 16 * h);
                *dot = dot8_512(*dot, &w, a);
            }
        }
        for (c, (acc, dot)) in acc.iter_mut().zip(dots).enumerate() {
            let i = (r0 + c) * stride + b;
            let s = _mm512_mul_ps(d, _mm512_set1_ps(*act.d.as_ptr().add(i)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, *acc);
            if F::OFFSET != Offset::No {
                *acc = _mm512_fmadd_ps(o, _mm512_set1_ps(*act.s.as_ptr().add(i)), *acc);
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm512_storeu_ps(out.as_mut_ptr(), acc);
    }
}

/// [`group512`] for rows `8u..8u + 8` of the group in 256-bit vectors.
#[inline(always)]
unsafe fn group256<F: Format, const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    u: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    let (k, stride) = (act.k, act.stride);
    let mut acc = [_mm256_setzero_ps(); M];
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        prefetch_ahead(p, F::GROUP);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * u).cast()));
        let o = match F::OFFSET {
            Offset::No => _mm256_setzero_ps(),
            Offset::Min => _mm256_cvtph_ps(_mm_loadu_si128(p.add(LANE_BYTES + 16 * u).cast())),
            Offset::Scaled(c) => _mm256_mul_ps(d, _mm256_set1_ps(c)),
        };
        let mut dots = [_mm256_setzero_si256(); M];
        for h in 0..2 {
            let w = F::half256(p, h, u);
            for (c, dot) in dots.iter_mut().enumerate() {
                let a = act.qs.as_ptr().add((r0 + c) * k + 32 * b + 16 * h);
                *dot = dot8_256(*dot, &w, a);
            }
        }
        for (c, (acc, dot)) in acc.iter_mut().zip(dots).enumerate() {
            let i = (r0 + c) * stride + b;
            let s = _mm256_mul_ps(d, _mm256_set1_ps(*act.d.as_ptr().add(i)));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, *acc);
            if F::OFFSET != Offset::No {
                *acc = _mm256_fmadd_ps(o, _mm256_set1_ps(*act.s.as_ptr().add(i)), *acc);
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * u), acc);
    }
}

/// [`group512`] in 256-bit vectors for up to four activation rows: both
/// halves of the group at once, so each broadcast activation pair feeds
/// both halves' multiplies and each block is prefetched once. Taken a
/// `W_p` at a time, so that only one pair of weight vectors is live
/// beside the accumulators.
/// Each lane sees the same operations as in [`group256`].
#[inline(always)]
unsafe fn group256x2<F: Format, const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]],
) {
    let (k, stride) = (act.k, act.stride);
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        prefetch_ahead(p, F::GROUP);
        let mut dots = [[_mm256_setzero_si256(); 2]; M];
        for c in 0..4 {
            let chunks = [F::chunk256(p, c, 0), F::chunk256(p, c, 1)];
            for j in 0..4 {
                let w = [F::pair256(chunks[0], c, j), F::pair256(chunks[1], c, j)];
                for (r, dots) in dots.iter_mut().enumerate() {
                    let a = act.qs.as_ptr().add((r0 + r) * k + 32 * b + 2 * (4 * c + j));
                    let x = _mm256_set1_epi32(a.cast::<i32>().read_unaligned());
                    for (dot, w) in dots.iter_mut().zip(w) {
                        *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(w, x));
                    }
                }
            }
        }
        for u in 0..2 {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * u).cast()));
            let o = match F::OFFSET {
                Offset::No => _mm256_setzero_ps(),
                Offset::Min => _mm256_cvtph_ps(_mm_loadu_si128(p.add(LANE_BYTES + 16 * u).cast())),
                Offset::Scaled(c) => _mm256_mul_ps(d, _mm256_set1_ps(c)),
            };
            for (c, (acc, dots)) in acc.iter_mut().zip(&dots).enumerate() {
                let i = (r0 + c) * stride + b;
                let s = _mm256_mul_ps(d, _mm256_set1_ps(*act.d.as_ptr().add(i)));
                acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[u]), s, acc[u]);
                if F::OFFSET != Offset::No {
                    acc[u] = _mm256_fmadd_ps(o, _mm256_set1_ps(*act.s.as_ptr().add(i)), acc[u]);
                }
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
    }
}

/// Q4_1 against 8-bit activations ([`ActRows::quantize8`]), both halves of
/// the group for up to four rows. The masked nibbles (unsigned, 0..=15)
/// and four broadcast activation bytes go to `PMADDUBSW`, twice the
/// multiplies per instruction of `PMADDWD`; its i16 sums are added up in
/// i16 over the block (eight of at most 2 · 15 · 127 = 3,810: 30,480, no
/// overflow) and widened once per block by a `PMADDWD` with ones. With
/// `VEX` (AVX-VNNI), one `VPDPBUSD` adds the products straight into i32:
/// the same sums.
#[inline(always)]
unsafe fn group_a8<const M: usize, const VEX: bool>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]],
) {
    type F = Q41;
    let (k, stride) = (act.k, act.stride);
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        prefetch_ahead(p, F::GROUP);
        let mut dots = [[_mm256_setzero_si256(); 2]; M];
        for c in 0..4 {
            let x = [
                _mm256_loadu_si256(p.add(F::QS + CHUNK_BYTES * c).cast::<__m256i>()),
                _mm256_loadu_si256(p.add(F::QS + CHUNK_BYTES * c + 32).cast::<__m256i>()),
            ];
            for t in 0..2 {
                let w = x.map(|x| {
                    if t == 0 {
                        _mm256_and_si256(x, mask)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(x, 4), mask)
                    }
                });
                for (r, dots) in dots.iter_mut().enumerate() {
                    let a = act.q8.as_ptr().add((r0 + r) * k + 32 * b + 8 * c + 4 * t);
                    let xa = _mm256_set1_epi32(a.cast::<i32>().read_unaligned());
                    for (dot, w) in dots.iter_mut().zip(w) {
                        *dot = if VEX {
                            _mm256_dpbusd_avx_epi32(*dot, w, xa)
                        } else {
                            _mm256_add_epi16(*dot, _mm256_maddubs_epi16(w, xa))
                        };
                    }
                }
            }
        }
        for u in 0..2 {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * u).cast()));
            let o = _mm256_cvtph_ps(_mm_loadu_si128(p.add(LANE_BYTES + 16 * u).cast()));
            for (c, (acc, dots)) in acc.iter_mut().zip(&dots).enumerate() {
                let i = (r0 + c) * stride + b;
                let s = _mm256_mul_ps(d, _mm256_set1_ps(*act.d.as_ptr().add(i)));
                let dot = if VEX {
                    dots[u]
                } else {
                    _mm256_madd_epi16(dots[u], ones)
                };
                acc[u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[u]);
                acc[u] = _mm256_fmadd_ps(o, _mm256_set1_ps(*act.s.as_ptr().add(i)), acc[u]);
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
    }
}

/// [`group_a8`] for all sixteen rows in 512-bit vectors: `VPDPBUSD` adds a
/// lane's four nibbles times four broadcast activation bytes straight into
/// i32, half the instructions per multiply of 16-bit `VPDPWSSD`. Its
/// integer sums equal `group_a8`'s (both exact) and the float steps are
/// the same, so either CPU gives the same bits.
#[inline(always)]
unsafe fn group512_a8<const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    type F = Q41;
    let (k, stride) = (act.k, act.stride);
    let mut acc = [_mm512_setzero_ps(); M];
    let mask = _mm512_set1_epi8(0x0F);
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        prefetch_ahead(p, F::GROUP);
        let mut dots = [_mm512_setzero_si512(); M];
        for c in 0..4 {
            let x = _mm512_loadu_si512(p.add(F::QS + CHUNK_BYTES * c).cast());
            let lo = _mm512_and_si512(x, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask);
            for (r, dot) in dots.iter_mut().enumerate() {
                let a = act.q8.as_ptr().add((r0 + r) * k + 32 * b + 8 * c);
                *dot = dpbusd512_at::<0>(*dot, lo, a);
                *dot = dpbusd512_at::<4>(*dot, hi, a);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        let o = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(LANE_BYTES).cast()));
        for (c, (acc, dot)) in acc.iter_mut().zip(dots).enumerate() {
            let i = (r0 + c) * stride + b;
            let s = _mm512_mul_ps(d, _mm512_set1_ps(*act.d.as_ptr().add(i)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, *acc);
            *acc = _mm512_fmadd_ps(o, _mm512_set1_ps(*act.s.as_ptr().add(i)), *acc);
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm512_storeu_ps(out.as_mut_ptr(), acc);
    }
}

/// Q8_0 against 8-bit activations in natural order: each `VPDPBUSD`
/// multiplies four values of all sixteen rows by four broadcast activation
/// bytes, half the instructions per multiply of [`group512`]'s 16-bit
/// `VPDPWSSD`. The layout holds a row's values in pairs (`W_p`), so a
/// `VPERMW` brings `W_{2u}`'s and `W_{2u+1}`'s pairs of each row together
/// in its lane, and `VPDPBUSD`'s unsigned operand takes them +128 (a sign
/// flip); `128 · Σq` (`ActRows::sums`) comes off the block's integer sum,
/// which leaves the exact `Σ w·q` of the 16-bit kernels on the widened
/// values, and the float steps are [`group512`]'s: the same bits.
#[inline(always)]
unsafe fn group512_a8_q80<const M: usize>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    type F = Q80;
    let (k, stride, groups) = (act.k, act.stride, act.k / 32);
    let mut acc = [_mm512_setzero_ps(); M];
    // Word 2r of a lane pair: row r's pair from the first `W_p`, word
    // 2r + 1: from the second.
    let order: [i16; 32] = std::array::from_fn(|j| (j / 2 + 16 * (j % 2)) as i16);
    let order = _mm512_loadu_si512(order.as_ptr().cast());
    let flip = _mm512_set1_epi8(i8::MIN);
    for b in 0..nb {
        let p = g.add(b * F::GROUP);
        prefetch_ahead(p, F::GROUP);
        let mut dots = [_mm512_setzero_si512(); M];
        for u in 0..8 {
            let x = _mm512_loadu_si512(p.add(LANE_BYTES * (1 + 2 * u)).cast());
            let w = _mm512_xor_si512(_mm512_permutexvar_epi16(order, x), flip);
            for (r, dot) in dots.iter_mut().enumerate() {
                let a = act.q8.as_ptr().add((r0 + r) * k + 32 * b + 4 * u);
                *dot = dpbusd512_at::<0>(*dot, w, a);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        for (c, (acc, dot)) in acc.iter_mut().zip(dots).enumerate() {
            let i = (r0 + c) * stride + b;
            let offset = 128 * *act.sums.as_ptr().add((r0 + c) * groups + b);
            let dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(offset));
            let s = _mm512_mul_ps(d, _mm512_set1_ps(*act.d.as_ptr().add(i)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, *acc);
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        _mm512_storeu_ps(out.as_mut_ptr(), acc);
    }
}

/// Adds `x · w[r][at]` for each outlier to the group's sixteen results
/// `out[r]`: the values that [`group_a8`]'s 8-bit activations left out
/// (their `q` is 0), each against its Q4_1 column `d · q + m`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_outliers_q41(g: *const u8, outliers: &[Outlier], out: &mut [f32; ROWS]) {
    type F = Q41;
    let mask = _mm256_set1_epi32(0x0F);
    for o in outliers {
        let (b, i) = (o.at as usize / 32, o.at as usize % 32);
        let p = g.add(b * F::GROUP);
        // Value i is nibble i % 8 / 2 of the low (even i) or high half of
        // each row's word in chunk i / 8.
        let shift = _mm_cvtsi32_si128((16 * (i % 2) + 4 * (i % 8 / 2)) as i32);
        let x = _mm256_set1_ps(o.x);
        for u in 0..2 {
            let words = _mm256_loadu_si256(p.add(F::QS + CHUNK_BYTES * (i / 8) + 32 * u).cast());
            let q = _mm256_and_si256(_mm256_srl_epi32(words, shift), mask);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * u).cast()));
            let m = _mm256_cvtph_ps(_mm_loadu_si128(p.add(LANE_BYTES + 16 * u).cast()));
            let w = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), m);
            let r = out.as_mut_ptr().add(8 * u);
            _mm256_storeu_ps(r, _mm256_fmadd_ps(x, w, _mm256_loadu_ps(r)));
        }
    }
}

/// Adds `x · w[r][at]` for each outlier to the group's sixteen results
/// `out[r]`: the values Q8_0's 8-bit activations left out, each against
/// its column `d · q` (a multiply, then a fused multiply-add, as the
/// portable version for other CPUs does them).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_outliers_q80(g: *const u8, outliers: &[Outlier], out: &mut [f32; ROWS]) {
    let mut acc = [
        _mm256_loadu_ps(out.as_ptr()),
        _mm256_loadu_ps(out.as_ptr().add(8)),
    ];
    for o in outliers {
        let (p, words, up) = q80_column(g, o);
        let x = _mm256_set1_ps(o.x);
        for (u, acc) in acc.iter_mut().enumerate() {
            let words = _mm_loadu_si128(words.add(16 * u).cast());
            let q = _mm256_srai_epi32(_mm256_sll_epi32(_mm256_cvtepu16_epi32(words), up), 24);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * u).cast()));
            *acc = _mm256_fmadd_ps(x, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), *acc);
        }
    }
    _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
}

/// [`add_outliers_q80`] on 512-bit vectors, all sixteen rows at once.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn add_outliers_q80_512(
    g: *const u8,
    outliers: &[Outlier],
    out: &mut [f32; ROWS],
) {
    let mut acc = _mm512_loadu_ps(out.as_ptr());
    for o in outliers {
        let (p, words, up) = q80_column(g, o);
        let words = _mm256_loadu_si256(words.cast());
        let q = _mm512_srai_epi32(_mm512_sll_epi32(_mm512_cvtepu16_epi32(words), up), 24);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
        let w = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(o.x), w, acc);
    }
    _mm512_storeu_ps(out.as_mut_ptr(), acc);
}

/// Where outlier `o`'s column lies in a Q8_0 group: its block, the `W_p`
/// holding it and the left shift that takes its byte of each row's word
/// (value `i` of row `r` is byte `i % 2` of word `r` of `W_{i / 2}`) to the
/// top of an i32 lane, for an arithmetic shift down.
#[inline(always)]
unsafe fn q80_column(g: *const u8, o: &Outlier) -> (*const u8, *const u8, __m128i) {
    let (b, i) = (o.at as usize / 32, o.at as usize % 32);
    let p = g.add(b * Q80::GROUP);
    let up = _mm_cvtsi32_si128((24 - 8 * (i % 2)) as i32);
    (p, p.add(LANE_BYTES * (1 + i / 2)), up)
}

/// Calls `$kernel::<Format, M>($args)` for the type `$ty` and row count.
macro_rules! by_type {
    ($ty:expr, $m:expr, $kernel:ident($($arg:expr),*)) => {
        match $ty {
            GgmlType::Q4_0 => by_m!($m, M => $kernel::<Q40, M>($($arg),*)),
            GgmlType::Q4_1 => by_m!($m, M => $kernel::<Q41, M>($($arg),*)),
            GgmlType::Q5_0 => by_m!($m, M => $kernel::<Q50, M>($($arg),*)),
            GgmlType::Q5_1 => by_m!($m, M => $kernel::<Q51, M>($($arg),*)),
            GgmlType::Q8_0 => by_m!($m, M => $kernel::<Q80, M>($($arg),*)),
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
                by_m!($m, M => $kernel::<Levels<false>, M>($($arg),*))
            }
            GgmlType::MXFP4 => by_m!($m, M => $kernel::<Levels<true>, M>($($arg),*)),
            _ => unreachable!("interleaved kernel called for {}", $ty),
        }
    };
}

/// [`group_a8`] for up to eight rows: four and four more.
#[inline(always)]
unsafe fn a8_in_fours<const VEX: bool>(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    let (lo, hi) = out.split_at_mut(4);
    by_m!(m.min(4), M => group_a8::<M, VEX>(g, nb, act, r0, lo));
    if m > 4 {
        by_m!(m - 4, M => group_a8::<M, VEX>(g, nb, act, r0 + 4, hi));
    }
}

/// Q4_1 with 8-bit activations on AVX-VNNI ([`group_a8`] with `VEX`).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn dot_group_a8_avx_vnni(
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    a8_in_fours::<true>(g, nb, act, r0, m, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_group_avx2(
    ty: GgmlType,
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    if act.a8 && ty == GgmlType::Q4_1 {
        // Four rows and four more. (Q8_0's 8-bit values come widened to
        // 16 bits, `ActRows::widen8`, for the kernels below.)
        a8_in_fours::<false>(g, nb, act, r0, m, out);
        return;
    }
    // Five to eight rows: twice four rows unpacks the weights twice, which
    // the shared broadcasts more than pay for, except where the fifth bits
    // make unpacking dear: Q5_0/Q5_1 take one half for eight rows
    // (`gemm_quant` bench, m = 8; `docs/perf-log.md`).
    match m {
        1..=4 => by_type!(ty, m, group256x2(g, nb, act, r0, out)),
        _ if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) => {
            for u in 0..2 {
                by_type!(ty, m, group256(g, nb, act, r0, u, out))
            }
        }
        _ => {
            by_type!(ty, 4, group256x2(g, nb, act, r0, out));
            let rest = &mut out[4..];
            by_type!(ty, m - 4, group256x2(g, nb, act, r0 + 4, rest))
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_group_avx512(
    ty: GgmlType,
    g: *const u8,
    nb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    out: &mut [[f32; ROWS]; ACT_ROWS],
) {
    if act.a8 && ty == GgmlType::Q8_0 {
        by_m!(m, M => group512_a8_q80::<M>(g, nb, act, r0, out))
    } else if act.a8 {
        // Q4_1 (`dot_group` checked).
        by_m!(m, M => group512_a8::<M>(g, nb, act, r0, out))
    } else {
        by_type!(ty, m, group512(g, nb, act, r0, out))
    }
}
