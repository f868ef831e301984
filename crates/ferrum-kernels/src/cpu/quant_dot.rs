//! Fused dequantize-and-dot for decode-sized batches (AVX2 + FMA).
//!
//! Each 32-value group of a weight row is decoded straight into four
//! eight-lane registers and multiplied into up to eight activation rows, so
//! the weight is read once from memory and never written back as f32.
//! Types without a kernel here go through row dequantization instead.

use ferrum_types::GgmlType;

use super::simd;

/// Whether [`dot_rows`] handles `ty` on this CPU.
pub(crate) fn supports(ty: GgmlType) -> bool {
    simd::has_avx2()
        && has_f16c()
        && matches!(
            ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q4_K
                | GgmlType::Q6_K
        )
}

fn has_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dots[i] = a[i, :] · dequant(row)` for `m = dots.len() ≤ 8` rows of `a`
/// (`[m, k]`). The caller checks [`supports`] and that `row` holds exactly
/// the blocks of `k` values.
pub(crate) fn dot_rows(ty: GgmlType, row: &[u8], a: &[f32], k: usize, dots: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert!(supports(ty) && dots.len() <= 8 && a.len() >= dots.len() * k);
        // SAFETY: `supports` checked AVX2/FMA/F16C; the caller guarantees the
        // row and activation extents that the kernels index within.
        unsafe { x86::dot_rows(ty, row, a, k, dots) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, row, a, k, dots);
        unreachable!("supports() is false off x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use ferrum_types::GgmlType;

    use crate::quant::scale_min_k4;

    /// The little-endian f16 at `b[i..i + 2]`, converted by F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_at(b: &[u8], i: usize) -> f32 {
        let bits = u16::from_le_bytes([b[i], b[i + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// Accumulators for up to eight activation rows: four per row for one
    /// or two rows, so the FMAs of one group are independent (one chain
    /// would be bound by FMA latency, not by memory); one per row from
    /// three rows on, where the rows' chains interleave.
    struct Acc<const M: usize> {
        acc: [[__m256; 4]; M],
    }

    impl<const M: usize> Acc<M> {
        /// Adds `w · a[i, off..off + 32]` for every row `i`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn add(&mut self, w: &[__m256; 4], a: *const f32, k: usize, off: usize) {
            for i in 0..M {
                let p = a.add(i * k + off);
                let s = &mut self.acc[i];
                if M <= 2 {
                    s[0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(p), s[0]);
                    s[1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(p.add(8)), s[1]);
                    s[2] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(p.add(16)), s[2]);
                    s[3] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(p.add(24)), s[3]);
                } else {
                    // With three or more rows their chains already overlap;
                    // one accumulator per row keeps M + 4 values in the 16
                    // ymm registers (4 per row would spill from M = 3 on).
                    let mut t = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(p), s[0]);
                    t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(p.add(8)), t);
                    t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(p.add(16)), t);
                    s[0] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(p.add(24)), t);
                }
            }
        }
    }

    /// Sixteen bytes as two groups of eight i32 lanes (zero-extended).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn u8x16_to_i32(v: __m128i) -> (__m256i, __m256i) {
        (
            _mm256_cvtepu8_epi32(v),
            _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)),
        )
    }

    /// 32 unsigned values in two 16-byte halves → four f32 groups, `v·d + b`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn affine(lo: __m128i, hi: __m128i, d: __m256, b: __m256) -> [__m256; 4] {
        let (a0, a1) = u8x16_to_i32(lo);
        let (a2, a3) = u8x16_to_i32(hi);
        [
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), d, b),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), d, b),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(a2), d, b),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(a3), d, b),
        ]
    }

    /// Low and high nibbles of 16 bytes: the values of elements 0..16 and
    /// 16..32 of a legacy 4-bit block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(qs: *const u8) -> (__m128i, __m128i) {
        let v = _mm_loadu_si128(qs.cast());
        let mask = _mm_set1_epi8(0x0F);
        (
            _mm_and_si128(v, mask),
            _mm_and_si128(_mm_srli_epi16(v, 4), mask),
        )
    }

    /// Spreads 16 bits over 16 bytes: byte `e` is 0x10 when bit `e` is set.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn spread(bits: u32) -> __m128i {
        let rep = |b: u32| (0x0101_0101_0101_0101u64 * u64::from(b & 0xFF)) as i64;
        let bytes = _mm_set_epi64x(rep(bits >> 8), rep(bits));
        let sel = _mm_set_epi8(-128, 64, 32, 16, 8, 4, 2, 1, -128, 64, 32, 16, 8, 4, 2, 1);
        let hit = _mm_cmpeq_epi8(_mm_and_si128(bytes, sel), sel);
        _mm_and_si128(hit, _mm_set1_epi8(0x10))
    }

    /// Bits `shift..shift + 2` of each byte of `qh`, moved to bits 4..6.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_high(qh: __m256i, shift: i32) -> __m256i {
        let h = match shift {
            0 => qh,
            2 => _mm256_srli_epi16(qh, 2),
            4 => _mm256_srli_epi16(qh, 4),
            _ => _mm256_srli_epi16(qh, 6),
        };
        _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x03)), 4)
    }

    /// `(x - 32) · s` for eight i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_scale(x: __m256i, s: f32) -> __m256 {
        _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_sub_epi32(x, _mm256_set1_epi32(32))),
            _mm256_set1_ps(s),
        )
    }

    /// Adds the fifth bits of Q5 values: bit `e` of `qh` becomes `16` on
    /// element `e` (elements 0..16 in `lo`, 16..32 in `hi`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fifth_bits(lo: __m128i, hi: __m128i, qh: u32) -> (__m128i, __m128i) {
        (
            _mm_or_si128(lo, spread(qh & 0xFFFF)),
            _mm_or_si128(hi, spread(qh >> 16)),
        )
    }

    /// Dispatches on the row count so each kernel is compiled for a fixed
    /// `M`: its loops unroll and the accumulators stay in registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows(ty: GgmlType, row: &[u8], a: &[f32], k: usize, dots: &mut [f32]) {
        match dots.len() {
            1 => dot_rows_m::<1>(ty, row, a, k, dots),
            2 => dot_rows_m::<2>(ty, row, a, k, dots),
            3 => dot_rows_m::<3>(ty, row, a, k, dots),
            4 => dot_rows_m::<4>(ty, row, a, k, dots),
            5 => dot_rows_m::<5>(ty, row, a, k, dots),
            6 => dot_rows_m::<6>(ty, row, a, k, dots),
            7 => dot_rows_m::<7>(ty, row, a, k, dots),
            _ => dot_rows_m::<8>(ty, row, a, k, dots),
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_rows_m<const M: usize>(
        ty: GgmlType,
        row: &[u8],
        a: &[f32],
        k: usize,
        dots: &mut [f32],
    ) {
        let mut acc = Acc::<M> {
            acc: [[_mm256_setzero_ps(); 4]; M],
        };
        let pa = a.as_ptr();
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        for (bi, b) in row.chunks_exact(bb).enumerate() {
            let off = bi * bs;
            let p = b.as_ptr();
            match ty {
                GgmlType::Q8_0 => {
                    let d = _mm256_set1_ps(f16_at(b, 0));
                    let mut w = [_mm256_setzero_ps(); 4];
                    for (g, wg) in w.iter_mut().enumerate() {
                        let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(2 + 8 * g).cast()));
                        *wg = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
                    }
                    acc.add(&w, pa, k, off);
                }
                GgmlType::Q4_0 => {
                    let d = f16_at(b, 0);
                    let (lo, hi) = nibbles(p.add(2));
                    acc.add(
                        &affine(lo, hi, _mm256_set1_ps(d), _mm256_set1_ps(-8.0 * d)),
                        pa,
                        k,
                        off,
                    );
                }
                GgmlType::Q4_1 => {
                    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                    let (lo, hi) = nibbles(p.add(4));
                    acc.add(
                        &affine(lo, hi, _mm256_set1_ps(d), _mm256_set1_ps(m)),
                        pa,
                        k,
                        off,
                    );
                }
                GgmlType::Q5_0 => {
                    let d = f16_at(b, 0);
                    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                    let (lo, hi) = nibbles(p.add(6));
                    let (lo, hi) = fifth_bits(lo, hi, qh);
                    acc.add(
                        &affine(lo, hi, _mm256_set1_ps(d), _mm256_set1_ps(-16.0 * d)),
                        pa,
                        k,
                        off,
                    );
                }
                GgmlType::Q5_1 => {
                    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                    let (lo, hi) = nibbles(p.add(8));
                    let (lo, hi) = fifth_bits(lo, hi, qh);
                    acc.add(
                        &affine(lo, hi, _mm256_set1_ps(d), _mm256_set1_ps(m)),
                        pa,
                        k,
                        off,
                    );
                }
                GgmlType::Q4_K => {
                    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                    let scales = &b[4..16];
                    for c in 0..4 {
                        let q = _mm256_loadu_si256(p.add(16 + 32 * c).cast());
                        let mask = _mm256_set1_epi8(0x0F);
                        let lo = _mm256_and_si256(q, mask);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                        for (sub, v) in [(2 * c, lo), (2 * c + 1, hi)] {
                            let (s, mn) = scale_min_k4(sub, scales);
                            let w = affine(
                                _mm256_castsi256_si128(v),
                                _mm256_extracti128_si256(v, 1),
                                _mm256_set1_ps(d * s as f32),
                                _mm256_set1_ps(-dmin * mn as f32),
                            );
                            acc.add(&w, pa, k, off + 32 * sub);
                        }
                    }
                }
                GgmlType::Q6_K => {
                    let d = f16_at(b, 208);
                    let sc = &b[192..208];
                    let mask4 = _mm256_set1_epi8(0x0F);
                    for half in 0..2 {
                        let ql0 = _mm256_loadu_si256(p.add(64 * half).cast());
                        let ql1 = _mm256_loadu_si256(p.add(64 * half + 32).cast());
                        let qh = _mm256_loadu_si256(p.add(128 + 32 * half).cast());
                        let groups = [
                            _mm256_or_si256(_mm256_and_si256(ql0, mask4), q6_high(qh, 0)),
                            _mm256_or_si256(_mm256_and_si256(ql1, mask4), q6_high(qh, 2)),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4),
                                q6_high(qh, 4),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4),
                                q6_high(qh, 6),
                            ),
                        ];
                        for (g, v) in groups.iter().enumerate() {
                            // Values 0..16 use scale 2g, 16..32 scale 2g + 1.
                            let s0 = d * sc[8 * half + 2 * g] as i8 as f32;
                            let s1 = d * sc[8 * half + 2 * g + 1] as i8 as f32;
                            let lo = _mm256_castsi256_si128(*v);
                            let hi = _mm256_extracti128_si256(*v, 1);
                            let (a0, a1) = u8x16_to_i32(lo);
                            let (a2, a3) = u8x16_to_i32(hi);
                            let w = [
                                q6_scale(a0, s0),
                                q6_scale(a1, s0),
                                q6_scale(a2, s1),
                                q6_scale(a3, s1),
                            ];
                            acc.add(&w, pa, k, off + 128 * half + 32 * g);
                        }
                    }
                }
                _ => unreachable!("dot_rows called for {ty} without a kernel"),
            }
        }
        for (i, d) in dots.iter_mut().enumerate().take(M) {
            let mut lanes = [0f32; 8];
            let [a0, a1, a2, a3] = acc.acc[i];
            let sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
            *d = lanes.iter().sum();
        }
    }
}
