"""Converts a small Hugging Face folder (an `fixtures/hf-tiny`
checkpoint: llama, mixtral, qwen2, qwen3_moe, phi3, gemma2, deepseek_v2/v3) into an f32 GGUF file
the way llama.cpp's `convert_hf_to_gguf.py` (and its `conversion/` modules)
do: their metadata keys and tensor names, Q/K rows permuted to ggml's RoPE
layout for `llama`, experts stacked into `ffn_*_exps`, Gemma norms stored as
1 + w, Llama 3.1 RoPE scaling written as the `rope_freqs.weight` factors,
YaRN as `rope.scaling.*` keys (DeepSeek's `mscale_all_dim` as 0.1 times it
in `yarn_log_multiplier`) and DeepSeek V3's router as sigmoid gating with
groups and the `exp_probs_b` bias.
llama.cpp's own script needs torch, which this set-up avoids; llama.cpp
itself reads the result (`scripts/llama_cpp_logits.py`) as the check. The fixtures carry no
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


# HF model_type -> GGUF architecture (llama.cpp converts Mixtral as `llama`).
ARCH = {"llama": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3_moe": "qwen3moe", "phi3": "phi3",
        "gemma2": "gemma2", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2"}


def main(src, dst):
    src = Path(src)
    cfg = json.loads((src / "config.json").read_text())
    mt = cfg["model_type"]
    if mt not in ARCH:
        sys.exit(f"{src}: model_type {mt!r}; this converts {', '.join(ARCH)}")
    arch = ARCH[mt]
    t = load_file(str(src / "model.safetensors"))
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    vocab = cfg["vocab_size"]
    rope = cfg.get("rope_parameters") or {**(cfg.get("rope_scaling") or {}),
                                          "rope_theta": cfg.get("rope_theta", 10000.0)}
    n_exp = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    mla = mt in ("deepseek_v2", "deepseek_v3")

    w = gguf.GGUFWriter(dst, arch)
    # Not the folder's name: llama.cpp keys token attributes on names like "phi3".
    w.add_name("hf-tiny fixture")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    rot = int(rope.get("partial_rotary_factor", 1.0) * hidden) // n_head if mt == "phi3" else head_dim
    if mla:
        rot = cfg["qk_rope_head_dim"]
    w.add_rope_dimension_count(rot)
    w.add_head_count(n_head)
    # DeepSeek's latent attention is stored as one KV head (MQA), as llama.cpp does.
    w.add_head_count_kv(1 if mla else n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if mla:
        rank, rope_d = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        if cfg.get("q_lora_rank"):  # DeepSeek-V2-Lite has a plain q_proj instead
            w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(rank)
        w.add_key_length(rank + rope_d)
        w.add_value_length(rank)
        w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope_d)
        w.add_value_length_mla(cfg["v_head_dim"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        if cfg.get("norm_topk_prob"):
            w.add_expert_weights_norm(True)
        if mt == "deepseek_v3":  # noaux_tc: sigmoid scores, groups ranked by their two best
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
            w.add_expert_group_count(cfg["n_group"])
            w.add_expert_group_used_count(cfg["topk_group"])
    else:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if n_exp:
        w.add_expert_count(n_exp)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if mt == "qwen3_moe":
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if rope.get("rope_type") == "yarn":  # as llama.cpp's converter writes it
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow),
                         ("attention_factor", w.add_rope_scaling_yarn_attn_factor)):
            if rope.get(key) is not None:
                add(rope[key])
        if mla and rope.get("mscale_all_dim") is not None:
            w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if mt == "phi3":
        w.add_rope_scaling_orig_ctx_len(cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
        w.add_sliding_window(cfg.get("sliding_window") or 0)
    if mt == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])

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

    # llama.cpp's Gemma converters store RMSNorm weights as 1 + w.
    def norm(x):
        return x + 1 if mt == "gemma2" else x

    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", norm(t["model.norm.weight"]))
    if "lm_head.weight" in t or mt != "gemma2":
        w.add_tensor("output.weight", t.get("lm_head.weight", t["model.embed_tokens.weight"]))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out = {}
        if mla:
            a = p + "self_attn."
            nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            kv_b = t[a + "kv_b_proj.weight"].reshape(n_head, nope + v, -1)
            if a + "q_proj.weight" in t:
                out.update(attn_q=t[a + "q_proj.weight"])
            else:
                out.update(attn_q_a=t[a + "q_a_proj.weight"], attn_q_a_norm=t[a + "q_a_layernorm.weight"],
                           attn_q_b=t[a + "q_b_proj.weight"])
            out.update(attn_kv_a_mqa=t[a + "kv_a_proj_with_mqa.weight"],
                       attn_kv_a_norm=t[a + "kv_a_layernorm.weight"],
                       # k_b transposed per head [n_head, rank, nope]; v_b [n_head, v, rank].
                       attn_k_b=kv_b[:, :nope, :].transpose(0, 2, 1), attn_v_b=kv_b[:, nope:, :])
        elif mt == "phi3":
            out["attn_qkv"] = t[p + "self_attn.qkv_proj.weight"]
        else:
            q, k = t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"]
            if arch == "llama":
                q, k = permute(q, n_head, n_head), permute(k, n_head, n_kv)
            out.update(attn_q=q, attn_k=k, attn_v=t[p + "self_attn.v_proj.weight"])
        out["attn_output"] = t[p + "self_attn.o_proj.weight"]
        out["attn_norm"] = norm(t[p + "input_layernorm.weight"])
        if mt == "gemma2":
            out["post_attention_norm"] = norm(t[p + "post_attention_layernorm.weight"])
            out["ffn_norm"] = norm(t[p + "pre_feedforward_layernorm.weight"])
            out["post_ffw_norm"] = norm(t[p + "post_feedforward_layernorm.weight"])
        else:
            out["ffn_norm"] = t[p + "post_attention_layernorm.weight"]
        if mt == "qwen3_moe":
            out["attn_q_norm"] = t[p + "self_attn.q_norm.weight"]
            out["attn_k_norm"] = t[p + "self_attn.k_norm.weight"]
        if n_exp and f"{p}mlp.gate.weight" in t and mla:
            e = lambda name: np.stack([t[f"{p}mlp.experts.{x}.{name}.weight"] for x in range(n_exp)])
            out.update(ffn_gate_inp=t[f"{p}mlp.gate.weight"], ffn_gate_exps=e("gate_proj"),
                       ffn_up_exps=e("up_proj"), ffn_down_exps=e("down_proj"),
                       ffn_gate_shexp=t[f"{p}mlp.shared_experts.gate_proj.weight"],
                       ffn_up_shexp=t[f"{p}mlp.shared_experts.up_proj.weight"],
                       ffn_down_shexp=t[f"{p}mlp.shared_experts.down_proj.weight"])
        elif n_exp and not mla:
            # Experts stacked [n_exp, rows, k], as llama.cpp's converters do.
            block, (g, u, d) = (("block_sparse_moe", ("w1", "w3", "w2")) if mt == "mixtral"
                                else ("mlp", ("gate_proj", "up_proj", "down_proj")))
            e = lambda name: np.stack([t[f"{p}{block}.experts.{x}.{name}.weight"] for x in range(n_exp)])
            out.update(ffn_gate_inp=t[f"{p}{block}.gate.weight"], ffn_gate_exps=e(g),
                       ffn_up_exps=e(u), ffn_down_exps=e(d))
        elif mt == "phi3":
            out.update(ffn_up=t[p + "mlp.gate_up_proj.weight"], ffn_down=t[p + "mlp.down_proj.weight"])
        else:
            out.update(ffn_gate=t[p + "mlp.gate_proj.weight"], ffn_up=t[p + "mlp.up_proj.weight"],
                       ffn_down=t[p + "mlp.down_proj.weight"])
        for name, x in out.items():
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(x, dtype=np.float32))
        biases = {"exp_probs_b": f"{p}mlp.gate.e_score_correction_bias"}
        if mt == "qwen2":
            biases.update({f"attn_{x}": f"{p}self_attn.{x}_proj.bias" for x in "qkv"})
        for name, hf in biases.items():
            if hf in t:
                w.add_tensor(f"blk.{i}.{name}.bias", np.ascontiguousarray(t[hf], dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
