//! Quantized Hugging Face checkpoints: `config.json`'s `quantization_config`
//! (GPTQ, AWQ, FP8, compressed-tensors) and each scheme's on-disk packing.
//!
//! The integer schemes all mean `w[j, i] = scale[j, g] · (q[j, i] − zero[j, g])`
//! with `g` the group of input column `i`; they differ only in how `q`,
//! `zero`, `scale` and the groups are packed. Each unpacker therefore yields
//! one plain [`GroupedInts`], and a single converter (in the model crate)
//! turns that into kernel formats. FP8 weights unpack to f32 values.

use ferrum_types::{FerrumError, Result};
use safetensors::Dtype;
use serde_json::Value;

use crate::safetensors::SafeTensors;

/// A checkpoint's quantization scheme, validated.
#[derive(Clone, Debug, PartialEq)]
pub enum HfQuant {
    /// GPTQ (AutoGPTQ / GPTQModel): `qweight` packed along the input dim,
    /// `qzeros` along the output dim, `g_idx` mapping inputs to groups.
    /// `v2`: `checkpoint_format` `gptq_v2`, whose zeros are stored as they
    /// are (v1 stores `zero − 1`).
    Gptq {
        bits: u32,
        group_size: Option<usize>,
        desc_act: bool,
        sym: bool,
        v2: bool,
    },
    /// AWQ, GEMM layout: 4-bit values packed along the output dim in the
    /// order 0, 2, 4, 6, 1, 3, 5, 7, zero points packed the same way.
    Awq { group_size: usize },
    /// FP8 e4m3 weights times `weight_scale_inv`: one per tensor, one per
    /// output row, or one per `block` (rows × columns).
    Fp8 { block: Option<[usize; 2]> },
    /// compressed-tensors `pack-quantized`: ints packed along the input dim,
    /// eight 4-bit (or four 8-bit) to a word; zero points packed along the
    /// output dim when asymmetric.
    PackQuantized {
        bits: u32,
        group_size: Option<usize>,
        symmetric: bool,
    },
    /// compressed-tensors `float-quantized`: FP8 e4m3 weights times
    /// `weight_scale` (per tensor, per channel or per block).
    FloatQuantized { block: Option<[usize; 2]> },
}

fn field<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    cfg.get(key).filter(|v| !v.is_null())
}

fn bad(field: &str, value: impl std::fmt::Display, supported: &str) -> String {
    format!("quantization_config: {field} = {value} is not supported ({supported})")
}

/// `group_size`: a positive multiple of 32 or -1/absent (one group per row).
fn group_size(cfg: &Value) -> std::result::Result<Option<usize>, String> {
    match field(cfg, "group_size").map(|v| (v.as_i64(), v)) {
        None | Some((Some(-1), _)) => Ok(None),
        Some((Some(g), _)) if g > 0 && g % 32 == 0 => Ok(Some(g as usize)),
        Some((_, v)) => Err(bad("group_size", v, "a multiple of 32, or -1")),
    }
}

fn block_size(v: Option<&Value>) -> std::result::Result<Option<[usize; 2]>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let dims: Vec<usize> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default();
    match dims[..] {
        [r, c] if r > 0 && c > 0 => Ok(Some([r, c])),
        _ => Err(bad("weight_block_size", v, "two positive integers")),
    }
}

