"""Checks the GPTQ and compressed-tensors packing of the folders
`make_quant_fixtures.py` wrote against code nobody here wrote: llama.cpp's
own dequantizers (`dequant_gptq`, `dequant_packed` in `conversion/base.py`
of its converter), lifted out of that file and run on our packed tensors.
Their output must equal the `dequantized/` weights bit for bit (which
Ferrum's unpacking equals too: tests/hf_quantized.rs). AWQ's packing follows
AutoAWQ's `WQLinear_GEMM.pack`, which llama.cpp does not read; FP8 needs a
torch with float8 (2.1+), which Debian's 1.13 is not, so FP8 values are
checked against `ml_dtypes` and the OCP table instead.

Needs torch and numpy (Debian: python3-torch).

    python3 scripts/check_quant_fixtures.py LLAMA_CPP_DIR QUANT_DIR
"""
import ast
import json
import struct
import sys
import types
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    """The tensors numpy can hold (BF16/FP8 are skipped: not needed here)."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__" or h["dtype"] not in NP:
            continue
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], NP[h["dtype"]]).reshape(h["shape"])
    return out


def bf16(path):
    """BF16 tensors as f32 (compressed-tensors' scales)."""
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name != "__metadata__" and h["dtype"] == "BF16":
            a, b = h["data_offsets"]
            u = np.frombuffer(raw[8 + n + a:8 + n + b], np.uint16).astype(np.uint32) << 16
            out[name] = u.view(np.float32).reshape(h["shape"])
    return out


class ItemSize(ast.NodeTransformer):
    """`DTYPE.itemsize` (torch 2.1+) as `torch.empty(0, dtype=DTYPE).element_size()`
    for Debian's torch 1.13: the one change made to llama.cpp's code."""

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr != "itemsize":
            return node
        empty = ast.Call(
            func=ast.Attribute(value=ast.Name(id="torch", ctx=ast.Load()), attr="empty", ctx=ast.Load()),
            args=[ast.Constant(0)], keywords=[ast.keyword(arg="dtype", value=node.value)])
        return ast.Call(func=ast.Attribute(value=empty, attr="element_size", ctx=ast.Load()), args=[], keywords=[])


def llama_cpp_dequantizers(base_py, quant_config):
    """llama.cpp's nested `dequant_gptq` and `dequant_packed`, compiled as
    they are with the names they close over."""
    tree = ast.parse(Path(base_py).read_text())
    wanted = {"dequant_gptq", "dequant_packed"}
    defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {d.name for d in defs} == wanted, f"{base_py} no longer defines {wanted}"
    module = ast.fix_missing_locations(ItemSize().visit(ast.Module(body=defs, type_ignores=[])))
    scope = {
        "torch": torch, "Tensor": Tensor, "Sequence": Sequence, "quant_config": quant_config,
        "self": types.SimpleNamespace(lazy=False), "LazyTorchTensor": None,
    }
    exec(compile(module, base_py, "exec"), scope)
    return scope["dequant_gptq"], scope["dequant_packed"]


def main(llama_cpp, quant_dir):
    base_py = Path(llama_cpp) / "conversion" / "base.py"
    checked = 0
    for d in sorted(Path(quant_dir).iterdir()):
        qc = json.loads((d / "config.json").read_text())["quantization_config"]
        method = qc["quant_method"]
        if method not in ("gptq", "compressed-tensors") or qc.get("format") == "float-quantized":
            continue
        dequant_gptq, dequant_packed = llama_cpp_dequantizers(base_py, qc)
        t = read_safetensors(d / "model.safetensors")
        t.update(bf16(d / "model.safetensors"))
        want = read_safetensors(d / "dequantized" / "model.safetensors")
        T = lambda name: torch.from_numpy(np.array(t[name]))
        for name in want:
            base = name.removesuffix(".weight")
            if method == "gptq" and base + ".qweight" in t:
                got = dequant_gptq(T(base + ".g_idx").long(), T(base + ".qweight"), T(base + ".qzeros"),
                                   T(base + ".scales"))
            elif method == "compressed-tensors" and base + ".weight_packed" in t:
                w = qc["config_groups"]["group_0"]["weights"]
                zp = T(base + ".weight_zero_point") if base + ".weight_zero_point" in t else None
                got = dequant_packed(T(base + ".weight_packed"), T(base + ".weight_scale"),
                                     T(base + ".weight_shape"), zp, w["num_bits"], w["group_size"])
            else:
                continue
            got = got.float().numpy()
            if not np.array_equal(got, want[name]):
                sys.exit(f"{d.name} {name}: llama.cpp's dequantizer differs by "
                         f"{np.abs(got - want[name]).max()}")
            checked += 1
        print(f"{d.name}: llama.cpp's dequantizer agrees")
    if checked == 0:
        sys.exit("no GPTQ or compressed-tensors weights found")


if __name__ == "__main__":
    main(*sys.argv[1:])
