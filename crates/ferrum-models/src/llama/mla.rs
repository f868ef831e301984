//! Multi-head latent attention (DeepSeek V2).
//!
//! Keys and values of every head are up-projections of one small latent
//! per token (`kv_lora_rank` values, RMS-normed) plus one `rope`-dim key
//! shared by all heads. The KV cache therefore holds `kv_lora_rank + rope`
//! values per token and layer, in the ordinary paged pool (one "KV head"
//! of that width, under the same block manager as every other family),
//! where standard attention would hold `2 · heads · head_dim`.
//!
//! The up-projections are absorbed, as the DeepSeek-V2 paper describes:
//! each head's query is mapped into the latent space once (`q_nope · W_UK`,
//! with its rope part carried along) and attends directly over the cached
//! rows `[latent; rope key]`; the attention output, still in the latent
//! space, is mapped to the head's value space by `W_UV` afterwards. Both
//! maps are per-head matrices built at load ([`MlaWeights::absorb_q`],
//! [`MlaWeights::to_v`]), so a step never expands the cache to full K/V.
//!
//! Layouts: a head's query dims are reordered at load so its `rope` dims
//! sit where the rotate-half kernel pairs them (see `weights.rs`), and the
//! rope key's pairs likewise; `q·k` is unchanged by the common
//! reordering.

use ferrum_kernels::{AttnConfig, Backend, Gemm, Heads, Mat, PagedKv, QkOp, Span};
use ferrum_types::{FerrumError, Result};

use super::config::MlaConfig;
use super::linear::Linear;
use super::tensors::{partial_rotary_row_of, require, vector, Raw, Source};

/// How a token's queries (`[heads · (nope + rope)]`, rows reordered per
/// head for the rotate-half kernel) come from its hidden state.
pub enum MlaQuery<B: Backend> {
    /// `[q_lora_rank, hidden]`, its RMSNorm, then `[heads · (nope + rope),
    /// q_lora_rank]` (DeepSeek V2, V3).
    LowRank {
        rank: usize,
        a: Linear<B>,
        norm: B::Buffer,
        b: Linear<B>,
    },
    /// One `[heads · (nope + rope), hidden]` projection (V2-Lite).
    Full(Linear<B>),
}

pub struct MlaWeights<B: Backend> {
    pub query: MlaQuery<B>,
    /// The latent `[kv_lora_rank, hidden]` and its RMSNorm; the shared rope
    /// key `[rope, hidden]` (pairs reordered to rotate-half).
    pub kv_a: Linear<B>,
    pub kv_a_norm: B::Buffer,
    pub k_rope: Linear<B>,
    /// Per head `[kv_lora_rank + rope, nope + rope]`: a query head (in its
    /// load-time order) to its latent-space query `[q_nope · W_UK; q_rope]`.
    pub absorb_q: Vec<B::Buffer>,
    /// Per head `[v, kv_lora_rank + rope]`: a latent-space output to the
    /// head's values (`W_UV`; the rope columns are zero).
    pub to_v: Vec<B::Buffer>,
    /// `[kv_lora_rank + rope, kv_lora_rank]` and `[.., rope]` placements
    /// (0/1 matrices): the cache row `[latent; rope key]` and the value row
    /// `[latent; 0]` are built by two small GEMMs instead of per-row copies.
    pub place_latent: B::Buffer,
    pub place_rope: B::Buffer,
}

/// Per-sequence work buffers, grown to the longest segment seen.
pub struct MlaScratch<B: Backend> {
    rows: usize,
    xs: B::Buffer,
    qa: B::Buffer,
    qan: B::Buffer,
    qb: B::Buffer,
    qh: B::Buffer,
    head_in: B::Buffer,
    head_out: B::Buffer,
    q_lat: B::Buffer,
    c: B::Buffer,
    cn: B::Buffer,
    kr: B::Buffer,
    krh: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    tmp: B::Buffer,
    o_lat: B::Buffer,
    o_heads: B::Buffer,
    o_tok: B::Buffer,
}

