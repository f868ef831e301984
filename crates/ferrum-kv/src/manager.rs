//! The block pool, per-sequence block tables and the prefix cache.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use ferrum_types::{FerrumError, Result};

/// A block to copy before a step writes into a shared one (copy-on-write):
/// the model copies `src`'s K/V in every layer into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: u32,
    pub dst: u32,
}

/// Pool occupancy and prefix-cache counters, for the scheduler and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvUsage {
    pub block_size: usize,
    pub total_blocks: usize,
    /// Blocks in some sequence's table.
    pub used_blocks: usize,
    /// Unused blocks that still hold a cached prefix (evictable).
    pub cached_blocks: usize,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
}

impl KvUsage {
    /// Blocks a new allocation can take: never-used plus evictable ones.
    pub fn available_blocks(&self) -> usize {
        self.total_blocks - self.used_blocks
    }
}

/// A change to what the prefix cache holds, for routers that place
/// requests where their prefix is cached (vLLM's KV events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks registered in the cache, in order: each one's chain
    /// hash, the hash of the block before the first (`None` at a prompt's
    /// start), and their tokens (`block_size` per block).
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
    },
    /// Cached blocks evicted to make room.
    Removed { hashes: Vec<u64> },
    /// Everything was forgotten.
    AllCleared,
}

#[derive(Default)]
struct Seq {
    blocks: Vec<u32>,
    /// Every token written, so full blocks can be hashed and a truncation
    /// keeps the history consistent.
    tokens: Vec<u32>,
    /// Chain hash of each full block, in order.
    hashes: Vec<u64>,
    /// Written without its tokens (imported K/V): never enters the cache.
    opaque: bool,
}

/// What the prefix cache knows about a registered block. Parent hash and
/// tokens (kept in [`BlockManager::block_tokens`]) are compared on a hit, so
/// a 64-bit hash collision cannot hand a sequence the wrong K/V.
struct Cached {
    block: u32,
    parent: u64,
}

#[derive(Clone, Copy, Default)]
struct Meta {
    refs: u32,
    /// The chain hash under which this block is registered.
    key: Option<u64>,
    /// Position in the eviction queue while unused and cached.
    tick: u64,
}

/// Allocates blocks, keeps block tables with reference counts, shares and
/// caches full prefix blocks.
pub struct BlockManager {
    block_size: usize,
    prefix_caching: bool,
    meta: Vec<Meta>,
    /// Blocks holding nothing worth keeping. Popped last-in-first-out so the
    /// pages touched most recently are reused first.
    free: Vec<u32>,
    /// Unused blocks that hold a cached prefix, oldest first.
    evictable: BTreeMap<u64, u32>,
    by_hash: HashMap<u64, Cached>,
    /// The tokens of each registered block, `block_size` per block: one
    /// allocation for the pool's life rather than one per cached block.
    block_tokens: Vec<u32>,
    seqs: HashMap<String, Seq>,
    tick: u64,
    query_tokens: u64,
    hit_tokens: u64,
    /// Changes to the cache not yet taken ([`BlockManager::take_events`]);
    /// `None` unless asked for ([`BlockManager::record_events`]).
    events: Option<Vec<KvEvent>>,
}

