//! The Llama family (Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3, Gemma 3) as
//! one model generic over [`Backend`], its variants chosen by configuration.
//!
//! Every entry point of [`DecoderOnlyLLM`] runs the same forward pass over a
//! batch of *segments* (consecutive new tokens of one sequence): the
//! projections and MLP are single GEMMs over all segments' rows; attention
//! runs per segment against that sequence's own KV cache.

mod config;
mod kv;
mod presets;
mod weights;

use std::path::Path;

use ferrum_formats::gguf::GgufFile;
use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::{AttnConfig, AttnSegment, Backend};
use ferrum_kv::KvUsage;
use ferrum_types::{DecodeBackend, FerrumError, Result, TensorRef};

pub use config::{Activation, Arch, LlamaConfig};
use kv::KvStore;
pub use presets::{preset, PRESETS};
use weights::{Embedding, Source, Weights};

use crate::llm::{
    kv_capacity_from_env, DecoderOnlyLLM, KvPoolConfig, LlmRuntimeConfig, LoadProgress,
};

/// Per-sequence KV capacity when `FERRUM_KV_CAPACITY` is not set (clamped to
/// the model's context length): enough for long chats without reserving a
/// 32K-token cache per sequence up front.
pub const DEFAULT_KV_CAPACITY: usize = 4096;

/// Sequences per [`Backend::paged_attention_segments`] call.
const ATTN_CHUNK: usize = 16;

/// A placeholder for the unused places of a chunk of segments.
const NO_SEGMENT: AttnSegment<'static> = AttnSegment {
    pages: ferrum_kernels::PagedKv {
        block_table: &[],
        block_size: 1,
    },
    offset: 0,
    q_len: 0,
    kv_len: 0,
    pos_offset: 0,
};

/// Reusable activation buffers, grown to the largest batch seen, so that a
/// step allocates nothing once they have grown.
struct Scratch<B: Backend> {
    rows: usize,
    seg_rows: usize,
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
    seg_q: B::Buffer,
    seg_k: B::Buffer,
    seg_v: B::Buffer,
    seg_qh: B::Buffer,
    seg_kh: B::Buffer,
    seg_vh: B::Buffer,
    seg_attn: B::Buffer,
    seg_tok: B::Buffer,
    /// Every segment's head-major queries and attention output, back to
    /// back, for backends with [`Backend::SEGMENTED_ATTENTION`].
    heads_q: B::Buffer,
    heads_out: B::Buffer,
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
            rows: 0,
            seg_rows: 0,
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
            seg_q: e(),
            seg_k: e(),
            seg_v: e(),
            seg_qh: e(),
            seg_kh: e(),
            seg_vh: e(),
            seg_attn: e(),
            seg_tok: e(),
            heads_q: e(),
            heads_out: e(),
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
            if B::SEGMENTED_ATTENTION {
                self.heads_q = B::alloc(rows * qd);
                self.heads_out = B::alloc(rows * qd);
            }
            self.rows = rows;
        }
        if seg_rows > self.seg_rows {
            self.seg_q = B::alloc(seg_rows * qd);
            self.seg_k = B::alloc(seg_rows * kvd);
            self.seg_v = B::alloc(seg_rows * kvd);
            self.seg_qh = B::alloc(seg_rows * qd);
            self.seg_kh = B::alloc(seg_rows * kvd);
            self.seg_vh = B::alloc(seg_rows * kvd);
            self.seg_attn = B::alloc(seg_rows * qd);
            self.seg_tok = B::alloc(seg_rows * qd);
            self.seg_rows = seg_rows;
        }
    }

    fn ensure_head(&mut self, c: &LlamaConfig, rows: usize) {
        if rows > self.head_rows {
            self.sel = B::alloc(rows * c.hidden);
            self.head_out = B::alloc(rows * c.vocab);
            self.head_rows = rows;
        }
    }
}

