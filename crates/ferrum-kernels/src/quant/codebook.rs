//! The 4-bit codebook formats (IQ4_NL, IQ4_XS, MXFP4): each 4-bit index
//! picks one of sixteen signed integers, times the block's scale.
//!
//! - IQ4_NL: 32 values, an f16 `d` and 16 bytes of indices (low nibbles
//!   values 0..16, high ones 16..32, as Q4_0); `x = d · IQ4[q]`.
//! - IQ4_XS: 256 values, an f16 `d`, a 6-bit scale `ls` per 32 (low four
//!   bits in `scales_l`, a nibble per 32, the top two in the u16
//!   `scales_h`), then IQ4_NL's index layout per 32: `x = d·(ls−32)·IQ4[q]`.
//! - MXFP4 (OCP microscaling, gpt-oss's experts): 32 values, an E8M0 byte
//!   `e` (a power of two) and the indices; the codebook is FP4 E2M1's eight
//!   magnitudes doubled to integers, so `x = 2^(e−128) · MX[q]`.

use super::f16_at;

/// IQ4_NL's and IQ4_XS's sixteen levels (ggml's `kvalues_iq4nl`).
pub const IQ4: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's levels: E2M1 values times two (ggml's `kvalues_mxfp4`).
pub const MX: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 32 values from 16 bytes of indices into `levels`, times `d`.
fn nibbles(qs: &[u8], levels: &[i8; 16], d: f32, out: &mut [f32]) {
    for j in 0..16 {
        out[j] = d * f32::from(levels[usize::from(qs[j] & 0xF)]);
        out[j + 16] = d * f32::from(levels[usize::from(qs[j] >> 4)]);
    }
}

pub(super) fn iq4_nl(b: &[u8], out: &mut [f32]) {
    nibbles(&b[2..18], &IQ4, f16_at(b, 0), out);
}

/// IQ4_XS's eight signed sub-block scales `ls − 32`.
pub(crate) fn iq4_xs_scales(b: &[u8]) -> [i32; 8] {
    let high = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|s| {
        let low = (b[4 + s / 2] >> (4 * (s % 2))) & 0xF;
        let top = (high >> (2 * s)) & 3;
        (i32::from(low) | i32::from(top) << 4) - 32
    })
}

pub(super) fn iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (s, ls) in iq4_xs_scales(b).into_iter().enumerate() {
        let qs = &b[8 + 16 * s..8 + 16 * (s + 1)];
        nibbles(qs, &IQ4, d * ls as f32, &mut out[32 * s..32 * (s + 1)]);
    }
}

/// `2^(e − 128)` (ggml's `ggml_e8m0_to_fp32_half`), exact for every `e`:
/// the two smallest are f32 subnormals.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

pub(super) fn mxfp4(b: &[u8], out: &mut [f32]) {
    nibbles(&b[1..17], &MX, e8m0_half(b[0]), out);
}