impl<B: Backend> MlaScratch<B> {
    pub fn new() -> Self {
        let e = || B::alloc(0);
        Self {
            rows: 0,
            xs: e(),
            qa: e(),
            qan: e(),
            qb: e(),
            qh: e(),
            head_in: e(),
            head_out: e(),
            q_lat: e(),
            c: e(),
            cn: e(),
            kr: e(),
            krh: e(),
            k: e(),
            v: e(),
            tmp: e(),
            o_lat: e(),
            o_heads: e(),
            o_tok: e(),
        }
    }

    fn ensure(&mut self, m: &MlaConfig, heads: usize, hidden: usize, n: usize) {
        if n <= self.rows {
            return;
        }
        let (qk, dkv) = (m.nope + m.rope, m.kv_lora_rank + m.rope);
        self.xs = B::alloc(n * hidden);
        let rank = m.q_lora_rank.unwrap_or(0);
        self.qa = B::alloc(n * rank);
        self.qan = B::alloc(n * rank);
        self.qb = B::alloc(n * heads * qk);
        self.qh = B::alloc(n * heads * qk);
        self.head_in = B::alloc(n * qk.max(dkv));
        self.head_out = B::alloc(n * dkv.max(m.v));
        self.q_lat = B::alloc(n * heads * dkv);
        self.c = B::alloc(n * m.kv_lora_rank);
        self.cn = B::alloc(n * m.kv_lora_rank);
        self.kr = B::alloc(n * m.rope);
        self.krh = B::alloc(n * m.rope);
        self.k = B::alloc(n * dkv);
        self.v = B::alloc(n * dkv);
        self.tmp = B::alloc(n * dkv);
        self.o_lat = B::alloc(n * heads * dkv);
        self.o_heads = B::alloc(n * heads * m.v);
        self.o_tok = B::alloc(n * heads * m.v);
        self.rows = n;
    }
}

/// One segment's place in the step: its rows in the batch, positions and
/// pages.
pub struct Segment<'a> {
    pub r0: usize,
    pub n: usize,
    pub pos: usize,
    pub pages: PagedKv<'a>,
}

/// The RoPE tables latent attention uses: the queries' (head of `nope +
/// rope`, `rope` of it rotating) and the shared key's (`rope` wide).
pub struct MlaRope<'a, B: Backend> {
    pub q: (&'a B::Buffer, &'a B::Buffer),
    pub k: (&'a B::Buffer, &'a B::Buffer),
}

