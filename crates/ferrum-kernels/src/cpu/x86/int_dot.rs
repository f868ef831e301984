use std::arch::x86_64::*;

use ferrum_types::GgmlType;

use super::{ActRows, SUM_GROUP};
use crate::cpu::simd::prefetch_ahead;
use crate::quant::scale_min_k4;

/// The little-endian f16 at `p`, converted by F16C.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned().to_le();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Byte-wise nibble `hi` (0 low, 1 high) of the 32 bytes at `p`.
#[inline(always)]
unsafe fn nibbles32(p: *const u8, hi: bool) -> __m256i {
    let q = _mm256_loadu_si256(p.cast());
    let q = if hi { _mm256_srli_epi16(q, 4) } else { q };
    _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
}

/// A 256-value super-block: integer scales per 16 values, an f32 scale
/// and (when `MINS`) minimums per 32 values scaled by `dmin`.
struct KHeader {
    d: f32,
    dmin: f32,
    scales: [i16; 16],
    mins: [i32; 8],
}

trait KQuant {
    const BYTES: usize;
    const UNSIGNED: bool;
    const MINS: bool;
    unsafe fn header(b: *const u8, h: &mut KHeader);
    /// Group `g`'s 32 values as bytes (u8 if `UNSIGNED`, else i8).
    unsafe fn bytes(b: *const u8, g: usize) -> __m256i;
}

/// Q4_K and Q5_K share the header: d, dmin, 12 bytes of packed 6-bit
/// sub-block scales and minimums.
#[inline(always)]
unsafe fn k4_header(b: *const u8, h: &mut KHeader) {
    (h.d, h.dmin) = (f16_at(b), f16_at(b.add(2)));
    let packed = std::slice::from_raw_parts(b.add(4), 12);
    for g in 0..8 {
        let (s, m) = scale_min_k4(g, packed);
        h.scales[2 * g] = i16::from(s);
        h.scales[2 * g + 1] = i16::from(s);
        h.mins[g] = i32::from(m);
    }
}

struct Q4K;
impl KQuant for Q4K {
    const BYTES: usize = 144;
    const UNSIGNED: bool = true;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn header(b: *const u8, h: &mut KHeader) {
        k4_header(b, h);
    }
    #[inline(always)]
    unsafe fn bytes(b: *const u8, g: usize) -> __m256i {
        nibbles32(b.add(16 + 32 * (g / 2)), g % 2 == 1)
    }
}

struct Q5K;
impl KQuant for Q5K {
    const BYTES: usize = 176;
    const UNSIGNED: bool = true;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn header(b: *const u8, h: &mut KHeader) {
        k4_header(b, h);
    }
    #[inline(always)]
    unsafe fn bytes(b: *const u8, g: usize) -> __m256i {
        // Bit g of each of the 32 `qh` bytes is the fifth bit of group g.
        let qh = _mm256_loadu_si256(b.add(16).cast());
        let bit = _mm256_set1_epi8((1u8 << g) as i8);
        let hit = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        let high = _mm256_and_si256(hit, _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(b.add(48 + 32 * (g / 2)), g % 2 == 1), high)
    }
}

struct Q6K;
impl KQuant for Q6K {
    const BYTES: usize = 210;
    const UNSIGNED: bool = false;
    const MINS: bool = false;
    #[inline(always)]
    unsafe fn header(b: *const u8, h: &mut KHeader) {
        h.d = f16_at(b.add(208));
        for (i, s) in h.scales.iter_mut().enumerate() {
            *s = i16::from(*b.add(192 + i) as i8);
        }
    }
    #[inline(always)]
    unsafe fn bytes(b: *const u8, g: usize) -> __m256i {
        // Group g = 4·half + j: low bits from `ql` (nibble j / 2 of the
        // 32 bytes at 64·half + 32·(j % 2)), bits 4..6 from bits 2j..2j+2
        // of the 32 `qh` bytes at 128 + 32·half; the values are q - 32.
        let (half, j) = (g / 4, g % 4);
        let low = nibbles32(b.add(64 * half + 32 * (j % 2)), j >= 2);
        let qh = _mm256_loadu_si256(b.add(128 + 32 * half).cast());
        let qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32));
        let high = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4);
        _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32))
    }
}

