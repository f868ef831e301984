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
    /// Phi-3's LongRoPE: per-pair divisors, the long set when the cache
    /// reaches past `original_max_position` (chosen once per table, as
    /// llama.cpp chooses by context size), and cos/sin scaled by
    /// `attn_factor`.
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original_max_position: usize,
        attn_factor: f32,
    },
    /// YaRN (Peng et al., 2023): pairs that turn fewer than `beta_slow`
    /// times over the original context are interpolated (frequency divided
    /// by `factor`), those turning more than `beta_fast` times are kept, and
    /// a linear ramp over the pair index blends the two between; cos/sin
    /// are scaled by `attn_factor`. As transformers and llama.cpp apply it:
    /// at every position, not only past the original context.
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Round the ramp's ends outward to whole pairs (both references'
        /// default).
        truncate: bool,
        attn_factor: f32,
    },
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
        Self { theta, scaling: RopeScaling::None }
    }

    /// From a Hugging Face `rope_parameters`/`rope_scaling` entry.
    pub fn from_hf(p: &RopeParams, max_pos: usize) -> Result<Self, String> {
        let scaling = match p.rope_type.as_str() {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: p.factor.unwrap_or(1.0) as f32 },
            "yarn" => {
                let orig = p
                    .original_max_position_embeddings
                    .ok_or("yarn needs original_max_position_embeddings")?;
                let factor = yarn_factor(p, max_pos);
                let attn_factor = match (p.attention_factor, p.mscale, p.mscale_all_dim) {
                    (Some(a), ..) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, all)
                    }
                    _ => yarn_mscale(factor, 1.0),
                };
                if !(factor.is_finite() && factor > 0.0 && orig > 0) {
                    return Err(format!(
                        "yarn factor {factor} over {orig} positions is not valid"
                    ));
                }
                RopeScaling::Yarn {
                    factor: factor as f32,
                    original_max_position: orig,
                    beta_fast: p.beta_fast as f32,
                    beta_slow: p.beta_slow as f32,
                    truncate: p.truncate,
                    attn_factor: attn_factor as f32,
                }
            }
            "longrope" | "su" => {
                let orig = p.original_max_position_embeddings.unwrap_or(max_pos);
                // transformers: the given attention factor, else one from
                // the given factor, else from the two context lengths.
                let scale = p.factor.unwrap_or(max_pos as f64 / orig as f64);
                let to32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
                if p.short_factor.is_empty() || p.short_factor.len() != p.long_factor.len() {
                    return Err("longrope needs short_factor and long_factor of one length".into());
                }
                RopeScaling::LongRope {
                    short: to32(&p.short_factor),
                    long: to32(&p.long_factor),
                    original_max_position: orig,
                    attn_factor: p
                        .attention_factor
                        .map_or_else(|| long_rope_attn_factor(scale, orig), |a| a as f32),
                }
            }
            "llama3" => RopeScaling::Llama3 {
                factor: p.factor.unwrap_or(1.0) as f32,
                low_freq_factor: p.low_freq_factor as f32,
                high_freq_factor: p.high_freq_factor as f32,
                original_max_position: p.original_max_position_embeddings.unwrap_or(max_pos) as f32,
            },
            other => {
                return Err(format!(
                    "rope type '{other}' is not supported (default, linear, llama3, longrope, yarn)"
                ))
            }
        };
        Ok(Self { theta: p.theta as f32, scaling })
    }

    /// Inverse frequency of each of the `head_dim / 2` rotated pairs, for
    /// tables of `positions`.
    pub fn inv_freq(&self, head_dim: usize, positions: usize) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let base = 1.0 / self.theta.powf((2 * i) as f32 / head_dim as f32);
                match self.scaling {
                    RopeScaling::Yarn {
                        factor,
                        original_max_position,
                        beta_fast,
                        beta_slow,
                        truncate,
                        ..
                    } => {
                        let (low, high) = yarn_ramp(
                            self.theta,
                            head_dim,
                            original_max_position,
                            (beta_fast, beta_slow),
                            truncate,
                        );
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        let pos_freq = self.theta.powf((2 * i) as f32 / head_dim as f32);
                        let interp = 1.0 / (factor * pos_freq);
                        interp * (1.0 - keep) + base * keep
                    }
                    RopeScaling::None => base,
                    RopeScaling::LongRope {
                        ref short,
                        ref long,
                        original_max_position,
                        ..
                    } => {
                        let f = if positions > original_max_position {
                            long
                        } else {
                            short
                        };
                        base / f.get(i).copied().unwrap_or(1.0)
                    }
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
    /// `llama::tensors::partial_rotary_row_of`), so one rotate-half kernel
    /// serves both.
    pub fn partial_tables(
        &self,
        positions: usize,
        head_dim: usize,
        rotary: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv_freq(rotary, positions);
        let half = head_dim / 2;
        // LongRoPE's and YaRN's cos/sin scale applies to the rotating pairs
        // only (transformers scales the rotary half's cos and sin; the
        // passed-through dimensions stay as they are).
        let m = match self.scaling {
            RopeScaling::LongRope { attn_factor, .. } | RopeScaling::Yarn { attn_factor, .. } => {
                attn_factor
            }
            _ => 1.0,
        };
        let mut cos = vec![1f32; positions * half];
        let mut sin = vec![0f32; positions * half];
        for p in 0..positions {
            for (i, &f) in inv.iter().enumerate().take(half) {
                let angle = p as f32 * f;
                cos[p * half + i] = angle.cos() * m;
                sin[p * half + i] = angle.sin() * m;
            }
        }
        (cos, sin)
    }
}

