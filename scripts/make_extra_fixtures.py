#!/usr/bin/env python3
"""Tiny random checkpoints with transformers' outputs for what the shared
hf-tiny fixtures do not cover: YaRN RoPE, DeepSeek-V2-Lite's attention
(queries without the low-rank bottleneck) and DeepSeek-V3's router
(`noaux_tc`: sigmoid scores, a per-expert selection bias, groups ranked by
their two best scores).

    python scripts/make_extra_fixtures.py [OUT_DIR [NAME ...]]

Run in a venv with torch and transformers 5.24 (the version the shared
fixtures' newest rows were made with). It reuses `make_hf_tiny.py` from
`fixtures/` (this repository's copy): same seed, same
weight distributions, same `reference.json` layout and the same checks
(reload is bit-identical, `generate()` equals a cache-free greedy loop).
OUT_DIR defaults to `crates/ferrum-models/tests/data/hf-tiny`; the output
is committed (about 2 MB), so CI needs neither torch nor transformers.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

import make_hf_tiny as base  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

MLA = dict(base.COMMON, num_key_value_heads=4)


def yarn(theta, factor, orig, **extra):
    return dict(rope_type="yarn", rope_theta=theta, factor=factor,
                original_max_position_embeddings=orig, beta_fast=32.0, beta_slow=1.0, **extra)


def configs():
    c = {}
    c["qwen2-yarn"] = (
        Qwen2ForCausalLM,
        Qwen2Config(**base.COMMON, rope_parameters=yarn(1e6, 4.0, 64), tie_word_embeddings=True,
                    use_sliding_window=False),
        "Qwen2 with YaRN (factor 4, original 64, beta 32/1): of the 8 frequencies 1 is kept, 1 blended, "
        "6 divided by 4; cos/sin scaled by 0.1 ln 4 + 1 (no mscale keys)",
    )
    c["deepseek-v2-lite"] = (
        DeepseekV2ForCausalLM,
        DeepseekV2Config(
            **MLA, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=16,
            v_head_dim=16, head_dim=16, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
            moe_intermediate_size=32, first_k_dense_replace=1, topk_method="greedy", norm_topk_prob=False,
            routed_scaling_factor=1.0, rope_parameters=yarn(1e4, 8.0, 64, mscale=0.707, mscale_all_dim=0.707),
            tie_word_embeddings=False,
        ),
        "DeepSeek-V2-Lite shape: latent attention with a plain q_proj (no q LoRA), 16 rope dims, YaRN "
        "(factor 8, original 64, mscale = mscale_all_dim = 0.707: cos/sin unscaled, softmax scale times "
        "(0.0707 ln 8 + 1)^2); layer 0 dense, layer 1 MoE 8 experts top-2 greedy softmax + 2 shared",
    )
    c["deepseek-v3"] = (
        DeepseekV3ForCausalLM,
        DeepseekV3Config(
            **MLA, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
            rope_parameters=yarn(1e4, 4.0, 128, mscale=1.0, mscale_all_dim=1.0), tie_word_embeddings=False,
        ),
        "DeepSeek-V3: q LoRA latent attention, YaRN (factor 4, original 128, mscale 1/1), noaux_tc router: "
        "sigmoid scores, random e_score_correction_bias N(0, 0.2) added for the choice only, 4 groups of 2 "
        "ranked by the sum of their two best biased scores, best 2 groups kept, top-2, renormalised, x2.5",
    )
    v3 = c["deepseek-v3"][1].to_dict()
    v3["rope_interleave"] = False
    c["deepseek-v3-halves"] = (
        DeepseekV3ForCausalLM,
        DeepseekV3Config(**{k: v for k, v in v3.items() if k in DeepseekV3Config().to_dict()}),
        "deepseek-v3 with rope_interleave false: its rope dims rotate in halves (i, i + d/2), not in "
        "adjacent pairs as DeepSeek's own checkpoints store them",
    )
    return c


def reinit_with_router_bias(model, gemma=False):
    """The shared re-initialisation, then the routers' selection bias (a
    buffer, which it does not touch), so the fixture exercises it."""
    plain_reinit(model, gemma)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.normal_(0.0, base.WEIGHT_STD)


plain_reinit = base.reinit_
base.reinit_ = reinit_with_router_bias


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "crates", "ferrum-models",
                                                              "tests", "data", "hf-tiny")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    base.transformers.logging.set_verbosity_error()
    only = sys.argv[2:]
    for name, (cls, cfg, note) in configs().items():
        if not only or name in only:
            base.make_decoder(name, cls, cfg, note, out)


if __name__ == "__main__":
    main()
