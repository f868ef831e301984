//! Compute backends for Ferrum.
//!
//! [`Backend`] is the one abstraction over devices: every op a model needs,
//! with an execution [`Backend::Context`] that CPU runs inline and GPUs turn
//! into a stream of launches. [`CpuBackend`] is the default implementation.

mod backend;
mod batch_attention;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod dtype;
mod paged;
pub mod quant;
mod seed_ops;
mod shapes;

pub use backend::{
    pack_bytes, packed_bytes, AttnConfig, AttnSegment, Backend, Capabilities, ExpertRows,
    GgufQuantType, KvCache, KvDtype, PagedKv, QkMode, QkNorm, QkOp, QkPrep, QuantKind,
    QuantWeights, ReduceOp,
};
pub use batch_attention::{AttnLayer, AttnPlan, AttnScratch};
pub use cpu::{CpuBackend, CpuBuffer, CpuGptqWeight};
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use dtype::Dtype;
pub use paged::{copy_append, encode_segments, gather_attention, rows_by_parts};
pub use seed_ops::SeedOps;
pub use shapes::{Gemm, Heads, Mat, Span};
