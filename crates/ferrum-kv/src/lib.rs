//! Paged KV-cache bookkeeping: which fixed-size blocks of a shared pool hold
//! which sequence's positions.
//!
//! This crate holds no tensors. A model keeps one K and one V pool per layer
//! (`total_blocks × block_size` positions each) and asks the
//! [`BlockManager`] where each sequence's positions live: its *block table*.
//! The manager also implements prefix caching: a full block is named by a
//! hash chain of the tokens it holds and every token before it, so a later
//! sequence that starts with the same tokens attaches the block instead of
//! recomputing it. Blocks no sequence uses but that still name a prefix stay
//! cached and are evicted least-recently-used, only when a new block is
//! needed. One manager serves one model, so the model is implicit in the key.

mod manager;

pub use manager::{BlockCopy, BlockManager, KvEvent, KvUsage};
