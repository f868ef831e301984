//! The Llama family (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3, Gemma 3) as
//! one model generic over [`Backend`], its variants chosen by configuration.
//!
//! [`PagedLlm::forward_paged`] runs one forward pass over a batch of items
//! (consecutive new tokens of one sequence each): the projections and MLP
//! are single GEMMs over all items' rows; attention runs per item against
//! the pool blocks of its block table.

mod arch;
mod config;
mod describe;
mod gguf_config;
mod kv;
mod linear;
mod mla;
mod moe;
mod presets;
mod quantized;
mod tensors;
mod weights;

use std::path::Path;

use ferrum_formats::gguf::GgufFile;
use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::{
    AttnConfig, AttnLayer, AttnScratch, AttnSegment, Backend, Gemm, Mat, QkNorm, QkPrep,
};
use ferrum_kv::BlockCopy;
use ferrum_types::{FerrumError, Result, TensorRef};

pub use arch::{Arch, NAMES};
pub use config::{Activation, LlamaConfig, MlaConfig, MoeConfig, Scoring};
use kv::KvStore;
use linear::Embedding;
use mla::{MlaRope, MlaScratch};
use moe::MoeScratch;
pub use presets::{preset, PRESETS};
pub use quantized::checkpoint_layouts;
use tensors::Source;
use weights::{Mlp, Weights};

use crate::llm::{KvPoolConfig, LlmRuntimeConfig, LoadProgress};
use crate::paged::{check_tokens, BatchItem, KvPool, PagedLlm};

/// Per-sequence KV capacity when `FERRUM_KV_CAPACITY` is not set (clamped to
/// the model's context length): enough for long chats without reserving a
/// 32K-token cache per sequence up front.
pub const DEFAULT_KV_CAPACITY: usize = 4096;

/// The most sequences a captured decode step holds (see
/// [`Capabilities::graphs`](ferrum_kernels::Capabilities)): larger decode batches run eagerly.
const GRAPH_CHUNK: usize = 64;

/// An empty vector on `v`'s allocation, for segments that borrow other
/// block tables. A batch's segments borrow its items, which live for one
/// forward pass, while the allocation is kept for the next, so that a step
/// allocates nothing (`tests/decode_allocations.rs`): collecting a vector's
/// iterator into a vector of an element of the same size and alignment
/// reuses its buffer. (The vector is empty: the conversion never runs.)
fn recycle<'b>(mut v: Vec<AttnSegment<'_>>) -> Vec<AttnSegment<'b>> {
    v.clear();
    v.into_iter()
        .map(|s| AttnSegment {
            pages: ferrum_kernels::PagedKv {
                block_table: &[],
                block_size: s.pages.block_size,
            },
            offset: s.offset,
            q_len: s.q_len,
            kv_len: s.kv_len,
            pos_offset: s.pos_offset,
        })
        .collect()
}

/// Tells each model its own graph keys apart from other models' (a draft
/// model shares the device with its target).
static NEXT_GRAPH_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A model's captured decode steps (see [`Capabilities::graphs`](ferrum_kernels::Capabilities)).
struct Graphs {
    /// This model's part of every graph key.
    id: u64,
    /// The scratch generation the graphs were captured against.
    generation: u64,
    /// Batch sizes that ran eagerly since then: a step is captured the
    /// second time its size comes, once every buffer has grown to it.
    warm: Vec<usize>,
    /// Capture is off (`FERRUM_CUDA_GRAPHS=0`) or failed once: the same ops
    /// run eagerly.
    off: bool,
}

/// Reusable activation buffers, grown to the largest batch seen, so that a
/// step allocates nothing once they have grown.
struct Scratch<B: Backend> {
    /// Bumped whenever a buffer is replaced (captured steps hold addresses).
    generation: u64,
    rows: usize,
    /// Rows the logits buffers hold.
    head_rows: usize,
    x: B::Buffer,
    xn: B::Buffer,
    qkv: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    attn: B::Buffer,
    o: B::Buffer,
    gate_up: B::Buffer,
    act: B::Buffer,
    /// What the backend's attention strategy works in.
    attn_work: AttnScratch<B>,
    /// The batch's attention segments; kept for its allocation only (see
    /// [`recycle`]).
    segs: Vec<AttnSegment<'static>>,
    /// The batch's token ids, looked-up embedding rows on the host, and the
    /// rows whose logits are wanted.
    ids: Vec<u32>,
    host: Vec<f32>,
    picks: Vec<usize>,
    /// Hidden states of the wanted rows, and their logits.
    sel: B::Buffer,
    head_out: B::Buffer,
}

