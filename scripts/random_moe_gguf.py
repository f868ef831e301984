"""Writes a GGUF of Qwen3-30B-A3B's shapes with random weights (Q4_K experts and
attention, f32 routers, a stand-in vocabulary), so llama.cpp and Ferrum can be timed
on the same file where the real checkpoint is not at hand. Needs `gguf` and `numpy`;
about a minute and 17 GB for all 48 layers.

    python scripts/random_moe_gguf.py OUT.gguf [LAYERS]
"""
import sys
import numpy as np
import gguf

out = sys.argv[1]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 48
h, heads, kv, hd, ne, k, eim, vocab = 2048, 32, 4, 128, 128, 8, 768, 151936
w = gguf.GGUFWriter(out, "qwen3moe")
w.add_context_length(40960); w.add_embedding_length(h); w.add_block_count(layers)
w.add_feed_forward_length(6144); w.add_expert_feed_forward_length(eim)
w.add_head_count(heads); w.add_head_count_kv(kv); w.add_key_length(hd); w.add_value_length(hd)
w.add_rope_dimension_count(hd); w.add_rope_freq_base(1e6); w.add_layer_norm_rms_eps(1e-6)
w.add_expert_count(ne); w.add_expert_used_count(k); w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
toks += [f"\u2581t{i}" for i in range(vocab - len(toks))]
types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
types += [gguf.TokenType.NORMAL] * (vocab - 259)
w.add_tokenizer_model("llama"); w.add_token_list(toks); w.add_token_scores([0.0] * vocab); w.add_token_types(types)
w.add_bos_token_id(1); w.add_eos_token_id(2)
rng = np.random.default_rng(0)
QK = gguf.GGMLQuantizationType.Q4_K

def q4k(shape):
    """Random Q4_K blocks with small positive f16 scales: shape [.., rows, k]."""
    *lead, rows, kk = shape
    nb = int(np.prod(lead or [1])) * rows * kk // 256
    b = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
    d = np.full((nb, 2), 0.001, dtype=np.float16).view(np.uint8)
    b[:, 0:2] = d[:, 0:2]; b[:, 2:4] = d[:, 0:2]
    return b.reshape(*lead, rows, kk // 256 * 144)

def f32(*shape):
    return (rng.standard_normal(shape).astype(np.float32) * 0.02)

w.add_tensor("token_embd.weight", q4k([vocab, h]), raw_dtype=QK)
w.add_tensor("output_norm.weight", np.ones(h, np.float32))
w.add_tensor("output.weight", q4k([vocab, h]), raw_dtype=QK)
for i in range(layers):
    p = f"blk.{i}."
    w.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(h, np.float32))
    w.add_tensor(p + "attn_q_norm.weight", np.ones(hd, np.float32))
    w.add_tensor(p + "attn_k_norm.weight", np.ones(hd, np.float32))
    w.add_tensor(p + "attn_q.weight", q4k([heads * hd, h]), raw_dtype=QK)
    w.add_tensor(p + "attn_k.weight", q4k([kv * hd, h]), raw_dtype=QK)
    w.add_tensor(p + "attn_v.weight", q4k([kv * hd, h]), raw_dtype=QK)
    w.add_tensor(p + "attn_output.weight", q4k([h, heads * hd]), raw_dtype=QK)
    w.add_tensor(p + "ffn_gate_inp.weight", f32(ne, h))
    w.add_tensor(p + "ffn_gate_exps.weight", q4k([ne, eim, h]), raw_dtype=QK)
    w.add_tensor(p + "ffn_up_exps.weight", q4k([ne, eim, h]), raw_dtype=QK)
    w.add_tensor(p + "ffn_down_exps.weight", q4k([ne, h, eim]), raw_dtype=QK)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
