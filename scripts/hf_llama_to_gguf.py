"""Converts a small Hugging Face Llama folder (an `../shared/fixtures/hf-tiny`
checkpoint) into an f32 GGUF file the way llama.cpp's `convert_hf_to_gguf.py`
does for `LlamaForCausalLM`: its metadata keys, its tensor names, Q/K rows
permuted to ggml's RoPE layout, and Llama 3.1 RoPE scaling written as the
`rope_freqs.weight` factors (not as metadata). The fixtures carry no
tokenizer, so a byte-fallback SentencePiece vocabulary of the model's size
stands in (llama.cpp needs one to load the file; the tests feed token ids).

Needs `gguf`, `safetensors` and `numpy` from PyPI (no torch).

    python scripts/hf_llama_to_gguf.py HF_DIR OUT.gguf
"""
import json
import math
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file


def permute(w, n_head, n_head_kv):
    """llama.cpp's `LlamaModel.permute`: HF's half-split rotary rows to
    ggml's interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(rope, head_dim):
    """llama.cpp's `LlamaModel.generate_extra_tensors` for `rope_type: llama3`."""
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = rope.get("factor", 8.0)
    low = rope.get("low_freq_factor", 1.0)
    high = rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def main(src, dst):
    src = Path(src)
    cfg = json.loads((src / "config.json").read_text())
    if cfg["model_type"] != "llama":
        sys.exit(f"{src}: model_type {cfg['model_type']!r}, this converts llama only")
    t = load_file(str(src / "model.safetensors"))
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    vocab = cfg["vocab_size"]
    rope = cfg.get("rope_parameters") or {**(cfg.get("rope_scaling") or {}),
                                          "rope_theta": cfg.get("rope_theta", 10000.0)}

    w = gguf.GGUFWriter(dst, "llama")
    w.add_name(src.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    # A byte-fallback SentencePiece vocabulary of the model's size.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    w.add_tensor("output.weight", t.get("lm_head.weight", t["model.embed_tokens.weight"]))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names = {
            "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
        }
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(t[p + "self_attn.q_proj.weight"], n_head, n_head))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(t[p + "self_attn.k_proj.weight"], n_head, n_kv))
        for g, h in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", t[p + h + ".weight"])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
