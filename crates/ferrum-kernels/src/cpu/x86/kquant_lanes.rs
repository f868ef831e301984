//! The repacked k-quant kernels for x86-64: AVX2, and AVX-512 VNNI's
//! `VPDPBUSD` / `VPDPWSSD` on 256-bit vectors where the CPU has them (the
//! same integers, so the same results).

use std::arch::x86_64::*;

use ferrum_types::GgmlType;

use super::ActRows;
use crate::cpu::simd::prefetch_ahead;

/// The little-endian f16 at `p`, converted by F16C.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned().to_le();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// `x` shifted left by `s` bits in 16-bit lanes (right for negative `s`);
/// masked per byte afterwards, bits stay within their byte where needed.
#[inline(always)]
unsafe fn shift16(x: __m256i, s: i32) -> __m256i {
    match s.cmp(&0) {
        std::cmp::Ordering::Greater => _mm256_sll_epi16(x, _mm_cvtsi32_si128(s)),
        std::cmp::Ordering::Less => _mm256_srl_epi16(x, _mm_cvtsi32_si128(-s)),
        std::cmp::Ordering::Equal => x,
    }
}

/// One repacked format (the parent module describes the layout).
trait Lanes {
    const BYTES: usize;
    /// Q6_K: 16-value sub-blocks, `2j` in parts 0..4 and `2j + 1` in parts
    /// 4..8 of lane `j`, and unsigned values offset by 32.
    const SIXTEENS: bool;
    /// Parts whose `PMADDUBSW` results fit one 16-bit sum: at most
    /// `32767 / (2 · 127 · max q)`, rounded down to a power of two.
    const RUN: usize;
    /// `d`, `dmin` and the scale bytes: Q4_K/Q5_K's eight scales then eight
    /// minimums; Q6_K's sixteen signed scales.
    unsafe fn header(b: *const u8) -> (f32, f32, __m128i);
    /// The eight parts as unsigned bytes.
    unsafe fn parts(b: *const u8, out: &mut [__m256i; 8]);
}

/// Part `2u` and `2u + 1`'s low four bits from the 32 bytes at `p`.
#[inline(always)]
unsafe fn nibble_parts(p: *const u8, out: &mut [__m256i; 8]) {
    let mask = _mm256_set1_epi8(0x0F);
    for u in 0..4 {
        let x = _mm256_loadu_si256(p.add(32 * u).cast());
        out[2 * u] = _mm256_and_si256(x, mask);
        out[2 * u + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
    }
}

/// Q4_K's and Q5_K's 12 bytes of 6-bit scales and minimums, unpacked to
/// eight scale bytes then eight minimum bytes (ggml's arrangement of the
/// packing, done on words).
#[inline(always)]
unsafe fn k4_header(b: *const u8) -> (f32, f32, __m128i) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let word = |i: usize| b.add(4 + 4 * i).cast::<u32>().read_unaligned().to_le();
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let mins_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let mins_lo = u1 & K1;
    let scales_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let scales_lo = u0 & K1;
    let bytes = _mm_setr_epi32(
        scales_lo as i32,
        scales_hi as i32,
        mins_lo as i32,
        mins_hi as i32,
    );
    (f16_at(b), f16_at(b.add(2)), bytes)
}

struct Q4K;
impl Lanes for Q4K {
    const BYTES: usize = 144;
    const SIXTEENS: bool = false;
    const RUN: usize = 8;
    #[inline(always)]
    unsafe fn header(b: *const u8) -> (f32, f32, __m128i) {
        k4_header(b)
    }
    #[inline(always)]
    unsafe fn parts(b: *const u8, out: &mut [__m256i; 8]) {
        nibble_parts(b.add(16), out);
    }
}

struct Q5K;
impl Lanes for Q5K {
    const BYTES: usize = 176;
    const SIXTEENS: bool = false;
    const RUN: usize = 4;
    #[inline(always)]
    unsafe fn header(b: *const u8) -> (f32, f32, __m128i) {
        k4_header(b)
    }
    #[inline(always)]
    unsafe fn parts(b: *const u8, out: &mut [__m256i; 8]) {
        nibble_parts(b.add(48), out);
        // Bit h of the plane's bytes moves to bit 4.
        let qh = _mm256_loadu_si256(b.add(16).cast());
        let bit = _mm256_set1_epi8(0x10);
        for (h, part) in out.iter_mut().enumerate() {
            let high = _mm256_and_si256(shift16(qh, 4 - h as i32), bit);
            *part = _mm256_or_si256(*part, high);
        }
    }
}

