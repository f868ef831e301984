//! Finding and opening models: `--model` takes a path or an alias.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ferrum_engine::Speculation;
use ferrum_formats::gguf::GgufFile;
use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::safetensors::SafeTensors;
use ferrum_formats::sampling::RecommendedSampling;
use ferrum_models::{registry, PagedLlm};
use ferrum_models::{KvDtype, KvPoolConfig};
use ferrum_server::ModelCard;
use ferrum_tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};

use crate::pull::{pull, recipe, RECIPES};

/// The model `run`, `serve` and `bench` use when none is given: the
/// smallest of the aliases that answers simple questions right (capitals,
/// small sums, opposites: `cli.rs` asks it ten). SmolLM2-135M, five times
/// faster, got all three of a newcomer's first questions wrong; it stays
/// the tests' quick model.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder:0.5b";

/// A path as given; an alias or `owner/repo:file`, fetched into the cache
/// on first use.
pub fn resolve(model: &str) -> Result<PathBuf> {
    let p = Path::new(model);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    if recipe(model).is_some() || model.contains('/') && model.contains(':') {
        return pull(model);
    }
    let names: Vec<&str> = RECIPES.iter().map(|r| r.alias).collect();
    if let Some(near) = nearest(model, &names) {
        bail!("model not found: {model}; did you mean {near}?");
    }
    bail!(
        "model not found: {model} (give a .gguf file, a Hugging Face folder, owner/repo:file, or one of: {})",
        names.join(", ")
    )
}

/// The alias a mistyped name was most likely meant to be: the closest by
/// edit distance (case aside: aliases are lower case), if within a third of
/// its length.
fn nearest<'a>(model: &str, names: &[&'a str]) -> Option<&'a str> {
    let model = model.to_lowercase();
    names
        .iter()
        .map(|n| (edit_distance(&model, n), *n))
        .filter(|&(d, n)| d * 3 <= n.len().max(3))
        .min()
        .map(|(_, n)| n)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The model a command runs: positional (`ferrum run qwen2.5-coder:0.5b`,
/// as `ollama run` takes it) or `--model`/`-m` (as llama.cpp's tools take
/// it).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArg {
    /// A .gguf file, a Hugging Face folder, owner/repo:file, or an alias
    /// (qwen2.5-coder:0.5b, smollm2, ...). [default: qwen2.5-coder:0.5b]
    #[arg(value_name = "MODEL")]
    given: Option<String>,
    /// The same as MODEL.
    #[arg(
        long = "model",
        short = 'm',
        value_name = "MODEL",
        conflicts_with = "given"
    )]
    flag: Option<String>,
}

impl ModelArg {
    pub fn name(&self) -> &str {
        self.flag
            .as_deref()
            .or(self.given.as_deref())
            .unwrap_or(DEFAULT_MODEL)
    }
}

/// Where a model runs: `cpu` (default), `cuda` or `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device {s:?} (use cpu, cuda or cuda:N)")),
        }
    }
}

impl Device {
    /// Opens the GPU when one is asked for; a clear error when this build
    /// has no CUDA or the machine no GPU.
    pub fn init(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => Ok(ferrum_kernels::CudaBackend::init(n)?),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => bail!(
                "this ferrum was built without CUDA; rebuild with `cargo build --release --features cuda`"
            ),
        }
    }
}