impl<B: Backend> Scratch<B> {
    fn new() -> Self {
        let e = || B::alloc(0);
        Self {
            generation: 0,
            rows: 0,
            head_rows: 0,
            x: e(),
            xn: e(),
            qkv: e(),
            q: e(),
            k: e(),
            v: e(),
            attn: e(),
            o: e(),
            gate_up: e(),
            act: e(),
            attn_work: AttnScratch::default(),
            segs: Vec::new(),
            ids: Vec::new(),
            host: Vec::new(),
            picks: Vec::new(),
            sel: e(),
            head_out: e(),
        }
    }

    fn ensure(&mut self, c: &LlamaConfig, rows: usize, seg_rows: usize) {
        let (h, qd, kvd, im) = (
            c.hidden,
            c.heads * c.head_dim,
            c.kv_heads * c.head_dim,
            c.intermediate,
        );
        if rows > self.rows {
            self.x = B::alloc(rows * h);
            self.xn = B::alloc(rows * h);
            self.qkv = B::alloc(rows * (qd + 2 * kvd));
            self.q = B::alloc(rows * qd);
            self.k = B::alloc(rows * kvd);
            self.v = B::alloc(rows * kvd);
            self.attn = B::alloc(rows * qd);
            self.o = B::alloc(rows * h);
            self.gate_up = B::alloc(rows * 2 * im);
            self.act = B::alloc(rows * im);
            self.rows = rows;
            self.generation += 1;
        }
        if self.attn_work.ensure(rows, seg_rows, qd, kvd) {
            self.generation += 1;
        }
    }

    fn ensure_head(&mut self, c: &LlamaConfig, rows: usize) {
        if rows > self.head_rows {
            self.sel = B::alloc(rows * c.hidden);
            self.head_out = B::alloc(rows * c.vocab);
            self.head_rows = rows;
            self.generation += 1;
        }
    }
}

pub struct LlamaModel<B: Backend> {
    cfg: LlamaConfig,
    rt: LlmRuntimeConfig,
    w: Weights<B>,
    cos: B::Buffer,
    sin: B::Buffer,
    local_rope: Option<(B::Buffer, B::Buffer)>,
    kv: KvStore<B>,
    kv_capacity: usize,
    scratch: Scratch<B>,
    moe_scratch: MoeScratch<B>,
    mla_scratch: MlaScratch<B>,
    /// Latent attention's RoPE tables: the queries' cos/sin, the shared
    /// key's cos/sin.
    mla_rope: Option<[B::Buffer; 4]>,
    graphs: Graphs,
}

