//! Integer dot products of GGUF weight rows with 16-bit activation rows
//! (`crate::quant::act`).
//!
//! Weight values are unpacked to i16 and multiplied with the activations in
//! pairs into i32 lanes (`VPDPWSSD` where AVX-512 VNNI exists, else
//! `PMADDWD`: the same integers, as no sum can overflow). Legacy blocks
//! convert each 32-value dot to f32 and scale it by weight scale ×
//! activation scale; k-quants first multiply the weights by their integer
//! sub-block scales, accumulate a whole 256-value block in integers and
//! convert once, which is what makes them cheap.
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

/// Whether the CPU has 256-bit `VPDPWSSD` (AVX-512 VNNI with VL).
pub(crate) fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dots[c] = act[r0 + c] · dequant(row)` for `dots.len() ≤ 8` activation
/// rows. `row` holds exactly the blocks of `act.k` values; `off` is scratch
/// of `act.stride` values, zero from the group count on (see
/// [`offset_scratch`]). The caller checks [`supports`].
pub(crate) fn dot_rows(
    ty: GgmlType,
    row: &[u8],
    act: &ActRows,
    r0: usize,
    dots: &mut [f32],
    off: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert!(supports(ty) && dots.len() <= 8 && act.group == act_group(ty));
        debug_assert!(act.qs.len() >= (r0 + dots.len()) * act.k);
        debug_assert_eq!(row.len(), act.k / ty.block_size() * ty.block_bytes());
        debug_assert_eq!(off.len(), act.stride);
        // SAFETY: `supports` checked AVX2/FMA/F16C (and `has_vnni` the VNNI
        // entry's features); the extents asserted above are what they read.
        unsafe {
            if has_vnni() {
                x86::dot_rows_vnni(ty, row, act, r0, dots, off)
            } else {
                x86::dot_rows_avx2(ty, row, act, r0, dots, off)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, row, act, r0, dots, off);
        unreachable!("supports() is false off x86-64");
    }
}

/// Sizes `off` for [`dot_rows`] with `act`: once per task, not per row.
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
        let bits = u16::from_le_bytes([*p, *p.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// A legacy (32-value) block format: one f32 scale per block, and unless
    /// `OFFSET` a constant offset already folded into the values.
    trait Legacy {
        const BYTES: usize;
        const OFFSET: bool;
        /// The scale and the offset added to every dequantized value.
        unsafe fn header(b: *const u8) -> (f32, f32);
        /// Values 0..16 and 16..32 as i16.
        unsafe fn values(b: *const u8) -> (__m256i, __m256i);
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

    /// Low nibbles of 16 bytes as values 0..16, high nibbles as 16..32.
    #[inline(always)]
    unsafe fn nibbles16(p: *const u8) -> __m256i {
        let v = _mm_loadu_si128(p.cast());
        let mask = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(v, 4), mask),
            _mm_and_si128(v, mask),
        )
    }

    /// 0x10 in byte `e` where bit `e` of the little-endian u32 at `p` is set.
    #[inline(always)]
    unsafe fn fifth_bits(p: *const u8) -> __m256i {
        let bits = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let hit = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
        _mm256_and_si256(hit, _mm256_set1_epi8(0x10))
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
        const OFFSET: bool = false;
        #[inline(always)]
        unsafe fn header(b: *const u8) -> (f32, f32) {
            (f16_at(b), 0.0)
        }
        #[inline(always)]
        unsafe fn values(b: *const u8) -> (__m256i, __m256i) {
            let (lo, hi) = nibbles_i16(b.add(2));
            let eight = _mm256_set1_epi16(8);
            (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight))
        }
    }

    struct Q41;
    impl Legacy for Q41 {
        const BYTES: usize = 20;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn header(b: *const u8) -> (f32, f32) {
            (f16_at(b), f16_at(b.add(2)))
        }
        #[inline(always)]
        unsafe fn values(b: *const u8) -> (__m256i, __m256i) {
            nibbles_i16(b.add(4))
        }
    }

    struct Q50;
    impl Legacy for Q50 {
        const BYTES: usize = 22;
        const OFFSET: bool = false;
        #[inline(always)]
        unsafe fn header(b: *const u8) -> (f32, f32) {
            (f16_at(b), 0.0)
        }
        #[inline(always)]
        unsafe fn values(b: *const u8) -> (__m256i, __m256i) {
            let v = _mm256_or_si256(nibbles16(b.add(6)), fifth_bits(b.add(2)));
            widen(_mm256_sub_epi8(v, _mm256_set1_epi8(16)), false)
        }
    }

    struct Q51;
    impl Legacy for Q51 {
        const BYTES: usize = 24;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn header(b: *const u8) -> (f32, f32) {
            (f16_at(b), f16_at(b.add(2)))
        }
        #[inline(always)]
        unsafe fn values(b: *const u8) -> (__m256i, __m256i) {
            widen(
                _mm256_or_si256(nibbles16(b.add(8)), fifth_bits(b.add(4))),
                true,
            )
        }
    }

    struct Q80;
    impl Legacy for Q80 {
        const BYTES: usize = 34;
        const OFFSET: bool = false;
        #[inline(always)]
        unsafe fn header(b: *const u8) -> (f32, f32) {
            (f16_at(b), 0.0)
        }
        #[inline(always)]
        unsafe fn values(b: *const u8) -> (__m256i, __m256i) {
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

    /// Legacy blocks: each 32-value block's integer dot is converted and
    /// scaled by weight scale × activation scale; float offsets are one
    /// short dot with the activation group sums after the loop.
    #[inline(always)]
    unsafe fn legacy_rows<F: Legacy, const VNNI: bool, const M: usize>(
        row: &[u8],
        act: &ActRows,
        r0: usize,
        off: &mut [f32],
        dots: &mut [f32],
    ) {
        let (k, stride) = (act.k, act.stride);
        let qs = act.qs.as_ptr().add(r0 * k);
        let ds = act.d.as_ptr().add(r0 * stride);
        let mut acc = [_mm256_setzero_ps(); M];
        for (bi, b) in row.chunks_exact(F::BYTES).enumerate() {
            let p = b.as_ptr();
            let (dw, o) = F::header(p);
            if F::OFFSET {
                off[bi] = o;
            }
            let (lo, hi) = F::values(p);
            let sw = _mm256_set1_ps(dw);
            for (c, acc) in acc.iter_mut().enumerate() {
                let a = qs.add(c * k + 32 * bi);
                let i = dot16::<VNNI>(_mm256_setzero_si256(), lo, _mm256_loadu_si256(a.cast()));
                let i = dot16::<VNNI>(i, hi, _mm256_loadu_si256(a.add(16).cast()));
                let s = _mm256_mul_ps(sw, _mm256_broadcast_ss(&*ds.add(c * stride + bi)));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, *acc);
            }
        }
        for (c, (dot, acc)) in dots.iter_mut().zip(acc).enumerate() {
            *dot = hsum(acc);
            if F::OFFSET {
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

    /// K-quant super-blocks: the weights times their integer sub-block
    /// scales stay integers, so a whole 256-value block accumulates in i32
    /// lanes and is converted and scaled once (the activations have one
    /// scale per 256 values for these types).
    #[inline(always)]
    unsafe fn k_rows<F: KQuant, const VNNI: bool, const M: usize>(
        row: &[u8],
        act: &ActRows,
        r0: usize,
        dots: &mut [f32],
    ) {
        let (k, stride, nsums) = (act.k, act.stride, act.k / SUM_GROUP);
        let qs = act.qs.as_ptr().add(r0 * k);
        let ds = act.d.as_ptr().add(r0 * stride);
        let sums = act.sums.as_ptr().add(r0 * nsums);
        let mut acc = [_mm256_setzero_ps(); M];
        let mut h = KHeader {
            d: 0.0,
            dmin: 0.0,
            scales: [0; 16],
            mins: [0; 8],
        };
        for (bi, b) in row.chunks_exact(F::BYTES).enumerate() {
            let p = b.as_ptr();
            F::header(p, &mut h);
            let mut iacc = [_mm256_setzero_si256(); M];
            for g in 0..8 {
                let (lo, hi) = widen(F::bytes(p, g), F::UNSIGNED);
                let lo = _mm256_mullo_epi16(lo, _mm256_set1_epi16(h.scales[2 * g]));
                let hi = _mm256_mullo_epi16(hi, _mm256_set1_epi16(h.scales[2 * g + 1]));
                for (c, iacc) in iacc.iter_mut().enumerate() {
                    let a = qs.add(c * k + 256 * bi + 32 * g);
                    let i = dot16::<VNNI>(*iacc, lo, _mm256_loadu_si256(a.cast()));
                    *iacc = dot16::<VNNI>(i, hi, _mm256_loadu_si256(a.add(16).cast()));
                }
            }
            let mins = _mm256_loadu_si256(h.mins.as_ptr().cast());
            for (c, (acc, iacc)) in acc.iter_mut().zip(iacc).enumerate() {
                let da = *ds.add(c * stride + bi);
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_set1_ps(h.d * da), *acc);
                if F::MINS {
                    let s = _mm256_loadu_si256(sums.add(c * nsums + 8 * bi).cast());
                    let m = _mm256_cvtepi32_ps(_mm256_mullo_epi32(s, mins));
                    *acc = _mm256_fmadd_ps(m, _mm256_set1_ps(-h.dmin * da), *acc);
                }
            }
        }
        for (dot, acc) in dots.iter_mut().zip(acc) {
            *dot = hsum(acc);
        }
    }

    /// Compiles a kernel once per row count, so its loops unroll and the
    /// accumulators stay in registers.
    macro_rules! by_rows {
        ($kernel:ident::<$f:ty, $vnni:ident>($dots:expr $(, $arg:expr)*)) => {
            match $dots.len() {
                1 => $kernel::<$f, $vnni, 1>($($arg,)* $dots),
                2 => $kernel::<$f, $vnni, 2>($($arg,)* $dots),
                3 => $kernel::<$f, $vnni, 3>($($arg,)* $dots),
                4 => $kernel::<$f, $vnni, 4>($($arg,)* $dots),
                5 => $kernel::<$f, $vnni, 5>($($arg,)* $dots),
                6 => $kernel::<$f, $vnni, 6>($($arg,)* $dots),
                7 => $kernel::<$f, $vnni, 7>($($arg,)* $dots),
                _ => $kernel::<$f, $vnni, 8>($($arg,)* $dots),
            }
        };
    }

    #[inline(always)]
    unsafe fn by_type<const VNNI: bool>(
        ty: GgmlType,
        row: &[u8],
        act: &ActRows,
        r0: usize,
        dots: &mut [f32],
        off: &mut [f32],
    ) {
        match ty {
            GgmlType::Q4_0 => by_rows!(legacy_rows::<Q40, VNNI>(dots, row, act, r0, off)),
            GgmlType::Q4_1 => by_rows!(legacy_rows::<Q41, VNNI>(dots, row, act, r0, off)),
            GgmlType::Q5_0 => by_rows!(legacy_rows::<Q50, VNNI>(dots, row, act, r0, off)),
            GgmlType::Q5_1 => by_rows!(legacy_rows::<Q51, VNNI>(dots, row, act, r0, off)),
            GgmlType::Q8_0 => by_rows!(legacy_rows::<Q80, VNNI>(dots, row, act, r0, off)),
            GgmlType::Q4_K => by_rows!(k_rows::<Q4K, VNNI>(dots, row, act, r0)),
            GgmlType::Q5_K => by_rows!(k_rows::<Q5K, VNNI>(dots, row, act, r0)),
            GgmlType::Q6_K => by_rows!(k_rows::<Q6K, VNNI>(dots, row, act, r0)),
            _ => unreachable!("integer dot_rows called for {ty} without a kernel"),
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_rows_avx2(
        ty: GgmlType,
        row: &[u8],
        act: &ActRows,
        r0: usize,
        dots: &mut [f32],
        off: &mut [f32],
    ) {
        by_type::<false>(ty, row, act, r0, dots, off)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(crate) unsafe fn dot_rows_vnni(
        ty: GgmlType,
        row: &[u8],
        act: &ActRows,
        r0: usize,
        dots: &mut [f32],
        off: &mut [f32],
    ) {
        by_type::<true>(ty, row, act, r0, dots, off)
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
            let row = blocks(&mut rng, ty, 1, k);
            let a: Vec<f32> = (0..8 * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let mut act = ActRows::default();
            act.quantize(&a, 8, k, act_group(ty));
            let mut off = Vec::new();
            offset_scratch(&act, &mut off);
            for m in 1..=8 {
                let (mut x, mut y) = (vec![0f32; m], vec![0f32; m]);
                // SAFETY: both entries' features were detected above.
                unsafe {
                    x86::dot_rows_avx2(ty, &row, &act, 0, &mut x, &mut off);
                    x86::dot_rows_vnni(ty, &row, &act, 0, &mut y, &mut off);
                }
                assert_eq!(x, y, "{ty} m{m}");
            }
        }
    }
}