/// LongRoPE's cos/sin scale for a context `scale` times the original
/// `orig` positions: `√(1 + ln scale / ln orig)`, 1 when not extended
/// (transformers' and llama.cpp's Phi-3 formula).
pub fn long_rope_attn_factor(scale: f64, orig: usize) -> f32 {
    if scale <= 1.0 {
        return 1.0;
    }
    (1.0 + scale.ln() / (orig as f64).ln()).sqrt() as f32
}

/// YaRN's magnitude term `0.1 · m · ln s + 1` (1 when not extended).
pub fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// The YaRN factor of `p`: given, or the ratio of the context lengths
/// (transformers' rule for configs that leave it out, as DeepSeek V3's may).
pub fn yarn_factor(p: &RopeParams, max_pos: usize) -> f64 {
    p.factor.unwrap_or_else(|| {
        max_pos as f64 / p.original_max_position_embeddings.unwrap_or(max_pos).max(1) as f64
    })
}

/// The multiplier DeepSeek's attention applies to its softmax scale under
/// YaRN: `mscale(factor, mscale_all_dim)²` when `mscale_all_dim` is set
/// (transformers' `yarn_apply_mscale`), else 1.
pub fn yarn_softmax_scale(p: &RopeParams, max_pos: usize) -> f32 {
    match p.mscale_all_dim {
        Some(all) if all != 0.0 && p.rope_type != "default" => {
            yarn_mscale(yarn_factor(p, max_pos), all).powi(2) as f32
        }
        _ => 1.0,
    }
}

/// The pair indices where YaRN's ramp starts and ends (`low`, `high`,
/// `high > low`): the dimensions that turn `beta_fast` and `beta_slow`
/// times over `orig` positions, computed in f64 as both references do.
fn yarn_ramp(theta: f32, dim: usize, orig: usize, beta: (f32, f32), truncate: bool) -> (f32, f32) {
    let d = dim as f64;
    let corr = |rotations: f32| {
        d * (orig as f64 / (rotations as f64 * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (theta as f64).ln())
    };
    let (mut low, mut high) = (corr(beta.0), corr(beta.1));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0) as f32, high.min(d - 1.0) as f32);
    // transformers' guard against a zero-width ramp.
    (low, if high == low { high + 0.001 } else { high })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_rope_picks_factors_by_table_length_and_scales() {
        let spec = RopeSpec {
            theta: 10_000.0,
            scaling: RopeScaling::LongRope {
                short: vec![1.0, 2.0],
                long: vec![4.0, 8.0],
                original_max_position: 16,
                attn_factor: long_rope_attn_factor(8.0, 16),
            },
        };
        // sqrt(1 + ln 8 / ln 16) = sqrt(1.75).
        assert!((long_rope_attn_factor(8.0, 16) - 1.75f32.sqrt()).abs() < 1e-6);
        assert_eq!(long_rope_attn_factor(1.0, 16), 1.0);
        let base = [1.0f32, 1.0 / 100.0];
        let short = spec.inv_freq(4, 16);
        let long = spec.inv_freq(4, 17);
        for i in 0..2 {
            assert!((short[i] - base[i] / [1.0, 2.0][i]).abs() < 1e-9);
            assert!((long[i] - base[i] / [4.0, 8.0][i]).abs() < 1e-9);
        }
        let (cos, sin) = spec.tables(16, 4);
        let m = 1.75f32.sqrt();
        // Position 3, pair 1: angle 3 · 0.01 / 2.
        let a = 3.0 * 0.01 / 2.0f32;
        assert!((cos[3 * 2 + 1] - a.cos() * m).abs() < 1e-6);
        assert!((sin[3 * 2 + 1] - a.sin() * m).abs() < 1e-6);
        // Partial rotary (2 of 6 dims): the scale is the rotating pair's;
        // the pairs passed through stay cos 1, sin 0 (Phi-4-mini).
        let (cos, sin) = spec.partial_tables(16, 6, 2);
        for p in 0..16 {
            assert!((cos[p * 3] - (p as f32).cos() * m).abs() < 1e-6);
            assert_eq!((cos[p * 3 + 1], sin[p * 3 + 1]), (1.0, 0.0));
            assert_eq!((cos[p * 3 + 2], sin[p * 3 + 2]), (1.0, 0.0));
        }
    }
}