struct Q6K;
impl Lanes for Q6K {
    const BYTES: usize = 210;
    const SIXTEENS: bool = true;
    const RUN: usize = 2;
    #[inline(always)]
    unsafe fn header(b: *const u8) -> (f32, f32, __m128i) {
        (f16_at(b.add(208)), 0.0, _mm_loadu_si128(b.add(192).cast()))
    }
    #[inline(always)]
    unsafe fn parts(b: *const u8, out: &mut [__m256i; 8]) {
        nibble_parts(b, out);
        // Bits 2i, 2i + 1 of plane u's bytes move to bits 4, 5 of part 4u + i.
        let bits = _mm256_set1_epi8(0x30);
        for u in 0..2 {
            let qh = _mm256_loadu_si256(b.add(128 + 32 * u).cast());
            for i in 0..4 {
                let high = _mm256_and_si256(shift16(qh, 4 - 2 * i as i32), bits);
                out[4 * u + i] = _mm256_or_si256(out[4 * u + i], high);
            }
        }
    }
}

/// Bytes `idx` of `x` (a byte shuffle within 128 bits).
#[inline(always)]
unsafe fn pick(x: __m128i, idx: [i8; 16]) -> __m128i {
    _mm_shuffle_epi8(x, _mm_loadu_si128(idx.as_ptr().cast()))
}

/// `VPDPBUSD` (unsigned `w` bytes times signed `a` bytes, four products
/// per i32 lane) and `VPDPWSSD` in inline assembly: from the intrinsics,
/// LLVM's generic tuning splits them back into two instructions each.
/// Only reached from the VNNI entry point, whose target features let them
/// inline.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn dpbusd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpbusd {d:y}, {w:y}, {a:y}",
        d = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(zmm_reg) a,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn dpwssd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpwssd {d:y}, {w:y}, {a:y}",
        d = inout(zmm_reg) acc,
        w = in(zmm_reg) w,
        a = in(zmm_reg) a,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `acc` plus, per i32 lane, the two products of its pair of i16 lanes.
#[inline(always)]
unsafe fn dot16<const VNNI: bool>(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    if VNNI {
        dpwssd(acc, w, a)
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
    }
}

/// The sum of eight lanes, in a fixed order.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// One weight row's super-block as the 8-bit kernels use it: scales for
/// parts 0..4 and 4..8 (the same but for Q6_K) as i16 pairs per lane
/// (`PMADDWD`) and as i32 lanes (VNNI), Q6_K's sixteen scales as i16 (its
/// offset), and the float factors.
#[derive(Clone, Copy)]
struct Scales8 {
    s16: [__m256i; 2],
    s32: [__m256i; 2],
    nat: __m256i,
    d: __m256,
    minsd: __m256,
}

#[inline(always)]
unsafe fn scales8<F: Lanes>(d: f32, dmin: f32, sb: __m128i) -> Scales8 {
    let mins = _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(sb));
    let (d, minsd) = (
        _mm256_set1_ps(d),
        _mm256_mul_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(dmin)),
    );
    if F::SIXTEENS {
        let sa = pick(sb, [0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14]);
        let sbb = pick(sb, [1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15]);
        let even = pick(sb, [0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0]);
        let odd = pick(sb, [1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0]);
        Scales8 {
            s16: [_mm256_cvtepi8_epi16(sa), _mm256_cvtepi8_epi16(sbb)],
            s32: [_mm256_cvtepi8_epi32(even), _mm256_cvtepi8_epi32(odd)],
            nat: _mm256_cvtepi8_epi16(sb),
            d,
            minsd,
        }
    } else {
        let s16 = _mm256_cvtepu8_epi16(pick(sb, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]));
        let s32 = _mm256_cvtepu8_epi32(sb);
        Scales8 {
            s16: [s16; 2],
            s32: [s32; 2],
            nat: _mm256_setzero_si256(),
            d,
            minsd,
        }
    }
}

