#!/usr/bin/env python3
"""Tiny random checkpoints whose config.json is written the way the Hub's
published checkpoints write it (the older, flat style transformers still
reads), with transformers' outputs: the settings that were silently
misread before (issue 60) each get one.

    python scripts/make_hub_config_fixtures.py [OUT_DIR [NAME ...]]

Run in a venv with torch and transformers 5.24. Each model is built from a
transformers-5 config with `make_hf_tiny.py`'s seed and weight
distributions (from `fixtures/`)
and saved; then its config.json is replaced by the Hub-style text, the
folder is reloaded, and the reloaded model must give bit-identical logits
(so transformers reads the Hub text as the config it was built from);
`reference.json` is then written as `make_hf_tiny.py` writes it. OUT_DIR
defaults to `crates/ferrum-models/tests/data/hf-tiny`; the output is
committed, so CI needs neither torch nor transformers.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

import make_hf_tiny as base  # noqa: E402
from transformers import (  # noqa: E402
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)

C = base.COMMON


def longrope(pairs, short_base, long_base):
    """Per-pair frequency divisors, rising like Phi-3's."""
    short = [round(short_base + 0.05 * i, 4) for i in range(pairs)]
    long_ = [round(long_base * (1 + i), 4) for i in range(pairs)]
    return short, long_


def cases():
    """name -> (model class, transformers-5 config, Hub-style config.json dict, note)."""
    c = {}
    # Phi-4-mini: partial rotary (0.75 of 16 dims: 6 rotating pairs), LongRoPE
    # with the pretraining length at the top level, tied embeddings. The
    # prompt (12) passes the original length (8), so transformers takes the
    # long factors from the first step, as Ferrum's tables of 512 do.
    short, long_ = longrope(6, 1.0, 1.5)
    rope = {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "short_factor": short, "long_factor": long_,
    }
    cfg = Phi3Config(
        **C, rope_parameters=rope, original_max_position_embeddings=8, sliding_window=None,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    hub = {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **C,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75, "original_max_position_embeddings": 8,
        "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long_},
        "sliding_window": None, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    }
    c["phi4-mini-longrope"] = (
        Phi3ForCausalLM, cfg, hub,
        "Phi-4-mini's config shape: partial rotary 0.75, LongRoPE (long factors, attention factor sqrt(1 + ln 64 / ln 8)) "
        "with original_max_position_embeddings 8 at the top level, tied",
    )
    # Phi-3.5: full rotary, LongRoPE, the original length at the top level.
    short, long_ = longrope(8, 1.0, 1.3)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long_}
    cfg = Phi3Config(
        **C, rope_parameters=rope, original_max_position_embeddings=8, sliding_window=None,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    hub = {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", **C,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "original_max_position_embeddings": 8,
        "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long_},
        "sliding_window": None, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float32",
    }
    c["phi3.5-longrope"] = (
        Phi3ForCausalLM, cfg, hub,
        "Phi-3.5's config shape: LongRoPE over every dimension, original_max_position_embeddings 8 at the top level",
    )
    # Gemma 3 as google/gemma-3 ships it: no layer_types (sliding_window_pattern
    # instead), rope_local_base_freq for the sliding layers, the global
    # layers' linear scaling in rope_scaling.
    g3 = dict(C, num_hidden_layers=4)
    cfg = Gemma3TextConfig(
        **g3, head_dim=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        query_pre_attn_scalar=256, final_logit_softcapping=None, attn_logit_softcapping=None,
        tie_word_embeddings=True,
    )
    hub = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", **g3, "head_dim": 32,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "sliding_window": 8,
        "sliding_window_pattern": 2, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 256,
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    c["gemma3-hub"] = (
        Gemma3ForCausalLM, cfg, hub,
        "Gemma 3 as the Hub ships it: sliding_window_pattern 2 (sliding, full, sliding, full) without layer_types, "
        "rope_local_base_freq 1e4 for the sliding layers, linear x8 on the global ones (theta 1e6)",
    )
    # Gemma 2 without layer_types: transformers alternates, sliding first.
    g2 = dict(C, num_hidden_layers=4)
    cfg = Gemma2Config(
        **g2, head_dim=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        tie_word_embeddings=True,
    )
    hub = {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **g2, "head_dim": 32,
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "sliding_window": 8, "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    c["gemma2-hub"] = (
        Gemma2ForCausalLM, cfg, hub,
        "Gemma 2 as the Hub ships it: no layer_types, so layers alternate sliding(8)/full, sliding first",
    )
    # Mixtral with a sliding window (transformers applies it).
    cfg = MixtralConfig(
        **C, head_dim=16, rope_theta=1000000.0, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=8, tie_word_embeddings=False,
    )
    hub = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **C, "head_dim": 16,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "num_local_experts": 8,
        "num_experts_per_tok": 2, "sliding_window": 8, "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.02, "torch_dtype": "float32",
    }
    c["mixtral-swa"] = (
        MixtralForCausalLM, cfg, hub, "Mixtral with sliding_window 8 < 28 tokens",
    )
    # Llama with biases on every attention projection, o_proj included.
    cfg = LlamaConfig(**C, head_dim=16, rope_theta=500000.0, attention_bias=True, tie_word_embeddings=False)
    hub = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **C, "head_dim": 16,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "attention_bias": True,
        "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    c["llama-attn-bias"] = (
        LlamaForCausalLM, cfg, hub, "Llama with attention_bias: q, k, v and o_proj biases",
    )
    # Llama with biases on gate, up and down.
    cfg = LlamaConfig(**C, head_dim=16, rope_theta=10000.0, mlp_bias=True, tie_word_embeddings=False)
    hub = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **C, "head_dim": 16,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False,
        "mlp_bias": True, "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    c["llama-mlp-bias"] = (
        LlamaForCausalLM, cfg, hub, "Llama with mlp_bias: gate, up and down biases",
    )
    return c


@torch.no_grad()
def make(name, cls, cfg, hub, note, out_root):
    base.make_decoder(name, cls, cfg, note, out_root)
    out = os.path.join(out_root, name)
    ids = torch.tensor([base.INPUT_IDS])
    built = cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    want = built(ids, use_cache=False).logits[0]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hub, f, indent=2)
        f.write("\n")
    hub_model = cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    diff = (hub_model(ids, use_cache=False).logits[0] - want).abs().max().item()
    assert diff == 0.0, f"{name}: the Hub-style config changes transformers' logits by {diff}"
    print(f"{name:20s} the Hub-style config.json reads as the one it was built from")


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        HERE, "..", "crates", "ferrum-models", "tests", "data", "hf-tiny")
    only = set(sys.argv[2:])
    for name, (cls, cfg, hub, note) in cases().items():
        if not only or name in only:
            make(name, cls, cfg, hub, note, out_root)


if __name__ == "__main__":
    main()
