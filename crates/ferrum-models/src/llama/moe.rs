//! Mixture-of-experts MLPs (Qwen3-MoE, Mixtral): a router scores every
//! expert per token, the `top_k` best run, and their outputs are mixed by
//! the router's softmax weights.
//!
//! Tokens are grouped per expert, so each expert's weights (kept in their
//! quantized blocks) are read once per step for all the tokens routed to
//! it, in prefill and batched decode alike: the expert's rows are gathered,
//! run through its gated MLP as one GEMM, and added back to their tokens
//! weighted ([`Backend::scale_add_rows`]). The routing itself (a softmax
//! over a handful of experts per token) runs on the host.

use ferrum_kernels::Backend;
use ferrum_types::Result;

use super::config::{Activation, MoeConfig};
use super::weights::Linear;

/// A gated MLP: one expert, or a layer's dense MLP.
pub struct Expert<B: Backend> {
    /// Fused `[2·intermediate, hidden]`, gate rows first.
    pub gate_up: Linear<B>,
    pub down: Linear<B>,
}

pub struct MoeWeights<B: Backend> {
    /// `[experts, hidden]`.
    pub router: Linear<B>,
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
    /// Reused per token: (expert, probability).
    ranked: Vec<(usize, f32)>,
}

impl Routing {
    /// Routes `rows` tokens from their router logits (`[rows, experts]`):
    /// softmax over all experts, the `top_k` most probable (ties go to the
    /// lower expert index, as `torch.topk` picks them), renormalised to sum
    /// to 1 when `norm`.
    /// With `m.groups` (DeepSeek V2's group-limited greedy), experts are
    /// picked only from the `topk_group` groups whose best expert scores
    /// highest (the others' probabilities become 0, as transformers masks
    /// them). `m.routed_scale` multiplies every chosen weight.
    pub fn route(&mut self, logits: &[f32], m: &MoeConfig) {
        let (experts, top_k, norm, scale) = (m.experts, m.top_k, m.norm_top_k, m.routed_scale);
        self.rows.resize_with(experts, Vec::new);
        self.weights.resize_with(experts, Vec::new);
        self.rows.iter_mut().for_each(Vec::clear);
        self.weights.iter_mut().for_each(Vec::clear);
        for (r, l) in logits.chunks_exact(experts).enumerate() {
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = l.iter().map(|&v| (v - max).exp()).sum();
            self.ranked.clear();
            self.ranked.extend(
                l.iter()
                    .enumerate()
                    .map(|(e, &v)| (e, (v - max).exp() / sum)),
            );
            if let Some((groups, keep)) = m.groups {
                let size = experts / groups;
                let best = |g: usize| {
                    self.ranked[g * size..(g + 1) * size]
                        .iter()
                        .fold(f32::NEG_INFINITY, |a, c| a.max(c.1))
                };
                let mut order: Vec<usize> = (0..groups).collect();
                order.sort_by(|&a, &b| best(b).total_cmp(&best(a)).then(a.cmp(&b)));
                for &g in &order[keep.min(groups)..] {
                    self.ranked[g * size..(g + 1) * size]
                        .iter_mut()
                        .for_each(|c| c.1 = 0.0);
                }
            }
            self.ranked
                .sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let chosen = &self.ranked[..top_k.min(experts)];
            let total: f32 = if norm {
                chosen.iter().map(|c| c.1).sum::<f32>() / scale
            } else {
                1.0 / scale
            };
            for &(e, p) in chosen {
                self.rows[e].push(r as u32);
                self.weights[e].push(p / total);
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

    fn ensure(&mut self, m: &MoeConfig, rows: usize, hidden: usize) {
        if rows > self.rows {
            let im = m.intermediate.max(m.shared_intermediate.unwrap_or(0));
            self.router_out = B::alloc(rows * m.experts);
            self.x = B::alloc(rows * hidden);
            self.gate_up = B::alloc(rows * 2 * im);
            self.act = B::alloc(rows * im);
            self.out = B::alloc(rows * hidden);
            self.zeros = vec![0.0; rows * hidden];
            self.rows = rows;
        }
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
        s.ensure(m, rows, hidden);
        let (ne, im) = (m.experts, m.intermediate);
        self.router
            .forward(ctx, x, &mut s.router_out, rows, ne, hidden)?;
        B::sync(ctx);
        B::take_error(ctx)?;
        s.router_host.resize(rows * ne, 0.0);
        B::read_into(&s.router_out, &mut s.router_host);
        s.routing.route(&s.router_host, m);
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
        match act {
            Activation::Silu => B::fused_silu_mul_split(ctx, gate_up, a, n, im),
            Activation::GeluTanh => B::fused_gelu_tanh_mul_split(ctx, gate_up, a, n, im),
        }
        self.down.forward(ctx, a, out, n, hidden, im)
    }
}

#[cfg(test)]
mod tests {
    use super::Routing;
    use crate::llama::MoeConfig;

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
        r.route(&logits, &moe(2, true, 1.0, None));
        assert_eq!(r.rows, vec![vec![1], vec![0, 1], vec![2], vec![0, 2]]);
        assert_eq!(r.weights[1][0], 0.5);
        assert_eq!(r.weights[3][0], 0.5);
        assert_eq!(r.weights[0], vec![0.5]);
        // Token 2: softmax over all four, then renormalised over 2 and 3.
        let (a, b) = (3f32.exp(), 1f32.exp());
        assert!((r.weights[2][0] - a / (a + b)).abs() < 1e-6);
        // Without renormalisation the weights are the full softmax's.
        r.route(&logits[8..], &moe(2, false, 2.0, None));
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
        r.route(&logits, &moe(2, false, 1.0, Some((2, 1))));
        assert_eq!(r.rows, vec![vec![], vec![], vec![0], vec![0]]);
        let z: f32 = logits.iter().map(|v| v.exp()).sum();
        assert!((r.weights[3][0] - 1f32.exp() / z).abs() < 1e-6);
        // Both groups kept: plain top-2.
        r.route(&logits, &moe(2, false, 1.0, Some((2, 2))));
        assert_eq!(r.rows, vec![vec![0], vec![], vec![0], vec![]]);
    }
}
