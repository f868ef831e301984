//! [`KvManaged`]: a [`PagedLlm`] with its own [`BlockManager`], which gives
//! any paged model the seed's per-`cache_id` API ([`DecoderOnlyLLM`]) and
//! the [`DecodeBackend`] hand-off. Written once here, for every family; the
//! engine's scheduler does the same bookkeeping itself, planning blocks for
//! a whole batch.

use ferrum_kv::BlockManager;
use ferrum_types::{DecodeBackend, FerrumError, Result, TensorRef};

use crate::llm::{DecoderOnlyLLM, LlmRuntimeConfig};
use crate::paged::{check_tokens, with_items, BatchItem, LogitsWanted, PagedLlm};

/// One sequence's new tokens, named by the caller's `cache_id`.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    pub cache_id: &'a str,
    pub tokens: &'a [u32],
    /// Absolute position of the first token. Before the cache's end it
    /// rolls the cache back to `pos`; after it is an error.
    pub pos: usize,
    pub logits: LogitsWanted,
}

/// Rows of logits [`KvManaged`] keeps its buffer for.
const KEEP_LOGIT_ROWS: usize = 64;

/// A paged model and the block manager over its pool.
pub struct KvManaged<M> {
    model: M,
    blocks: BlockManager,
    /// All wanted rows' logits of the last forward pass, kept between
    /// calls: a fresh buffer was zeroed (1.5 MB for eight SmolLM2
    /// sequences) and, above the allocator's mmap threshold, faulted in
    /// page by page on every step, by one thread while the others waited.
    logits: Vec<f32>,
}

impl<M: PagedLlm> KvManaged<M> {
    pub fn new(model: M) -> Self {
        let blocks = model.kv_pool().manager();
        Self { model, blocks, logits: Vec::new() }
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// Whether `cache_id` holds a cache.
    pub fn contains(&self, cache_id: &str) -> bool {
        self.blocks.contains(cache_id)
    }

    /// Runs `segs` as one batch, the wanted logits back to back in `logits`
    /// (see [`PagedLlm::forward_paged`]). Every segment is checked before
    /// any cache changes.
    pub fn forward_into(&mut self, segs: &[Segment], logits: &mut Vec<f32>) -> Result<()> {
        let (vocab, capacity) = (self.model.config().vocab_size, self.model.kv_capacity());
        for (i, s) in segs.iter().enumerate() {
            check_tokens(s.tokens, s.pos, vocab, capacity)?;
            if segs[..i].iter().any(|o| o.cache_id == s.cache_id) {
                return Err(FerrumError::invalid(format!(
                    "sequence {} appears twice in one batch",
                    s.cache_id
                )));
            }
            let len = self.blocks.len(s.cache_id);
            if s.pos > len {
                return Err(FerrumError::invalid(format!(
                    "sequence {} continues at position {} but holds only {len} tokens",
                    s.cache_id, s.pos
                )));
            }
        }
        for s in segs {
            self.blocks.truncate(s.cache_id, s.pos);
        }
        let wants = segs.iter().map(|s| (s.cache_id, s.pos + s.tokens.len()));
        let copies = self.blocks.reserve_many(wants)?;
        if !copies.is_empty() {
            self.model.copy_blocks(&copies)?;
        }
        let (model, blocks) = (&mut self.model, &self.blocks);
        let items = segs.iter().map(|s| BatchItem {
            tokens: s.tokens,
            pos: s.pos,
            block_table: blocks.table(s.cache_id),
            logits: s.logits,
        });
        let run = with_items(items, |items| model.forward_paged(items, logits));
        if let Err(e) = run {
            // Nothing new is valid: keep the caches as they were.
            for s in segs {
                self.blocks.truncate(s.cache_id, s.pos);
            }
            return Err(e);
        }
        for s in segs {
            self.blocks.commit(s.cache_id, s.tokens);
        }
        Ok(())
    }

    /// [`KvManaged::forward_into`], each segment's logits apart.
    pub fn forward(&mut self, segs: &[Segment]) -> Result<Vec<Option<Vec<f32>>>> {
        let mut all = std::mem::take(&mut self.logits);
        self.forward_into(segs, &mut all)?;
        let vocab = self.model.config().vocab_size;
        let mut taken = 0;
        let out = segs
            .iter()
            .map(|s| {
                let count = s.logits.rows(s.tokens.len());
                taken += count;
                (count > 0).then(|| all[(taken - count) * vocab..taken * vocab].to_vec())
            })
            .collect();
        self.recycle(all);
        Ok(out)
    }

    /// Keeps `all` as the next pass's logits buffer when it holds a decode
    /// batch's rows, not a whole prompt's.
    fn recycle(&mut self, all: Vec<f32>) {
        if all.len() <= KEEP_LOGIT_ROWS * self.model.config().vocab_size {
            self.logits = all;
        }
    }

    /// Like [`DecoderOnlyLLM::prefill`], reporting errors instead of
    /// panicking.
    pub fn try_prefill(&mut self, cache_id: &str, tokens: &[u32]) -> Result<Vec<f32>> {
        let pos = self.blocks.len(cache_id);
        self.single(cache_id, tokens, pos, LogitsWanted::Last)
    }

    /// Like [`DecoderOnlyLLM::decode`], reporting errors instead of
    /// panicking.
    pub fn try_decode(&mut self, cache_id: &str, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.single(cache_id, &[token], pos, LogitsWanted::Last)
    }

    /// Like [`DecoderOnlyLLM::forward_verify`], reporting errors instead of
    /// panicking.
    pub fn try_verify(&mut self, cache_id: &str, tokens: &[u32]) -> Result<Vec<f32>> {
        let pos = self.blocks.len(cache_id);
        self.single(cache_id, tokens, pos, LogitsWanted::All)
    }

    fn single(
        &mut self,
        cache_id: &str,
        tokens: &[u32],
        pos: usize,
        logits: LogitsWanted,
    ) -> Result<Vec<f32>> {
        let seg = Segment { cache_id, tokens, pos, logits };
        let mut all = std::mem::take(&mut self.logits);
        self.forward_into(&[seg], &mut all)?;
        if logits == LogitsWanted::All {
            // Every position's logits (a verification, a perplexity
            // chunk): the caller takes the buffer itself.
            return Ok(all);
        }
        let out = all.clone();
        self.recycle(all);
        Ok(out)
    }

    /// Copies `cache_id`'s K/V out (see [`PagedLlm::read_kv`]).
    pub fn export_kv(&self, cache_id: &str) -> Result<Vec<(TensorRef, TensorRef)>> {
        if !self.blocks.contains(cache_id) {
            return Err(FerrumError::invalid(format!(
                "sequence {cache_id} has no KV cache"
            )));
        }
        let len = self.blocks.len(cache_id);
        self.model.read_kv(self.blocks.table(cache_id), len)
    }

    /// Installs K/V exported by [`KvManaged::export_kv`] (from any model of
    /// the same shape) as `cache_id`'s cache. The tokens it came from are
    /// unknown, so its blocks never enter the prefix cache.
    pub fn import_kv(
        &mut self,
        cache_id: &str,
        kv: &[(TensorRef, TensorRef)],
        len: usize,
    ) -> Result<()> {
        let capacity = self.model.kv_capacity();
        if len > capacity {
            return Err(FerrumError::ContextOverflow { needed: len, capacity });
        }
        self.blocks.release(cache_id);
        self.blocks.reserve(cache_id, len)?;
        if let Err(e) = self.model.write_kv(self.blocks.table(cache_id), kv, len) {
            self.blocks.release(cache_id);
            return Err(e);
        }
        self.blocks.commit_opaque(cache_id, len);
        Ok(())
    }
}

/// Panics with the error: the infallible trait methods have no other way to
/// report it. Callers that must not panic use the `try_*` methods.
fn or_panic<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

impl<M: PagedLlm> DecoderOnlyLLM for KvManaged<M> {
    fn config(&self) -> &LlmRuntimeConfig {
        self.model.config()
    }

