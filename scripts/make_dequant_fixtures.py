#!/usr/bin/env python3
"""Writes crates/ferrum-kernels/tests/fixtures/dequant.json: a few blocks of every
GGUF type Ferrum dequantizes, with the values the `gguf` Python package's numpy
dequantizer gives for them (the independent reference).

Blocks come from real tensors of the fetched models where a model has that type,
otherwise from random bytes with finite random scales. Q8_K (an activation-only
format the package does not dequantize) is computed here from its layout:
f32 d, int8 qs[256], int16 bsums[16] -> d * qs.

    python3 -m venv /tmp/gg && /tmp/gg/bin/pip install gguf numpy
    scripts/fetch-models.sh smollm2 qwen0.5b gemma3
    /tmp/gg/bin/python scripts/make_dequant_fixtures.py [MODELS_DIR]
"""
import base64, json, os, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

BLOCKS = 4
models = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
    "FERRUM_MODELS", os.path.expanduser("~/.cache/ferrum/models"))
files = ["SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "gemma-3-270m-q4_k_m.gguf"]
types = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
         "IQ4_NL", "IQ4_XS", "MXFP4"]
# f16 scale fields (byte offsets) per block, for random blocks.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ4_NL": [0], "IQ4_XS": [0]}

rng = np.random.default_rng(7)
real = {}
for f in files:
    path = os.path.join(models, f)
    if not os.path.exists(path):
        sys.exit(f"missing {path}: run scripts/fetch-models.sh first")
    for t in gguf.GGUFReader(path).tensors:
        name = t.tensor_type.name
        if name not in real:
            real[name] = (f"{f}:{t.name}", bytes(np.asarray(t.data).reshape(-1).view(np.uint8)))

out = {}
for name in types:
    qt = Q[name]
    bs, bb = gguf.GGML_QUANT_SIZES[qt]
    n = BLOCKS * max(bs, 64 if bs == 1 else bs)  # plain types: 64 values
    nbytes = n // bs * bb
    if name in real and len(real[name][1]) >= nbytes:
        source, raw = real[name][0], real[name][1][:nbytes]
    else:
        source = "random blocks"
        if name in ("F32", "F16", "BF16"):
            v = rng.normal(0, 2, n).astype(np.float32)
            raw = {"F32": v.tobytes(), "F16": v.astype(np.float16).tobytes(),
                   "BF16": (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()}[name]
        else:
            buf = bytearray(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
            for blk in range(n // bs):
                if name == "MXFP4":
                    buf[blk * bb] = int(rng.integers(110, 135))  # E8M0: 2^(e-128)
                if name == "Q8_K":
                    buf[blk * bb: blk * bb + 4] = np.float32(rng.normal(0, 0.01)).tobytes()
                for off in F16_FIELDS.get(name, []):
                    p = blk * bb + off
                    buf[p:p + 2] = np.float16(rng.normal(0, 0.05)).tobytes()
            raw = bytes(buf)
    if name == "Q8_K":
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, bb)
        d = blocks[:, :4].copy().view(np.float32)
        qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        values = (d * qs).reshape(-1)
    else:
        values = dequantize(np.frombuffer(raw, dtype=np.uint8), qt).reshape(-1).astype(np.float32)
    assert values.size == n, (name, values.size, n)
    out[name] = {"source": source, "bytes_b64": base64.b64encode(raw).decode(),
                 "values": [float(x) for x in values]}
    print(f"{name:5} {n:5} values from {source}")

dest = os.path.join(os.path.dirname(__file__), "..", "crates", "ferrum-kernels", "tests", "fixtures", "dequant.json")
with open(dest, "w") as fh:
    json.dump({"generator": "scripts/make_dequant_fixtures.py", "gguf_version": gguf.__version__ if hasattr(gguf, "__version__") else "unknown", "types": out}, fh)
print("wrote", os.path.normpath(dest))
