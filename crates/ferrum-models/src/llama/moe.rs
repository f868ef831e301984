//! Mixture-of-experts MLPs (Qwen3-MoE, Mixtral): a router scores every
//! expert per token, the `top_k` best run, and their outputs are mixed by
//! the router's softmax weights.
//!
//! Tokens are grouped per expert, so each expert's weights (kept in their
//! quantized blocks) are read once per step for all the tokens routed to
//! it, in prefill and batched decode alike: the expert's rows are gathered,
//! run through its gated MLP as one GEMM, and added back to their tokens
//! weighted ([`Backend::scale_add_rows`]). Where the backend groups experts
//! ([`Capabilities::grouped_experts`](ferrum_kernels::Capabilities), a GPU), all routed rows are gathered at
//! once, sorted by expert, and each projection runs as one grouped GEMM
//! over every expert of the step ([`Backend::gemm_quant_experts`]); each
//! token then sums its experts' rows ([`Backend::gather_add_rows`]). The
//! routing itself (a softmax over a handful of experts per token) runs on
//! the host.

use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::quant::dequantize;
use ferrum_kernels::{Backend, ExpertRows, GgufQuantType, Mat, QuantKind};
use ferrum_types::{FerrumError, Result};

use super::arch::Arch;
use super::config::{Activation, MoeConfig, Scoring};
use super::linear::{fuse_or_f32, Linear};
use super::tensors::{missing, require, vector, Bytes, Raw, Source};

/// A gated MLP: one expert, or a layer's dense MLP.
pub struct Expert<B: Backend> {
    /// Fused `[2·intermediate, hidden]`, gate rows first.
    pub gate_up: Linear<B>,
    pub down: Linear<B>,
    /// Biases of gate and up (fused as their weights) and of down, where
    /// the config has them (Llama's `mlp_bias`).
    pub bias: Option<[B::Buffer; 2]>,
}

pub struct MoeWeights<B: Backend> {
    /// `[experts, hidden]`.
    pub router: Linear<B>,
    /// Added to the sigmoid scores for choosing experts, not for weighting
    /// them (DeepSeek V3's `e_score_correction_bias`).
    pub choice_bias: Option<Vec<f32>>,
    pub experts: Vec<Expert<B>>,
    /// Run for every token beside the routed ones (DeepSeek).
    pub shared: Option<Expert<B>>,
}

/// Per-expert token lists of one step: the rows routed to expert `e` and
/// their weights.
#[derive(Default)]
pub struct Routing {
    pub rows: Vec<Vec<u32>>,
    pub weights: Vec<Vec<f32>>,
    /// Reused per token: (expert, weight, choice score).
    ranked: Vec<(usize, f32, f32)>,
    /// For grouped experts ([`Routing::sort_by_expert`]): the routed rows
    /// in expert order, each expert's span of them, and per token its
    /// slots' positions in that order with their weights (`per` a token,
    /// in expert order).
    sorted: Vec<u32>,
    spans: Vec<(usize, usize, usize)>,
    slot_pos: Vec<u32>,
    slot_weight: Vec<f32>,
    filled: Vec<usize>,
}