impl<B: Backend> MlaWeights<B> {
    /// One segment's attention: reads its rows of `xn` (`[rows, hidden]`),
    /// appends its latent rows to the layer's pools and writes its output
    /// rows (`[n, heads · v]`, token-major) into `attn` at its offset.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &mut B::Context,
        m: &MlaConfig,
        (heads, hidden, eps, scale): (usize, usize, f32, f32),
        s: &mut MlaScratch<B>,
        rope: &MlaRope<B>,
        xn: &B::Buffer,
        (k_pool, v_pool): (&mut B::Buffer, &mut B::Buffer),
        seg: &Segment,
        attn: &mut B::Buffer,
    ) -> Result<()> {
        let (n, p) = (seg.n, seg.pos);
        let dkv = m.kv_lora_rank + m.rope;
        s.ensure(m, heads, hidden, n);
        B::copy_slice(ctx, xn, seg.r0 * hidden, &mut s.xs, 0, n * hidden);
        self.latent_queries(ctx, m, (heads, hidden, eps), s, rope.q, (n, p))?;
        self.cached_rows(ctx, m, (hidden, eps), s, rope.k, (n, p))?;
        B::paged_kv_append(
            ctx,
            [k_pool, v_pool],
            &seg.pages,
            p,
            [&s.k, &s.v],
            Heads { tokens: n, heads: 1, head_dim: dkv },
        );
        let cfg = AttnConfig {
            num_heads: heads,
            num_kv_heads: 1,
            head_dim: dkv,
            causal: true,
            scale,
            ..AttnConfig::default()
        };
        B::paged_attention(
            ctx,
            &s.q_lat,
            [k_pool, v_pool],
            &seg.pages,
            &mut s.o_lat,
            Span { q_len: n, kv_len: p + n, pos_offset: p },
            &cfg,
        );
        // Latent outputs to each head's values, then token-major.
        for h in 0..heads {
            B::copy_slice(ctx, &s.o_lat, h * n * dkv, &mut s.head_in, 0, n * dkv);
            B::gemm(
                ctx,
                &s.head_in,
                &self.to_v[h],
                &mut s.head_out,
                Gemm { m: n, n: m.v, k: dkv },
            );
            B::copy_slice(ctx, &s.head_out, 0, &mut s.o_heads, h * n * m.v, n * m.v);
        }
        B::transpose_head_to_token(
            ctx,
            &s.o_heads,
            &mut s.o_tok,
            Heads { tokens: n, heads, head_dim: m.v },
        );
        let width = heads * m.v;
        B::copy_slice(ctx, &s.o_tok, 0, attn, seg.r0 * width, n * width);
        Ok(())
    }

    /// The queries of `s.xs`'s `n` rows at position `p` (low-rank, normed,
    /// up; or one projection), RoPE on each head's rope dims, then each
    /// head taken into the latent space: `s.q_lat`, head-major.
    fn latent_queries(
        &self,
        ctx: &mut B::Context,
        m: &MlaConfig,
        (heads, hidden, eps): (usize, usize, f32),
        s: &mut MlaScratch<B>,
        (qc, qs): (&B::Buffer, &B::Buffer),
        (n, p): (usize, usize),
    ) -> Result<()> {
        let (qk, dkv) = (m.nope + m.rope, m.kv_lora_rank + m.rope);
        match &self.query {
            MlaQuery::LowRank { rank, a, norm, b } => {
                let rank = *rank;
                a.forward(ctx, &s.xs, &mut s.qa, n, rank, hidden)?;
                B::rms_norm(
                    ctx,
                    &s.qa,
                    norm,
                    eps,
                    &mut s.qan,
                    Mat { rows: n, cols: rank },
                );
                b.forward(ctx, &s.qan, &mut s.qb, n, heads * qk, rank)?;
            }
            MlaQuery::Full(q) => q.forward(ctx, &s.xs, &mut s.qb, n, heads * qk, hidden)?,
        }
        let rope = QkOp::Rope { cos: qc, sin: qs };
        let q_heads = Heads { tokens: n, heads, head_dim: qk };
        B::qk_norm_rope(ctx, &s.qb, rope, &mut s.qh, q_heads, p);
        for h in 0..heads {
            B::copy_slice(ctx, &s.qh, h * n * qk, &mut s.head_in, 0, n * qk);
            B::gemm(
                ctx,
                &s.head_in,
                &self.absorb_q[h],
                &mut s.head_out,
                Gemm { m: n, n: dkv, k: qk },
            );
            B::copy_slice(ctx, &s.head_out, 0, &mut s.q_lat, h * n * dkv, n * dkv);
        }
        Ok(())
    }

    /// The rows `s.xs` adds to the cache: `[latent; rope key]` for keys
    /// (`s.k`), `[latent; 0]` for values (`s.v`).
    fn cached_rows(
        &self,
        ctx: &mut B::Context,
        m: &MlaConfig,
        (hidden, eps): (usize, f32),
        s: &mut MlaScratch<B>,
        (kc, ks): (&B::Buffer, &B::Buffer),
        (n, p): (usize, usize),
    ) -> Result<()> {
        let (rank, dkv) = (m.kv_lora_rank, m.kv_lora_rank + m.rope);
        self.kv_a.forward(ctx, &s.xs, &mut s.c, n, rank, hidden)?;
        B::rms_norm(
            ctx,
            &s.c,
            &self.kv_a_norm,
            eps,
            &mut s.cn,
            Mat { rows: n, cols: rank },
        );
        self.k_rope
            .forward(ctx, &s.xs, &mut s.kr, n, m.rope, hidden)?;
        let rope = QkOp::Rope { cos: kc, sin: ks };
        let k_heads = Heads { tokens: n, heads: 1, head_dim: m.rope };
        B::qk_norm_rope(ctx, &s.kr, rope, &mut s.krh, k_heads, p);
        B::gemm(
            ctx,
            &s.cn,
            &self.place_latent,
            &mut s.v,
            Gemm { m: n, n: dkv, k: rank },
        );
        B::gemm(
            ctx,
            &s.krh,
            &self.place_rope,
            &mut s.tmp,
            Gemm { m: n, n: dkv, k: m.rope },
        );
        B::copy_slice(ctx, &s.v, 0, &mut s.k, 0, n * dkv);
        B::add_inplace(ctx, &mut s.k, &s.tmp, n * dkv);
        Ok(())
    }
}

