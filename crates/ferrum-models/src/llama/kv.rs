//! The model's KV storage: one paged K and V pool per layer, shared by all
//! sequences. Which blocks hold what is the caller's to track (see
//! [`crate::paged`]); this module only moves data in and out of blocks.

use ferrum_kernels::{Backend, Heads, KvDtype, PagedKv};
use ferrum_kv::BlockCopy;
use ferrum_types::{FerrumError, Result, TensorRef};

use crate::llm::KvPoolConfig;
use crate::paged::KvPool;

pub(super) struct KvStore<B: Backend> {
    pub k: Vec<B::Buffer>,
    pub v: Vec<B::Buffer>,
    pub pool: KvPool,
    nkv: usize,
    hd: usize,
    dtype: KvDtype,
}

impl<B: Backend> KvStore<B> {
    /// Pools of `cfg.dtype` for `tokens` positions in `cfg.block_size`
    /// blocks (0: the backend's choice for sequences of `capacity`). On the
    /// CPU the pools are zero pages the OS maps on first write, so an
    /// unused pool costs address space, not memory.
    pub fn new(
        layers: usize,
        nkv: usize,
        hd: usize,
        cfg: &KvPoolConfig,
        tokens: usize,
        capacity: usize,
    ) -> Result<Self> {
        let dtype = B::capabilities().kv_dtype(cfg.dtype)?;
        let bs = match cfg.block_size {
            0 => B::kv_block_size(capacity),
            b => b,
        };
        let blocks = tokens.div_ceil(bs).max(1);
        let len = blocks * nkv * bs * hd;
        // As vLLM logs its block count: what the pool holds and costs at
        // most (on the CPU it is paid as blocks are first written).
        tracing::info!(
            "KV pool: {blocks} blocks of {bs} positions, {} positions ({:.1} MiB of {})",
            blocks * bs,
            (2 * layers * len * dtype.bytes()) as f64 / (1024.0 * 1024.0),
            dtype.name()
        );
        Ok(Self {
            k: (0..layers).map(|_| B::alloc_kv(len, dtype)).collect(),
            v: (0..layers).map(|_| B::alloc_kv(len, dtype)).collect(),
            pool: KvPool {
                blocks,
                block_size: bs,
                prefix_caching: cfg.prefix_caching,
            },
            nkv,
            hd,
            dtype,
        })
    }

    pub fn pages<'a>(&self, table: &'a [u32]) -> PagedKv<'a> {
        PagedKv {
            block_table: table,
            block_size: self.pool.block_size,
        }
    }

    /// Performs copy-on-write copies in every layer.
    pub fn copy_blocks(&mut self, ctx: &mut B::Context, copies: &[BlockCopy]) -> Result<()> {
        let n = self.nkv * self.pool.block_size * self.hd;
        for c in copies {
            if c.src as usize >= self.pool.blocks || c.dst as usize >= self.pool.blocks {
                return Err(FerrumError::invalid(format!(
                    "block copy {} -> {} outside a pool of {} blocks",
                    c.src, c.dst, self.pool.blocks
                )));
            }
            let (src, dst) = (c.src as usize * n, c.dst as usize * n);
            for pool in self.k.iter_mut().chain(self.v.iter_mut()) {
                // Source and destination are distinct blocks of one buffer:
                // stage through a copy so the borrow rules hold on every
                // backend.
                let tmp = {
                    let mut t = B::alloc_kv(n, self.dtype);
                    B::copy_slice(ctx, pool, src, &mut t, 0, n);
                    t
                };
                B::copy_slice(ctx, &tmp, 0, pool, dst, n);
            }
        }
        Ok(())
    }

    /// Checks that `table` names pool blocks and covers `len` positions.
    pub fn check_table(&self, table: &[u32], len: usize) -> Result<()> {
        if table.len() * self.pool.block_size < len {
            return Err(FerrumError::invalid(format!(
                "a block table of {} blocks cannot hold {len} positions",
                table.len()
            )));
        }
        if let Some(&b) = table.iter().find(|&&b| b as usize >= self.pool.blocks) {
            return Err(FerrumError::invalid(format!(
                "block {b} is outside a pool of {} blocks",
                self.pool.blocks
            )));
        }
        Ok(())
    }

    /// The K/V of `len` positions in `table`, one `(K, V)` pair per layer of
    /// `[nkv, len, hd]`, as f32.
    pub fn read(&self, table: &[u32], len: usize) -> Result<Vec<(TensorRef, TensorRef)>> {
        self.check_table(table, len)?;
        let pages = self.pages(table);
        let (nkv, hd) = (self.nkv, self.hd);
        let ctx = &mut B::new_context();
        let take = |pool: &B::Buffer, ctx: &mut B::Context| {
            let mut out = B::alloc(nkv * len * hd);
            for h in 0..nkv {
                for p0 in (0..len).step_by(pages.block_size) {
                    let run = pages.block_size.min(len - p0) * hd;
                    let src = pages.offset(p0, h, nkv, hd);
                    B::copy_slice(ctx, pool, src, &mut out, (h * len + p0) * hd, run);
                }
            }
            B::sync(ctx);
            B::take_error(ctx)?;
            TensorRef::new(vec![nkv, len, hd], B::to_vec(&out, nkv * len * hd))
        };
        self.k
            .iter()
            .zip(&self.v)
            .map(|(k, v)| Ok((take(k, ctx)?, take(v, ctx)?)))
            .collect()
    }

    /// Writes `[nkv, len, hd]` K/V per layer into the blocks of `table`.
    pub fn write(
        &mut self,
        table: &[u32],
        kv: &[(TensorRef, TensorRef)],
        len: usize,
    ) -> Result<()> {
        let (nkv, hd) = (self.nkv, self.hd);
        if kv.len() != self.k.len() {
            return Err(FerrumError::invalid(format!(
                "KV for {} layers given to a model of {}",
                kv.len(),
                self.k.len()
            )));
        }
        for (k, v) in kv {
            for t in [k, v] {
                if t.shape() != [nkv, len, hd] {
                    return Err(FerrumError::invalid(format!(
                        "KV tensor of shape {:?}, expected {:?}",
                        t.shape(),
                        [nkv, len, hd]
                    )));
                }
            }
        }
        self.check_table(table, len)?;
        let ctx = &mut B::new_context();
        let pages = self.pages(table);
        for ((kp, vp), (k, v)) in self.k.iter_mut().zip(self.v.iter_mut()).zip(kv) {
            let (kb, vb) = (B::from_slice(k.data()), B::from_slice(v.data()));
            B::paged_kv_append(
                ctx,
                [kp, vp],
                &pages,
                0,
                [&kb, &vb],
                Heads { tokens: len, heads: nkv, head_dim: hd },
            );
        }
        B::sync(ctx);
        B::take_error(ctx)?;
        Ok(())
    }
}