impl Routing {
    /// Routes `rows` tokens from their router logits (`[rows, experts]`).
    /// Scores per `m.scoring`: a softmax over all experts, or each logit's
    /// sigmoid with `bias` added for the choice only. The `top_k` best
    /// choices are taken (ties go to the lower expert index, as
    /// `torch.topk` picks them), their weights renormalised to sum to 1
    /// when `m.norm_top_k`, then multiplied by `m.routed_scale`.
    /// With `m.groups` (DeepSeek's group-limited routing), experts are
    /// picked only from the `keep` groups that rank best: by their best
    /// score after a softmax (V2's `group_limited_greedy`, which zeroes
    /// the others' scores, as transformers does), by the sum of their two
    /// best biased scores after a sigmoid (V3's `noaux_tc`).
    pub fn route(&mut self, logits: &[f32], m: &MoeConfig, bias: Option<&[f32]>) {
        let (experts, top_k, norm, scale) = (m.experts, m.top_k, m.norm_top_k, m.routed_scale);
        self.rows.resize_with(experts, Vec::new);
        self.weights.resize_with(experts, Vec::new);
        // Room for every token in every list, so that decode steps of a
        // batch size seen before do not allocate.
        let tokens = logits.len() / experts.max(1);
        for list in &mut self.rows {
            list.clear();
            list.reserve(tokens);
        }
        for list in &mut self.weights {
            list.clear();
            list.reserve(tokens);
        }
        for (r, l) in logits.chunks_exact(experts).enumerate() {
            self.ranked.clear();
            match m.scoring {
                Scoring::Softmax => {
                    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f32 = l.iter().map(|&v| (v - max).exp()).sum();
                    self.ranked.extend(l.iter().enumerate().map(|(e, &v)| {
                        let p = (v - max).exp() / sum;
                        (e, p, p)
                    }));
                }
                Scoring::Sigmoid => {
                    self.ranked.extend(l.iter().enumerate().map(|(e, &v)| {
                        let s = 1.0 / (1.0 + (-v).exp());
                        (e, s, s + bias.map_or(0.0, |b| b[e]))
                    }));
                }
            }
            if let Some((groups, keep)) = m.groups {
                self.keep_best_groups(groups, keep, m.scoring);
            }
            self.ranked
                .sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
            let chosen = &self.ranked[..top_k.min(experts)];
            let total: f32 = if norm {
                chosen.iter().map(|c| c.1).sum::<f32>() / scale
            } else {
                1.0 / scale
            };
            for &(e, w, _) in chosen {
                self.rows[e].push(r as u32);
                self.weights[e].push(w / total);
            }
        }
    }

    /// Lays the last [`Self::route`] of `tokens` tokens, `per` experts each,
    /// out for grouped experts: `sorted` (rows grouped by expert, experts
    /// in order), `spans` (expert, first slot, slots) of the experts used,
    /// and each token's `per` slot positions and weights, in expert order
    /// as the one-by-one path adds them.
    pub fn sort_by_expert(&mut self, tokens: usize, per: usize) {
        self.sorted.clear();
        self.spans.clear();
        self.slot_pos.clear();
        self.slot_pos.resize(tokens * per, 0);
        self.slot_weight.clear();
        self.slot_weight.resize(tokens * per, 0.0);
        self.filled.clear();
        self.filled.resize(tokens, 0);
        for (e, (rows, weights)) in self.rows.iter().zip(&self.weights).enumerate() {
            if rows.is_empty() {
                continue;
            }
            self.spans.push((e, self.sorted.len(), rows.len()));
            for (&r, &w) in rows.iter().zip(weights) {
                let (r, slot) = (r as usize, &mut self.filled[r as usize]);
                self.slot_pos[r * per + *slot] = self.sorted.len() as u32;
                self.slot_weight[r * per + *slot] = w;
                *slot += 1;
                self.sorted.push(r as u32);
            }
        }
    }

    /// Rules out the experts of all but the `keep` best of `groups` equal
    /// groups of `self.ranked` (in expert order); see [`Self::route`].
    fn keep_best_groups(&mut self, groups: usize, keep: usize, scoring: Scoring) {
        let size = self.ranked.len() / groups;
        let group_score = |g: &[(usize, f32, f32)]| match scoring {
            Scoring::Softmax => g.iter().fold(f32::NEG_INFINITY, |a, c| a.max(c.2)),
            Scoring::Sigmoid => {
                let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                for c in g {
                    if c.2 > first {
                        (first, second) = (c.2, first);
                    } else if c.2 > second {
                        second = c.2;
                    }
                }
                first + if size > 1 { second } else { 0.0 }
            }
        };
        let scores: Vec<f32> = self.ranked.chunks(size).map(group_score).collect();
        let mut order: Vec<usize> = (0..groups).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        for &g in &order[keep.min(groups)..] {
            for c in &mut self.ranked[g * size..(g + 1) * size] {
                match scoring {
                    Scoring::Softmax => (c.1, c.2) = (0.0, 0.0),
                    Scoring::Sigmoid => c.2 = f32::NEG_INFINITY,
                }
            }
        }
    }
}

