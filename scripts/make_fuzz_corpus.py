"""Writes the seed inputs of the fuzz targets (`fuzz/seeds/<target>/`):
a tiny valid checkpoint of each kind and the hostile cases issue #61 found,
kept as regression inputs. `crates/ferrum-engine/tests/fuzz_corpus.rs` runs
every target on them and on mutations of them in CI; `cargo fuzz run
<target>` starts from them.

Input layouts:
- gguf_file: a GGUF file's bytes.
- hf_checkpoint: config.json, a NUL byte, then model.safetensors' bytes.
- chat_template: a Jinja chat template's text.

Needs `gguf`, `safetensors` and `numpy` (CI's venv has them).

    python scripts/make_fuzz_corpus.py fuzz/seeds
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# 260 tokens: the GGUF converter writes a byte-fallback vocabulary (3 + 256).
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
          "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 260, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "hidden_act": "silu"}


def tensors(cfg):
    rng = np.random.default_rng(0)
    h, i, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    t = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                  p + "self_attn.q_proj.weight": (nq * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
                  p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nq * hd),
                  p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                  p + "mlp.down_proj.weight": (h, i)})
    return {k: rng.standard_normal(s).astype(np.float32) * 0.1 for k, s in t.items()}


def checkpoint(cfg, ts):
    with tempfile.TemporaryDirectory() as d:
        save_file(ts, f"{d}/model.safetensors")
        return json.dumps(cfg).encode() + b"\0" + Path(f"{d}/model.safetensors").read_bytes()


def main(out):
    out = Path(out)
    hf = out / "hf_checkpoint"
    hf.mkdir(parents=True, exist_ok=True)
    good = tensors(CONFIG)
    (hf / "valid").write_bytes(checkpoint(CONFIG, good))
    # The cases of issue #61: a count of four billion layers (it aborted
    # allocating 6 TB), a transposed weight with the right element count,
    # a NaN-like and a negative hyperparameter, an untied model without
    # lm_head.weight.
    (hf / "layers_4294967295").write_bytes(checkpoint({**CONFIG, "num_hidden_layers": 4294967295}, good))
    transposed = dict(good)
    transposed["model.layers.0.mlp.gate_proj.weight"] = good["model.layers.0.mlp.gate_proj.weight"].T.copy()
    (hf / "transposed_gate").write_bytes(checkpoint(CONFIG, transposed))
    (hf / "rope_theta_huge").write_bytes(checkpoint({**CONFIG, "rope_theta": 1e308 * 10}, good))
    (hf / "rms_norm_eps_negative").write_bytes(checkpoint({**CONFIG, "rms_norm_eps": -1e-5}, good))
    untied = {k: v for k, v in good.items() if k != "lm_head.weight"}
    (hf / "lm_head_missing").write_bytes(checkpoint(CONFIG, untied))

    gg = out / "gguf_file"
    gg.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(CONFIG))
        save_file(good, f"{d}/model.safetensors")
        script = Path(__file__).with_name("hf_llama_to_gguf.py")
        subprocess.run([sys.executable, str(script), d, f"{d}/m.gguf"], check=True, stdout=subprocess.DEVNULL)
        valid = Path(f"{d}/m.gguf").read_bytes()
    (gg / "valid").write_bytes(valid)
    # block_count = 0xFFFFFFFF: `inspect` and `run` grew to 3.7 GB and hung.
    key = b"llama.block_count"
    at = valid.index(key) + len(key)
    assert valid[at:at + 4] == (4).to_bytes(4, "little")  # GGUF type UINT32
    bad = valid[:at + 4] + (0xFFFFFFFF).to_bytes(4, "little") + valid[at + 8:]
    (gg / "block_count_4294967295").write_bytes(bad)

    ct = out / "chat_template"
    ct.mkdir(parents=True, exist_ok=True)
    (ct / "valid").write_text(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    (ct / "llama3").write_text(
        "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
        " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
    # A template that loops (it froze the server) and ones that grow their
    # output or recurse without bound.
    (ct / "loops").write_text("{% for i in range(1000000000) %}{% for j in range(1000000000) %}x{% endfor %}{% endfor %}")
    (ct / "huge_output").write_text("{{ 'x' * 1000000000 }}")
    (ct / "recursion").write_text("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")


if __name__ == "__main__":
    main(sys.argv[1])