/// 32 bytes widened to two vectors of 16 i16 within their 128-bit
/// lanes: values 0..8 and 16..24, then 8..16 and 24..32 (the order of
/// [`super::order_activations`]).
#[inline(always)]
unsafe fn widen(v: __m256i, unsigned: bool) -> (__m256i, __m256i) {
    let high = if unsigned {
        _mm256_setzero_si256()
    } else {
        _mm256_cmpgt_epi8(_mm256_setzero_si256(), v)
    };
    (_mm256_unpacklo_epi8(v, high), _mm256_unpackhi_epi8(v, high))
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

/// `VPDPWSSD` in inline assembly: from the intrinsic, LLVM's generic
/// tuning splits it back into `VPMADDWD` + `VPADDD`. Only reached from
/// the VNNI entry point, whose target features let it inline this.
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

/// The sum of eight lanes, in a fixed order.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The `R` weight rows from row `j` of `n` rows (past the end, the last
/// row again: its results are computed twice and stored once).
#[inline(always)]
unsafe fn row_ptrs<const R: usize>(
    w: *const u8,
    row_bytes: usize,
    j: usize,
    n: usize,
) -> [*const u8; R] {
    std::array::from_fn(|r| w.add((j + r).min(n - 1) * row_bytes))
}

/// K-quant super-blocks: the weights times their integer sub-block
/// scales stay integers, so a whole 256-value block accumulates in i32
/// lanes and is converted and scaled once (the activations have one
/// scale per 256 values for these types). `R` weight rows at a time, as
/// for the legacy blocks.
#[inline(always)]
unsafe fn k_rows<F: KQuant, const VNNI: bool, const M: usize, const R: usize>(
    w: *const u8,
    row_bytes: usize,
    act: &ActRows,
    r0: usize,
    dots: &mut [[f32; 8]],
) {
    let (k, stride, nsums, n) = (act.k, act.stride, act.k / SUM_GROUP, dots.len());
    let qs = act.qs.as_ptr().add(r0 * k);
    let ds = act.d.as_ptr().add(r0 * stride);
    let sums = act.sums.as_ptr().add(r0 * nsums);
    let mut h = [(); R].map(|_| KHeader {
        d: 0.0,
        dmin: 0.0,
        scales: [0; 16],
        mins: [0; 8],
    });
    for j in (0..n).step_by(R) {
        let w = row_ptrs::<R>(w, row_bytes, j, n);
        let mut acc = [[_mm256_setzero_ps(); M]; R];
        for bi in 0..k / 256 {
            let p = w.map(|w| w.add(bi * F::BYTES));
            for (p, h) in p.iter().zip(h.iter_mut()) {
                prefetch_ahead(*p, F::BYTES);
                F::header(*p, h);
            }
            let mut iacc = [[_mm256_setzero_si256(); M]; R];
            for g in 0..8 {
                let mut wv = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                for (r, v) in wv.iter_mut().enumerate() {
                    let (lo, hi) = widen(F::bytes(p[r], g), F::UNSIGNED);
                    // Each vector holds eight values of either 16-value
                    // sub-block: the first scale in the low lane.
                    let scale = _mm256_set_m128i(
                        _mm_set1_epi16(h[r].scales[2 * g + 1]),
                        _mm_set1_epi16(h[r].scales[2 * g]),
                    );
                    *v = (_mm256_mullo_epi16(lo, scale), _mm256_mullo_epi16(hi, scale));
                }
                for c in 0..M {
                    let a = qs.add(c * k + 256 * bi + 32 * g);
                    let (a0, a1) = (
                        _mm256_loadu_si256(a.cast()),
                        _mm256_loadu_si256(a.add(16).cast()),
                    );
                    for (iacc, &(lo, hi)) in iacc.iter_mut().zip(&wv) {
                        iacc[c] = dot16::<VNNI>(dot16::<VNNI>(iacc[c], lo, a0), hi, a1);
                    }
                }
            }
            for r in 0..R {
                let mins = _mm256_loadu_si256(h[r].mins.as_ptr().cast());
                let (d, dmin) = (_mm256_set1_ps(h[r].d), _mm256_set1_ps(-h[r].dmin));
                for c in 0..M {
                    let da = _mm256_set1_ps(*ds.add(c * stride + bi));
                    let mut x = _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[r][c]), d);
                    if F::MINS {
                        let s = _mm256_loadu_si256(sums.add(c * nsums + 8 * bi).cast());
                        let m = _mm256_cvtepi32_ps(_mm256_mullo_epi32(s, mins));
                        x = _mm256_fmadd_ps(m, dmin, x);
                    }
                    acc[r][c] = _mm256_fmadd_ps(x, da, acc[r][c]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(n - j) {
            for (c, acc) in acc.iter().enumerate() {
                dots[j + r][c] = hsum(*acc);
            }
        }
    }
}

/// Weight rows per k-quant kernel pass for `m` activation rows: one or
/// two rows are too little data to share, so the weight rows go one at
/// a time (more independent work per row in flight); from three on,
/// two weight rows share each activation load. Either way each output
/// is computed by the same instructions.
const fn k_pair(m: usize) -> usize {
    if m >= 3 {
        2
    } else {
        1
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn by_type<const VNNI: bool>(
    ty: GgmlType,
    w: *const u8,
    rb: usize,
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
) {
    match ty {
        GgmlType::Q4_K => {
            by_m!(m, M => k_rows::<Q4K, VNNI, M, { k_pair(M) }>(w, rb, act, r0, dots))
        }
        GgmlType::Q5_K => {
            by_m!(m, M => k_rows::<Q5K, VNNI, M, { k_pair(M) }>(w, rb, act, r0, dots))
        }
        GgmlType::Q6_K => {
            by_m!(m, M => k_rows::<Q6K, VNNI, M, { k_pair(M) }>(w, rb, act, r0, dots))
        }
        _ => unreachable!("integer dot_rows called for {ty} without a kernel"),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_rows_avx2(
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
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_rows_vnni(
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
