//! Integer dot products of GGUF weight rows with 16-bit activation rows
//! (`crate::quant::act`).
//!
//! Weight values are unpacked to i16 and multiplied with the activations in
//! pairs into i32 lanes (`VPDPWSSD` where AVX-512 VNNI exists, else
//! `PMADDWD`: the same integers, as no sum can overflow). A legacy block's
//! eight i32 lanes are converted and accumulated with the block's combined
//! scale by one FMA, with no horizontal reduction per block (shuffles were
//! the bottleneck of batched rows); k-quants first multiply the weights by
//! their integer sub-block scales, accumulate a whole 256-value block in
//! integers and convert once.
//!
//! Every output is produced by the same instruction sequence whatever the
//! number of rows it is computed with, so a sequence's logits do not depend
//! on what it is batched with (the engine's batched == alone guarantee).

use ferrum_types::GgmlType;

use super::act_quant::{ActRows, SUM_GROUP};
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
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
}

/// Values per activation scale the kernel for `ty` expects: a k-quant
/// super-block, or a legacy block.
pub(crate) fn act_group(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 256,
        _ => 32,
    }
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

/// Whether the CPU has 256-bit `VPDPWSSD` (AVX-512 VNNI with VL) and the
/// AVX-512BW lane masks the kernels pair with it.
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dots[j][c] = act[r0 + c] · dequant(row j)` for the consecutive weight
/// rows in `rows` (one per element of `dots`) and `m ≤ 8` activation rows.
/// Each row holds exactly the blocks of `act.k` values; `off` is scratch
/// from [`offset_scratch`]. The caller checks [`supports`]. Taking a task's
/// rows in one call keeps dispatch and set-up out of the per-row cost, which
/// matters at decode shapes (a 896-wide row is 28 blocks).
pub(crate) fn dot_rows(
    ty: GgmlType,
    rows: &[u8],
    act: &ActRows,
    r0: usize,
    m: usize,
    dots: &mut [[f32; 8]],
    off: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let row_bytes = act.k / ty.block_size() * ty.block_bytes();
        assert!(supports(ty) && act.group == act_group(ty) && (1..=8).contains(&m));
        assert!(!dots.is_empty() && rows.len() == dots.len() * row_bytes);
        assert!(act.qs.len() >= (r0 + m) * act.k && off.len() == act.stride);
        // SAFETY: `supports` checked AVX2/FMA/F16C (and `has_vnni` the VNNI
        // entry's features); the extents asserted above are what they read.
        unsafe {
            if has_vnni() {
                x86::dot_rows_vnni(ty, rows.as_ptr(), row_bytes, act, r0, m, dots, off)
            } else {
                x86::dot_rows_avx2(ty, rows.as_ptr(), row_bytes, act, r0, m, dots, off)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, rows, act, r0, m, dots, off);
        unreachable!("supports() is false off x86-64");
    }
}

/// Sizes `off` for [`dot_rows`] with `act` (a weight row's block offsets,
/// zero past the last block): once per task, not per call.
pub(crate) fn offset_scratch(act: &ActRows, off: &mut Vec<f32>) {
    off.clear();
    off.resize(act.stride, 0.0);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use ferrum_types::GgmlType;

    use super::{ActRows, SUM_GROUP};
    use crate::quant::scale_min_k4;

    /// The little-endian f16 at `p`, converted by F16C.
    #[inline(always)]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let bits = p.cast::<u16>().read_unaligned().to_le();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// Where a legacy block's constant offset comes from (`x = d·q + o`).
    #[derive(PartialEq, Eq)]
    enum Offset {
        /// None, or folded into the values.
        No,
        /// The f16 minimum after the scale.
        Min,
        /// −16·d: Q5_0's constant, cheaper as an offset than subtracted
        /// from every value.
        Neg16,
    }

    /// A legacy (32-value) block format: an f16 scale first, an offset.
    trait Legacy {
        const BYTES: usize;
        const OFFSET: Offset;
        /// Values 0..16 and 16..32 as i16 (`AVX512`: AVX-512BW may be used).
        unsafe fn values<const AVX512: bool>(b: *const u8) -> (__m256i, __m256i);
    }

    /// Low nibbles of 16 bytes as i16 values 0..16, high nibbles as 16..32:
    /// widening first makes each half one instruction.
    #[inline(always)]
    unsafe fn nibbles_i16(p: *const u8) -> (__m256i, __m256i) {
        let x = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
        (
            _mm256_and_si256(x, _mm256_set1_epi16(0x0F)),
            _mm256_srli_epi16(x, 4),
        )
    }

    /// A Q5 block's 32 values as i16: the nibbles of the 16 bytes at `qs`
    /// plus 16 where bit `e` of the little-endian u32 at `qh` is set. With
    /// AVX-512BW the bits are lane masks for a masked add; otherwise they
    /// are spread to bytes (shuffle, test, compare: four instructions for
    /// all 32) and or-ed in before widening. Both give the same integers.
    #[inline(always)]
    unsafe fn q5_values<const AVX512: bool>(qs: *const u8, qh: *const u8) -> (__m256i, __m256i) {
        let bits = qh.cast::<u32>().read_unaligned().to_le();
        if AVX512 {
            let (lo, hi) = nibbles_i16(qs);
            let sixteen = _mm256_set1_epi16(16);
            let (klo, khi) = (bits as __mmask16, (bits >> 16) as __mmask16);
            return (
                _mm256_mask_add_epi16(lo, klo, lo, sixteen),
                _mm256_mask_add_epi16(hi, khi, hi, sixteen),
            );
        }
        // Byte i takes byte i / 8 of the bits (the shuffle stays within
        // 128-bit lanes, and each lane holds all four bytes), then tests
        // bit i % 8.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let hit = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        let fifth = _mm256_and_si256(hit, _mm256_set1_epi8(0x10));
        let q = _mm_loadu_si128(qs.cast());
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_or_si128(_mm_and_si128(q, mask), _mm256_castsi256_si128(fifth));
        let hi = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16(q, 4), mask),
            _mm256_extracti128_si256(fifth, 1),
        );
        (_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi))
    }

    /// Byte-wise nibble `hi` (0 low, 1 high) of the 32 bytes at `p`.
    #[inline(always)]
    unsafe fn nibbles32(p: *const u8, hi: bool) -> __m256i {
        let q = _mm256_loadu_si256(p.cast());
        let q = if hi { _mm256_srli_epi16(q, 4) } else { q };
        _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
    }

    struct Q40;
    impl Legacy for Q40 {
        const BYTES: usize = 18;
        const OFFSET: Offset = Offset::No;
        #[inline(always)]
        unsafe fn values<const AVX512: bool>(b: *const u8) -> (__m256i, __m256i) {
            let (lo, hi) = nibbles_i16(b.add(2));
            let eight = _mm256_set1_epi16(8);
            (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight))
        }
    }

    struct Q41;
    impl Legacy for Q41 {
        const BYTES: usize = 20;
        const OFFSET: Offset = Offset::Min;
        #[inline(always)]
        unsafe fn values<const AVX512: bool>(b: *const u8) -> (__m256i, __m256i) {
            nibbles_i16(b.add(4))
        }
    }

    struct Q50;
    impl Legacy for Q50 {
        const BYTES: usize = 22;
        const OFFSET: Offset = Offset::Neg16;
        #[inline(always)]
        unsafe fn values<const AVX512: bool>(b: *const u8) -> (__m256i, __m256i) {
            q5_values::<AVX512>(b.add(6), b.add(2))
        }
    }

    struct Q51;
    impl Legacy for Q51 {
        const BYTES: usize = 24;
        const OFFSET: Offset = Offset::Min;
        #[inline(always)]
        unsafe fn values<const AVX512: bool>(b: *const u8) -> (__m256i, __m256i) {
            q5_values::<AVX512>(b.add(8), b.add(4))
        }
    }

    struct Q80;
    impl Legacy for Q80 {
        const BYTES: usize = 34;
        const OFFSET: Offset = Offset::No;
        #[inline(always)]
        unsafe fn values<const AVX512: bool>(b: *const u8) -> (__m256i, __m256i) {
            (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(2).cast())),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(18).cast())),
            )
        }
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

    /// 32 bytes widened to two vectors of 16 i16 (values 0..16 and 16..32).
    #[inline(always)]
    unsafe fn widen(v: __m256i, unsigned: bool) -> (__m256i, __m256i) {
        let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        if unsigned {
            (_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi))
        } else {
            (_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi))
        }
    }

    /// `acc` plus, per i32 lane, the two products of its pair of i16 lanes.
    #[inline(always)]
    unsafe fn dot16<const VNNI: bool>(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        if VNNI {
            _mm256_dpwssd_epi32(acc, w, a)
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

    /// Blocks per step of the legacy kernel: their f16 scales are converted
    /// and multiplied by the activation scales eight at a time.
    const STEP: usize = 8;

    /// Eight f16 values at `p + i·stride` (lanes `i ≥ n` zero) as f32.
    #[inline(always)]
    unsafe fn f16x8(p: *const u8, stride: usize, n: usize) -> __m256 {
        let h = |i: usize| {
            if i < n {
                p.add(i * stride).cast::<i16>().read_unaligned().to_le()
            } else {
                0
            }
        };
        _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            h(4),
            h(5),
            h(6),
            h(7),
        ))
    }

    /// Blocks `b0..b0 + nv` (`nv ≤ STEP`) of one weight row against `M`
    /// activation rows into `acc`. Called with `nv = STEP` (a constant once
    /// inlined, so the loops unroll without tests) except for a short last
    /// step, whose offset lanes past `nv` are zero. Each block's weights are
    /// unpacked once and used for all `M` rows while the `M` accumulators
    /// stay in registers.
    #[inline(always)]
    unsafe fn legacy_step<F: Legacy, const VNNI: bool, const M: usize>(
        row: *const u8,
        act: &ActRows,
        r0: usize,
        b0: usize,
        nv: usize,
        off: &mut [f32],
        acc: &mut [__m256; M],
    ) {
        let (k, stride) = (act.k, act.stride);
        let p = row.add(b0 * F::BYTES);
        let sw = f16x8(p, F::BYTES, nv);
        // `stride` is a multiple of STEP, so the eight lanes fit.
        let o = off.as_mut_ptr().add(b0);
        match F::OFFSET {
            Offset::No => {}
            Offset::Min => _mm256_storeu_ps(o, f16x8(p.add(2), F::BYTES, nv)),
            Offset::Neg16 => _mm256_storeu_ps(o, _mm256_mul_ps(sw, _mm256_set1_ps(-16.0))),
        }
        // Each block's scale for each activation row, read back one lane
        // at a time as a broadcast (a load, not a shuffle).
        let mut s = [[0f32; STEP]; M];
        for (c, s) in s.iter_mut().enumerate() {
            let da = _mm256_loadu_ps(act.d.as_ptr().add((r0 + c) * stride + b0));
            _mm256_storeu_ps(s.as_mut_ptr(), _mm256_mul_ps(sw, da));
        }
        // `b` indexes the inner dimension of `s`, which no iterator covers.
        #[allow(clippy::needless_range_loop)]
        for b in 0..nv {
            let (lo, hi) = F::values::<VNNI>(p.add(b * F::BYTES));
            for (c, acc) in acc.iter_mut().enumerate() {
                let a = act.qs.as_ptr().add((r0 + c) * k + 32 * (b0 + b));
                let (a0, a1) = (
                    _mm256_loadu_si256(a.cast()),
                    _mm256_loadu_si256(a.add(16).cast()),
                );
                let v = dot16::<VNNI>(_mm256_madd_epi16(lo, a0), hi, a1);
                let sb = _mm256_broadcast_ss(&s[c][b]);
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), sb, *acc);
            }
        }
    }

    /// Legacy blocks, eight at a time (see [`legacy_step`]). Float offsets
    /// are one short dot with the activation group sums after the loop.
    #[inline(always)]
    unsafe fn legacy_rows<F: Legacy, const VNNI: bool, const M: usize>(
        w: *const u8,
        row_bytes: usize,
        act: &ActRows,
        r0: usize,
        off: &mut [f32],
        dots: &mut [[f32; 8]],
    ) {
        let (stride, nb) = (act.stride, act.k / 32);
        for (j, dots) in dots.iter_mut().enumerate() {
            let row = w.add(j * row_bytes);
            let mut acc = [_mm256_setzero_ps(); M];
            let full = nb - nb % STEP;
            for b0 in (0..full).step_by(STEP) {
                legacy_step::<F, VNNI, M>(row, act, r0, b0, STEP, off, &mut acc);
            }
            if full < nb {
                legacy_step::<F, VNNI, M>(row, act, r0, full, nb - full, off, &mut acc);
            }
            for (c, (dot, acc)) in dots.iter_mut().zip(acc).enumerate() {
                *dot = hsum(acc);
                if F::OFFSET != Offset::No {
                    let sums = act.s.as_ptr().add((r0 + c) * stride);
                    let mut v = _mm256_setzero_ps();
                    for g in (0..stride).step_by(8) {
                        v = _mm256_fmadd_ps(
                            _mm256_loadu_ps(off.as_ptr().add(g)),
                            _mm256_loadu_ps(sums.add(g)),
                            v,
                        );
                    }
                    *dot += hsum(v);
                }
            }
        }
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
                    F::header(*p, h);
                }
                let mut iacc = [[_mm256_setzero_si256(); M]; R];
                for g in 0..8 {
                    let mut wv = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                    for (r, v) in wv.iter_mut().enumerate() {
                        let (lo, hi) = widen(F::bytes(p[r], g), F::UNSIGNED);
                        *v = (
                            _mm256_mullo_epi16(lo, _mm256_set1_epi16(h[r].scales[2 * g])),
                            _mm256_mullo_epi16(hi, _mm256_set1_epi16(h[r].scales[2 * g + 1])),
                        );
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

    /// Runs `$e` with the const `$M` equal to the activation row count
    /// `$m` (1..=8), so each count gets its own compiled kernel whose loops
    /// unroll and whose accumulators stay in registers.
    macro_rules! by_m {
        ($m:expr, $M:ident => $e:expr) => {{
            match $m {
                1 => { const $M: usize = 1; $e }
                2 => { const $M: usize = 2; $e }
                3 => { const $M: usize = 3; $e }
                4 => { const $M: usize = 4; $e }
                5 => { const $M: usize = 5; $e }
                6 => { const $M: usize = 6; $e }
                7 => { const $M: usize = 7; $e }
                _ => { const $M: usize = 8; $e }
            }
        }};
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
        off: &mut [f32],
    ) {
        match ty {
            GgmlType::Q4_0 => by_m!(m, M => legacy_rows::<Q40, VNNI, M>(w, rb, act, r0, off, dots)),
            GgmlType::Q4_1 => by_m!(m, M => legacy_rows::<Q41, VNNI, M>(w, rb, act, r0, off, dots)),
            GgmlType::Q5_0 => by_m!(m, M => legacy_rows::<Q50, VNNI, M>(w, rb, act, r0, off, dots)),
            GgmlType::Q5_1 => by_m!(m, M => legacy_rows::<Q51, VNNI, M>(w, rb, act, r0, off, dots)),
            GgmlType::Q8_0 => by_m!(m, M => legacy_rows::<Q80, VNNI, M>(w, rb, act, r0, off, dots)),
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
        off: &mut [f32],
    ) {
        by_type::<false>(ty, w, row_bytes, act, r0, m, dots, off)
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
        off: &mut [f32],
    ) {
        by_type::<true>(ty, w, row_bytes, act, r0, m, dots, off)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use ferrum_types::GgmlType;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::{act_group, has_vnni, offset_scratch, supports, x86, ActRows};
    use crate::quant::act::quantize_act;

    /// Random blocks with small finite f16 scales at the types' scale offsets.
    fn blocks(rng: &mut StdRng, ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
        let scales: &[usize] = match ty {
            GgmlType::Q6_K => &[208],
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
            _ => &[0],
        };
        let bb = ty.block_bytes();
        let mut v: Vec<u8> = (0..rows * k / ty.block_size() * bb)
            .map(|_| rng.random())
            .collect();
        for b in v.chunks_mut(bb) {
            for &o in scales {
                let s = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
                b[o..o + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
        v
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The vector quantizer writes exactly the scalar reference's values.
    #[test]
    fn vector_quantizer_matches_the_reference() {
        if !supports(GgmlType::Q4_0) {
            return;
        }
        let mut rng = StdRng::seed_from_u64(3);
        for group in [32, 256] {
            let (m, k) = (3, 512);
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            let mut act = ActRows::default();
            act.quantize(&a, m, k, group);
            for r in 0..m {
                let mut qs = vec![0i16; k];
                let mut d = vec![0f32; k / group];
                quantize_act(&a[r * k..(r + 1) * k], group, &mut qs, &mut d);
                assert_eq!(qs, act.qs[r * k..(r + 1) * k], "group {group} row {r}");
                assert_eq!(d, act.d[r * act.stride..r * act.stride + k / group]);
            }
        }
    }

    /// The VNNI and the plain AVX2 kernels give the same bits for every
    /// type and row count (their integer sums cannot differ).
    #[test]
    fn vnni_and_avx2_kernels_agree_bitwise() {
        if !has_vnni() || !supports(GgmlType::Q4_0) {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(4);
        for ty in TYPES {
            let k = 512;
            let row = blocks(&mut rng, ty, 2, k);
            let a: Vec<f32> = (0..8 * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let mut act = ActRows::default();
            act.quantize(&a, 8, k, act_group(ty));
            let mut off = Vec::new();
            offset_scratch(&act, &mut off);
            let rb = row.len() / 2;
            for m in 1..=8 {
                let (mut x, mut y) = ([[0f32; 8]; 2], [[0f32; 8]; 2]);
                // SAFETY: both entries' features were detected above.
                unsafe {
                    x86::dot_rows_avx2(ty, row.as_ptr(), rb, &act, 0, m, &mut x, &mut off);
                    x86::dot_rows_vnni(ty, row.as_ptr(), rb, &act, 0, m, &mut y, &mut off);
                }
                assert_eq!(x, y, "{ty} m{m}");
            }
        }
    }
}