/// Device buffers of the experts' work, grown to the largest step seen.
pub struct MoeScratch<B: Backend> {
    rows: usize,
    router_out: B::Buffer,
    router_host: Vec<f32>,
    x: B::Buffer,
    gate_up: B::Buffer,
    act: B::Buffer,
    out: B::Buffer,
    zeros: Vec<f32>,
    routing: Routing,
}

impl<B: Backend> MoeScratch<B> {
    pub fn new() -> Self {
        Self {
            rows: 0,
            router_out: B::alloc(0),
            router_host: Vec::new(),
            x: B::alloc(0),
            gate_up: B::alloc(0),
            act: B::alloc(0),
            out: B::alloc(0),
            zeros: Vec::new(),
            routing: Routing::default(),
        }
    }

    /// Room for `rows` tokens; the experts' buffers hold `slots` rows
    /// (`rows`, or `rows · top_k` when experts run grouped).
    fn ensure(&mut self, m: &MoeConfig, rows: usize, slots: usize, hidden: usize) {
        if slots > self.rows {
            let im = m.intermediate.max(m.shared_intermediate.unwrap_or(0));
            self.router_out = B::alloc(slots * m.experts);
            self.x = B::alloc(slots * hidden);
            self.gate_up = B::alloc(slots * 2 * im);
            self.act = B::alloc(slots * im);
            self.out = B::alloc(slots * hidden);
            self.zeros = vec![0.0; slots * hidden];
            self.rows = slots;
        }
        debug_assert!(rows <= self.rows);
    }
}

impl<B: Backend> MoeWeights<B> {
    /// `out[rows, hidden]` = the mixture's output for `x[rows, hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &mut B::Context,
        m: &MoeConfig,
        act: Activation,
        s: &mut MoeScratch<B>,
        x: &B::Buffer,
        out: &mut B::Buffer,
        rows: usize,
        hidden: usize,
    ) -> Result<()> {
        let grouped = self.grouped_types();
        let per = m.top_k.min(m.experts);
        let slots = if grouped.is_some() { rows * per } else { rows };
        s.ensure(m, rows, slots, hidden);
        let (ne, im) = (m.experts, m.intermediate);
        self.router
            .forward(ctx, x, &mut s.router_out, rows, ne, hidden)?;
        B::sync(ctx);
        B::take_error(ctx)?;
        s.router_host.resize(rows * ne, 0.0);
        B::read_into(&s.router_out, &mut s.router_host);
        s.routing
            .route(&s.router_host, m, self.choice_bias.as_deref());
        match (&self.shared, m.shared_intermediate) {
            // The shared expert's output starts the sum.
            (Some(shared), Some(sim)) => shared.run(
                ctx,
                act,
                x,
                &mut s.gate_up,
                &mut s.act,
                out,
                rows,
                hidden,
                sim,
            )?,
            _ => B::write_from(ctx, &s.zeros[..rows * hidden], out, 0),
        }
        if let Some((gate_up_type, down_type)) = grouped {
            return self.run_grouped(
                ctx,
                act,
                s,
                x,
                out,
                rows,
                per,
                hidden,
                im,
                gate_up_type,
                down_type,
            );
        }
        for (e, expert) in self.experts.iter().enumerate() {
            let picked = &s.routing.rows[e];
            let n = picked.len();
            if n == 0 {
                continue;
            }
            B::embedding_lookup(ctx, x, picked, &mut s.x, hidden);
            expert.run(
                ctx,
                act,
                &s.x,
                &mut s.gate_up,
                &mut s.act,
                &mut s.out,
                n,
                hidden,
                im,
            )?;
            B::scale_add_rows(ctx, &s.out, picked, &s.routing.weights[e], out, hidden);
        }
        Ok(())
    }
}

