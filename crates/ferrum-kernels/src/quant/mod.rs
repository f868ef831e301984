//! GGUF quantized block formats: dequantization to f32.
//!
//! The layouts follow ggml's `block_*` structs byte for byte; each function
//! takes whole blocks and writes `block_size` values per block. They are the
//! reference the quantized GEMM kernels are tested against, and the path that
//! loads small tensors (norms, biases) into f32.

pub mod act;
mod codebook;
mod kquants;

pub(crate) use codebook::{e8m0_half, iq4_xs_scales};
pub use codebook::{IQ4, MX};

pub(crate) use kquants::{file_quants, q3_k_scales, scale_min_k4};
mod legacy;
mod pack;

pub use pack::{pack_signed, quantize_q8_0, signed_range};

use ferrum_types::{FerrumError, GgmlType, Result};
use half::{bf16, f16};

/// Reads a little-endian f16 at `b[i..i + 2]` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, which must hold
/// exactly the number of values those blocks encode.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    if !bytes.len().is_multiple_of(bb) || bytes.len() / bb * bs != out.len() {
        return Err(FerrumError::invalid(format!(
            "dequantize {ty}: {} bytes do not encode {} values ({bs} values per {bb}-byte block)",
            bytes.len(),
            out.len()
        )));
    }
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs));
    use GgmlType as T;
    match ty {
        T::F32 => blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        T::F16 => f16_run(bytes, out),
        // The bits to an f32's top half: a loop the compiler vectorises.
        T::BF16 => blocks.for_each(|(b, o)| {
            o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        T::Q4_0 => blocks.for_each(|(b, o)| legacy::q4_0(b, o)),
        T::Q4_1 => blocks.for_each(|(b, o)| legacy::q4_1(b, o)),
        T::Q5_0 => blocks.for_each(|(b, o)| legacy::q5_0(b, o)),
        T::Q5_1 => blocks.for_each(|(b, o)| legacy::q5_1(b, o)),
        T::Q8_0 => blocks.for_each(|(b, o)| legacy::q8_0(b, o)),
        T::Q2_K => blocks.for_each(|(b, o)| kquants::q2_k(b, o)),
        T::Q3_K => blocks.for_each(|(b, o)| kquants::q3_k(b, o)),
        T::Q4_K => blocks.for_each(|(b, o)| kquants::q4_k(b, o)),
        T::Q5_K => blocks.for_each(|(b, o)| kquants::q5_k(b, o)),
        T::Q6_K => blocks.for_each(|(b, o)| kquants::q6_k(b, o)),
        T::Q8_K => blocks.for_each(|(b, o)| kquants::q8_k(b, o)),
        T::IQ4_NL => blocks.for_each(|(b, o)| codebook::iq4_nl(b, o)),
        T::IQ4_XS => blocks.for_each(|(b, o)| codebook::iq4_xs(b, o)),
        T::MXFP4 => blocks.for_each(|(b, o)| codebook::mxfp4(b, o)),
        other => {
            return Err(FerrumError::unsupported(format!(
                "dequantizing {other} tensors is not supported"
            )))
        }
    }
    Ok(())
}

/// F16 to f32 through `half`'s vectorised slice conversion (F16C where the
/// CPU has it): prefill widens whole F16 weights through here.
fn f16_run(bytes: &[u8], out: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    const RUN: usize = 64;
    let mut bits = [0u16; RUN];
    for (b, o) in bytes.chunks(2 * RUN).zip(out.chunks_mut(RUN)) {
        for (x, p) in bits.iter_mut().zip(b.chunks_exact(2)) {
            *x = u16::from_le_bytes([p[0], p[1]]);
        }
        bits[..o.len()]
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(o);
    }
}

/// Whether [`dequantize`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType as T;
    matches!(
        ty,
        T::F32
            | T::F16
            | T::BF16
            | T::Q4_0
            | T::Q4_1
            | T::Q5_0
            | T::Q5_1
            | T::Q8_0
            | T::Q2_K
            | T::Q3_K
            | T::Q4_K
            | T::Q5_K
            | T::Q6_K
            | T::Q8_K
            | T::IQ4_NL
            | T::IQ4_XS
            | T::MXFP4
    )
}

/// `n_blocks` GGUF blocks of `ty` with random quants and small positive f16
/// scales (so dequantized values are O(0.1–1), like trained weights): test
/// data for kernels, and the weights of `ferrum bench --random-weights`.
/// `None` for types without a known scale layout.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Option<Vec<u8>> {
    // Byte offsets of each block's f16 scale fields (d, and dmin / m).
    let scales: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::MXFP4 | GgmlType::F16 | GgmlType::BF16 => &[],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => return None,
    };
    let bb = ty.block_bytes();
    if bb == 2 {
        // F16, BF16: values uniform in ±0.05.
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        return Some(
            (0..n_blocks)
                .flat_map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
                    match ty {
                        GgmlType::F16 => f16::from_f32(v).to_le_bytes(),
                        _ => bf16::from_f32(v).to_le_bytes(),
                    }
                })
                .collect(),
        );
    }
    // xorshift64*: fast, and plenty for test data.
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545F4914F6CDD1D)
    };
    let mut bytes = vec![0u8; n_blocks * bb];
    for chunk in bytes.chunks_mut(8) {
        let r = next().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    for blk in bytes.chunks_mut(bb) {
        if ty == GgmlType::MXFP4 {
            // 2^-10 .. 2^-3 per block: levels up to 12 give values up to 1.5.
            blk[0] = 118 + (next() % 8) as u8;
        }
        for &o in scales {
            let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
            let d = f16::from_f32(0.001 + 0.049 * u).to_le_bytes();
            blk[o..o + 2].copy_from_slice(&d);
        }
    }
    Some(bytes)
}