impl HfQuant {
    /// The scheme a `config.json`'s `quantization_config` section describes.
    /// An unknown method or variant is an error naming the field and its
    /// value.
    pub fn from_section(q: &Value) -> std::result::Result<Self, String> {
        let method = field(q, "quant_method")
            .and_then(Value::as_str)
            .unwrap_or("");
        let bits = || field(q, "bits").and_then(Value::as_u64).unwrap_or(0) as u32;
        match method {
            "gptq" => {
                let bits = bits();
                if bits != 4 && bits != 8 {
                    return Err(bad("bits", bits, "GPTQ with 4 or 8 bits"));
                }
                let format = field(q, "checkpoint_format")
                    .and_then(Value::as_str)
                    .unwrap_or("gptq");
                let v2 = match format {
                    "gptq" => false,
                    "gptq_v2" => true,
                    other => return Err(bad("checkpoint_format", other, "gptq or gptq_v2")),
                };
                let flag = |k| field(q, k).and_then(Value::as_bool);
                Ok(HfQuant::Gptq {
                    bits,
                    group_size: group_size(q)?,
                    desc_act: flag("desc_act").unwrap_or(false),
                    sym: flag("sym").unwrap_or(true),
                    v2,
                })
            }
            "awq" => {
                if bits() != 4 {
                    return Err(bad("bits", bits(), "AWQ with 4 bits"));
                }
                let version = field(q, "version")
                    .and_then(Value::as_str)
                    .unwrap_or("gemm");
                if !version.eq_ignore_ascii_case("gemm") {
                    return Err(bad("version", version, "AWQ's gemm layout"));
                }
                if field(q, "zero_point").and_then(Value::as_bool) == Some(false) {
                    return Err(bad("zero_point", false, "AWQ with zero points"));
                }
                let group_size = group_size(q)?.ok_or_else(|| {
                    bad(
                        "group_size",
                        -1,
                        "AWQ with a group size that is a multiple of 32",
                    )
                })?;
                Ok(HfQuant::Awq { group_size })
            }
            "fp8" => {
                let fmt = field(q, "fmt").and_then(Value::as_str).unwrap_or("e4m3");
                if fmt != "e4m3" {
                    return Err(bad("fmt", fmt, "e4m3"));
                }
                Ok(HfQuant::Fp8 {
                    block: block_size(field(q, "weight_block_size"))?,
                })
            }
            "compressed-tensors" => compressed(q),
            other => Err(bad(
                "quant_method",
                format!("{other:?}"),
                "gptq, awq, fp8 or compressed-tensors",
            )),
        }
    }

    /// One line for `ferrum inspect`.
    pub fn describe(&self) -> String {
        let groups = |g: &Option<usize>| g.map_or("per row".to_string(), |g| format!("group {g}"));
        match self {
            HfQuant::Gptq { bits, group_size, desc_act, sym, v2 } => format!(
                "GPTQ int{bits}, {}, {}{}, checkpoint format {}",
                groups(group_size),
                if *sym { "symmetric" } else { "asymmetric" },
                if *desc_act { ", act-order" } else { "" },
                if *v2 { "gptq_v2" } else { "gptq" }
            ),
            HfQuant::Awq { group_size } => format!("AWQ int4 (GEMM layout), group {group_size}"),
            HfQuant::Fp8 { block } => format!("FP8 e4m3, {}", fp8_scales(block)),
            HfQuant::PackQuantized { bits, group_size, symmetric } => format!(
                "compressed-tensors pack-quantized int{bits}, {}, {}",
                groups(group_size),
                if *symmetric {
                    "symmetric"
                } else {
                    "asymmetric"
                }
            ),
            HfQuant::FloatQuantized { block } => {
                format!(
                    "compressed-tensors float-quantized FP8 e4m3, {}",
                    fp8_scales(block)
                )
            }
        }
    }
}

fn fp8_scales(block: &Option<[usize; 2]>) -> String {
    block.map_or("per-tensor or per-channel scales".into(), |[r, c]| {
        format!("{r}x{c} block scales")
    })
}

/// compressed-tensors: one config group whose `weights` say the format.
fn compressed(q: &Value) -> std::result::Result<HfQuant, String> {
    let format = field(q, "format").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<&Value> = field(q, "config_groups")
        .and_then(Value::as_object)
        .map(|m| m.values().collect())
        .unwrap_or_default();
    let [group] = groups[..] else {
        return Err(bad(
            "config_groups",
            format!("{} groups", groups.len()),
            "exactly one group",
        ));
    };
    let w = field(group, "weights").ok_or("quantization_config: config group has no weights")?;
    let num_bits = field(w, "num_bits").and_then(Value::as_u64).unwrap_or(0) as u32;
    let ty = field(w, "type").and_then(Value::as_str).unwrap_or("int");
    let strategy = field(w, "strategy").and_then(Value::as_str).unwrap_or("");
    match format {
        "pack-quantized" => {
            if ty != "int" || !matches!(num_bits, 4 | 8) {
                return Err(bad(
                    "weights",
                    format!("{ty} {num_bits}-bit"),
                    "pack-quantized int4 or int8",
                ));
            }
            let group_size = match strategy {
                "group" => group_size(w)?,
                "channel" => None,
                other => return Err(bad("strategy", other, "group or channel")),
            };
            Ok(HfQuant::PackQuantized {
                bits: num_bits,
                group_size,
                symmetric: field(w, "symmetric")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            })
        }
        "float-quantized" => {
            if ty != "float" || num_bits != 8 {
                return Err(bad(
                    "weights",
                    format!("{ty} {num_bits}-bit"),
                    "float-quantized FP8",
                ));
            }
            let block = match strategy {
                "tensor" | "channel" => None,
                "block" => block_size(field(w, "block_structure"))?,
                other => return Err(bad("strategy", other, "tensor, channel or block")),
            };
            Ok(HfQuant::FloatQuantized { block })
        }
        other => Err(bad(
            "format",
            format!("{other:?}"),
            "pack-quantized or float-quantized",
        )),
    }
}