    fn prefill(&mut self, cache_id: &str, tokens: &[u32]) -> Vec<f32> {
        or_panic(self.try_prefill(cache_id, tokens))
    }

    fn decode(&mut self, cache_id: &str, token: u32, pos: u32) -> Vec<f32> {
        or_panic(self.try_decode(cache_id, token, pos as usize))
    }

    fn release(&mut self, cache_id: &str) {
        self.blocks.release(cache_id);
    }

    fn kv_len(&self, cache_id: &str) -> usize {
        self.blocks.len(cache_id)
    }

    fn prepare(&mut self, cache_id: &str, max_tokens: usize) {
        let rows = max_tokens.min(self.model.kv_capacity());
        self.model.prepare(rows);
        self.blocks.reserve_capacity(cache_id, rows);
    }

    fn kv_capacity(&self) -> usize {
        self.model.kv_capacity()
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
        or_panic(self.try_verify(cache_id, tokens))
    }

    fn unified_forward(
        &mut self,
        items: &[(String, Vec<u32>, usize, bool)],
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let segs: Vec<Segment> = items
            .iter()
            .map(|(id, toks, pos, last)| Segment {
                cache_id: id,
                tokens: toks,
                pos: *pos,
                logits: if *last {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                },
            })
            .collect();
        self.forward(&segs)
    }

    fn truncate_kv(&mut self, cache_id: &str, new_len: usize) {
        self.blocks.truncate(cache_id, new_len);
    }

    fn reset(&mut self) {
        self.blocks.clear();
    }
}

/// A [`DecodeBackend`] over any paged model: the decode hot path with its
/// own KV caches, fed by a prefill elsewhere.
pub struct PagedDecodeBackend<M> {
    inner: KvManaged<M>,
    name: String,
}

impl<M: PagedLlm> PagedDecodeBackend<M> {
    pub fn new(model: M, name: impl Into<String>) -> Self {
        Self {
            inner: KvManaged::new(model),
            name: name.into(),
        }
    }
}

impl<M: PagedLlm> DecodeBackend for PagedDecodeBackend<M> {
    fn decode_step(
        &mut self,
        token_id: u32,
        position: usize,
        cache_key: &str,
    ) -> Result<TensorRef> {
        if !self.inner.contains(cache_key) {
            return Err(FerrumError::invalid(format!(
                "no KV cache for {cache_key}: call init_kv_cache first"
            )));
        }
        let logits = self.inner.try_decode(cache_key, token_id, position)?;
        TensorRef::new(vec![1, 1, logits.len()], logits)
    }

    fn init_kv_cache(
        &mut self,
        cache_key: &str,
        kv_data: Vec<(TensorRef, TensorRef)>,
        prefill_len: usize,
    ) -> Result<()> {
        self.inner.import_kv(cache_key, &kv_data, prefill_len)
    }

    fn has_kv_cache(&self, cache_key: &str) -> bool {
        self.inner.contains(cache_key)
    }

    fn release_kv_cache(&mut self, cache_key: &str) {
        self.inner.release(cache_key);
    }

    fn name(&self) -> &str {
        &self.name
    }
}
