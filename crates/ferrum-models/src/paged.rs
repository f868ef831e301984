//! `PagedLlm`: a model that stores K/V in paged pools but keeps no block
//! accounting. Whoever drives it (the engine's scheduler, or
//! [`crate::KvManaged`] for the seed's per-`cache_id` API) owns a
//! [`BlockManager`] over the pool and hands the model a block table with
//! every batch item, as vLLM's scheduler hands its model runner block
//! tables. A new architecture (or MLA's latent cache) therefore writes its
//! forward pass and storage, never the KV plumbing.

use ferrum_kv::{BlockCopy, BlockManager};
use ferrum_types::{FerrumError, Result, TensorRef};

use crate::llm::LlmRuntimeConfig;

/// Which logits an item wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// An intermediate prefill chunk: none.
    None,
    /// The last token's (a final chunk or a decode).
    Last,
    /// Every token's (speculative verification, prompt scoring).
    All,
}

impl LogitsWanted {
    /// Logit rows wanted from an item of `n` tokens (its last ones).
    pub fn rows(self, n: usize) -> usize {
        match self {
            LogitsWanted::None => 0,
            LogitsWanted::Last => 1,
            LogitsWanted::All => n,
        }
    }
}

/// One sequence's new tokens in a batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchItem<'a> {
    pub tokens: &'a [u32],
    /// Absolute position of the first token: the positions before it are
    /// in the cache already.
    pub pos: usize,
    /// The pool blocks holding positions `0..pos + tokens.len()`, in order
    /// (reserved by the caller, with copy-on-write copies done).
    pub block_table: &'a [u32],
    pub logits: LogitsWanted,
}

impl BatchItem<'_> {
    const EMPTY: BatchItem<'static> = BatchItem {
        tokens: &[],
        pos: 0,
        block_table: &[],
        logits: LogitsWanted::None,
    };
}

/// The shape of a model's KV pool, fixed at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPool {
    pub blocks: usize,
    pub block_size: usize,
    /// Whether full blocks of earlier prompts are kept and shared; a choice
    /// made with the pool (`--no-prefix-caching`), applied by its manager.
    pub prefix_caching: bool,
}

impl KvPool {
    /// A block manager over this pool.
    pub fn manager(&self) -> BlockManager {
        BlockManager::new(self.blocks, self.block_size, self.prefix_caching)
    }
}

/// A decoder-only model over a paged KV pool it stores but does not manage.
pub trait PagedLlm: Send + Sync {
    fn config(&self) -> &LlmRuntimeConfig;

    /// The most positions one sequence may hold.
    fn kv_capacity(&self) -> usize;

    /// The pool the model allocated.
    fn kv_pool(&self) -> KvPool;

    /// Runs one forward pass over `items`, writing their K/V into the
    /// blocks of their tables and the wanted logits back to back into
    /// `logits` (resized to exactly `vocab_size` per wanted row, in item
    /// order). Bad items are an error before anything is written: [`check_tokens`] and a block table that covers each item
    /// with blocks of the pool. Once the model's scratch has grown to the batch, a step
    /// allocates nothing.
    fn forward_paged(&mut self, items: &[BatchItem], logits: &mut Vec<f32>) -> Result<()>;

    /// Copies whole blocks in every layer (copy-on-write of shared blocks).
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()>;

    /// Grows scratch for batches of up to `rows` tokens now rather than on
    /// the first timed step. Default: nothing to do.
    fn prepare(&mut self, _rows: usize) {}

    /// The K/V of the `len` positions in `table`: one `(K, V)` pair per
    /// layer, each `[kv_heads, len, head_dim]` f32, the hand-off format of
    /// [`ferrum_types::DecodeBackend::init_kv_cache`].
    fn read_kv(&self, table: &[u32], len: usize) -> Result<Vec<(TensorRef, TensorRef)>>;

    /// Writes K/V in [`PagedLlm::read_kv`]'s format into the blocks of
    /// `table` (which must cover `len` positions).
    fn write_kv(&mut self, table: &[u32], kv: &[(TensorRef, TensorRef)], len: usize) -> Result<()>;
}

impl<M: PagedLlm + ?Sized> PagedLlm for Box<M> {
    fn config(&self) -> &LlmRuntimeConfig {
        (**self).config()
    }
    fn kv_capacity(&self) -> usize {
        (**self).kv_capacity()
    }
    fn kv_pool(&self) -> KvPool {
        (**self).kv_pool()
    }
    fn forward_paged(&mut self, items: &[BatchItem], logits: &mut Vec<f32>) -> Result<()> {
        (**self).forward_paged(items, logits)
    }
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        (**self).copy_blocks(copies)
    }
    fn prepare(&mut self, rows: usize) {
        (**self).prepare(rows)
    }
    fn read_kv(&self, table: &[u32], len: usize) -> Result<Vec<(TensorRef, TensorRef)>> {
        (**self).read_kv(table, len)
    }
    fn write_kv(&mut self, table: &[u32], kv: &[(TensorRef, TensorRef)], len: usize) -> Result<()> {
        (**self).write_kv(table, kv, len)
    }
}

/// `tokens` written from `pos`: not empty, inside the vocabulary, ending
/// within `capacity`.
pub(crate) fn check_tokens(
    tokens: &[u32],
    pos: usize,
    vocab: usize,
    capacity: usize,
) -> Result<()> {
    if tokens.is_empty() {
        return Err(FerrumError::invalid(
            "a batch item has no tokens to process",
        ));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(FerrumError::invalid(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    if pos + tokens.len() > capacity {
        return Err(FerrumError::ContextOverflow { needed: pos + tokens.len(), capacity });
    }
    Ok(())
}

/// Collects `items` into a slice for `run`: on the stack for batches of up
/// to 64 (a serving step allocates nothing for them), else in a `Vec`.
pub fn with_items<'a, R>(
    items: impl ExactSizeIterator<Item = BatchItem<'a>>,
    run: impl FnOnce(&[BatchItem<'a>]) -> R,
) -> R {
    const STACK: usize = 64;
    if items.len() > STACK {
        let all: Vec<BatchItem> = items.collect();
        return run(&all);
    }
    let mut buf = [BatchItem::EMPTY; STACK];
    let mut n = 0;
    for (slot, it) in buf.iter_mut().zip(items) {
        *slot = it;
        n += 1;
    }
    run(&buf[..n])
}