/// One sequence's new tokens in a batch.
#[derive(Clone, Copy)]
pub struct Segment<'a> {
    pub cache_id: &'a str,
    pub tokens: &'a [u32],
    /// Absolute position of the first token (the cache length before it).
    pub pos: usize,
    /// Logits wanted: none, the last token's, or every token's.
    pub logits: LogitsWanted,
}

impl<'a> Segment<'a> {
    const EMPTY: Segment<'static> = Segment {
        cache_id: "",
        tokens: &[],
        pos: 0,
        logits: LogitsWanted::None,
    };

    /// An engine item `(cache_id, tokens, pos, is_final_chunk)`: a final
    /// chunk wants its last token's logits.
    fn of_item((id, toks, pos, last): &'a (String, Vec<u32>, usize, bool)) -> Self {
        Segment {
            cache_id: id,
            tokens: toks,
            pos: *pos,
            logits: if *last {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    None,
    Last,
    All,
}

impl LogitsWanted {
    /// Logit rows wanted from a segment of `n` tokens (its last ones).
    fn rows(self, n: usize) -> usize {
        match self {
            LogitsWanted::None => 0,
            LogitsWanted::Last => 1,
            LogitsWanted::All => n,
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
    /// The wanted logits of the last [`LlamaModel::forward`], kept so that
    /// the next one neither allocates nor zero-fills them again.
    logits: Vec<f32>,
    /// Passed where an op ignores its norm weight.
    empty: B::Buffer,
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
        Ok(Self::new(cfg, w, pool))
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
        let st = SafeTensors::open_dir(dir)?;
        let w = Weights::load(&Source::Hf(&st), &cfg, progress)
            .map_err(|e| FerrumError::bad_file(dir, e.to_string()))?;
        Ok(Self::new(cfg, w, pool))
    }

    /// A model of `cfg`'s shapes with random weights in `ty` blocks (see
    /// [`preset`]), for benchmarks.
    pub fn random(cfg: LlamaConfig, ty: ferrum_kernels::GgufQuantType, seed: u64) -> Result<Self> {
        let w = Weights::random(&cfg, ty, seed)?;
        Ok(Self::new(cfg, w, &KvPoolConfig::default()))
    }

    /// A pool smaller than one sequence's capacity lowers that capacity to
    /// the pool size.
    fn new(cfg: LlamaConfig, mut w: Weights<B>, pool: &KvPoolConfig) -> Self {
        w.set_int8_inputs(true);
        let default_capacity = kv_capacity_from_env(cfg.max_seq_len, DEFAULT_KV_CAPACITY);
        let tokens = pool.resolve_tokens(default_capacity);
        let kv_capacity = default_capacity.min(tokens);
        let kv = KvStore::new(
            cfg.layers,
            cfg.kv_heads,
            cfg.head_dim,
            pool,
            tokens,
            kv_capacity,
        );
        let (cos, sin) = cfg.rope.tables(kv_capacity, cfg.head_dim);
        let local_rope = cfg.rope_local.as_ref().map(|r| {
            let (c, s) = r.tables(kv_capacity, cfg.head_dim);
            (B::from_slice(&c), B::from_slice(&s))
        });
        let rt = LlmRuntimeConfig {
            hidden_size: cfg.hidden,
            num_layers: cfg.layers,
            num_kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            vocab_size: cfg.vocab,
            max_seq_len: cfg.max_seq_len,
        };
        Self {
            cfg,
            rt,
            w,
            cos: B::from_slice(&cos),
            sin: B::from_slice(&sin),
            local_rope,
            kv,
            kv_capacity,
            scratch: Scratch::new(),
            logits: Vec::new(),
            empty: B::alloc(0),
        }
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

    /// Runs one forward pass over `segs` and returns, per segment, the
    /// logits it asked for (`vocab` floats per row, row-major).
    pub fn forward(&mut self, segs: &[Segment]) -> Result<Vec<Option<Vec<f32>>>> {
        let mut all = std::mem::take(&mut self.logits);
        let done = self.forward_into(segs, &mut all);
        self.logits = all;
        done?;
        let all = &self.logits;
        let vocab = self.cfg.vocab;
        let mut taken = 0;
        Ok(segs
            .iter()
            .map(|s| {
                let count = s.logits.rows(s.tokens.len());
                taken += count;
                (count > 0).then(|| all[(taken - count) * vocab..taken * vocab].to_vec())
            })
            .collect())
    }

    /// [`LlamaModel::forward`] writing the wanted logits back to back into
    /// `logits` (resized to exactly them), in segment order. Once the
    /// scratch buffers have grown to the batch, a step allocates nothing
    /// (tested), so serving loops that keep `logits` decode without
    /// touching the heap.
    ///
    /// Every segment is validated before anything is written: token ids,
    /// positions (a segment starting before its cache end rolls the cache
    /// back to `pos`; after it is an error) and KV capacity.
    pub fn forward_into(&mut self, segs: &[Segment], logits: &mut Vec<f32>) -> Result<()> {
        let vocab = self.cfg.vocab;
        for (i, s) in segs.iter().enumerate() {
            if s.tokens.is_empty() {
                return Err(FerrumError::invalid(format!(
                    "sequence {} has no tokens to process",
                    s.cache_id
                )));
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(FerrumError::invalid(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
            if segs[..i].iter().any(|o| o.cache_id == s.cache_id) {
                return Err(FerrumError::invalid(format!(
                    "sequence {} appears twice in one batch",
                    s.cache_id
                )));
            }
            let len = self.kv.blocks.len(s.cache_id);
            if s.pos > len {
                return Err(FerrumError::invalid(format!(
                    "sequence {} continues at position {} but holds only {len} tokens",
                    s.cache_id, s.pos
                )));
            }
            if s.pos + s.tokens.len() > self.kv_capacity {
                return Err(FerrumError::ContextOverflow {
                    needed: s.pos + s.tokens.len(),
                    capacity: self.kv_capacity,
                });
            }
        }
        // A segment that starts inside its cache replaces what follows.
        for s in segs {
            self.kv.blocks.truncate(s.cache_id, s.pos);
        }
        let wants = segs.iter().map(|s| (s.cache_id, s.pos + s.tokens.len()));
        let copies = self.kv.blocks.reserve_many(wants)?;
        if !copies.is_empty() {
            let ctx = &mut B::new_context();
            self.kv.copy_blocks(ctx, &copies);
        }
        let rows: usize = segs.iter().map(|s| s.tokens.len()).sum();
        let seg_rows = segs.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        self.scratch.ensure(&self.cfg, rows, seg_rows);
        self.run_layers(segs, rows)?;
        for s in segs {
            self.kv.blocks.commit(s.cache_id, s.tokens);
        }
        self.logits_into(segs, logits)
    }

    fn run_layers(&mut self, segs: &[Segment], rows: usize) -> Result<()> {
        let c = &self.cfg;
        let (h, hd, nh, nkv, im) = (c.hidden, c.head_dim, c.heads, c.kv_heads, c.intermediate);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let eps = c.rms_eps;
        let s = &mut self.scratch;
        let ctx = &mut B::new_context();

        s.ids.clear();
        s.ids
            .extend(segs.iter().flat_map(|s| s.tokens.iter().copied()));
        self.w.embed.lookup(ctx, &s.ids, &mut s.x, h, &mut s.host)?;
        B::rms_norm(
            ctx,
            &s.x,
            &self.w.layers[0].attn_norm,
            eps,
            &mut s.xn,
            rows,
            h,
        );

        let mode = if c.qk_norm { 1 } else { 2 };
        for (l, lw) in self.w.layers.iter().enumerate() {
            // Attention.
            let qkv = [&mut s.q, &mut s.k, &mut s.v];
            lw.qkv
                .forward(ctx, &s.xn, &mut s.qkv, qkv, rows, qd, kvd, h)?;
            let sliding = c.sliding[l];
            let (cos, sin) = match (&self.local_rope, sliding) {
                (Some((lc, ls)), true) => (lc, ls),
                _ => (&self.cos, &self.sin),
            };
            let attn_cfg = AttnConfig {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                causal: true,
                scale: c.attn_scale,
                kv_seq_stride: 0,
                sliding_window: if sliding { c.sliding_window } else { 0 },
            };
            // Several sequences' attention goes to the backend in one call
            // where it has a kernel for that (chunks of ATTN_CHUNK on the
            // stack: no allocation).
            let batched = B::SEGMENTED_ATTENTION && segs.len() > 1;
            let mut chunk = [NO_SEGMENT; ATTN_CHUNK];
            let mut filled = 0;
            let mut r0 = 0;
            for (i, seg) in segs.iter().enumerate() {
                let n = seg.tokens.len();
                let p = seg.pos;
                let pages = ferrum_kernels::PagedKv {
                    block_table: self.kv.blocks.table(seg.cache_id),
                    block_size: self.kv.blocks.block_size(),
                };
                let (kp, vp) = (&mut self.kv.k[l], &mut self.kv.v[l]);
                // A lone segment is the whole batch: its rows are read and
                // written in place rather than copied out and back.
                let direct = segs.len() == 1;
                if !direct {
                    B::copy_slice(ctx, &s.q, r0 * qd, &mut s.seg_q, 0, n * qd);
                    B::copy_slice(ctx, &s.k, r0 * kvd, &mut s.seg_k, 0, n * kvd);
                    B::copy_slice(ctx, &s.v, r0 * kvd, &mut s.seg_v, 0, n * kvd);
                }
                let (q_in, k_in, v_in) = if direct {
                    (&s.q, &s.k, &s.v)
                } else {
                    (&s.seg_q, &s.seg_k, &s.seg_v)
                };
                let qn = lw.q_norm.as_ref().unwrap_or(&self.empty);
                let kn = lw.k_norm.as_ref().unwrap_or(&self.empty);
                B::qk_norm_rope(
                    ctx,
                    q_in,
                    qn,
                    cos,
                    sin,
                    &mut s.seg_qh,
                    n,
                    nh,
                    hd,
                    p,
                    eps,
                    mode,
                );
                B::qk_norm_rope(
                    ctx,
                    k_in,
                    kn,
                    cos,
                    sin,
                    &mut s.seg_kh,
                    n,
                    nkv,
                    hd,
                    p,
                    eps,
                    mode,
                );
                B::qk_norm_rope(
                    ctx,
                    v_in,
                    &self.empty,
                    cos,
                    sin,
                    &mut s.seg_vh,
                    n,
                    nkv,
                    hd,
                    p,
                    eps,
                    0,
                );
                B::paged_kv_append(ctx, kp, vp, &pages, p, &s.seg_kh, &s.seg_vh, n, nkv, hd);
                if batched {
                    B::copy_slice(ctx, &s.seg_qh, 0, &mut s.heads_q, r0 * qd, n * qd);
                    chunk[filled] = AttnSegment {
                        pages,
                        offset: r0 * qd,
                        q_len: n,
                        kv_len: p + n,
                        pos_offset: p,
                    };
                    filled += 1;
                    if filled == ATTN_CHUNK || i + 1 == segs.len() {
                        let (kp, vp) = (&self.kv.k[l], &self.kv.v[l]);
                        B::paged_attention_segments(
                            ctx,
                            &s.heads_q,
                            kp,
                            vp,
                            &chunk[..filled],
                            &mut s.heads_out,
                            &attn_cfg,
                        );
                        filled = 0;
                    }
                    r0 += n;
                    continue;
                }
                B::paged_attention(
                    ctx,
                    &s.seg_qh,
                    kp,
                    vp,
                    &pages,
                    &mut s.seg_attn,
                    n,
                    p + n,
                    p,
                    &attn_cfg,
                );
                if direct {
                    B::transpose_head_to_token(ctx, &s.seg_attn, &mut s.attn, n, nh, hd);
                } else {
                    B::transpose_head_to_token(ctx, &s.seg_attn, &mut s.seg_tok, n, nh, hd);
                    B::copy_slice(ctx, &s.seg_tok, 0, &mut s.attn, r0 * qd, n * qd);
                }
                r0 += n;
            }
            if batched {
                // Head-major back to token-major rows; one query's heads
                // already are its row.
                let mut r0 = 0;
                for seg in segs {
                    let n = seg.tokens.len();
                    if n == 1 {
                        B::copy_slice(ctx, &s.heads_out, r0 * qd, &mut s.attn, r0 * qd, qd);
                    } else {
                        B::copy_slice(ctx, &s.heads_out, r0 * qd, &mut s.seg_attn, 0, n * qd);
                        B::transpose_head_to_token(ctx, &s.seg_attn, &mut s.seg_tok, n, nh, hd);
                        B::copy_slice(ctx, &s.seg_tok, 0, &mut s.attn, r0 * qd, n * qd);
                    }
                    r0 += n;
                }
            }
            lw.o.forward(ctx, &s.attn, &mut s.o, rows, h, qd)?;
            // Residual + pre-MLP norm.
            match &lw.post_attn_norm {
                Some(post) => {
                    B::rms_norm(ctx, &s.o, post, eps, &mut s.xn, rows, h);
                    B::add_inplace(ctx, &mut s.x, &s.xn, rows * h);
                    B::rms_norm(ctx, &s.x, &lw.ffn_norm, eps, &mut s.xn, rows, h);
                }
                None => B::fused_add_rms_norm(
                    ctx,
                    &mut s.x,
                    &s.o,
                    &lw.ffn_norm,
                    eps,
                    &mut s.xn,
                    rows,
                    h,
                ),
            }
            // MLP.
            lw.gate_up
                .forward(ctx, &s.xn, &mut s.gate_up, rows, 2 * im, h)?;
            match c.act {
                Activation::Silu => B::fused_silu_mul_split(ctx, &s.gate_up, &mut s.act, rows, im),
                Activation::GeluTanh => {
                    B::fused_gelu_tanh_mul_split(ctx, &s.gate_up, &mut s.act, rows, im)
                }
            }
            lw.down.forward(ctx, &s.act, &mut s.o, rows, h, im)?;
            // Residual + the next layer's (or the final) norm.
            let next_norm = match self.w.layers.get(l + 1) {
                Some(next) => &next.attn_norm,
                None => &self.w.final_norm,
            };
            match &lw.post_ffn_norm {
                Some(post) => {
                    B::rms_norm(ctx, &s.o, post, eps, &mut s.xn, rows, h);
                    B::add_inplace(ctx, &mut s.x, &s.xn, rows * h);
                    B::rms_norm(ctx, &s.x, next_norm, eps, &mut s.xn, rows, h);
                }
                None => {
                    B::fused_add_rms_norm(ctx, &mut s.x, &s.o, next_norm, eps, &mut s.xn, rows, h)
                }
            }
        }
        B::sync(ctx);
        Ok(())
    }

    /// Final-normed hidden states (`scratch.xn`) → logits of the wanted
    /// rows, back to back in `logits`.
    fn logits_into(&mut self, segs: &[Segment], logits: &mut Vec<f32>) -> Result<()> {
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
            logits.clear();
            return Ok(());
        }
        s.ensure_head(&self.cfg, rows);
        let ctx = &mut B::new_context();
        for (i, &r) in s.picks.iter().enumerate() {
            B::copy_slice(ctx, &s.xn, r * h, &mut s.sel, i * h, h);
        }
        match (&self.w.lm_head, &self.w.embed) {
            (Some(head), _) => head.forward(ctx, &s.sel, &mut s.head_out, rows, vocab, h)?,
            (None, Embedding::Dense(table)) => {
                B::gemm(ctx, &s.sel, table, &mut s.head_out, rows, vocab, h)
            }
            (None, Embedding::Blocks { .. }) => {
                return Err(FerrumError::invalid("tied head needs a dense table"))
            }
        }
        B::sync(ctx);
        // Every element is overwritten: resizing a buffer already of this
        // size (each decode step of a steady batch) writes nothing.
        logits.resize(rows * vocab, 0.0);
        B::read_into(&s.head_out, logits);
        if let Some(cap) = self.cfg.final_softcap {
            for v in logits.iter_mut() {
                *v = cap * (*v / cap).tanh();
            }
        }
        Ok(())
    }

    /// Copies `cache_id`'s K/V out: one `(K, V)` pair per layer, each
    /// `[kv_heads, len, head_dim]`, the hand-off format of
    /// [`ferrum_types::DecodeBackend::init_kv_cache`].
    pub fn export_kv(&self, cache_id: &str) -> Result<Vec<(TensorRef, TensorRef)>> {
        self.kv.export(cache_id)
    }

    /// Installs K/V exported by [`LlamaModel::export_kv`] (from any model of
    /// the same shape) as `cache_id`'s cache.
    pub fn import_kv(
        &mut self,
        cache_id: &str,
        kv: &[(TensorRef, TensorRef)],
        len: usize,
    ) -> Result<()> {
        if len > self.kv_capacity {
            return Err(FerrumError::ContextOverflow {
                needed: len,
                capacity: self.kv_capacity,
            });
        }
        self.kv.import(cache_id, kv, len)
    }

    /// Like [`DecoderOnlyLLM::prefill`], reporting errors instead of
    /// panicking.
    pub fn try_prefill(&mut self, cache_id: &str, tokens: &[u32]) -> Result<Vec<f32>> {
        let pos = self.kv_len(cache_id);
        self.single(cache_id, tokens, pos, LogitsWanted::Last)
    }

    /// Like [`DecoderOnlyLLM::decode`], reporting errors instead of
    /// panicking.
    pub fn try_decode(&mut self, cache_id: &str, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.single(cache_id, &[token], pos, LogitsWanted::Last)
    }

    fn single(
        &mut self,
        cache_id: &str,
        tokens: &[u32],
        pos: usize,
        logits: LogitsWanted,
    ) -> Result<Vec<f32>> {
        let seg = Segment {
            cache_id,
            tokens,
            pos,
            logits,
        };
        let mut out = Vec::new();
        self.forward_into(&[seg], &mut out)?;
        if out.is_empty() {
            return Err(FerrumError::invalid("no logits were produced"));
        }
        Ok(out)
    }
}

/// Panics with the error: the infallible trait methods have no other way to
/// report it. Engines call `forward`/`try_*` or check capacity first.
fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

impl<B: Backend> DecoderOnlyLLM for LlamaModel<B> {
    fn config(&self) -> &LlmRuntimeConfig {
        &self.rt
    }

    fn prefill(&mut self, cache_id: &str, tokens: &[u32]) -> Vec<f32> {
        or_panic(self.try_prefill(cache_id, tokens))
    }

    fn decode(&mut self, cache_id: &str, token: u32, pos: u32) -> Vec<f32> {
        or_panic(self.try_decode(cache_id, token, pos as usize))
    }

    fn release(&mut self, cache_id: &str) {
        self.kv.blocks.release(cache_id);
    }

    fn kv_len(&self, cache_id: &str) -> usize {
        self.kv.blocks.len(cache_id)
    }

    fn prepare(&mut self, cache_id: &str, max_tokens: usize) {
        let rows = max_tokens.min(self.kv_capacity);
        self.scratch.ensure(&self.cfg, rows, rows);
        self.kv.blocks.reserve_capacity(cache_id, rows);
    }

    fn kv_capacity(&self) -> usize {
        self.kv_capacity
    }

    fn decode_batch(&mut self, batch: &[(String, u32, u32)]) -> Vec<Vec<f32>> {
        let toks: Vec<[u32; 1]> = batch.iter().map(|(_, t, _)| [*t]).collect();
        let segs: Vec<Segment> = batch
            .iter()
            .zip(&toks)
            .map(|((id, _, pos), t)| Segment {
                cache_id: id,
                tokens: t,
                pos: *pos as usize,
                logits: LogitsWanted::Last,
            })
            .collect();
        or_panic(self.forward(&segs))
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect()
    }

    fn forward_verify(&mut self, cache_id: &str, tokens: &[u32]) -> Vec<f32> {
        let pos = self.kv_len(cache_id);
        or_panic(self.single(cache_id, tokens, pos, LogitsWanted::All))
    }

    fn unified_forward(
        &mut self,
        items: &[(String, Vec<u32>, usize, bool)],
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let segs: Vec<Segment> = items.iter().map(Segment::of_item).collect();
        self.forward(&segs)
    }

    fn unified_forward_into(
        &mut self,
        items: &[(String, Vec<u32>, usize, bool)],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        // Segments on the stack for engine-sized batches: no allocation.
        const STACK: usize = 64;
        if items.len() > STACK {
            let segs: Vec<Segment> = items.iter().map(Segment::of_item).collect();
            return self.forward_into(&segs, logits);
        }
        let mut segs = [Segment::EMPTY; STACK];
        for (s, item) in segs.iter_mut().zip(items) {
            *s = Segment::of_item(item);
        }
        self.forward_into(&segs[..items.len()], logits)
    }

    fn truncate_kv(&mut self, cache_id: &str, new_len: usize) {
        self.kv.blocks.truncate(cache_id, new_len);
    }

    fn reset(&mut self) {
        self.kv.blocks.clear();
    }

    fn kv_usage(&self) -> Option<KvUsage> {
        Some(self.kv.blocks.usage())
    }

    fn kv_blocks_needed(&self, cache_id: &str, new_len: usize) -> usize {
        self.kv.blocks.blocks_needed(cache_id, new_len)
    }

    fn reuse_prefix(&mut self, cache_id: &str, prompt: &[u32]) -> usize {
        let max = prompt.len().min(self.kv_capacity);
        self.kv.blocks.match_prefix(cache_id, &prompt[..max])
    }
}

/// A [`DecodeBackend`] over a Llama-family model on any [`Backend`]: the
/// decode hot path with its own KV caches, fed by a prefill elsewhere.
pub struct LlamaDecodeBackend<B: Backend> {
    model: LlamaModel<B>,
    name: String,
}

impl<B: Backend> LlamaDecodeBackend<B> {
    pub fn new(model: LlamaModel<B>, name: impl Into<String>) -> Self {
        Self {
            model,
            name: name.into(),
        }
    }
}

impl<B: Backend> DecodeBackend for LlamaDecodeBackend<B> {
    fn decode_step(
        &mut self,
        token_id: u32,
        position: usize,
        cache_key: &str,
    ) -> Result<TensorRef> {
        if !self.has_kv_cache(cache_key) {
            return Err(FerrumError::invalid(format!(
                "no KV cache for {cache_key}: call init_kv_cache first"
            )));
        }
        let logits = self.model.try_decode(cache_key, token_id, position)?;
        TensorRef::new(vec![1, 1, logits.len()], logits)
    }

    fn init_kv_cache(
        &mut self,
        cache_key: &str,
        kv_data: Vec<(TensorRef, TensorRef)>,
        prefill_len: usize,
    ) -> Result<()> {
        self.model.import_kv(cache_key, &kv_data, prefill_len)
    }

    fn has_kv_cache(&self, cache_key: &str) -> bool {
        self.model.kv.blocks.contains(cache_key)
    }

    fn release_kv_cache(&mut self, cache_key: &str) {
        self.model.release(cache_key);
    }

    fn name(&self) -> &str {
        &self.name
    }
}