/// One integer-quantized weight `[n, k]`, unpacked:
/// `w[j, i] = scale[j·groups + g] · (q[j·k + i] − zero[j·groups + g])`
/// with `g = group_of[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedInts {
    pub n: usize,
    pub k: usize,
    pub bits: u32,
    /// `[n, k]` unsigned codes below `2^bits`.
    pub q: Vec<u8>,
    pub groups: usize,
    /// `[n, groups]`.
    pub scale: Vec<f32>,
    /// `[n, groups]`; up to `2^bits` (GPTQ v1 stores `zero − 1` in `bits`
    /// bits, so a stored all-ones word means `2^bits`).
    pub zero: Vec<u16>,
    /// `[k]`: the group of each input column.
    pub group_of: Vec<u32>,
}

impl GroupedInts {
    /// The f32 weight `[n, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (j, row) in out.chunks_exact_mut(self.k).enumerate() {
            for (i, w) in row.iter_mut().enumerate() {
                let g = j * self.groups + self.group_of[i] as usize;
                *w = self.scale[g] * (f32::from(self.q[j * self.k + i]) - f32::from(self.zero[g]));
            }
        }
        out
    }
}

/// A quantized linear weight as read from the checkpoint.
pub enum HfLinear {
    Ints(GroupedInts),
    /// FP8 weights times their scales, `[n, k]`.
    Floats {
        k: usize,
        values: Vec<f32>,
    },
}

fn err(name: &str, msg: impl std::fmt::Display) -> FerrumError {
    FerrumError::invalid(format!("tensor {name}: {msg}"))
}

/// Reads `name` as i32 words, checking its shape.
fn words(st: &SafeTensors, name: &str, shape: &[usize]) -> Result<Vec<i32>> {
    let (v, got) = st.to_i32(name)?;
    if got != shape {
        return Err(err(name, format!("shape {got:?}, expected {shape:?}")));
    }
    Ok(v)
}

/// Reads `name` as f32 values, checking its shape.
fn floats(st: &SafeTensors, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let (v, got) = st.to_f32(name)?;
    if got != shape {
        return Err(err(name, format!("shape {got:?}, expected {shape:?}")));
    }
    Ok(v)
}

/// Field `i` of `bits` bits in word `w`.
fn nibble(w: i32, i: usize, bits: u32) -> u32 {
    ((w as u32) >> (i as u32 * bits)) & ((1u32 << bits) - 1)
}

/// The group of each of `k` inputs: `g_idx` when the checkpoint has one
/// (act-order), else consecutive groups of `group_size`.
fn group_index(
    st: &SafeTensors,
    name: &str,
    k: usize,
    groups: usize,
    group_size: Option<usize>,
) -> Result<Vec<u32>> {
    let idx: Vec<u32> = if st.contains(name) {
        words(st, name, &[k])?
            .into_iter()
            .map(|g| u32::try_from(g).unwrap_or(u32::MAX))
            .collect()
    } else {
        let gs = group_size.unwrap_or(k).max(1);
        (0..k).map(|i| (i / gs) as u32).collect()
    };
    if let Some(bad) = idx.iter().find(|&&g| g as usize >= groups) {
        return Err(err(
            name,
            format!("group {bad} is out of range for {groups} groups"),
        ));
    }
    Ok(idx)
}

fn groups_for(k: usize, group_size: Option<usize>) -> usize {
    group_size.map_or(1, |g| k.div_ceil(g))
}

