//! What a backend buffer holds ([`Backend::dtype`](crate::Backend::dtype)).
//!
//! The seed's `Backend` moves every buffer as f32 words, and GGUF blocks,
//! f16 KV and u32 input orders travel in them as raw bits. Each buffer
//! carries one of these tags from the call that made it, so an op checks
//! what it is handed instead of reading one layout as another (a Q4_K
//! weight as Q6_K, a KV pool as a weight, an order as values).

use ferrum_types::{FerrumError, GgmlType, Result};

/// The element type of a backend buffer's words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dtype {
    /// f32 values: what `alloc` and `from_slice` make. Also GGUF blocks
    /// packed into words by the caller with [`crate::pack_bytes`] (the
    /// seed's route to `gemm_quant`), which the kind given to `gemm_quant`
    /// names.
    #[default]
    F32,
    /// f16 values, two to a word (a half-precision KV pool from
    /// `alloc_kv`); the paged ops and `copy_slice` count f16 values.
    F16,
    /// u32 values bit for bit: an input order (`from_u32`).
    U32,
    /// GGUF blocks of this type in the file's layout (`load_gguf`).
    Blocks(GgmlType),
    /// GGUF blocks of this type re-laid out at load for one backend's
    /// kernels (`load_gguf`); only that backend's `gemm_quant` reads them.
    Repacked(GgmlType),
}

impl Dtype {
    /// Whether a weight of this dtype can be read as `ty` blocks, and if
    /// so whether in the backend's repacked layout; an error naming both
    /// otherwise (`what` is the op, for the message).
    pub fn weight_layout(self, ty: GgmlType, what: &str) -> Result<bool> {
        match self {
            Dtype::Repacked(t) if t == ty => Ok(true),
            Dtype::Blocks(t) if t == ty => Ok(false),
            Dtype::F32 => Ok(false),
            other => Err(FerrumError::invalid(format!(
                "{what} {ty}: the weight holds {}",
                other.describe()
            ))),
        }
    }

    /// An input order must be u32 (`from_u32`), never values.
    pub fn check_order(self, what: &str) -> Result<()> {
        match self {
            Dtype::U32 => Ok(()),
            other => Err(FerrumError::invalid(format!(
                "{what}: the input order holds {}, not u32 (make it with from_u32)",
                other.describe()
            ))),
        }
    }

    /// The dtype in words, for errors.
    pub fn describe(self) -> String {
        match self {
            Dtype::F32 => "f32 values".into(),
            Dtype::F16 => "f16 values".into(),
            Dtype::U32 => "u32 values".into(),
            Dtype::Blocks(t) => format!("{t} blocks"),
            Dtype::Repacked(t) => format!("{t} blocks, repacked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Dtype;
    use ferrum_types::GgmlType;

    #[test]
    fn weights_are_read_only_as_what_they_hold() {
        let q4k = GgmlType::Q4_K;
        assert!(!Dtype::Blocks(q4k).weight_layout(q4k, "op").unwrap());
        assert!(Dtype::Repacked(q4k).weight_layout(q4k, "op").unwrap());
        assert!(!Dtype::F32.weight_layout(q4k, "op").unwrap());
        for wrong in [
            Dtype::Blocks(GgmlType::Q6_K),
            Dtype::Repacked(GgmlType::Q8_0),
            Dtype::F16,
            Dtype::U32,
        ] {
            let e = wrong.weight_layout(q4k, "gemm_quant").unwrap_err();
            assert!(e.to_string().contains(&wrong.describe()), "{e}");
        }
        assert!(Dtype::U32.check_order("op").is_ok());
        for wrong in [Dtype::F32, Dtype::F16, Dtype::Blocks(q4k)] {
            assert!(wrong.check_order("op").is_err());
        }
    }
}