/// The hash of a full block given its parent's hash.
fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockManager {
    /// A pool of `total_blocks` blocks of `block_size` positions.
    pub fn new(total_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        let block_size = block_size.max(1);
        Self {
            block_size,
            prefix_caching,
            meta: vec![Meta::default(); total_blocks],
            free: (0..total_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            by_hash: HashMap::with_capacity(total_blocks),
            block_tokens: vec![0; total_blocks * block_size],
            seqs: HashMap::new(),
            tick: 0,
            query_tokens: 0,
            hit_tokens: 0,
            events: None,
        }
    }

    /// Keeps a record of the cache's changes from now on, for
    /// [`BlockManager::take_events`].
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The cache's changes since the last call, oldest first (none unless
    /// [`BlockManager::record_events`] was called).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn event(&mut self, e: KvEvent) {
        if let Some(events) = &mut self.events {
            events.push(e);
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Positions written for `seq` (0 if unknown).
    pub fn len(&self, seq: &str) -> usize {
        self.seqs.get(seq).map_or(0, |s| s.tokens.len())
    }

    pub fn contains(&self, seq: &str) -> bool {
        self.seqs.contains_key(seq)
    }

    /// Sequences with a table.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// `seq`'s block table (empty if unknown).
    pub fn table(&self, seq: &str) -> &[u32] {
        self.seqs.get(seq).map_or(&[], |s| &s.blocks)
    }

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            block_size: self.block_size,
            total_blocks: self.meta.len(),
            used_blocks: self.meta.len() - self.free.len() - self.evictable.len(),
            cached_blocks: self.evictable.len(),
            prefix_query_tokens: self.query_tokens,
            prefix_hit_tokens: self.hit_tokens,
        }
    }

    /// New blocks `seq` needs to hold `new_len` positions, copies for
    /// copy-on-write included.
    pub fn blocks_needed(&self, seq: &str, new_len: usize) -> usize {
        let (len, have, shared_tail) = match self.seqs.get(seq) {
            Some(s) => {
                let len = s.tokens.len();
                let tail = s.blocks.get(len / self.block_size);
                let shared = tail.is_some_and(|&b| self.meta[b as usize].refs > 1);
                (len, s.blocks.len(), shared)
            }
            None => (0, 0, false),
        };
        if new_len <= len {
            return 0;
        }
        new_len.div_ceil(self.block_size).saturating_sub(have) + usize::from(shared_tail)
    }

    /// Makes room for `seq` to grow to `new_len` positions (creating it if
    /// unknown) and returns the block copies to perform before writing.
    /// Fails without changing anything when the pool is short.
    pub fn reserve(&mut self, seq: &str, new_len: usize) -> Result<Vec<BlockCopy>> {
        self.reserve_many([(seq, new_len)])
    }

    /// [`BlockManager::reserve`] for several sequences at once: all or none.
    /// Allocates nothing for known sequences unless a block table grows or a
    /// copy is needed.
    pub fn reserve_many<'a, I>(&mut self, wants: I) -> Result<Vec<BlockCopy>>
    where
        I: IntoIterator<Item = (&'a str, usize)> + Clone,
    {
        let needed: usize = wants
            .clone()
            .into_iter()
            .map(|(s, n)| self.blocks_needed(s, n))
            .sum();
        let free = self.free.len() + self.evictable.len();
        if needed > free {
            return Err(FerrumError::KvExhausted { needed, free });
        }
        let mut copies = Vec::new();
        for (seq, new_len) in wants {
            let (key, mut s) = self.take_seq(seq);
            let len = s.tokens.len();
            if new_len > len {
                if let Some(&b) = s.blocks.get(len / self.block_size) {
                    // The block about to be written: shared blocks are
                    // copied, an own block stops naming its old prefix.
                    if self.meta[b as usize].refs > 1 {
                        let dst = self.take_block()?;
                        copies.push(BlockCopy { src: b, dst });
                        self.unref(b);
                        s.blocks[len / self.block_size] = dst;
                    } else {
                        self.unregister(b);
                    }
                }
                while s.blocks.len() * self.block_size < new_len {
                    let b = self.take_block()?;
                    s.blocks.push(b);
                }
            }
            self.seqs.insert(key, s);
        }
        Ok(copies)
    }

    /// Reserves room in `seq`'s bookkeeping (creating it if unknown) for
    /// `max_len` positions, so growing to that length allocates nothing.
    pub fn reserve_capacity(&mut self, seq: &str, max_len: usize) {
        let (key, mut s) = self.take_seq(seq);
        let blocks = max_len.div_ceil(self.block_size);
        s.blocks.reserve(blocks.saturating_sub(s.blocks.len()));
        s.hashes.reserve(blocks.saturating_sub(s.hashes.len()));
        s.tokens.reserve(max_len.saturating_sub(s.tokens.len()));
        self.seqs.insert(key, s);
    }

    /// Removes `seq`'s entry (a new one if unknown) with its key, so that
    /// putting it back does not allocate the key again.
    fn take_seq(&mut self, seq: &str) -> (String, Seq) {
        self.seqs
            .remove_entry(seq)
            .unwrap_or_else(|| (seq.to_string(), Seq::default()))
    }

    /// Records that `tokens` were written at the end of `seq` (after a
    /// [`BlockManager::reserve`] that covered them) and registers blocks
    /// that became full in the prefix cache.
    pub fn commit(&mut self, seq: &str, tokens: &[u32]) {
        let Some((key, mut s)) = self.seqs.remove_entry(seq) else {
            return;
        };
        let room = s.blocks.len() * self.block_size - s.tokens.len();
        s.tokens
            .extend_from_slice(&tokens[..tokens.len().min(room)]);
        let mut stored: Option<KvEvent> = None;
        while (s.hashes.len() + 1) * self.block_size <= s.tokens.len() {
            let i = s.hashes.len();
            let parent = s.hashes.last().copied().unwrap_or(0);
            let toks = &s.tokens[i * self.block_size..(i + 1) * self.block_size];
            let h = chain(parent, toks);
            s.hashes.push(h);
            let b = s.blocks[i];
            if self.prefix_caching
                && !s.opaque
                && self.meta[b as usize].key.is_none()
                && !self.by_hash.contains_key(&h)
            {
                self.meta[b as usize].key = Some(h);
                let bs = self.block_size;
                self.block_tokens[b as usize * bs..(b as usize + 1) * bs].copy_from_slice(toks);
                self.by_hash.insert(h, Cached { block: b, parent });
                if self.events.is_some() {
                    // Blocks registered in a row make one event, as vLLM's.
                    match &mut stored {
                        Some(KvEvent::Stored { hashes, tokens, .. })
                            if hashes.last() == Some(&parent) =>
                        {
                            hashes.push(h);
                            tokens.extend_from_slice(toks);
                        }
                        _ => {
                            if let Some(e) = stored.take() {
                                self.event(e);
                            }
                            stored = Some(KvEvent::Stored {
                                hashes: vec![h],
                                parent: (i > 0).then_some(parent),
                                tokens: toks.to_vec(),
                            });
                        }
                    }
                }
            }
        }
        if let Some(e) = stored {
            self.event(e);
        }
        self.seqs.insert(key, s);
    }

    /// Records `n` positions written at the end of `seq` whose tokens are
    /// unknown (K/V imported from elsewhere). The sequence's blocks are never
    /// registered in the prefix cache: their content cannot be named.
    pub fn commit_opaque(&mut self, seq: &str, n: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            s.opaque = true;
            let room = s.blocks.len() * self.block_size - s.tokens.len();
            s.tokens.extend(std::iter::repeat_n(u32::MAX, n.min(room)));
        }
    }

    /// Attaches cached blocks that hold a prefix of `prompt` to `seq`, which
    /// must be new or empty, and returns how many positions they cover. At
    /// least one prompt token is always left to compute, since the caller
    /// needs the logits after the last one.
    pub fn match_prefix(&mut self, seq: &str, prompt: &[u32]) -> usize {
        if self.len(seq) > 0 {
            return 0;
        }
        self.query_tokens += prompt.len() as u64;
        if !self.prefix_caching {
            return 0;
        }
        let bs = self.block_size;
        let (key, mut s) = self.take_seq(seq);
        for b in std::mem::take(&mut s.blocks) {
            self.unref(b);
        }
        let full = prompt.len().saturating_sub(1) / bs;
        let mut parent = 0;
        for i in 0..full {
            let toks = &prompt[i * bs..(i + 1) * bs];
            let h = chain(parent, toks);
            let block = match self.by_hash.get(&h) {
                Some(c)
                    if c.parent == parent
                        && self.block_tokens[c.block as usize * bs..][..bs] == *toks =>
                {
                    c.block
                }
                _ => break,
            };
            let m = &mut self.meta[block as usize];
            if m.refs == 0 {
                self.evictable.remove(&m.tick);
            }
            m.refs += 1;
            s.blocks.push(block);
            s.hashes.push(h);
            s.tokens.extend_from_slice(toks);
            parent = h;
        }
        let hit = s.tokens.len();
        self.hit_tokens += hit as u64;
        self.seqs.insert(key, s);
        hit
    }

    /// Keeps only `seq`'s first `new_len` positions.
    pub fn truncate(&mut self, seq: &str, new_len: usize) {
        let Some(s) = self.seqs.get_mut(seq) else {
            return;
        };
        if new_len >= s.tokens.len() {
            return;
        }
        let dropped = s.blocks.split_off(new_len.div_ceil(self.block_size));
        s.hashes.truncate(new_len / self.block_size);
        s.tokens.truncate(new_len);
        for b in dropped {
            self.unref(b);
        }
    }

    /// Frees `seq`'s table; its full blocks stay cached until evicted.
    pub fn release(&mut self, seq: &str) {
        if let Some(s) = self.seqs.remove(seq) {
            for b in s.blocks {
                self.unref(b);
            }
        }
    }

    /// Releases every sequence and forgets every cached prefix.
    pub fn clear(&mut self) {
        let total = self.meta.len();
        let recording = self.events.is_some();
        *self = Self::new(total, self.block_size, self.prefix_caching);
        if recording {
            self.events = Some(vec![KvEvent::AllCleared]);
        }
    }

    fn take_block(&mut self) -> Result<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self
                    .evictable
                    .pop_first()
                    .ok_or(FerrumError::KvExhausted { needed: 1, free: 0 })?;
                self.unregister(b);
                b
            }
        };
        self.meta[b as usize].refs = 1;
        Ok(b)
    }

    fn unref(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        m.refs = m.refs.saturating_sub(1);
        if m.refs > 0 {
            return;
        }
        if m.key.is_some() {
            self.tick += 1;
            m.tick = self.tick;
            self.evictable.insert(self.tick, b);
        } else {
            self.free.push(b);
        }
    }

    fn unregister(&mut self, b: u32) {
        if let Some(h) = self.meta[b as usize].key.take() {
            if self.by_hash.get(&h).is_some_and(|c| c.block == b) {
                self.by_hash.remove(&h);
                self.event(KvEvent::Removed { hashes: vec![h] });
            }
        }
    }
}

#[cfg(test)]
mod tests;
