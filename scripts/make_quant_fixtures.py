"""Quantizes `fixtures/hf-tiny` checkpoints into the formats vLLM
users download (GPTQ v1/v2 4- and 8-bit with and without act-order, AWQ's
GEMM layout, FP8 with per-tensor / per-channel / block scales, and
compressed-tensors pack-quantized and float-quantized), with the packing
each project publishes, and writes beside every quantized folder a
`dequantized/` folder holding the f32 weights that checkpoint means.
Ferrum's logits on the two must agree (crates/ferrum-models/tests/hf_quantized.rs).

The packing follows the published code, read for this: GPTQModel's
`pack` (qweight packed along the input dim, qzeros along the output dim,
v1 zeros stored minus one), AutoAWQ's `WQLinear_GEMM.pack` (output dim,
order 0 2 4 6 1 3 5 7), compressed-tensors' `pack_to_int32` (input dim;
zero points along the output dim); `scripts/check_quant_fixtures.py`
dequantizes the result with llama.cpp's own converter code as the check.
FP8 folders also get `q8_0/`: the dequantized weights rounded to Q8_0 by
llama.cpp's reference quantizer (the `gguf` package's bit-exact port), which
is what Ferrum's CPU runs FP8 as.
Needs numpy, safetensors, gguf and ml_dtypes (FP8 and bf16 values).

    python scripts/make_quant_fixtures.py FIXTURE_DIR OUT_DIR
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, quants
from safetensors.numpy import load_file

GROUP = 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
DTYPES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
}


def save(tensors, path):
    """A safetensors file (written here: the Python package's numpy API has
    no FP8)."""
    header, data, offset = {}, [], 0
    for name, t in sorted(tensors.items()):
        t = np.ascontiguousarray(t)
        b = t.tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        data.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data))


def pack(vals, bits, axis):
    """Packs unsigned `vals` (< 2^bits) along `axis`, 32 / bits to an int32,
    value p of a word at bits p * bits."""
    per = 32 // bits
    v = np.moveaxis(vals.astype(np.uint32), axis, 0)
    v = v.reshape(v.shape[0] // per, per, *v.shape[1:])
    words = np.zeros(v.shape[:1] + v.shape[2:], dtype=np.uint32)
    for p in range(per):
        words |= v[:, p] << np.uint32(p * bits)
    return np.moveaxis(words, 0, axis).view(np.int32)


def quantize(w, bits, sym, group_of, groups, scale_dtype):
    """Per (row, group) scale and zero point; returns unsigned codes
    `q[n, k]`, `scale[n, groups]` (as stored), `zero[n, groups]` and the
    dequantized f32 weight."""
    n, k = w.shape
    maxq = 2**bits - 1
    scale = np.zeros((n, groups), np.float32)
    zero = np.zeros((n, groups), np.int64)
    for g in range(groups):
        cols = group_of == g
        wg = w[:, cols]
        if sym:
            s = np.abs(wg).max(axis=1) / (maxq // 2) + 1e-8
            z = np.full(n, 2 ** (bits - 1))
        else:
            lo, hi = np.minimum(wg.min(axis=1), 0), np.maximum(wg.max(axis=1), 0)
            s = (hi - lo) / maxq + 1e-8
            # v1 checkpoints store zero - 1: keep zeros >= 1 there.
            z = np.clip(np.round(-lo / s), 1, maxq)
        scale[:, g] = s.astype(scale_dtype).astype(np.float32)
        zero[:, g] = z
    s_col = scale[:, group_of]
    z_col = zero[:, group_of]
    q = np.clip(np.round(w / s_col) + z_col, 0, maxq).astype(np.int64)
    deq = (s_col * (q - z_col)).astype(np.float32)
    return q, scale.astype(scale_dtype), zero, deq


def act_order(k, seed):
    """GPTQ's act-order groups: input column `perm[i]` goes to group
    `i // GROUP`, `perm` (here random) by decreasing Hessian diagonal."""
    perm = np.random.default_rng(seed).permutation(k)
    g_idx = np.zeros(k, np.int32)
    g_idx[perm] = np.arange(k) // GROUP
    return g_idx


def gptq(w, bits, sym, desc_act, v2, seed):
    n, k = w.shape
    g_idx = act_order(k, seed) if desc_act else (np.arange(k) // GROUP).astype(np.int32)
    groups = k // GROUP
    q, scale, zero, deq = quantize(w, bits, sym, g_idx, groups, np.float16)
    stored_zero = zero if v2 else zero - 1
    t = {
        "qweight": pack(q.T, bits, 0),
        "qzeros": pack((stored_zero.T & (2**bits - 1)), bits, 1),
        "scales": scale.T.copy(),
        "g_idx": g_idx,
    }
    return t, deq


def awq(w, seed):
    n, k = w.shape
    group_of = np.arange(k) // GROUP
    q, scale, zero, deq = quantize(w, 4, False, group_of, k // GROUP, np.float16)

    def awq_pack(v):  # v: [rows, n] along the output dim, AWQ's order
        cols = v.reshape(v.shape[0], n // 8, 8)[:, :, AWQ_ORDER]
        return pack(cols.reshape(v.shape[0], n), 4, 1)

    return {"qweight": awq_pack(q.T), "qzeros": awq_pack(zero.T), "scales": scale.T.copy()}, deq


def ct_pack(w, sym, seed):
    n, k = w.shape
    group_of = np.arange(k) // GROUP
    q, scale, zero, deq = quantize(w, 4, sym, group_of, k // GROUP, ml_dtypes.bfloat16)
    t = {
        "weight_packed": pack(q, 4, 1),
        "weight_scale": scale,
        "weight_shape": np.array([n, k], np.int64),
    }
    if not sym:
        t["weight_zero_point"] = pack(zero, 4, 0)
    return t, deq


def fp8(w, scales, suffix, block=None):
    """FP8 e4m3 weights with per-tensor (`scales` "tensor"), per-row or block
    scales; the stored scale multiplies the FP8 value."""
    n, k = w.shape
    if scales == "tensor":
        s = np.array(np.abs(w).max() / 448.0, np.float32)
        s_full = np.full_like(w, s)
    elif scales == "channel":
        s = (np.abs(w).max(axis=1, keepdims=True) / 448.0).astype(np.float32)
        s_full = np.broadcast_to(s, w.shape)
    else:
        br, bc = block
        s = np.zeros(((n + br - 1) // br, (k + bc - 1) // bc), np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max() / 448.0
        s_full = np.repeat(np.repeat(s, br, 0), bc, 1)[:n, :k]
    q = (w / s_full).astype(ml_dtypes.float8_e4m3fn)
    deq = (q.astype(np.float32) * s_full).astype(np.float32)
    if scales == "tensor" and suffix == "weight_scale":
        s = s.reshape(1)
    return {"weight": q, suffix: s}, deq


def q8_0(w):
    """`w` through llama.cpp's Q8_0 quantizer and back."""
    q = quants.quantize(w.astype(np.float32), GGMLQuantizationType.Q8_0)
    return quants.dequantize(q, GGMLQuantizationType.Q8_0).reshape(w.shape).astype(np.float32)