/// `d` rope dims in the rotate-half order `(i, i + d/2)` the kernels use:
/// slot `i` takes dim `src(i)`. Interleaved pairs `(2i, 2i + 1)`
/// (DeepSeek's checkpoints) are gathered; halves stay where they are.
pub(super) fn rope_to_half(d: usize, interleaved: bool) -> impl Fn(usize) -> usize {
    move |i| match (interleaved, i < d / 2) {
        (false, _) => i,
        (true, true) => 2 * i,
        (true, false) => 2 * (i - d / 2) + 1,
    }
}

/// Latent attention of layer `i`: see `mla.rs`. A query
/// head's `nope + rope` rows are reordered as `[rope (rotate-half); nope]`
/// and then as partial rotary (`partial_rotary_row_of`), and the absorbed
/// maps are built in that order.
pub(super) fn load_mla<B: Backend>(
    src: &Source,
    m: &MlaConfig,
    i: usize,
    h: usize,
    heads: usize,
) -> Result<MlaWeights<B>> {
    let (nope, rope, rank) = (m.nope, m.rope, m.kv_lora_rank);
    let (qk, dkv) = (nope + rope, rank + rope);
    let name = |hf: &str| tensor_name(src, i, hf);
    let inter = rope_to_half(rope, m.rope_interleaved);
    let partial = partial_rotary_row_of(qk, rope);
    // Head slot -> the Hugging Face dim it holds (within a head).
    let hf_dim = |slot: usize| {
        let b = partial(slot);
        if b < rope {
            nope + inter(b)
        } else {
            b - rope
        }
    };
    let head_rows = |r: usize| (r / qk) * qk + hf_dim(r % qk);
    let query = match m.q_lora_rank {
        Some(rank) => MlaQuery::LowRank {
            rank,
            a: Linear::upload(require(src, &name("q_a_proj.weight"), &[rank, h])?, rank, h)?,
            norm: B::from_slice(&vector(src, &name("q_a_layernorm.weight"), rank)?),
            b: Linear::upload(
                require(src, &name("q_b_proj.weight"), &[heads * qk, rank])?
                    .permute_rows(heads * qk, head_rows),
                heads * qk,
                rank,
            )?,
        },
        None => MlaQuery::Full(Linear::upload(
            require(src, &name("q_proj.weight"), &[heads * qk, h])?
                .permute_rows(heads * qk, head_rows),
            heads * qk,
            h,
        )?),
    };
    let [c, kr]: [Raw; 2] = require(src, &name("kv_a_proj_with_mqa.weight"), &[dkv, h])?
        .split_rows(dkv, &[rank, rope])
        .try_into()
        .map_err(|_| FerrumError::invalid("kv_a split into other than 2 parts"))?;
    let kr = kr.permute_rows(rope, &inter);
    let kv_b = kv_b(src, m, i, heads)?;
    let (absorb_q, to_v) = absorbed::<B>(&kv_b, m, heads, &partial);
    let mut place_latent = vec![0f32; dkv * rank];
    (0..rank).for_each(|r| place_latent[r * rank + r] = 1.0);
    let mut place_rope = vec![0f32; dkv * rope];
    (0..rope).for_each(|j| place_rope[(rank + j) * rope + j] = 1.0);
    Ok(MlaWeights {
        query,
        kv_a: Linear::upload(c, rank, h)?,
        kv_a_norm: B::from_slice(&vector(src, &name("kv_a_layernorm.weight"), rank)?),
        k_rope: Linear::upload(kr, rope, h)?,
        absorb_q,
        to_v,
        place_latent: B::from_slice(&place_latent),
        place_rope: B::from_slice(&place_rope),
    })
}