/// The shape `[n, k]` of the quantized weight stored for `weight_name`
/// (`….weight`) under `scheme`, read from its packed tensors; `None` where
/// this weight is not quantized (kept as a plain tensor, such as `lm_head`).
pub fn quantized_shape(
    st: &SafeTensors,
    scheme: &HfQuant,
    weight_name: &str,
) -> Result<Option<(usize, usize)>> {
    let base = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
    let t = |s: &str| format!("{base}.{s}");
    let dims = |name: &str| -> Result<Option<(usize, usize)>> {
        match st.get(name).map(|v| v.shape.to_vec()).as_deref() {
            None => Ok(None),
            Some([a, b]) => Ok(Some((*a, *b))),
            Some(other) => Err(err(name, format!("shape {other:?}, expected 2 dimensions"))),
        }
    };
    Ok(match *scheme {
        HfQuant::Gptq { bits, .. } => {
            dims(&t("qweight"))?.map(|(kp, n)| (n, kp * (32 / bits) as usize))
        }
        HfQuant::Awq { .. } => dims(&t("qweight"))?.map(|(k, n8)| (n8 * 8, k)),
        HfQuant::PackQuantized { .. } => {
            if !st.contains(&t("weight_packed")) {
                return Ok(None);
            }
            let name = t("weight_shape");
            let shape = words(st, &name, &[2])?;
            let dim =
                |x: i32| usize::try_from(x).map_err(|_| err(&name, format!("says {shape:?}")));
            Some((dim(shape[0])?, dim(shape[1])?))
        }
        HfQuant::Fp8 { .. } | HfQuant::FloatQuantized { .. } => match st.get(weight_name) {
            Some(w) if w.dtype == Dtype::F8_E4M3 => dims(weight_name)?,
            // Kept in higher precision (an ignored layer such as lm_head).
            _ => None,
        },
    })
}

/// The integer or FP8 weight stored for `weight_name` under `scheme`
/// (`None`: not quantized, see [`quantized_shape`]); it must hold the
/// `numel` values the model expects.
pub fn load_linear(
    st: &SafeTensors,
    scheme: &HfQuant,
    weight_name: &str,
    numel: usize,
) -> Result<Option<HfLinear>> {
    let Some((n, k)) = quantized_shape(st, scheme, weight_name)? else {
        return Ok(None);
    };
    if n * k != numel || n == 0 {
        return Err(err(
            weight_name,
            format!("the checkpoint holds a [{n}, {k}] weight, expected {numel} values"),
        ));
    }
    let base = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
    Ok(Some(match *scheme {
        HfQuant::Gptq { bits, group_size, v2, .. } => {
            HfLinear::Ints(gptq(st, base, bits, group_size, v2, n, k)?)
        }
        HfQuant::Awq { group_size } => HfLinear::Ints(awq(st, base, group_size, n, k)?),
        HfQuant::PackQuantized { bits, group_size, symmetric } => {
            HfLinear::Ints(packed(st, base, bits, group_size, symmetric, n, k)?)
        }
        HfQuant::Fp8 { block } | HfQuant::FloatQuantized { block } => {
            let scale = match scheme {
                HfQuant::Fp8 { .. } => "weight_scale_inv",
                _ => "weight_scale",
            };
            let scale = format!("{base}.{scale}");
            HfLinear::Floats {
                k,
                values: fp8(st, weight_name, &scale, block, n, k)?,
            }
        }
    }))
}

fn pack_check(name: &str, bits: u32, n: usize, k: usize, along_k: bool) -> Result<usize> {
    let pack = (32 / bits) as usize;
    let dim = if along_k { k } else { n };
    if !dim.is_multiple_of(pack) {
        return Err(err(
            name,
            format!("{dim} is not a multiple of {pack} values per packed word"),
        ));
    }
    Ok(pack)
}

