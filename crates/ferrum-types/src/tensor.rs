//! A cheap-to-clone, host-resident f32 tensor.

use std::sync::Arc;

use crate::{FerrumError, Result};

/// An immutable f32 tensor in host memory, shared by reference count.
///
/// This is what crosses the boundary between a model's execution backend and
/// the engine: logits for sampling and per-layer K/V handed from prefill to a
/// decode backend. Both are consumed on the host (the sampler runs there), so a
/// host tensor is the honest type; device tensors stay inside their backend.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    shape: Vec<usize>,
    data: Arc<[f32]>,
}

impl TensorRef {
    /// Wraps `data` with `shape`; errors when the element counts disagree.
    pub fn new(shape: Vec<usize>, data: impl Into<Arc<[f32]>>) -> Result<Self> {
        let data = data.into();
        let numel: usize = shape.iter().product();
        if numel != data.len() {
            return Err(FerrumError::invalid(format!(
                "tensor shape {shape:?} holds {numel} elements but {} were given",
                data.len()
            )));
        }
        Ok(Self { shape, data })
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Row-major contents.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Total element count.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_must_match_data() {
        let t = TensorRef::new(vec![1, 1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        assert_eq!(t.shape(), &[1, 1, 3]);
        assert_eq!(t.numel(), 3);
        assert_eq!(t.data()[2], 3.0);
        assert!(TensorRef::new(vec![2, 2], vec![1.0]).is_err());
    }
}