/// Layer `i`'s latent-attention tensor `hf` (its Hugging Face name under
/// `self_attn.`) as the file names it: llama.cpp's `deepseek2` names in a
/// GGUF.
fn tensor_name(src: &Source, i: usize, hf: &str) -> String {
    match src {
        Source::Gguf(_) => {
            let g = match hf {
                "q_proj.weight" => "attn_q.weight",
                "q_a_proj.weight" => "attn_q_a.weight",
                "q_a_layernorm.weight" => "attn_q_a_norm.weight",
                "q_b_proj.weight" => "attn_q_b.weight",
                "kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
                "kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
                other => other,
            };
            format!("blk.{i}.{g}")
        }
        Source::Hf(..) => format!("model.layers.{i}.self_attn.{hf}"),
    }
}

/// `kv_b_proj` as Hugging Face stores it, `[heads · (nope + v), rank]`;
/// llama.cpp splits it into `attn_k_b` (each head's part transposed,
/// `[heads, rank, nope]`) and `attn_v_b` (`[heads, v, rank]`), put back
/// together here.
fn kv_b(src: &Source, m: &MlaConfig, i: usize, heads: usize) -> Result<Vec<f32>> {
    let (nope, rank, v) = (m.nope, m.kv_lora_rank, m.v);
    if let Source::Hf(..) = src {
        let name = tensor_name(src, i, "kv_b_proj.weight");
        return require(src, &name, &[heads * (nope + v), rank])?.to_f32(heads * (nope + v), rank);
    }
    let k_b = require(
        src,
        &format!("blk.{i}.attn_k_b.weight"),
        &[heads, rank, nope],
    )?
    .to_f32(heads * rank, nope)?;
    let v_b = require(src, &format!("blk.{i}.attn_v_b.weight"), &[heads, v, rank])?
        .to_f32(heads * v, rank)?;
    let mut kv_b = vec![0f32; heads * (nope + v) * rank];
    for hh in 0..heads {
        for r in 0..rank {
            for d in 0..nope {
                kv_b[(hh * (nope + v) + d) * rank + r] = k_b[(hh * rank + r) * nope + d];
            }
        }
        for j in 0..v {
            let row = (hh * (nope + v) + nope + j) * rank;
            kv_b[row..row + rank].copy_from_slice(&v_b[(hh * v + j) * rank..][..rank]);
        }
    }
    Ok(kv_b)
}

/// Per head, from `kv_b`: the map taking a query head (in slot order,
/// `partial`) to the cached latent plus rope dims, and the map from the
/// latent to the head's values.
fn absorbed<B: Backend>(
    kv_b: &[f32],
    m: &MlaConfig,
    heads: usize,
    partial: &impl Fn(usize) -> usize,
) -> (Vec<B::Buffer>, Vec<B::Buffer>) {
    let (nope, rope, rank, v) = (m.nope, m.rope, m.kv_lora_rank, m.v);
    let (qk, dkv) = (nope + rope, rank + rope);
    let w = |head: usize, row: usize, r: usize| kv_b[(head * (nope + v) + row) * rank + r];
    let mut absorb_q = Vec::with_capacity(heads);
    let mut to_v = Vec::with_capacity(heads);
    for hh in 0..heads {
        let mut a = vec![0f32; dkv * qk];
        for t in 0..qk {
            let b = partial(t);
            if b < rope {
                a[(rank + b) * qk + t] = 1.0;
            } else {
                for r in 0..rank {
                    a[r * qk + t] = w(hh, b - rope, r);
                }
            }
        }
        absorb_q.push(B::from_slice(&a));
        let mut o = vec![0f32; v * dkv];
        for j in 0..v {
            for r in 0..rank {
                o[j * dkv + r] = w(hh, nope + j, r);
            }
        }
        to_v.push(B::from_slice(&o));
    }
    (absorb_q, to_v)
}