impl<B: Backend> MoeWeights<B> {
    /// The experts' GGUF types (gate-up, down) where they can run grouped:
    /// the backend groups experts and every expert's projections are GGUF
    /// blocks of one type each, in file order.
    fn grouped_types(&self) -> Option<(GgufQuantType, GgufQuantType)> {
        fn gguf<B: Backend>(l: &Linear<B>) -> Option<GgufQuantType> {
            match l {
                Linear::Quant {
                    kind: QuantKind::Gguf { quant_type, .. },
                    order: None,
                    ..
                } => Some(*quant_type),
                _ => None,
            }
        }
        if !B::capabilities().grouped_experts {
            return None;
        }
        let first = self.experts.first()?;
        let types = (gguf(&first.gate_up)?, gguf(&first.down)?);
        self.experts
            .iter()
            .all(|e| gguf(&e.gate_up) == Some(types.0) && gguf(&e.down) == Some(types.1))
            .then_some(types)
    }

    /// The routed experts of a step as grouped GEMMs (see the module doc),
    /// added to `out`.
    #[allow(clippy::too_many_arguments)]
    fn run_grouped(
        &self,
        ctx: &mut B::Context,
        act: Activation,
        s: &mut MoeScratch<B>,
        x: &B::Buffer,
        out: &mut B::Buffer,
        rows: usize,
        per: usize,
        hidden: usize,
        im: usize,
        gate_up_type: GgufQuantType,
        down_type: GgufQuantType,
    ) -> Result<()> {
        let r = &mut s.routing;
        r.sort_by_expert(rows, per);
        let slots = r.sorted.len();
        B::embedding_lookup(ctx, x, &r.sorted, &mut s.x, hidden);
        let groups = |pick: fn(&Expert<B>) -> &Linear<B>| -> Vec<ExpertRows<'_, B>> {
            r.spans
                .iter()
                .filter_map(|&(e, start, rows)| match pick(&self.experts[e]) {
                    Linear::Quant { w, .. } => Some(ExpertRows { weights: w, start, rows }),
                    Linear::Dense(_) => None,
                })
                .collect()
        };
        B::gemm_quant_experts(
            ctx,
            &s.x,
            &groups(|e| &e.gate_up),
            &mut s.gate_up,
            2 * im,
            hidden,
            gate_up_type,
        )?;
        match act {
            Activation::Silu => {
                B::fused_silu_mul_split(ctx, &s.gate_up, &mut s.act, Mat { rows: slots, cols: im })
            }
            Activation::GeluTanh => B::fused_gelu_tanh_mul_split(
                ctx,
                &s.gate_up,
                &mut s.act,
                Mat { rows: slots, cols: im },
            ),
        }
        B::gemm_quant_experts(
            ctx,
            &s.act,
            &groups(|e| &e.down),
            &mut s.out,
            hidden,
            im,
            down_type,
        )?;
        B::gather_add_rows(ctx, &s.out, &r.slot_pos, &r.slot_weight, out, per, hidden)
    }
}

impl<B: Backend> Expert<B> {
    /// `out[n, hidden]` = this gated MLP (width `im`) on `x[n, hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        ctx: &mut B::Context,
        act: Activation,
        x: &B::Buffer,
        gate_up: &mut B::Buffer,
        a: &mut B::Buffer,
        out: &mut B::Buffer,
        n: usize,
        hidden: usize,
        im: usize,
    ) -> Result<()> {
        self.gate_up.forward(ctx, x, gate_up, n, 2 * im, hidden)?;
        if let Some([b, _]) = &self.bias {
            B::add_bias(ctx, gate_up, b, Mat { rows: n, cols: 2 * im });
        }
        match act {
            Activation::Silu => B::fused_silu_mul_split(ctx, gate_up, a, Mat { rows: n, cols: im }),
            Activation::GeluTanh => {
                B::fused_gelu_tanh_mul_split(ctx, gate_up, a, Mat { rows: n, cols: im })
            }
        }
        self.down.forward(ctx, a, out, n, hidden, im)?;
        if let Some([_, b]) = &self.bias {
            B::add_bias(ctx, out, b, Mat { rows: n, cols: hidden });
        }
        Ok(())
    }
}

