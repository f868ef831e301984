//! The 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
//!
//! Each block starts with an f16 scale `d` (and for `_1` types an f16 offset
//! `m`); 4-bit values sit low nibble first for elements 0..16 and high nibble
//! for 16..32; the 5-bit types keep the fifth bits in a little-endian u32.

use super::f16_at;

pub(super) fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        out[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
        out[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

pub(super) fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        out[j] = (qs[j] & 0xF) as f32 * d + m;
        out[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// The two 5-bit values `(j, j + 16)` of a Q5 block, before offset.
fn q5_pair(qh: u32, qs: &[u8], j: usize) -> (u32, u32) {
    let h0 = ((qh >> j) << 4) & 0x10;
    let h1 = (qh >> (j + 12)) & 0x10;
    ((qs[j] & 0xF) as u32 | h0, (qs[j] >> 4) as u32 | h1)
}

pub(super) fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (x0, x1) = q5_pair(qh, qs, j);
        out[j] = (x0 as i32 - 16) as f32 * d;
        out[j + 16] = (x1 as i32 - 16) as f32 * d;
    }
}

pub(super) fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let (x0, x1) = q5_pair(qh, qs, j);
        out[j] = x0 as f32 * d + m;
        out[j + 16] = x1 as f32 * d + m;
    }
}

pub(super) fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = q as i8 as f32 * d;
    }
}
