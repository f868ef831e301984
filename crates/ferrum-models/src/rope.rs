//! Rotary position embedding tables.
//!
//! Angles are computed in f32 the way transformers and llama.cpp compute
//! them (`pos · θ^(-2i/d)` in single precision), so our positions carry the
//! same rounding as the references we are tested against.

use ferrum_formats::hf_config::RopeParams;

/// How the inverse frequencies are derived from θ.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Each pair's frequency divided by its own factor: how GGUF files
    /// carry Llama 3.1+ scaling (the `rope_freqs.weight` tensor, llama.cpp's
    /// `freq_factors`, which its converter derives from the `llama3`
    /// parameters).
    Factors(Vec<f32>),
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: f32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub scaling: RopeScaling,
}

impl RopeSpec {
    pub fn plain(theta: f32) -> Self {
        Self {
            theta,
            scaling: RopeScaling::None,
        }
    }

    /// From a Hugging Face `rope_parameters`/`rope_scaling` entry.
    pub fn from_hf(p: &RopeParams, max_pos: usize) -> Result<Self, String> {
        let scaling = match p.rope_type.as_str() {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: p.factor as f32,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: p.factor as f32,
                low_freq_factor: p.low_freq_factor as f32,
                high_freq_factor: p.high_freq_factor as f32,
                original_max_position: p.original_max_position_embeddings.unwrap_or(max_pos) as f32,
            },
            other => {
                return Err(format!(
                    "rope type '{other}' is not supported (default, linear, llama3)"
                ))
            }
        };
        Ok(Self {
            theta: p.theta as f32,
            scaling,
        })
    }

    /// Inverse frequency of each of the `head_dim / 2` rotated pairs.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let base = 1.0 / self.theta.powf((2 * i) as f32 / head_dim as f32);
                match self.scaling {
                    RopeScaling::None => base,
                    RopeScaling::Linear { factor } => base / factor,
                    RopeScaling::Factors(ref f) => base / f.get(i).copied().unwrap_or(1.0),
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position,
                    } => {
                        let wavelen = 2.0 * std::f32::consts::PI / base;
                        let low_wavelen = original_max_position / low_freq_factor;
                        let high_wavelen = original_max_position / high_freq_factor;
                        if wavelen < high_wavelen {
                            base
                        } else if wavelen > low_wavelen {
                            base / factor
                        } else {
                            let smooth = (original_max_position / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * base / factor + smooth * base
                        }
                    }
                }
            })
            .collect()
    }

    /// `cos` and `sin` tables `[positions, head_dim / 2]`.
    pub fn tables(&self, positions: usize, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
        self.partial_tables(positions, head_dim, head_dim)
    }

    /// Tables where only `rotary` of the `head_dim` dimensions rotate
    /// (partial rotary, Phi-3): pairs past `rotary / 2` keep angle 0. The
    /// model orders each head's Q/K dimensions to match (see
    /// `llama::weights::partial_rotary_row_of`), so one rotate-half kernel
    /// serves both.
    pub fn partial_tables(
        &self,
        positions: usize,
        head_dim: usize,
        rotary: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut inv = self.inv_freq(rotary);
        let half = head_dim / 2;
        inv.resize(half, 0.0);
        let mut cos = vec![0f32; positions * half];
        let mut sin = vec![0f32; positions * half];
        for p in 0..positions {
            for (i, &f) in inv.iter().enumerate() {
                let angle = p as f32 * f;
                cos[p * half + i] = angle.cos();
                sin[p * half + i] = angle.sin();
            }
        }
        (cos, sin)
    }
}