def packed_names(packed, t):
    """The names of `packed` whose FP8 weight is `t` (empty if not FP8)."""
    w = packed.get(t)
    return {t} if w is not None and w.dtype == np.dtype(ml_dtypes.float8_e4m3fn) else set()


def variants():
    """(name, quantization_config, quantize(w, seed) -> (tensors, deq))."""
    ct = lambda fmt, weights: {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head"],
    }
    int4 = lambda sym: {"num_bits": 4, "type": "int", "symmetric": sym, "strategy": "group", "group_size": GROUP}
    gptq_cfg = lambda bits, sym, act, fmt: {
        "quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": act, "sym": sym,
        "checkpoint_format": fmt,
    }
    return [
        ("gptq-int4-sym", gptq_cfg(4, True, False, "gptq"), lambda w, s: gptq(w, 4, True, False, False, s)),
        ("gptq-int4-asym-actorder", gptq_cfg(4, False, True, "gptq"), lambda w, s: gptq(w, 4, False, True, False, s)),
        ("gptq-v2-int4-asym", gptq_cfg(4, False, False, "gptq_v2"), lambda w, s: gptq(w, 4, False, False, True, s)),
        ("gptq-int8-sym-actorder", gptq_cfg(8, True, True, "gptq"), lambda w, s: gptq(w, 8, True, True, False, s)),
        ("awq", {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": True},
         lambda w, s: awq(w, s)),
        ("fp8-tensor", {"quant_method": "fp8", "activation_scheme": "dynamic"},
         lambda w, s: fp8(w, "tensor", "weight_scale_inv")),
        ("fp8-channel", {"quant_method": "fp8", "activation_scheme": "dynamic"},
         lambda w, s: fp8(w, "channel", "weight_scale_inv")),
        ("fp8-block", {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]},
         lambda w, s: fp8(w, "block", "weight_scale_inv", (32, 32))),
        ("ct-int4-sym", ct("pack-quantized", int4(True)), lambda w, s: ct_pack(w, True, s)),
        ("ct-int4-asym", ct("pack-quantized", int4(False)), lambda w, s: ct_pack(w, False, s)),
        ("ct-fp8-channel", ct("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"}),
         lambda w, s: fp8(w, "channel", "weight_scale")),
    ]