/// A tile of `R` weight rows (their unpacked `parts` and scales) by `N`
/// activation rows (at `a[i]`, one super-block each): per lane `j`, the sum
/// of part · activation times the scale of the part's sub-block. Each
/// part's load feeds `N` multiplies and each activation load `R`. The
/// `PMADDWD` route and the VNNI one give the same integers, as no sum
/// overflows. (No closures here: they would not inherit the caller's
/// target features, and their intrinsics would become calls.)
#[inline(always)]
unsafe fn tile<F: Lanes, const VNNI: bool, const R: usize, const N: usize>(
    parts: &[[__m256i; 8]; R],
    sc: &[Scales8; R],
    a: [*const i8; N],
) -> [[__m256i; N]; R] {
    let zero = _mm256_setzero_si256();
    let mut x = [[zero; N]; R];
    if VNNI {
        let mut y = [[[zero; N]; R]; 2];
        for h in 0..8 {
            for i in 0..N {
                let av = _mm256_loadu_si256(a[i].add(32 * h).cast());
                for r in 0..R {
                    y[h / 4][r][i] = dpbusd(y[h / 4][r][i], parts[r][h], av);
                }
            }
        }
        for r in 0..R {
            for i in 0..N {
                x[r][i] = if F::SIXTEENS {
                    _mm256_add_epi32(
                        _mm256_mullo_epi32(y[0][r][i], sc[r].s32[0]),
                        _mm256_mullo_epi32(y[1][r][i], sc[r].s32[1]),
                    )
                } else {
                    _mm256_mullo_epi32(_mm256_add_epi32(y[0][r][i], y[1][r][i]), sc[r].s32[0])
                };
            }
        }
    } else {
        for run in 0..8 / F::RUN {
            let mut s = [[zero; N]; R];
            for p in 0..F::RUN {
                let h = F::RUN * run + p;
                for i in 0..N {
                    let av = _mm256_loadu_si256(a[i].add(32 * h).cast());
                    for r in 0..R {
                        s[r][i] = _mm256_add_epi16(s[r][i], _mm256_maddubs_epi16(parts[r][h], av));
                    }
                }
            }
            let set = F::RUN * run / 4;
            for r in 0..R {
                for i in 0..N {
                    x[r][i] = _mm256_add_epi32(x[r][i], _mm256_madd_epi16(s[r][i], sc[r].s16[set]));
                }
            }
        }
    }
    x
}

/// Activation rows `c0..c0 + N` against the tile's rows for super-block
/// `bi`, added to `acc`: per lane, `float(Σ) · d_a · d`, less Q4_K/Q5_K's
/// `dmin · m · d_a·Σa` (`d_a` the lane's 32-value activation scale).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_into<F: Lanes, const VNNI: bool, const R: usize, const N: usize, const M: usize>(
    parts: &[[__m256i; 8]; R],
    sc: &[Scales8; R],
    act: &ActRows,
    r0: usize,
    c0: usize,
    bi: usize,
    acc: &mut [[__m256; M]; R],
) {
    let (k, stride) = (act.k, act.stride);
    let mut a = [act.q8.as_ptr(); N];
    for (i, a) in a.iter_mut().enumerate() {
        *a = a.add((r0 + c0 + i) * k + 256 * bi);
    }
    let x = tile::<F, VNNI, R, N>(parts, sc, a);
    for i in 0..N {
        let c = c0 + i;
        let at = (r0 + c) * stride + 8 * bi;
        let da = _mm256_loadu_ps(act.d.as_ptr().add(at));
        let sa = _mm256_loadu_ps(act.s.as_ptr().add(at));
        let s16 = _mm256_loadu_si256(act.sums16.as_ptr().add((r0 + c) * k / 16 + 16 * bi).cast());
        for r in 0..R {
            let mut x = x[r][i];
            if F::SIXTEENS {
                let offset = _mm256_slli_epi32(_mm256_madd_epi16(sc[r].nat, s16), 5);
                x = _mm256_sub_epi32(x, offset);
            }
            let y = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(x), da), sc[r].d, acc[r][c]);
            acc[r][c] = if F::SIXTEENS {
                y
            } else {
                _mm256_fnmadd_ps(sc[r].minsd, sa, y)
            };
        }
    }
}