/// The `experts` matrices `[rows, k]` of one stacked GGUF tensor
/// (`[experts, rows, k]`, expert-major): each keeps its blocks.
pub(super) fn read_stacked(
    g: &GgufFile,
    name: &str,
    experts: usize,
    rows: usize,
    k: usize,
) -> Result<Vec<Raw>> {
    let t = g.tensor(name).ok_or_else(|| missing(name))?;
    let numel = experts * rows * k;
    if t.numel() != numel as u64 {
        return Err(FerrumError::invalid(format!(
            "tensor {name} has shape {:?}, expected {experts} experts of [{rows}, {k}]",
            t.shape()
        )));
    }
    let data = g.tensor_data(t);
    match GgufQuantType::from_ggml(t.ty) {
        Some(ty) => {
            let bytes = Bytes::mapped(g, t);
            let per = bytes.len() / experts;
            Ok((0..experts)
                .map(|e| Raw::Blocks {
                    bytes: bytes[e * per..(e + 1) * per].to_vec().into(),
                    ty,
                })
                .collect())
        }
        None => {
            let mut all = vec![0f32; numel];
            dequantize(t.ty, data, &mut all).map_err(|e| g.error(format!("tensor {name}: {e}")))?;
            Ok(all
                .chunks_exact(rows * k)
                .map(|c| Raw::F32(c.to_vec()))
                .collect())
        }
    }
}