impl<B: Backend> LlamaModel<B> {
    /// Loads a GGUF model with the default KV pool.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        Self::from_gguf_with(g, &KvPoolConfig::default())
    }

    /// Loads a GGUF model with a KV pool sized by `pool`.
    pub fn from_gguf_with(g: &GgufFile, pool: &KvPoolConfig) -> Result<Self> {
        Self::from_gguf_reporting(g, pool, &|_, _| {})
    }

    /// [`Self::from_gguf_with`], telling `progress` how far loading has come.
    pub fn from_gguf_reporting(
        g: &GgufFile,
        pool: &KvPoolConfig,
        progress: &LoadProgress<'_>,
    ) -> Result<Self> {
        let cfg = LlamaConfig::from_gguf(g)?;
        let w =
            Weights::load(&Source::Gguf(g), &cfg, progress).map_err(|e| g.error(e.to_string()))?;
        if let Err(e) = g.release_resident_pages() {
            tracing::debug!("could not release the file's pages after loading: {e}");
        }
        Self::new(cfg, w, pool)
    }

    /// Loads a Hugging Face folder (`config.json` + safetensors) with the
    /// default KV pool.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        Self::from_hf_dir_with(dir, &KvPoolConfig::default())
    }

    /// Loads a Hugging Face folder with a KV pool sized by `pool`.
    pub fn from_hf_dir_with(dir: &Path, pool: &KvPoolConfig) -> Result<Self> {
        Self::from_hf_dir_reporting(dir, pool, &|_, _| {})
    }

    /// [`Self::from_hf_dir_with`], telling `progress` how far loading has come.
    pub fn from_hf_dir_reporting(
        dir: &Path,
        pool: &KvPoolConfig,
        progress: &LoadProgress<'_>,
    ) -> Result<Self> {
        let hf = HfConfig::load(dir.join("config.json"))?;
        let cfg = LlamaConfig::from_hf(&hf)?;
        let quant = hf
            .quant()
            .map_err(|e| FerrumError::bad_file(dir.join("config.json"), e))?;
        let st = SafeTensors::open_dir(dir)?;
        let w = Weights::load(&Source::Hf(&st, quant.as_ref()), &cfg, progress)
            .map_err(|e| FerrumError::bad_file(dir, e.to_string()))?;
        let unused = weights::unused_tensors(&st, &cfg);
        if !unused.is_empty() {
            return Err(FerrumError::bad_file(
                dir,
                format!(
                    "{} tensor(s) of the checkpoint are not part of a {:?} model as Ferrum \
                     runs it, so it would compute something else: {}",
                    unused.len(),
                    cfg.arch,
                    unused
                        .iter()
                        .take(5)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Self::new(cfg, w, pool)
    }

    /// A model of `cfg`'s shapes with random weights in `ty` blocks (see
    /// [`preset`]), for benchmarks. `act_order`: every projection but the
    /// output head gets a shuffled input order, as act-order GPTQ
    /// checkpoints load (the cost of reordering the activation per GEMM).
    pub fn random(
        cfg: LlamaConfig,
        ty: ferrum_kernels::GgufQuantType,
        act_order: bool,
        seed: u64,
        pool: &KvPoolConfig,
    ) -> Result<Self> {
        let w = Weights::random(&cfg, ty, act_order, seed)?;
        Self::new(cfg, w, pool)
    }

    /// A pool smaller than one sequence's capacity lowers that capacity to
    /// the pool size.
    fn new(cfg: LlamaConfig, mut w: Weights<B>, pool: &KvPoolConfig) -> Result<Self> {
        w.set_int8_inputs(true);
        let default_capacity = pool.sequence_capacity(cfg.max_seq_len, DEFAULT_KV_CAPACITY)?;
        let tokens = pool.resolve_tokens(default_capacity);
        let kv_capacity = default_capacity.min(tokens);
        let kv = KvStore::new(
            cfg.layers,
            cfg.kv_heads,
            cfg.head_dim,
            pool,
            tokens,
            kv_capacity,
        )?;
        let (cos, sin) = cfg
            .rope
            .partial_tables(kv_capacity, cfg.head_dim, cfg.rotary_dims);
        let local_rope = cfg.rope_local.as_ref().map(|r| {
            let (c, s) = r.partial_tables(kv_capacity, cfg.head_dim, cfg.rotary_dims);
            (B::from_slice(&c), B::from_slice(&s))
        });
        let mla_rope = cfg.mla.as_ref().map(|m| {
            let (qc, qs) = cfg
                .rope
                .partial_tables(kv_capacity, m.nope + m.rope, m.rope);
            let (kc, ks) = cfg.rope.tables(kv_capacity, m.rope);
            [qc, qs, kc, ks].map(|t| B::from_slice(&t))
        });
        let rt = LlmRuntimeConfig {
            hidden_size: cfg.hidden,
            num_layers: cfg.layers,
            num_kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            vocab_size: cfg.vocab,
            max_seq_len: cfg.max_seq_len,
        };
        Ok(Self {
            cfg,
            rt,
            w,
            cos: B::from_slice(&cos),
            sin: B::from_slice(&sin),
            local_rope,
            kv,
            kv_capacity,
            scratch: Scratch::new(),
            moe_scratch: MoeScratch::new(),
            mla_scratch: MlaScratch::new(),
            mla_rope,
            graphs: Graphs {
                id: NEXT_GRAPH_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                generation: 0,
                warm: Vec::new(),
                off: false,
            },
        })
    }

    /// Whether the layers' projections take 8-bit inputs (lone outliers
    /// exact) where the backend has such a kernel (on by default: on
    /// SmolLM2 Q4_1 they moved perplexity by +0.002% on GPL-3; the choice of
    /// roles is measured in the weights module). Off, every projection
    /// keeps the backend's 16-bit activations, whose results are the same
    /// on every CPU the kernels run on.
    pub fn set_int8_activations(&mut self, on: bool) {
        self.w.set_int8_inputs(on);
    }

    pub fn llama_config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The batch's token embeddings into `scratch.x`.
    fn embed(&mut self, ctx: &mut B::Context, segs: &[BatchItem]) -> Result<()> {
        let s = &mut self.scratch;
        s.ids.clear();
        s.ids
            .extend(segs.iter().flat_map(|s| s.tokens.iter().copied()));
        self.w
            .embed
            .lookup(ctx, &s.ids, &mut s.x, self.cfg.hidden, &mut s.host)
    }

    /// The batch's attention segments, each item's queries at its rows'
    /// offset, on the kept allocation (see [`recycle`]).
    fn segments<'a>(&mut self, items: &'a [BatchItem]) -> Vec<AttnSegment<'a>> {
        let qd = self.cfg.heads * self.cfg.head_dim;
        let mut segs = recycle(std::mem::take(&mut self.scratch.segs));
        let mut r0 = 0;
        for it in items {
            let n = it.tokens.len();
            segs.push(AttnSegment {
                pages: self.kv.pages(it.block_table),
                offset: r0 * qd,
                q_len: n,
                kv_len: it.pos + n,
                pos_offset: it.pos,
            });
            r0 += n;
        }
        segs
    }

    /// Every layer over the embedded batch, leaving the final-normed
    /// hidden states in `scratch.xn`.
    fn layers(&mut self, ctx: &mut B::Context, segs: &[AttnSegment], rows: usize) -> Result<()> {
        let (h, eps) = (self.cfg.hidden, self.cfg.rms_eps);
        let s = &mut self.scratch;
        B::rms_norm(
            ctx,
            &s.x,
            &self.w.layers[0].attn_norm,
            eps,
            &mut s.xn,
            Mat { rows, cols: h },
        );
        for l in 0..self.cfg.layers {
            self.attention(ctx, l, segs, rows)?;
            self.mlp(ctx, l, rows)?;
        }
        Ok(())
    }

    /// Whether an all-decode batch runs as a captured step (see
    /// [`Capabilities::graphs`](ferrum_kernels::Capabilities)): one token and its logits per sequence, at most
    /// [`GRAPH_CHUNK`] sequences, and no layer that routes on the host
    /// (mixtures) or runs latent attention.
    fn graph_step_fits(&self, items: &[BatchItem]) -> bool {
        B::capabilities().graphs
            && !self.graphs.off
            && items.len() <= GRAPH_CHUNK
            && items
                .iter()
                .all(|s| s.tokens.len() == 1 && s.logits.rows(1) == 1)
            && self
                .w
                .layers
                .iter()
                .all(|l| l.mla.is_none() && matches!(l.mlp, Mlp::Dense(_)))
    }

    /// A decode step through a captured graph: the embedding lookup and
    /// the step's positions and block tables (`set_decode_state`) eagerly,
    /// the layers and the head replayed. A batch size is captured the
    /// second time it comes (the first grows every buffer to it); where
    /// capture is off or fails, the same ops run eagerly, with the same
    /// results.
    fn decode_step(
        &mut self,
        items: &[BatchItem],
        segs: &[AttnSegment],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = items.len();
        self.scratch.ensure_head(&self.cfg, rows);
        let ctx = &mut B::new_context();
        if self.scratch.generation != self.graphs.generation {
            B::reset_graph(ctx);
            self.graphs.warm.clear();
            self.graphs.generation = self.scratch.generation;
        }
        self.embed(ctx, items)?;
        // The attention ops' shapes (a layer's window or soft-cap changes
        // nothing the backend prepares).
        let attn = AttnConfig {
            num_heads: self.cfg.heads,
            num_kv_heads: self.cfg.kv_heads,
            head_dim: self.cfg.head_dim,
            causal: true,
            ..AttnConfig::default()
        };
        B::set_decode_state(ctx, segs, &attn);
        let key = self.graphs.id << 8 | rows as u64;
        let mut done = B::replay_graph(ctx, key)?;
        if !done && !self.graphs.off && self.graphs.warm.contains(&rows) {
            if B::begin_graph_capture(ctx, key).is_ok() {
                let ran = self
                    .layers(ctx, segs, rows)
                    .and_then(|()| self.head(ctx, items));
                let ended = B::end_graph_capture(ctx);
                if let Err(e) = ran.and(ended) {
                    tracing::warn!("decode steps run without graphs: capture failed ({e})");
                } else {
                    done = B::replay_graph(ctx, key)?;
                }
            }
            if !done {
                // Whatever the capture recorded did not run.
                let _ = B::take_error(ctx);
                self.graphs.off = true;
            }
        }
        if !done {
            self.layers(ctx, segs, rows)?;
            self.head(ctx, items)?;
            if !self.graphs.warm.contains(&rows) {
                self.graphs.warm.push(rows);
            }
        }
        B::sync(ctx);
        B::take_error(ctx)?;
        self.read_logits(rows, logits);
        Ok(())
    }

    /// A forward pass op by op: embeddings, layers, the wanted rows' logits.
    fn eager_step(
        &mut self,
        items: &[BatchItem],
        segs: &[AttnSegment],
        rows: usize,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let ctx = &mut B::new_context();
        self.embed(ctx, items)?;
        self.layers(ctx, segs, rows)?;
        let picked = self.head(ctx, items)?;
        B::sync(ctx);
        B::take_error(ctx)?;
        if picked == 0 {
            logits.clear();
            return Ok(());
        }
        self.read_logits(picked, logits);
        Ok(())
    }

    /// Layer `l`'s attention block on the normed stream `scratch.xn`: the
    /// QKV projection, then one backend call for the whole batch (QK norm
    /// and RoPE, K/V into each item's blocks, attention over them: how is
    /// the backend's choice), then the output projection and the residual
    /// into `scratch.x`, leaving the pre-MLP norm of it in `scratch.xn`.
    fn attention(
        &mut self,
        ctx: &mut B::Context,
        l: usize,
        segs: &[AttnSegment],
        rows: usize,
    ) -> Result<()> {
        if self.w.layers[l].mla.is_some() {
            return self.latent_attention(ctx, l, segs, rows);
        }
        let c = &self.cfg;
        let (h, hd, nh, nkv) = (c.hidden, c.head_dim, c.heads, c.kv_heads);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let (s, kv, lw) = (&mut self.scratch, &mut self.kv, &self.w.layers[l]);
        let Some(qkv_w) = &lw.qkv else {
            return Err(FerrumError::invalid("a layer without Q/K/V weights"));
        };
        let qkv = [&mut s.q, &mut s.k, &mut s.v];
        qkv_w.forward(ctx, &s.xn, &mut s.qkv, qkv, rows, qd, kvd, h)?;
        let sliding = c.sliding[l];
        let (cos, sin) = match (&self.local_rope, sliding) {
            (Some((lc, ls)), true) => (lc, ls),
            _ => (&self.cos, &self.sin),
        };
        let cfg = AttnConfig {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            causal: true,
            scale: c.attn_scale,
            kv_seq_stride: 0,
            sliding_window: if sliding { c.sliding_window } else { 0 },
            softcap: c.attn_softcap.unwrap_or(0.0),
        };
        let layer = AttnLayer {
            q: &s.q,
            k: &s.k,
            v: &s.v,
            prep: QkPrep {
                norm: match (c.qk_norm, &lw.q_norm, &lw.k_norm) {
                    (true, Some(q), Some(k)) => Some(QkNorm { q, k, eps: c.rms_eps }),
                    _ => None,
                },
                cos,
                sin,
            },
            cfg: &cfg,
            k_pool: &mut kv.k[l],
            v_pool: &mut kv.v[l],
        };
        B::attention(ctx, layer, segs, &mut s.attn_work, &mut s.attn);
        self.attention_out(ctx, l, rows, qd)
    }

    /// Latent attention (DeepSeek V2, `mla.rs`) of layer `l`, one item at a
    /// time, then the output projection and residual as [`Self::attention`].
    fn latent_attention(
        &mut self,
        ctx: &mut B::Context,
        l: usize,
        segs: &[AttnSegment],
        rows: usize,
    ) -> Result<()> {
        let c = &self.cfg;
        let missing = || FerrumError::invalid("latent attention without its weights");
        let (Some(m), Some(mla), Some([qc, qs, kc, ks])) =
            (&c.mla, &self.w.layers[l].mla, &self.mla_rope)
        else {
            return Err(missing());
        };
        let rope = MlaRope { q: (qc, qs), k: (kc, ks) };
        let dims = (c.heads, c.hidden, c.rms_eps, c.attn_scale);
        let s = &mut self.scratch;
        let mut r0 = 0;
        for seg in segs {
            let n = seg.q_len;
            let pools = (&mut self.kv.k[l], &mut self.kv.v[l]);
            let at = mla::Segment {
                r0,
                n,
                pos: seg.pos_offset,
                pages: seg.pages,
            };
            mla.forward(
                ctx,
                m,
                dims,
                &mut self.mla_scratch,
                &rope,
                &s.xn,
                pools,
                &at,
                &mut s.attn,
            )?;
            r0 += n;
        }
        let width = c.heads * m.v;
        self.attention_out(ctx, l, rows, width)
    }

    /// The output projection of layer `l`'s attention (`scratch.attn`, rows
    /// of `width`) and the residual into `scratch.x`, leaving the pre-MLP
    /// norm of it in `scratch.xn`.
    fn attention_out(
        &mut self,
        ctx: &mut B::Context,
        l: usize,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let (h, eps) = (self.cfg.hidden, self.cfg.rms_eps);
        let (s, lw) = (&mut self.scratch, &self.w.layers[l]);
        lw.o.forward(ctx, &s.attn, &mut s.o, rows, h, width)?;
        if let Some(b) = &lw.o_bias {
            B::add_bias(ctx, &mut s.o, b, Mat { rows, cols: h });
        }
        // Residual + pre-MLP norm.
        match &lw.post_attn_norm {
            Some(post) => {
                B::rms_norm(ctx, &s.o, post, eps, &mut s.xn, Mat { rows, cols: h });
                B::add_inplace(ctx, &mut s.x, &s.xn, rows * h);
                B::rms_norm(
                    ctx,
                    &s.x,
                    &lw.ffn_norm,
                    eps,
                    &mut s.xn,
                    Mat { rows, cols: h },
                );
            }
            None => B::fused_add_rms_norm(
                ctx,
                &mut s.x,
                &s.o,
                &lw.ffn_norm,
                eps,
                &mut s.xn,
                Mat { rows, cols: h },
            ),
        }
        Ok(())
    }

    /// Layer `l`'s gated MLP on `scratch.xn` and the residual into
    /// `scratch.x`, leaving the next layer's (or the final) norm of it in
    /// `scratch.xn`; a mixture of experts where the layer has one.
    fn mlp(&mut self, ctx: &mut B::Context, l: usize, rows: usize) -> Result<()> {
        let c = &self.cfg;
        let (h, im, eps) = (c.hidden, c.intermediate, c.rms_eps);
        let (s, w) = (&mut self.scratch, &self.w);
        let lw = &w.layers[l];
        match (&lw.mlp, &c.moe) {
            (Mlp::Dense(mlp), _) => mlp.run(
                ctx,
                c.act,
                &s.xn,
                &mut s.gate_up,
                &mut s.act,
                &mut s.o,
                rows,
                h,
                im,
            )?,
            (Mlp::Moe(moe), Some(m)) => moe.forward(
                ctx,
                m,
                c.act,
                &mut self.moe_scratch,
                &s.xn,
                &mut s.o,
                rows,
                h,
            )?,
            (Mlp::Moe(_), None) => {
                return Err(FerrumError::invalid(
                    "expert weights without an expert config",
                ))
            }
        }
        // Residual + the next layer's (or the final) norm.
        let next_norm = match w.layers.get(l + 1) {
            Some(next) => &next.attn_norm,
            None => &w.final_norm,
        };
        match &lw.post_ffn_norm {
            Some(post) => {
                B::rms_norm(ctx, &s.o, post, eps, &mut s.xn, Mat { rows, cols: h });
                B::add_inplace(ctx, &mut s.x, &s.xn, rows * h);
                B::rms_norm(ctx, &s.x, next_norm, eps, &mut s.xn, Mat { rows, cols: h });
            }
            None => B::fused_add_rms_norm(
                ctx,
                &mut s.x,
                &s.o,
                next_norm,
                eps,
                &mut s.xn,
                Mat { rows, cols: h },
            ),
        }
        Ok(())
    }

    /// Final-normed hidden states (`scratch.xn`) → logits of the wanted
    /// rows, back to back in `scratch.head_out`; returns how many rows.
    fn head(&mut self, ctx: &mut B::Context, segs: &[BatchItem]) -> Result<usize> {
        let (h, vocab) = (self.cfg.hidden, self.cfg.vocab);
        let s = &mut self.scratch;
        s.picks.clear();
        let mut r0 = 0;
        for seg in segs {
            let n = seg.tokens.len();
            s.picks.extend(r0 + n - seg.logits.rows(n)..r0 + n);
            r0 += n;
        }
        let rows = s.picks.len();
        if rows == 0 {
            return Ok(0);
        }
        s.ensure_head(&self.cfg, rows);
        for (i, &r) in s.picks.iter().enumerate() {
            B::copy_slice(ctx, &s.xn, r * h, &mut s.sel, i * h, h);
        }
        match (&self.w.lm_head, &self.w.embed) {
            (Some(head), _) => head.forward(ctx, &s.sel, &mut s.head_out, rows, vocab, h)?,
            (None, Embedding::Dense(table)) => B::gemm(
                ctx,
                &s.sel,
                table,
                &mut s.head_out,
                Gemm { m: rows, n: vocab, k: h },
            ),
            (None, Embedding::Blocks { .. }) => {
                return Err(FerrumError::invalid("tied head needs a dense table"))
            }
        }
        Ok(rows)
    }

    /// The `rows` logit rows `head` left on the device, into `logits`
    /// (after the context synced).
    fn read_logits(&mut self, rows: usize, logits: &mut Vec<f32>) {
        // Every element is overwritten: resizing a buffer already of this
        // size (each decode step of a steady batch) writes nothing.
        logits.resize(rows * self.cfg.vocab, 0.0);
        B::read_into(&self.scratch.head_out, logits);
        if let Some(cap) = self.cfg.final_softcap {
            for v in logits.iter_mut() {
                *v = cap * (*v / cap).tanh();
            }
        }
    }
}

impl<B: Backend> PagedLlm for LlamaModel<B> {
    fn config(&self) -> &LlmRuntimeConfig {
        &self.rt
    }

    fn kv_capacity(&self) -> usize {
        self.kv_capacity
    }

    fn kv_pool(&self) -> KvPool {
        self.kv.pool
    }

    fn forward_paged(&mut self, items: &[BatchItem], logits: &mut Vec<f32>) -> Result<()> {
        for it in items {
            check_tokens(it.tokens, it.pos, self.cfg.vocab, self.kv_capacity)?;
            self.kv
                .check_table(it.block_table, it.pos + it.tokens.len())?;
        }
        let rows: usize = items.iter().map(|s| s.tokens.len()).sum();
        let seg_rows = items.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        self.scratch.ensure(&self.cfg, rows, seg_rows);
        let segs = self.segments(items);
        let done = if self.graph_step_fits(items) {
            self.decode_step(items, &segs, logits)
        } else {
            self.eager_step(items, &segs, rows, logits)
        };
        self.scratch.segs = recycle(segs);
        done
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        let ctx = &mut B::new_context();
        self.kv.copy_blocks(ctx, copies)?;
        B::sync(ctx);
        B::take_error(ctx)?;
        Ok(())
    }

    fn prepare(&mut self, rows: usize) {
        let rows = rows.min(self.kv_capacity);
        self.scratch.ensure(&self.cfg, rows, rows);
    }

    fn read_kv(&self, table: &[u32], len: usize) -> Result<Vec<(TensorRef, TensorRef)>> {
        self.kv.read(table, len)
    }

    fn write_kv(&mut self, table: &[u32], kv: &[(TensorRef, TensorRef)], len: usize) -> Result<()> {
        self.kv.write(table, kv, len)
    }
}
