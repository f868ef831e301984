//! The sampling settings a model's authors recommend, read from the model
//! (GGUF `general.sampling.*` keys, or a Hugging Face folder's
//! `generation_config.json`): `ferrum run` and the server use them where
//! the command line or the request sets nothing, as Ollama and vLLM
//! (`--generation-config auto`, its default) do.

use std::path::Path;

use crate::gguf::GgufFile;

/// Recommended values; `None` where the model says nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RecommendedSampling {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
}

impl RecommendedSampling {
    /// llama.cpp's keys (`gguf-py`'s `Keys.General.SAMPLING_*`).
    pub fn from_gguf(g: &GgufFile) -> Self {
        let float = |k: &str| g.get(k).and_then(|v| v.as_f64()).map(|v| v as f32);
        Self {
            temperature: float("general.sampling.temp"),
            top_k: g
                .get("general.sampling.top_k")
                .and_then(|v| v.as_u64())
                .and_then(|v| usize::try_from(v).ok()),
            top_p: float("general.sampling.top_p"),
            min_p: float("general.sampling.min_p"),
            repeat_penalty: float("general.sampling.penalty_repeat"),
        }
    }

    /// The values a sampler takes (temperature in [0, 2], top-p in (0, 1],
    /// min-p in [0, 1], repetition penalty in [0.01, 10]); others are
    /// dropped with a warning, so that a file's metadata never makes every
    /// request fail.
    pub fn sanitized(self) -> Self {
        fn keep(v: Option<f32>, name: &str, ok: impl Fn(f32) -> bool) -> Option<f32> {
            match v {
                Some(x) if !(x.is_finite() && ok(x)) => {
                    tracing::warn!(
                        "the model recommends {name} {x}, which is out of range; ignored"
                    );
                    None
                }
                v => v,
            }
        }
        Self {
            temperature: keep(self.temperature, "temperature", |x| {
                (0.0..=2.0).contains(&x)
            }),
            top_k: self.top_k,
            top_p: keep(self.top_p, "top_p", |x| x > 0.0 && x <= 1.0),
            min_p: keep(self.min_p, "min_p", |x| (0.0..=1.0).contains(&x)),
            repeat_penalty: keep(self.repeat_penalty, "repetition_penalty", |x| {
                (0.01..=10.0).contains(&x)
            }),
        }
    }

    /// transformers' `generation_config.json`; `do_sample: false` means
    /// greedy. A missing or unreadable file recommends nothing.
    pub fn from_hf_dir(dir: &Path) -> Self {
        let Ok(text) = std::fs::read_to_string(dir.join("generation_config.json")) else {
            return Self::default();
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            tracing::warn!("generation_config.json is not JSON; its sampling settings are ignored");
            return Self::default();
        };
        let float = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
        let greedy = v.get("do_sample").and_then(|x| x.as_bool()) == Some(false);
        Self {
            temperature: if greedy {
                Some(0.0)
            } else {
                float("temperature")
            },
            top_k: v
                .get("top_k")
                .and_then(|x| x.as_u64())
                .and_then(|x| usize::try_from(x).ok()),
            top_p: float("top_p"),
            min_p: float("min_p"),
            repeat_penalty: float("repetition_penalty"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF holding only `general.architecture` and the given keys:
    /// `(key, type id, little-endian value bytes)`.
    fn gguf_with(keys: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((1 + keys.len() as u64).to_le_bytes());
        let mut kv = |key: &str, ty: u32, val: &[u8]| {
            b.extend((key.len() as u64).to_le_bytes());
            b.extend(key.as_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(val);
        };
        let mut arch = 5u64.to_le_bytes().to_vec();
        arch.extend(b"llama");
        kv("general.architecture", 8, &arch);
        for (k, ty, v) in keys {
            kv(k, *ty, v);
        }
        b
    }

    #[test]
    fn gguf_sampling_keys_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        // Types: 4 = u32, 6 = f32.
        let f = |x: f32| x.to_le_bytes().to_vec();
        std::fs::write(
            &path,
            gguf_with(&[
                ("general.sampling.temp", 6, f(0.6)),
                ("general.sampling.top_k", 4, 20u32.to_le_bytes().to_vec()),
                ("general.sampling.top_p", 6, f(0.95)),
                ("general.sampling.min_p", 6, f(0.0)),
                ("general.sampling.penalty_repeat", 6, f(1.05)),
            ]),
        )
        .unwrap();
        let g = GgufFile::open(&path).unwrap();
        let r = RecommendedSampling::from_gguf(&g);
        assert_eq!(
            r,
            RecommendedSampling {
                temperature: Some(0.6),
                top_k: Some(20),
                top_p: Some(0.95),
                // A stated zero is a choice, not an absence.
                min_p: Some(0.0),
                repeat_penalty: Some(1.05),
            }
        );
        std::fs::write(&path, gguf_with(&[])).unwrap();
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(
            RecommendedSampling::from_gguf(&g),
            RecommendedSampling::default()
        );
    }

    #[test]
    fn generation_config_is_read_and_do_sample_false_is_greedy() {
        let dir = tempfile::tempdir().unwrap();
        let write = |s: &str| std::fs::write(dir.path().join("generation_config.json"), s).unwrap();
        write(
            r#"{"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}"#,
        );
        let r = RecommendedSampling::from_hf_dir(dir.path());
        assert_eq!(
            r,
            RecommendedSampling {
                temperature: Some(0.7),
                top_k: Some(20),
                top_p: Some(0.8),
                min_p: None,
                repeat_penalty: Some(1.1),
            }
        );
        write(r#"{"do_sample": false, "temperature": 0.7}"#);
        assert_eq!(
            RecommendedSampling::from_hf_dir(dir.path()).temperature,
            Some(0.0)
        );
        write("not json");
        assert_eq!(
            RecommendedSampling::from_hf_dir(dir.path()),
            RecommendedSampling::default()
        );
        write(r#"{"temperature": 7.0, "top_p": 0.0, "min_p": 0.1}"#);
        let odd = RecommendedSampling::from_hf_dir(dir.path()).sanitized();
        assert_eq!(
            (odd.temperature, odd.top_p, odd.min_p),
            (None, None, Some(0.1))
        );
        std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
        assert_eq!(
            RecommendedSampling::from_hf_dir(dir.path()),
            RecommendedSampling::default()
        );
    }
}