/// Layer `i`'s router and experts: GGUF's stacked `ffn_*_exps` tensors, or
/// Hugging Face's per-expert ones (Qwen3-MoE's `mlp.experts.{e}.*_proj`,
/// Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`).
pub(super) fn load_moe<B: Backend>(
    src: &Source,
    arch: Arch,
    m: &MoeConfig,
    i: usize,
    h: usize,
) -> Result<MoeWeights<B>> {
    let (ne, im) = (m.experts, m.intermediate);
    let (router, gates, ups, downs) = match src {
        Source::Gguf(g) => {
            let n = |s: &str| format!("blk.{i}.{s}");
            (
                require(src, &n("ffn_gate_inp.weight"), &[ne, h])?,
                read_stacked(g, &n("ffn_gate_exps.weight"), ne, im, h)?,
                read_stacked(g, &n("ffn_up_exps.weight"), ne, im, h)?,
                read_stacked(g, &n("ffn_down_exps.weight"), ne, h, im)?,
            )
        }
        Source::Hf(..) => {
            let names = arch.traits().moe.ok_or_else(|| {
                FerrumError::invalid(format!("{arch:?} has no mixture-of-experts layers"))
            })?;
            let (block, [gate, up, down]) = (names.block, names.gate_up_down);
            let p = format!("model.layers.{i}.{block}");
            let each = |w: &str, rows: usize, k: usize| -> Result<Vec<Raw>> {
                (0..ne)
                    .map(|e| require(src, &format!("{p}.experts.{e}.{w}.weight"), &[rows, k]))
                    .collect()
            };
            (
                require(src, &format!("{p}.gate.weight"), &[ne, h])?,
                each(gate, im, h)?,
                each(up, im, h)?,
                each(down, h, im)?,
            )
        }
    };
    let shared = match m.shared_intermediate {
        Some(sim) => {
            let name = |n: usize| match src {
                Source::Gguf(_) => {
                    let g = ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"][n];
                    format!("blk.{i}.{g}.weight")
                }
                Source::Hf(..) => {
                    let p = ["gate_proj", "up_proj", "down_proj"][n];
                    format!("model.layers.{i}.mlp.shared_experts.{p}.weight")
                }
            };
            let gate_up = vec![
                (require(src, &name(0), &[sim, h])?, sim),
                (require(src, &name(1), &[sim, h])?, sim),
            ];
            Some(Expert {
                gate_up: Linear::upload(fuse_or_f32(gate_up, h)?, 2 * sim, h)?,
                down: Linear::upload(require(src, &name(2), &[h, sim])?, h, sim)?,
                bias: None,
            })
        }
        None => None,
    };
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .map(|((g, u), d)| {
            Ok(Expert {
                gate_up: Linear::upload(fuse_or_f32(vec![(g, im), (u, im)], h)?, 2 * im, h)?,
                down: Linear::upload(d, h, im)?,
                bias: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // DeepSeek V3's selection bias (`e_score_correction_bias`).
    let choice_bias = match m.scoring {
        Scoring::Softmax => None,
        Scoring::Sigmoid => Some(vector(
            src,
            &match src {
                Source::Gguf(_) => format!("blk.{i}.exp_probs_b.bias"),
                Source::Hf(..) => format!("model.layers.{i}.mlp.gate.e_score_correction_bias"),
            },
            ne,
        )?),
    };
    Ok(MoeWeights {
        choice_bias,
        router: Linear::upload(router, ne, h)?,
        experts,
        shared,
    })
}

#[cfg(test)]
mod tests {
    use super::Routing;
    use crate::llama::{MoeConfig, Scoring};

    fn moe(top_k: usize, norm: bool, scale: f32, groups: Option<(usize, usize)>) -> MoeConfig {
        MoeConfig {
            experts: 4,
            top_k,
            intermediate: 1,
            norm_top_k: norm,
            sparse: vec![true],
            routed_scale: scale,
            shared_intermediate: None,
            groups,
            scoring: Scoring::Softmax,
        }
    }

    #[test]
    fn routing_picks_top_k_with_ties_to_the_lower_index() {
        let mut r = Routing::default();
        // Token 0: experts 1 and 3 tie for first; 2 is third. Token 1: all
        // equal, so the two lowest indices. Token 2: a clear order.
        let logits = [
            0.0, 2.0, 1.0, 2.0, //
            0.5, 0.5, 0.5, 0.5, //
            -1.0, 0.0, 3.0, 1.0,
        ];
        r.route(&logits, &moe(2, true, 1.0, None), None);
        assert_eq!(r.rows, vec![vec![1], vec![0, 1], vec![2], vec![0, 2]]);
        assert_eq!(r.weights[1][0], 0.5);
        assert_eq!(r.weights[3][0], 0.5);
        assert_eq!(r.weights[0], vec![0.5]);
        // Token 2: softmax over all four, then renormalised over 2 and 3.
        let (a, b) = (3f32.exp(), 1f32.exp());
        assert!((r.weights[2][0] - a / (a + b)).abs() < 1e-6);
        // Without renormalisation the weights are the full softmax's.
        r.route(&logits[8..], &moe(2, false, 2.0, None), None);
        let z: f32 = [-1f32, 0.0, 3.0, 1.0].iter().map(|v| v.exp()).sum();
        // ... times the routed scale.
        assert!((r.weights[2][0] - 2.0 * a / z).abs() < 1e-6);
        assert!((r.weights[3][0] - 2.0 * b / z).abs() < 1e-6);
        assert!(r.rows[0].is_empty() && r.rows[1].is_empty());
    }

    #[test]
    fn group_limited_routing_picks_within_the_best_groups() {
        let mut r = Routing::default();
        // Groups {0, 1} and {2, 3}: group 1's best (expert 2, logit 2.0)
        // beats group 0's (expert 0, 1.9), so with one group kept, experts
        // 2 and 3 are chosen although expert 0 outscores expert 3.
        let logits = [1.9, 0.0, 2.0, 1.0];
        r.route(&logits, &moe(2, false, 1.0, Some((2, 1))), None);
        assert_eq!(r.rows, vec![vec![], vec![], vec![0], vec![0]]);
        let z: f32 = logits.iter().map(|v| v.exp()).sum();
        assert!((r.weights[3][0] - 1f32.exp() / z).abs() < 1e-6);
        // Both groups kept: plain top-2.
        r.route(&logits, &moe(2, false, 1.0, Some((2, 2))), None);
        assert_eq!(r.rows, vec![vec![0], vec![], vec![0], vec![]]);
    }

    /// The grouped layout (the GPU's path, which CI cannot run): rows in
    /// expert order, each used expert's span, and every token's slots
    /// pointing back at its own rows with its weights, in expert order.
    #[test]
    fn sorting_by_expert_keeps_each_tokens_experts_and_weights() {
        let mut r = Routing::default();
        let logits = [
            0.0, 2.0, 1.0, 3.0, // token 0: experts 3, 1
            5.0, 0.0, 4.0, 0.0, // token 1: experts 0, 2
            0.0, 1.0, 0.0, 2.0, // token 2: experts 3, 1
        ];
        r.route(&logits, &moe(2, true, 1.0, None), None);
        r.sort_by_expert(3, 2);
        assert_eq!(r.sorted, vec![1, 0, 2, 1, 0, 2]);
        assert_eq!(r.spans, vec![(0, 0, 1), (1, 1, 2), (2, 3, 1), (3, 4, 2)]);
        assert_eq!(r.slot_pos, vec![1, 4, 0, 3, 2, 5]);
        for t in 0..3 {
            for j in 0..2 {
                let pos = r.slot_pos[t * 2 + j] as usize;
                assert_eq!(r.sorted[pos] as usize, t);
                let (e, start, _) = *r.spans.iter().rev().find(|s| s.1 <= pos).unwrap();
                let i = r.rows[e].iter().position(|&x| x as usize == t).unwrap();
                assert_eq!(
                    r.slot_weight[t * 2 + j],
                    r.weights[e][i],
                    "token {t} start {start}"
                );
            }
        }
    }

    fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn sigmoid_routing_chooses_with_the_bias_and_weights_without_it() {
        let mut r = Routing::default();
        let m = MoeConfig {
            scoring: Scoring::Sigmoid,
            ..moe(2, true, 2.5, None)
        };
        // Unbiased, experts 0 and 1 score best; the bias lifts 3 above 1.
        let logits = [2.0, 1.0, -1.0, 0.5];
        let bias = [0.0, 0.0, 0.0, 0.3];
        r.route(&logits, &m, Some(&bias));
        assert_eq!(r.rows, vec![vec![0], vec![], vec![], vec![0]]);
        // Weights: the unbiased sigmoids, renormalised, times 2.5.
        let (a, b) = (sigmoid(2.0), sigmoid(0.5));
        assert!((r.weights[0][0] - 2.5 * a / (a + b)).abs() < 1e-6);
        assert!((r.weights[3][0] - 2.5 * b / (a + b)).abs() < 1e-6);
        // Not renormalised: the sigmoids themselves.
        r.route(
            &logits,
            &MoeConfig { norm_top_k: false, ..m.clone() },
            Some(&bias),
        );
        assert!((r.weights[3][0] - 2.5 * b).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_groups_rank_by_their_two_best_scores() {
        let mut r = Routing::default();
        // Groups {0, 1}, {2, 3}, {4, 5}. Group 0 holds the single best
        // expert (0) but group 1's two together beat it: 1 + 2 > 0 + 3 in
        // logits, so keeping one group picks 2 and 3 (V2's rule, by the
        // best expert, would keep group 0).
        let logits = [3.0, -3.0, 1.5, 1.4, -2.0, -2.0];
        let m = MoeConfig {
            experts: 6,
            scoring: Scoring::Sigmoid,
            ..moe(2, false, 1.0, Some((3, 1)))
        };
        r.route(&logits, &m, None);
        assert_eq!(
            r.rows,
            vec![vec![], vec![], vec![0], vec![0], vec![], vec![]]
        );
        // The softmax rule on the same logits keeps group 0.
        r.route(&logits, &MoeConfig { scoring: Scoring::Softmax, ..m }, None);
        assert_eq!(r.rows[0], vec![0]);
        assert!(r.rows[2].is_empty() && r.rows[3].is_empty());
    }
}