/// `R` weight rows from `row` against `M` activation rows in tiles of up
/// to four.
#[inline(always)]
unsafe fn row_tile<F: Lanes, const VNNI: bool, const M: usize, const R: usize>(
    rows: [*const u8; R],
    act: &ActRows,
    r0: usize,
    dots: &mut [[f32; 8]],
) {
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let mut parts = [[_mm256_setzero_si256(); 8]; R];
    let zero = scales8::<F>(0.0, 0.0, _mm_setzero_si128());
    let mut sc = [zero; R];
    for bi in 0..act.k / 256 {
        for r in 0..R {
            let b = rows[r].add(bi * F::BYTES);
            prefetch_ahead(b, F::BYTES);
            let (d, dmin, sb) = F::header(b);
            F::parts(b, &mut parts[r]);
            sc[r] = scales8::<F>(d, dmin, sb);
        }
        for c0 in (0..M).step_by(4) {
            match M - c0 {
                1 => tile_into::<F, VNNI, R, 1, M>(&parts, &sc, act, r0, c0, bi, &mut acc),
                2 => tile_into::<F, VNNI, R, 2, M>(&parts, &sc, act, r0, c0, bi, &mut acc),
                3 => tile_into::<F, VNNI, R, 3, M>(&parts, &sc, act, r0, c0, bi, &mut acc),
                _ => tile_into::<F, VNNI, R, 4, M>(&parts, &sc, act, r0, c0, bi, &mut acc),
            }
        }
    }
    for (dots, acc) in dots.iter_mut().zip(&acc) {
        for (dot, acc) in dots.iter_mut().zip(acc) {
            *dot = hsum(*acc);
        }
    }
}

/// 8-bit activations ([`super::order8`]): weight rows in pairs.
#[inline(always)]
unsafe fn rows8<F: Lanes, const VNNI: bool, const M: usize>(
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    dots: &mut [[f32; 8]],
) {
    let n = dots.len();
    for j in (0..n).step_by(2) {
        let row = w.add(j * row_bytes);
        if j + 1 < n {
            let rows = [row, row.add(row_bytes)];
            row_tile::<F, VNNI, M, 2>(rows, act, r0, &mut dots[j..j + 2]);
        } else {
            row_tile::<F, VNNI, M, 1>([row], act, r0, &mut dots[j..]);
        }
    }
}

/// 16-bit activations ([`super::order16`], one scale per super-block):
/// parts widened to i16 (Q6_K's made signed first), each activation row's
/// lane sums scaled per sub-block, `acc += (float(Σ)·d − float(Σm·Σa)·dmin)
/// · d_a`.
#[inline(always)]
unsafe fn rows16<F: Lanes, const VNNI: bool, const M: usize>(
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    dots: &mut [[f32; 8]],
) {
    let (k, stride, nsums) = (act.k, act.stride, act.k / 32);
    let qs = act.qs.as_ptr().add(r0 * k);
    let ds = act.d.as_ptr().add(r0 * stride);
    let sums = act.sums.as_ptr().add(r0 * nsums);
    for (j, dots) in dots.iter_mut().enumerate() {
        let row = w.add(j * row_bytes);
        let mut acc = [_mm256_setzero_ps(); M];
        for bi in 0..k / 256 {
            let b = row.add(bi * F::BYTES);
            prefetch_ahead(b, F::BYTES);
            let (d, dmin, sb) = F::header(b);
            let mut parts = [_mm256_setzero_si256(); 8];
            F::parts(b, &mut parts);
            // Each part as i16: lanes 0, 1, 4, 5 (`lo`), then 2, 3, 6, 7.
            let mut wide = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 8];
            for (part, wide) in parts.iter().zip(wide.iter_mut()) {
                let (x, high) = if F::SIXTEENS {
                    let x = _mm256_sub_epi8(*part, _mm256_set1_epi8(32));
                    (x, _mm256_cmpgt_epi8(_mm256_setzero_si256(), x))
                } else {
                    (*part, _mm256_setzero_si256())
                };
                *wide = (_mm256_unpacklo_epi8(x, high), _mm256_unpackhi_epi8(x, high));
            }
            let dv = _mm256_set1_ps(d);
            if F::SIXTEENS {
                let lo_a = scales32(sb, [0, 0, 2, 2, 8, 8, 10, 10, 0, 0, 0, 0, 0, 0, 0, 0], true);
                let lo_b = scales32(sb, [1, 1, 3, 3, 9, 9, 11, 11, 0, 0, 0, 0, 0, 0, 0, 0], true);
                let hi_a = scales32(
                    sb,
                    [4, 4, 6, 6, 12, 12, 14, 14, 0, 0, 0, 0, 0, 0, 0, 0],
                    true,
                );
                let hi_b = scales32(
                    sb,
                    [5, 5, 7, 7, 13, 13, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0],
                    true,
                );
                for (c, acc) in acc.iter_mut().enumerate() {
                    let a = qs.add(c * k + 256 * bi);
                    let (la, ha) = lane_dot::<VNNI>(a, &wide[..4]);
                    let (lb, hb) = lane_dot::<VNNI>(a.add(128), &wide[4..]);
                    let x = _mm256_add_epi32(
                        _mm256_add_epi32(
                            _mm256_mullo_epi32(la, lo_a),
                            _mm256_mullo_epi32(ha, hi_a),
                        ),
                        _mm256_add_epi32(
                            _mm256_mullo_epi32(lb, lo_b),
                            _mm256_mullo_epi32(hb, hi_b),
                        ),
                    );
                    let da = _mm256_set1_ps(*ds.add(c * stride + bi));
                    *acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(x), dv), da, *acc);
                }
            } else {
                let sc_lo = scales32(sb, [0, 0, 1, 1, 4, 4, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0], false);
                let sc_hi = scales32(sb, [2, 2, 3, 3, 6, 6, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0], false);
                let mins = _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(sb));
                let dminv = _mm256_set1_ps(-dmin);
                for (c, acc) in acc.iter_mut().enumerate() {
                    let a = qs.add(c * k + 256 * bi);
                    let (lo, hi) = lane_dot::<VNNI>(a, &wide);
                    let x = _mm256_add_epi32(
                        _mm256_mullo_epi32(lo, sc_lo),
                        _mm256_mullo_epi32(hi, sc_hi),
                    );
                    let s = _mm256_loadu_si256(sums.add(c * nsums + 8 * bi).cast());
                    let m = _mm256_cvtepi32_ps(_mm256_mullo_epi32(s, mins));
                    let x = _mm256_fmadd_ps(m, dminv, _mm256_mul_ps(_mm256_cvtepi32_ps(x), dv));
                    let da = _mm256_set1_ps(*ds.add(c * stride + bi));
                    *acc = _mm256_fmadd_ps(x, da, *acc);
                }
            }
        }
        for (dot, acc) in dots.iter_mut().zip(&acc) {
            *dot = hsum(*acc);
        }
    }
}