fn gptq(
    st: &SafeTensors,
    base: &str,
    bits: u32,
    group_size: Option<usize>,
    v2: bool,
    n: usize,
    k: usize,
) -> Result<GroupedInts> {
    let name = |s: &str| format!("{base}.{s}");
    let pack = pack_check(&name("qweight"), bits, n, k, true)?;
    pack_check(&name("qzeros"), bits, n, k, false)?;
    let qweight = words(st, &name("qweight"), &[k / pack, n])?;
    // With act-order the number of groups is the scales' row count.
    let (scales, sshape) = st.to_f32(&name("scales"))?;
    let groups = match sshape[..] {
        [g, cols] if cols == n && g > 0 => g,
        _ => {
            return Err(err(
                &name("scales"),
                format!("shape {sshape:?}, expected [groups, {n}]"),
            ))
        }
    };
    if !st.contains(&name("g_idx")) && groups != groups_for(k, group_size) {
        return Err(err(
            &name("scales"),
            format!("{groups} groups do not cover k = {k} in groups of {group_size:?}"),
        ));
    }
    let qzeros = words(st, &name("qzeros"), &[groups, n / pack])?;
    let group_of = group_index(st, &name("g_idx"), k, groups, group_size)?;
    let mut q = vec![0u8; n * k];
    for (w, word) in qweight.iter().enumerate() {
        let (row, j) = (w / n, w % n);
        for p in 0..pack {
            q[j * k + row * pack + p] = nibble(*word, p, bits) as u8;
        }
    }
    let mut zero = vec![0u16; n * groups];
    let mut scale = vec![0f32; n * groups];
    for g in 0..groups {
        for j in 0..n {
            let z = nibble(qzeros[g * (n / pack) + j / pack], j % pack, bits) as u16;
            zero[j * groups + g] = if v2 { z } else { z + 1 };
            scale[j * groups + g] = scales[g * n + j];
        }
    }
    Ok(GroupedInts {
        n,
        k,
        bits,
        q,
        groups,
        scale,
        zero,
        group_of,
    })
}

/// AWQ's packing order: field `i` of a word holds output `8c + AWQ_ORDER[i]`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

fn awq(st: &SafeTensors, base: &str, group_size: usize, n: usize, k: usize) -> Result<GroupedInts> {
    let name = |s: &str| format!("{base}.{s}");
    pack_check(&name("qweight"), 4, n, k, false)?;
    let groups = k.div_ceil(group_size);
    let qweight = words(st, &name("qweight"), &[k, n / 8])?;
    let qzeros = words(st, &name("qzeros"), &[groups, n / 8])?;
    let scales = floats(st, &name("scales"), &[groups, n])?;
    let mut q = vec![0u8; n * k];
    for (w, word) in qweight.iter().enumerate() {
        let (i, c) = (w / (n / 8), w % (n / 8));
        for (f, o) in AWQ_ORDER.iter().enumerate() {
            q[(8 * c + o) * k + i] = nibble(*word, f, 4) as u8;
        }
    }
    let mut zero = vec![0u16; n * groups];
    let mut scale = vec![0f32; n * groups];
    for g in 0..groups {
        for c in 0..n / 8 {
            for (f, o) in AWQ_ORDER.iter().enumerate() {
                let j = 8 * c + o;
                zero[j * groups + g] = nibble(qzeros[g * (n / 8) + c], f, 4) as u16;
                scale[j * groups + g] = scales[g * n + j];
            }
        }
    }
    Ok(GroupedInts {
        n,
        k,
        bits: 4,
        q,
        groups,
        scale,
        zero,
        group_of: (0..k).map(|i| (i / group_size) as u32).collect(),
    })
}

fn packed(
    st: &SafeTensors,
    base: &str,
    bits: u32,
    group_size: Option<usize>,
    symmetric: bool,
    n: usize,
    k: usize,
) -> Result<GroupedInts> {
    let name = |s: &str| format!("{base}.{s}");
    let pack = (32 / bits) as usize;
    let groups = groups_for(k, group_size);
    let words_per_row = k.div_ceil(pack);
    let packed = words(st, &name("weight_packed"), &[n, words_per_row])?;
    let scale = floats(st, &name("weight_scale"), &[n, groups])?;
    let zero: Vec<u16> = if symmetric {
        vec![1 << (bits - 1); n * groups]
    } else {
        let zp = words(st, &name("weight_zero_point"), &[n.div_ceil(pack), groups])?;
        let mut zero = vec![0u16; n * groups];
        for (j, z) in zero.chunks_exact_mut(groups).enumerate() {
            for (g, z) in z.iter_mut().enumerate() {
                *z = nibble(zp[(j / pack) * groups + g], j % pack, bits) as u16;
            }
        }
        zero
    };
    let mut q = vec![0u8; n * k];
    for (j, row) in q.chunks_exact_mut(k).enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            *v = nibble(packed[j * words_per_row + i / pack], i % pack, bits) as u8;
        }
    }
    Ok(GroupedInts {
        n,
        k,
        bits,
        q,
        groups,
        scale,
        zero,
        group_of: group_index(st, &name("weight_g_idx"), k, groups, group_size)?,
    })
}