/// Runs `$body` with `$B` the backend type `device` names.
macro_rules! on_device {
    ($device:expr, |$B:ident| $body:expr) => {{
        match $device {
            Device::Cpu => {
                type $B = ferrum_kernels::CpuBackend;
                $body
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => {
                type $B = ferrum_kernels::CudaBackend;
                $body
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => {
                type $B = ferrum_kernels::CpuBackend;
                $body
            }
        }
    }};
}
pub(crate) use on_device;

pub enum ModelFiles {
    Gguf(GgufFile),
    HfDir(PathBuf),
}

impl ModelFiles {
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            if !path.join("config.json").exists() {
                bail!(
                    "{}: a model folder needs config.json (plus safetensors and tokenizer.json)",
                    path.display()
                );
            }
            return Ok(Self::HfDir(path.to_path_buf()));
        }
        if !path.exists() {
            bail!(
                "model not found: {} (give a .gguf file or a Hugging Face model folder)",
                path.display()
            );
        }
        Ok(Self::Gguf(GgufFile::open(path)?))
    }

    /// The sampling settings the model recommends, those a sampler takes
    /// (see [`ferrum_formats::sampling`]).
    pub fn recommended_sampling(&self) -> RecommendedSampling {
        match self {
            Self::Gguf(g) => RecommendedSampling::from_gguf(g),
            Self::HfDir(d) => RecommendedSampling::from_hf_dir(d),
        }
        .sanitized()
    }

    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Ok(match self {
            Self::Gguf(g) => Tokenizer::from_gguf(g)?,
            Self::HfDir(d) => Tokenizer::from_hf_dir(d)?,
        })
    }

    /// The tokenizer, with the chat template in `template` (a Jinja file)
    /// instead of the model's when one is given.
    pub fn tokenizer_with(&self, template: Option<&Path>) -> Result<Tokenizer> {
        let tok = self.tokenizer()?;
        let Some(path) = template else {
            return Ok(tok);
        };
        let src = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the chat template {}", path.display()))?;
        Ok(tok.with_chat_template(src))
    }

    /// Loads the weights onto `device` with a KV pool sized by `pool`, with
    /// a progress bar on stderr (layer by layer; gone once loaded).
    pub fn load_llm(&self, device: Device, pool: &KvPoolConfig) -> Result<Box<dyn PagedLlm>> {
        device.init()?;
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("loading model [{bar:30}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let progress = |done: usize, total: usize| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        };
        let model: Result<Box<dyn PagedLlm>> = on_device!(device, |B| match self {
            Self::Gguf(g) => Ok(registry::load_gguf::<B>(g, pool, &progress)?),
            Self::HfDir(d) => Ok(registry::load_hf_dir::<B>(d, pool, &progress)?),
        });
        bar.finish_and_clear();
        // The loader's transient copies.
        ferrum_types::release_freed_memory();
        model
    }
}

/// What the model at `path` is (format, architecture, parameters, the
/// weights' main type, size), from its headers: the Ollama endpoints'
/// `details`. Best effort: what cannot be read stays empty.
pub fn model_card(path: &Path) -> ModelCard {
    let mut card = ModelCard {
        modified: std::fs::metadata(path).and_then(|m| m.modified()).ok(),
        ..ModelCard::default()
    };
    // Bytes by type name; the largest names the quantization.
    let mut bytes: std::collections::BTreeMap<String, u64> = Default::default();
    if path.is_dir() {
        card.format = "safetensors".into();
        if let Ok(cfg) = HfConfig::load(path.join("config.json")) {
            card.family = cfg.model_type;
        }
        if let Ok(st) = SafeTensors::open_dir(path) {
            for name in st.names() {
                if let Some(t) = st.get(name) {
                    card.parameters += t.numel() as u64;
                    *bytes.entry(format!("{:?}", t.dtype)).or_default() += t.data.len() as u64;
                }
            }
        }
        card.size = std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
    } else if let Ok(g) = GgufFile::open(path) {
        card.format = "gguf".into();
        card.family = g.architecture().unwrap_or("").to_string();
        for t in g.tensors() {
            card.parameters += t.numel();
            *bytes.entry(t.ty.to_string()).or_default() += g.tensor_range(t).len() as u64;
        }
        card.size = std::fs::metadata(path).map_or(0, |m| m.len());
    }
    card.quantization = bytes
        .into_iter()
        .max_by_key(|b| b.1)
        .map(|b| b.0.to_uppercase())
        .unwrap_or_default();
    card
}