/// Per i32 lane (of `PMADDWD` on a widened part), the scale of its
/// sub-block: `idx` picks the scale bytes, sign-extended if `signed`.
#[inline(always)]
unsafe fn scales32(sb: __m128i, idx: [i8; 16], signed: bool) -> __m256i {
    if signed {
        _mm256_cvtepi8_epi32(pick(sb, idx))
    } else {
        _mm256_cvtepu8_epi32(pick(sb, idx))
    }
}

/// Lane sums of a run of widened parts (`lo`, `hi` halves) with the
/// 16-bit activations at `a` (32 per part).
#[inline(always)]
unsafe fn lane_dot<const VNNI: bool>(
    a: *const i16,
    parts: &[(__m256i, __m256i)],
) -> (__m256i, __m256i) {
    let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for (h, &(wl, wh)) in parts.iter().enumerate() {
        let p = a.add(32 * h);
        lo = dot16::<VNNI>(lo, wl, _mm256_loadu_si256(p.cast()));
        hi = dot16::<VNNI>(hi, wh, _mm256_loadu_si256(p.add(16).cast()));
    }
    (lo, hi)
}

#[inline(always)]
unsafe fn by_type<const VNNI: bool>(
    ty: GgmlType,
    w: *const u8,
    rb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    macro_rules! run {
        ($f:ty) => {
            if act.a8 {
                by_m!(m, M => rows8::<$f, VNNI, M>(w, rb, act, r0, dots))
            } else {
                by_m!(m, M => rows16::<$f, VNNI, M>(w, rb, act, r0, dots))
            }
        };
    }
    match ty {
        GgmlType::Q4_K => run!(Q4K),
        GgmlType::Q5_K => run!(Q5K),
        GgmlType::Q6_K => run!(Q6K),
        _ => unreachable!("k-quant dot_rows called for {ty}"),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_avx2(
    ty: GgmlType,
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    by_type::<false>(ty, w, row_bytes, act, r0, m, dots)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn dot_rows_vnni(
    ty: GgmlType,
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    by_type::<true>(ty, w, row_bytes, act, r0, m, dots)
}