/// The value of an FP8 e4m3 ("fn": no infinities, one NaN pattern) byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0xF), f32::from(b & 7));
    let mag = match (e, b & 0x7F) {
        (_, 0x7F) => f32::NAN,
        (0, _) => m / 8.0 * 2f32.powi(-6),
        _ => (1.0 + m / 8.0) * 2f32.powi(e - 7),
    };
    sign * mag
}

/// An FP8 weight `[n, k]` times its scales: one scale, one per row, or one
/// per `block` of rows × columns.
fn fp8(
    st: &SafeTensors,
    weight_name: &str,
    scale_name: &str,
    block: Option<[usize; 2]>,
    n: usize,
    k: usize,
) -> Result<Vec<f32>> {
    let data = st.get(weight_name).map(|w| w.data).unwrap_or_default();
    let (scales, _) = st.to_f32(scale_name)?;
    let blocks = block.map(|[br, bc]| (br, bc, n.div_ceil(br) * k.div_ceil(bc)));
    let scale_of: Box<dyn Fn(usize, usize) -> f32> = match (blocks, scales.len()) {
        (Some((br, bc, count)), len) if len == count => {
            let cols = k.div_ceil(bc);
            Box::new(move |j, i| scales[(j / br) * cols + i / bc])
        }
        (None, 1) => Box::new(move |_, _| scales[0]),
        (None, len) if len == n => Box::new(move |j, _| scales[j]),
        (_, len) => {
            return Err(err(
                scale_name,
                format!(
                    "{len} scales fit neither one per tensor, per row nor per block of {block:?} for [{n}, {k}]"
                ),
            ))
        }
    };
    let values = data
        .iter()
        .enumerate()
        .map(|(x, &b)| e4m3_to_f32(b) * scale_of(x / k, x % k))
        .collect::<Vec<f32>>();
    if values.len() != n * k || values.iter().any(|v| v.is_nan()) {
        return Err(err(weight_name, "holds NaN or fewer bytes than its shape"));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn e4m3_values() {
        // From the OCP FP8 spec's e4m3 table.
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert!(e4m3_to_f32(0x7F).is_nan());
    }

    fn parse(q: Value) -> std::result::Result<Option<HfQuant>, String> {
        HfQuant::from_section(&q).map(Some)
    }

    #[test]
    fn configs_parse() {
        assert_eq!(
            parse(
                json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true, "sym": false})
            ),
            Ok(Some(HfQuant::Gptq {
                bits: 4,
                group_size: Some(128),
                desc_act: true,
                sym: false,
                v2: false
            }))
        );
        assert_eq!(
            parse(
                json!({"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"})
            ),
            Ok(Some(HfQuant::Gptq {
                bits: 8,
                group_size: None,
                desc_act: false,
                sym: true,
                v2: true
            }))
        );
        assert_eq!(
            parse(
                json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "GEMM", "zero_point": true})
            ),
            Ok(Some(HfQuant::Awq { group_size: 128 }))
        );
        assert_eq!(
            parse(
                json!({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
            ),
            Ok(Some(HfQuant::Fp8 { block: Some([128, 128]) }))
        );
        let ct = |format: &str, weights: Value| {
            json!({"quant_method": "compressed-tensors", "format": format,
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}})
        };
        assert_eq!(
            parse(ct(
                "pack-quantized",
                json!({"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group", "group_size": 32})
            )),
            Ok(Some(HfQuant::PackQuantized {
                bits: 4,
                group_size: Some(32),
                symmetric: false
            }))
        );
        assert_eq!(
            parse(ct(
                "float-quantized",
                json!({"num_bits": 8, "type": "float", "strategy": "channel"})
            )),
            Ok(Some(HfQuant::FloatQuantized { block: None }))
        );
    }

    #[test]
    fn unsupported_variants_name_the_field() {
        let cases = [
            (
                json!({"quant_method": "gptq", "bits": 3, "group_size": 128}),
                "bits = 3",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4, "group_size": 100}),
                "group_size = 100",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}),
                "checkpoint_format = marlin",
            ),
            (
                json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}),
                "version = gemv",
            ),
            (
                json!({"quant_method": "bitsandbytes"}),
                "quant_method = \"bitsandbytes\"",
            ),
            (json!({"quant_method": "fp8", "fmt": "e5m2"}), "fmt = e5m2"),
        ];
        for (q, want) in cases {
            let e = parse(q.clone()).expect_err(&q.to_string());
            assert!(e.contains(want), "{e} should name {want}");
        }
    }
}
