//! Integer checkpoints (GPTQ, AWQ, compressed-tensors) as GGUF blocks.
//!
//! `w = s · (q − z)` per group is exactly `d · v` with `d = s` and the
//! signed `v = q − z`, so the weights become 32-value block formats the
//! backends already run, with no rounding: Q4_0 when every zero point is
//! 8 (symmetric 4-bit: `v` in `-8..=7`), Q5_0 for other 4-bit zeros (`v`
//! in `-16..=15`; asymmetric 4-bit needs the fifth bit: Q4_1's f16 offset
//! `−z·s` would round), Q8_0 for 8-bit weights whose `v` fits in i8. Q5_0
//! costs 22 bytes per 32 weights against Q4_1's 20: 10% more to read per
//! token for exact weights (`ferrum bench --random-type q5_0` vs `q4_1`).
//! A group narrower than a block, or 8-bit values outside i8, would need
//! rounding, so such weights are dequantized to f32 instead (and said).
//! Act-order weights (`g_idx` not monotonic) are stored with their columns
//! sorted by group and an input order for the backend (`QuantWeights`).
//! Blocks store `d` as f16: exact for GPTQ and AWQ (f16 scales) and for
//! bf16 scales in f16's normal range; f32 scales round by 2^-11 relative,
//! far below the 4-bit step itself.

use ferrum_formats::hf_quant::{load_linear, quantized_shape, GroupedInts, HfLinear, HfQuant};
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::quant::pack_signed;
use ferrum_kernels::GgufQuantType;
use ferrum_types::Result;

/// A converted weight: blocks (with the input order of an act-order
/// checkpoint), or f32 where no block format holds it exactly.
pub(super) enum Converted {
    Blocks {
        bytes: Vec<u8>,
        ty: GgufQuantType,
        order: Option<Vec<u32>>,
    },
    F32(Vec<f32>),
}

/// The input order that sorts `group_of` (stable), or `None` if already
/// sorted.
fn sorting_order(group_of: &[u32]) -> Option<Vec<u32>> {
    if group_of.windows(2).all(|w| w[0] <= w[1]) {
        return None;
    }
    let mut order: Vec<u32> = (0..group_of.len() as u32).collect();
    order.sort_by_key(|&i| group_of[i as usize]);
    Some(order)
}

/// The block type that holds every `q − z` of `w` exactly.
fn block_type(w: &GroupedInts) -> Option<GgufQuantType> {
    match w.bits {
        4 if w.zero.iter().all(|&z| z == 8) => Some(GgufQuantType::Q4_0),
        4 => Some(GgufQuantType::Q5_0),
        8 => {
            let fits = w.q.chunks_exact(w.k).enumerate().all(|(j, row)| {
                row.iter().zip(&w.group_of).all(|(&q, &g)| {
                    let v = i32::from(q) - i32::from(w.zero[j * w.groups + g as usize]);
                    (-128..=127).contains(&v)
                })
            });
            fits.then_some(GgufQuantType::Q8_0)
        }
        _ => None,
    }
}

/// Converts `w` (see the module comment).
pub(super) fn convert(w: &GroupedInts) -> Result<Converted> {
    let order = sorting_order(&w.group_of);
    let col = |j: usize| order.as_ref().map_or(j, |o| o[j] as usize);
    // Every 32 consecutive (sorted) columns must share a group.
    let one_group_per_block = w.k.is_multiple_of(32)
        && (0..w.k)
            .step_by(32)
            .all(|b| (b..b + 32).all(|j| w.group_of[col(j)] == w.group_of[col(b)]));
    let ty = block_type(w).filter(|_| one_group_per_block);
    let Some(ty) = ty else {
        tracing::warn!(
            "a {}-bit weight [{}, {}] has groups no 32-value block format holds exactly; kept as f32",
            w.bits,
            w.n,
            w.k
        );
        return Ok(Converted::F32(w.dequantize()));
    };
    let blocks = w.k / 32;
    let mut d = Vec::with_capacity(w.n * blocks);
    let mut v = Vec::with_capacity(w.n * w.k);
    for j in 0..w.n {
        for b in 0..blocks {
            let g = j * w.groups + w.group_of[col(32 * b)] as usize;
            d.push(w.scale[g]);
            let z = i32::from(w.zero[g]);
            // In range: `block_type` chose a type that holds every `q − z`.
            v.extend((32 * b..32 * b + 32).map(|c| (i32::from(w.q[j * w.k + col(c)]) - z) as i8));
        }
    }
    Ok(Converted::Blocks {
        bytes: pack_signed(ty.ggml(), &d, &v)?,
        ty,
        order,
    })
}

