//! Writing 32-value GGUF blocks: from signed integers and one scale per
//! block (exact: how integer checkpoints such as GPTQ and AWQ become block
//! formats the kernels already run), and Q8_0 from f32 values.

use ferrum_types::{FerrumError, GgmlType, Result};
use half::f16;

/// The range of the signed values `ty` stores exactly: `d · v` with `v` in
/// `lo..=hi`.
pub fn signed_range(ty: GgmlType) -> Option<(i8, i8)> {
    match ty {
        GgmlType::Q4_0 => Some((-8, 7)),
        GgmlType::Q5_0 => Some((-16, 15)),
        GgmlType::Q8_0 => Some((-128, 127)),
        _ => None,
    }
}

/// Blocks of `ty` (Q4_0, Q5_0 or Q8_0) whose values are `d[b] · v[32b + i]`:
/// `v` holds whole blocks of 32 in `signed_range(ty)`, `d` one scale per
/// block (stored as f16, so exact for f16 scales).
pub fn pack_signed(ty: GgmlType, d: &[f32], v: &[i8]) -> Result<Vec<u8>> {
    let (lo, hi) = signed_range(ty).ok_or_else(|| {
        FerrumError::invalid(format!("pack_signed: {ty} is not Q4_0, Q5_0 or Q8_0"))
    })?;
    if v.len() != 32 * d.len() {
        return Err(FerrumError::invalid(format!(
            "pack_signed: {} values for {} blocks of 32",
            v.len(),
            d.len()
        )));
    }
    if let Some(x) = v.iter().find(|&&x| x < lo || x > hi) {
        return Err(FerrumError::invalid(format!(
            "pack_signed: {x} is outside {ty}'s range {lo}..={hi}"
        )));
    }
    let mut out = Vec::with_capacity(d.len() * ty.block_bytes());
    for (&d, v) in d.iter().zip(v.chunks_exact(32)) {
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        // Unsigned codes: the formats store `v − lo`.
        let u = |i: usize| (i16::from(v[i]) - i16::from(lo)) as u8;
        match ty {
            GgmlType::Q8_0 => out.extend(v.iter().map(|&x| x as u8)),
            GgmlType::Q5_0 => {
                let qh = (0..32).fold(0u32, |h, i| h | (u32::from(u(i) >> 4) << i));
                out.extend_from_slice(&qh.to_le_bytes());
                out.extend((0..16).map(|j| (u(j) & 0xF) | ((u(j + 16) & 0xF) << 4)));
            }
            _ => out.extend((0..16).map(|j| u(j) | (u(j + 16) << 4))),
        }
    }
    Ok(out)
}

/// Q8_0 blocks of `x` (whole blocks of 32): `d = max|x| / 127`, values
/// rounded to nearest, as llama.cpp's reference quantizer.
pub fn quantize_q8_0(x: &[f32]) -> Result<Vec<u8>> {
    if !x.len().is_multiple_of(32) {
        return Err(FerrumError::invalid(format!(
            "quantize_q8_0: {} values are not whole blocks of 32",
            x.len()
        )));
    }
    let blocks = x.len() / 32;
    let mut d = Vec::with_capacity(blocks);
    let mut v = Vec::with_capacity(x.len());
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        d.push(scale);
        v.extend(
            b.iter()
                .map(|x| (x * inv).round().clamp(-127.0, 127.0) as i8),
        );
    }
    pack_signed(GgmlType::Q8_0, &d, &v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    #[test]
    fn packed_blocks_dequantize_to_d_times_v() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            seed >> 8
        };
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
            let (lo, hi) = signed_range(ty).unwrap();
            let span = (i32::from(hi) - i32::from(lo) + 1) as u32;
            let d: Vec<f32> = (0..3).map(|b| 0.25 * (b + 1) as f32).collect();
            // Every block holds both ends of the range.
            let v: Vec<i8> = (0..96)
                .map(|i| match i % 32 {
                    0 => lo,
                    31 => hi,
                    _ => (i32::from(lo) + (next() % span) as i32) as i8,
                })
                .collect();
            let bytes = pack_signed(ty, &d, &v).unwrap();
            assert_eq!(bytes.len(), 3 * ty.block_bytes());
            let mut out = vec![0f32; 96];
            dequantize(ty, &bytes, &mut out).unwrap();
            for (i, o) in out.iter().enumerate() {
                assert_eq!(*o, d[i / 32] * f32::from(v[i]), "{ty} value {i}");
            }
        }
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(pack_signed(GgmlType::Q4_0, &[1.0], &[8; 32]).is_err());
        assert!(pack_signed(GgmlType::Q5_0, &[1.0], &[-17; 32]).is_err());
        assert!(pack_signed(GgmlType::Q4_1, &[1.0], &[0; 32]).is_err());
    }

    #[test]
    fn q8_0_rounds_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut out = vec![0f32; 64];
        dequantize(GgmlType::Q8_0, &quantize_q8_0(&x).unwrap(), &mut out).unwrap();
        for (b, (x, o)) in x.chunks(32).zip(out.chunks(32)).enumerate() {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Half a step, plus the f16 rounding of d (2^-11 relative) at full scale.
            let bound = amax / 127.0 * 0.5 + amax * 2f32.powi(-11);
            for (x, o) in x.iter().zip(o) {
                assert!((x - o).abs() <= bound, "block {b}: {x} -> {o}");
            }
        }
    }
}