# Projections that share an input share GPTQ's act-order (one Hessian).
SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def main(src, out):
    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    weights = load_file(src / "model.safetensors")
    for name, qcfg, fn in variants():
        d = out / f"{src.name}-{name}"
        (d / "dequantized").mkdir(parents=True, exist_ok=True)
        packed, deq = {}, {}
        for t, w in weights.items():
            proj = t.split(".")[-2]
            if t.endswith("_proj.weight") and ".layers." in t:
                layer = int(t.split(".layers.")[1].split(".")[0])
                seed = 1000 * layer + sum(map(ord, SHARED_INPUT.get(proj, proj)))
                tensors, dq = fn(w.astype(np.float32), seed)
                base = t.removesuffix(".weight")
                packed.update({f"{base}.{k}": v for k, v in tensors.items()})
                deq[t] = dq
            else:
                packed[t] = w
                deq[t] = w
        if "fp8" in name:
            (d / "q8_0").mkdir(exist_ok=True)
            q8 = {t: q8_0(w) if t in packed_names(packed, t) else w for t, w in deq.items()}
            save(q8, d / "q8_0" / "model.safetensors")
            (d / "q8_0" / "config.json").write_text(json.dumps(config, indent=1))
        save(packed, d / "model.safetensors")
        save(deq, d / "dequantized" / "model.safetensors")
        (d / "config.json").write_text(json.dumps({**config, "quantization_config": qcfg}, indent=1))
        (d / "dequantized" / "config.json").write_text(json.dumps(config, indent=1))
        shutil.copy(src / "reference.json", d / "reference.json")
        print(d)
    if src.name == "llama":
        malformed(out)


def malformed(out):
    """Broken copies of one GPTQ folder for the error tests: a qweight of the
    wrong shape, and a g_idx naming a group that does not exist."""
    src = out / "llama-gptq-int4-asym-actorder"
    bad = out.parent / "quant-bad"
    t = load_file(src / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj."
    for name, change in [
        ("qweight-shape", lambda t: t.update({q + "qweight": t[q + "qweight"][:-1]})),
        ("g_idx-range", lambda t: t.update({q + "g_idx": t[q + "g_idx"] + 100})),
    ]:
        d = bad / name
        d.mkdir(parents=True, exist_ok=True)
        broken = dict(t)
        change(broken)
        save(broken, d / "model.safetensors")
        shutil.copy(src / "config.json", d / "config.json")


if __name__ == "__main__":
    main(*sys.argv[1:])