/// KV-cache options shared by the commands that generate.
#[derive(clap::Args, Clone, Debug)]
pub struct KvArgs {
    /// Context size: the most tokens one conversation or request holds,
    /// prompt and answer together (default: FERRUM_KV_CAPACITY, else 4096;
    /// never more than the model was trained for).
    #[arg(long, short = 'c', value_name = "N", value_parser = crate::commands::at_least_one)]
    pub ctx: Option<usize>,
    /// Positions in the shared paged KV pool, all sequences together
    /// (default: FERRUM_KV_CACHE_TOKENS, else 4 x the per-sequence capacity).
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Positions per KV block (default: 16 on the CPU; one block per
    /// sequence on CUDA until its paged kernels land).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Do not keep and share KV blocks of earlier prompts.
    #[arg(long)]
    pub no_prefix_caching: bool,
    #[command(flatten)]
    pub dtype: KvDtypeArg,
}

impl KvArgs {
    /// The KV pool these flags ask for on `device`.
    pub fn pool(&self, device: Device) -> Result<KvPoolConfig> {
        Ok(KvPoolConfig {
            tokens: self.kv_cache_tokens.unwrap_or(0),
            sequences: KvPoolConfig::default().sequences,
            block_size: self.block_size.unwrap_or(0),
            prefix_caching: !self.no_prefix_caching,
            dtype: Some(self.dtype.resolve(device)?),
            context: self.ctx,
        })
    }
}

/// The KV cache's element type, for every command that loads a model to
/// generate or score with.
#[derive(clap::Args, Clone, Debug)]
pub struct KvDtypeArg {
    /// What the KV cache stores: f16 (half the memory and the bytes read
    /// per token at long context) or f32. Default: the device's (f16 on the
    /// CPU; f32 on CUDA, whose kernels read f32 K/V only, so f16 there is
    /// an error).
    #[arg(long, env = "FERRUM_KV_CACHE_DTYPE")]
    pub kv_cache_dtype: Option<KvDtype>,
}

impl KvDtypeArg {
    /// The dtype for `device`: as asked where its backend reads it (an
    /// error otherwise), else the backend's default.
    pub fn resolve(&self, device: Device) -> Result<KvDtype> {
        let caps = on_device!(device, |B| <B as ferrum_kernels::Backend>::capabilities());
        caps.kv_dtype(self.kv_cache_dtype)
            .map_err(|e| anyhow::anyhow!("--kv-cache-dtype: {e}"))
    }

    /// The default pool with this dtype on `device`.
    pub fn pool(&self, device: Device) -> Result<KvPoolConfig> {
        Ok(KvPoolConfig {
            dtype: Some(self.resolve(device)?),
            ..KvPoolConfig::default()
        })
    }
}

/// Speculative decoding options shared by `run` and `serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding with this draft model (smaller, same tokenizer),
    /// run greedily; output is distributed exactly as without it.
    #[arg(long, value_name = "MODEL")]
    pub spec_draft: Option<String>,
    /// Speculative decoding by prompt lookup: drafts are the tokens that
    /// followed the latest earlier occurrence of the last 1-3 tokens.
    #[arg(long, conflicts_with = "spec_draft")]
    pub spec_ngram: bool,
    /// Draft tokens verified per step.
    #[arg(long, default_value_t = 4)]
    pub spec_tokens: usize,
}

impl SpecArgs {
    /// The engine's speculation settings (loads the draft model, its KV
    /// pool configured like the target's: `pool`).
    pub fn load(&self, device: Device, pool: &KvPoolConfig) -> Result<Option<Speculation>> {
        let k = self.spec_tokens.max(1);
        if self.spec_ngram {
            return Ok(Some(Speculation::ngram(3, k)));
        }
        let Some(draft) = &self.spec_draft else {
            return Ok(None);
        };
        let files = ModelFiles::open(&resolve(draft)?)?;
        let model = files.load_llm(device, pool)?;
        Ok(Some(Speculation::draft_model(model, k)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_miss_aliases_are_suggested() {
        let names = [
            "smollm2",
            "qwen2.5-coder:0.5b",
            "qwen2.5-coder:1.5b",
            "gemma3:270m",
            "minilm",
        ];
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(nearest("smolm2", &names), Some("smollm2"));
        assert_eq!(nearest("SmolLM2", &names), Some("smollm2"), "case aside");
        assert_eq!(
            nearest("qwen2.5-coder:0.5", &names),
            Some("qwen2.5-coder:0.5b")
        );
        assert_eq!(
            nearest("gemma3", &names),
            None,
            "five edits from gemma3:270m"
        );
        assert_eq!(nearest("llama", &names), None);
    }

    #[test]
    fn kv_dtype_defaults_to_the_devices_and_names_the_flag_when_refused() {
        let arg = |d| KvDtypeArg { kv_cache_dtype: d };
        assert_eq!(arg(None).resolve(Device::Cpu).ok(), Some(KvDtype::F16));
        assert_eq!(
            arg(Some(KvDtype::F32)).resolve(Device::Cpu).ok(),
            Some(KvDtype::F32)
        );
        #[cfg(feature = "cuda")]
        {
            let cuda = Device::Cuda(0);
            assert_eq!(arg(None).resolve(cuda).ok(), Some(KvDtype::F32));
            let err = arg(Some(KvDtype::F16)).resolve(cuda).unwrap_err();
            assert!(err.to_string().contains("--kv-cache-dtype"), "{err}");
        }
    }
}
