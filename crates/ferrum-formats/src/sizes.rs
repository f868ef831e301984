//! Bounds on the sizes a model file may state, checked before anything is
//! sized from them: a count of four billion layers, from a corrupt or
//! hostile file, must be an error naming the field, not an allocation
//! that aborts the process. Each bound is far above any published model
//! (Llama 3.1 405B: 126 layers, hidden 16384, 128 heads; Gemma 3's
//! vocabulary: 262,144; DeepSeek V3: 256 experts).

/// `(field, value, largest accepted)`; the first over its bound is named.
pub fn check(sizes: &[(&str, usize, usize)]) -> Result<(), String> {
    match sizes.iter().find(|(_, v, max)| v > max) {
        Some((name, v, max)) => Err(format!(
            "{name} {v} is beyond what any model has (at most {max}); the file is corrupt"
        )),
        None => Ok(()),
    }
}

pub const MAX_LAYERS: usize = 1024;
pub const MAX_HIDDEN: usize = 1 << 16;
pub const MAX_INTERMEDIATE: usize = 1 << 20;
pub const MAX_HEADS: usize = 1024;
pub const MAX_HEAD_DIM: usize = 1024;
pub const MAX_VOCAB: usize = 1 << 22;
pub const MAX_POSITIONS: usize = 1 << 24;
pub const MAX_EXPERTS: usize = 1 << 12;

/// A hyperparameter that must be a positive finite number (RoPE's θ, a
/// norm's ε, a scaling factor): NaN, infinities, zero and negatives are
/// errors naming `name`.
pub fn positive(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("{name} {v} must be a positive finite number"))
    }
}
