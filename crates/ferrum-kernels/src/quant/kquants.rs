//! The 256-value "k-quant" super-block formats (Q2_K … Q8_K).

use ferrum_types::GgmlType;

use super::f16_at;

/// Scale and min of sub-block `j` from the 12-byte packed 6-bit table of
/// Q4_K / Q5_K.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The unsigned quants of a k-quant file block (`q` for Q2_K, Q4_K and
/// Q5_K, `q + 4` for Q3_K, `q + 32` for Q6_K), in value order: what the
/// CPU's repacked layouts are built from.
pub(crate) fn file_quants(ty: GgmlType, b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    match ty {
        GgmlType::Q2_K => {
            // Value v: bits 2j of byte v % 32 of its half's 32 quant bytes.
            let qs = &b[16..80];
            for (v, q) in q.iter_mut().enumerate() {
                let (half, j, i) = (v / 128, v % 128 / 32, v % 32);
                *q = (qs[32 * half + i] >> (2 * j)) & 3;
            }
        }
        GgmlType::Q3_K => {
            // Value v: bits 2j of byte v % 32 of its half's 32 quant
            // bytes (j = v % 128 / 32), and bit 4·half + j of `hmask`'s
            // byte v % 32 (set: no −4).
            let (hmask, qs) = (&b[..32], &b[32..96]);
            for (v, q) in q.iter_mut().enumerate() {
                let (half, j, i) = (v / 128, v % 128 / 32, v % 32);
                let low = (qs[32 * half + i] >> (2 * j)) & 3;
                *q = low | ((hmask[i] >> (4 * half + j)) & 1) << 2;
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs = &b[if ty == GgmlType::Q4_K { 16 } else { 48 }..];
            for c in 0..4 {
                for i in 0..32 {
                    let byte = qs[32 * c + i];
                    q[64 * c + i] = byte & 0x0F;
                    q[64 * c + 32 + i] = byte >> 4;
                    if ty == GgmlType::Q5_K {
                        let qh = b[16 + i];
                        q[64 * c + i] |= ((qh >> (2 * c)) & 1) << 4;
                        q[64 * c + 32 + i] |= ((qh >> (2 * c + 1)) & 1) << 4;
                    }
                }
            }
        }
        _ => {
            for half in 0..2 {
                let (ql, qh) = (&b[64 * half..], &b[128 + 32 * half..]);
                for l in 0..32 {
                    let v = 128 * half + l;
                    q[v] = (ql[l] & 0x0F) | (qh[l] & 3) << 4;
                    q[v + 32] = (ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4;
                    q[v + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
                    q[v + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
                }
            }
        }
    }
    q
}

/// Q2_K: `scales[16] qs[64] d dmin`; each sub-block of 16 has a 4-bit scale
/// and a 4-bit min.
pub(super) fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let mut is = 0;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                let base = half * 128 + j * 32 + part * 16;
                for l in 0..16 {
                    out[base + l] = dl * ((q[part * 16 + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K: `hmask[32] qs[64] scales[12] d`; 6-bit signed scales (offset 32)
/// and a high bit per value in `hmask` (cleared bit means subtract 4).
pub(super) fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let d = f16_at(b, 108);
    let scales = q3_k_scales(b);
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                let base = half * 128 + j * 32 + part * 16;
                for l in 0..16 {
                    let idx = part * 16 + l;
                    let low = ((q[idx] >> shift) & 3) as i32;
                    let sub = if hmask[idx] & m != 0 { 0 } else { 4 };
                    out[base + l] = dl * (low - sub) as f32;
                }
            }
            m <<= 1;
        }
    }
}

/// The sixteen signed scales of a Q3_K block, one per 16 values: 6 bits
/// (offset 32), the low four packed two to a byte, the top two four to a
/// byte.
pub(crate) fn q3_k_scales(b: &[u8]) -> [i8; 16] {
    let packed = &b[96..108];
    std::array::from_fn(|i| {
        let low = if i < 8 {
            packed[i] & 0xF
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// Q4_K: `d dmin scales[12] qs[128]`; eight sub-blocks of 32 with 6-bit
/// scales and mins.
pub(super) fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            out[c * 64 + l] = d1 * (q[l] & 0xF) as f32 - m1;
            out[c * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: Q4_K plus `qh[32]` holding the fifth bit of every value.
pub(super) fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[c * 64 + l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
            out[c * 64 + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// Q6_K: `ql[128] qh[64] scales[16] d`; 6-bit values offset by 32, one
/// signed 8-bit scale per 16 values.
pub(super) fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for half in 0..2 {
        let (ql, qh) = (&ql[half * 64..], &qh[half * 32..]);
        let sc = &sc[half * 8..];
        let y = &mut out[half * 128..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// Q8_K: `d (f32) qs[256] bsums[16]`; the activation format of k-quant dot
/// products. `bsums` are redundant sums and not needed to dequantize.
pub(super) fn q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in out.iter_mut().zip(&b[4..260]) {
        *o = q as i8 as f32 * d;
    }
}