/// What Ferrum runs each quantized weight of a checkpoint as, for
/// `ferrum inspect`: `(weight, layout)` in name order. Unpacks every
/// weight, as loading does.
pub fn checkpoint_layouts(st: &SafeTensors, scheme: &HfQuant) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in st.names() {
        let Some(base) = [".qweight", ".weight_packed", ".weight"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
        else {
            continue;
        };
        let weight = format!("{base}.weight");
        let Some((n, k)) = quantized_shape(st, scheme, &weight)? else {
            continue;
        };
        let layout = match load_linear(st, scheme, &weight, n * k)? {
            Some(HfLinear::Ints(g)) => match convert(&g)? {
                Converted::Blocks { ty, order, .. } => format!(
                    "{ty:?} blocks{}",
                    if order.is_some() {
                        " + act-order input order"
                    } else {
                        ""
                    }
                ),
                Converted::F32(_) => "f32 (no block format holds it exactly)".into(),
            },
            Some(HfLinear::Floats { .. }) => "Q8_0 blocks (rounded from FP8)".into(),
            None => continue,
        };
        out.push((format!("{weight} [{n}, {k}]"), layout));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrum_kernels::quant::dequantize;

    /// A random weight: `bits`, zeros `zero(j, g)`, groups of `gs` columns,
    /// scattered over the columns when `act_order`.
    fn random(bits: u32, gs: usize, act_order: bool, zero: impl Fn(usize) -> u16) -> GroupedInts {
        let (n, k) = (8, 128);
        let mut s = 12345u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let groups = k / gs;
        let mut group_of: Vec<u32> = (0..k).map(|i| (i / gs) as u32).collect();
        if act_order {
            for i in (1..k).rev() {
                group_of.swap(i, next() as usize % (i + 1));
            }
        }
        GroupedInts {
            n,
            k,
            bits,
            q: (0..n * k).map(|_| (next() % (1 << bits)) as u8).collect(),
            groups,
            // f16 values, as checkpoints store them.
            scale: (0..n * groups)
                .map(|i| (1 + i % 7) as f32 / 128.0)
                .collect(),
            zero: (0..n * groups).map(zero).collect(),
            group_of,
        }
    }

    /// The converted weight's values in the checkpoint's column order.
    fn values(c: Converted, n: usize, k: usize) -> (Option<GgufQuantType>, Vec<f32>) {
        match c {
            Converted::F32(v) => (None, v),
            Converted::Blocks { bytes, ty, order } => {
                let mut sorted = vec![0f32; n * k];
                dequantize(ty.ggml(), &bytes, &mut sorted).unwrap();
                let mut v = sorted.clone();
                for j in 0..n {
                    for c in 0..k {
                        let src = order.as_ref().map_or(c, |o| o[c] as usize);
                        v[j * k + src] = sorted[j * k + c];
                    }
                }
                (Some(ty), v)
            }
        }
    }

    #[test]
    fn conversion_is_exact_and_picks_the_narrowest_type() {
        use GgufQuantType as T;
        let cases: Vec<(GroupedInts, Option<T>)> = vec![
            (random(4, 32, false, |_| 8), Some(T::Q4_0)),
            (random(4, 64, true, |_| 8), Some(T::Q4_0)),
            (random(4, 32, false, |i| (i % 17) as u16), Some(T::Q5_0)),
            (random(4, 128, true, |i| (i % 16) as u16 + 1), Some(T::Q5_0)),
            (random(8, 32, true, |_| 128), Some(T::Q8_0)),
            // 8-bit values beyond i8, and groups narrower than a block:
            // no block format holds them, so f32.
            (random(8, 32, false, |_| 3), None),
            (random(4, 16, false, |_| 8), None),
        ];
        for (w, want) in cases {
            let (ty, got) = values(convert(&w).unwrap(), w.n, w.k);
            assert_eq!(ty, want, "bits {} groups {}", w.bits, w.groups);
            assert!(got == w.dequantize(), "{ty:?}: values differ");
        }
    }
}
