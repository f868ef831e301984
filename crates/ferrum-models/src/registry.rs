//! The architectures Ferrum loads, by the names GGUF files
//! (`general.architecture`) and Hugging Face folders (`model_type`) give
//! them, and the family code that runs each.
//!
//! A family of the Llama shape is declared in `llama/arch.rs` alone (its
//! names and traits). Another family: a module with its configuration,
//! weight roles and forward pass (implementing [`PagedLlm`]), a [`Family`]
//! variant with its names in [`OTHER_NAMES`], and its arms in [`load_gguf`]
//! / [`load_hf_dir`] (the compiler points at each). The engine, the server
//! and the command line need no change.

use std::path::Path;

use ferrum_formats::gguf::GgufFile;
use ferrum_formats::hf_config::read_model_type;
use ferrum_kernels::Backend;
use ferrum_types::{FerrumError, Result};

use crate::bert::BertModel;
use crate::encoder::Encoder;
use crate::llama::{Arch, LlamaModel};
use crate::llm::{KvPoolConfig, LoadProgress};
use crate::paged::PagedLlm;

/// The code that runs an architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Decoders of the Llama shape, the variant chosen by configuration.
    Llama(Arch),
    /// BERT encoders (embeddings; see `crate::bert`).
    Bert,
}

/// Names of the families outside the Llama shape (those are in
/// [`crate::llama::NAMES`]).
pub const OTHER_NAMES: &[(&str, Family)] = &[("bert", Family::Bert)];

/// Every architecture name Ferrum knows, GGUF's and Hugging Face's.
pub fn architectures() -> impl Iterator<Item = (&'static str, Family)> {
    crate::llama::NAMES
        .iter()
        .map(|&(n, a)| (n, Family::Llama(a)))
        .chain(OTHER_NAMES.iter().copied())
}

/// The family of architecture `name`; an error listing the known names.
pub fn family(name: &str) -> Result<Family> {
    architectures()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| f)
        .ok_or_else(|| {
            let known: Vec<&str> = architectures().map(|(n, _)| n).collect();
            FerrumError::unsupported(format!(
                "architecture '{name}' is not supported (supported: {})",
                known.join(", ")
            ))
        })
}

/// The family of the Hugging Face folder `dir` (from its `config.json`).
pub fn hf_family(dir: &Path) -> Result<Family> {
    family(&read_model_type(dir.join("config.json"))?)
}

fn not_a_decoder(name: &str) -> FerrumError {
    FerrumError::unsupported(format!(
        "architecture '{name}' is an encoder and is not supported for generation (it serves embeddings: ferrum embed, or /v1/embeddings)"
    ))
}

/// Loads the decoder in GGUF file `g` on backend `B`.
pub fn load_gguf<B: Backend>(
    g: &GgufFile,
    pool: &KvPoolConfig,
    progress: &LoadProgress<'_>,
) -> Result<Box<dyn PagedLlm>> {
    let name = g.architecture()?;
    match family(name).map_err(|e| g.error(e.to_string()))? {
        Family::Llama(_) => Ok(Box::new(LlamaModel::<B>::from_gguf_reporting(
            g, pool, progress,
        )?)),
        Family::Bert => Err(g.error(not_a_decoder(name).to_string())),
    }
}

/// Loads the decoder in Hugging Face folder `dir` on backend `B`.
pub fn load_hf_dir<B: Backend>(
    dir: &Path,
    pool: &KvPoolConfig,
    progress: &LoadProgress<'_>,
) -> Result<Box<dyn PagedLlm>> {
    let name = read_model_type(dir.join("config.json"))?;
    match family(&name)? {
        Family::Llama(_) => Ok(Box::new(LlamaModel::<B>::from_hf_dir_reporting(
            dir, pool, progress,
        )?)),
        Family::Bert => Err(not_a_decoder(&name)),
    }
}

/// Loads the encoder in Hugging Face folder `dir` on backend `B`, for
/// embeddings.
pub fn load_encoder<B: Backend>(dir: &Path) -> Result<Box<dyn Encoder>> {
    let name = read_model_type(dir.join("config.json"))?;
    match family(&name)? {
        Family::Bert => Ok(Box::new(BertModel::<B>::from_hf_dir(dir)?)),
        Family::Llama(_) => Err(FerrumError::unsupported(format!(
            "architecture '{name}' is a decoder: it generates text (ferrum run, ferrum serve) and does not serve embeddings here; embedding models are encoders such as BERT (--model minilm)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_resolves_and_unknown_names_list_the_known_ones() {
        for (name, fam) in architectures() {
            assert_eq!(family(name).ok(), Some(fam), "{name}");
        }
        assert_eq!(Arch::from_name("gemma3_text").ok(), Some(Arch::Gemma3));
        assert!(Arch::from_name("bert").is_err());
        let err = family("mamba").unwrap_err().to_string();
        assert!(err.contains("'mamba' is not supported"), "{err}");
        assert!(err.contains("qwen3") && err.contains("bert"), "{err}");
        assert_eq!(family("bert").ok(), Some(Family::Bert));
        assert!(not_a_decoder("bert").to_string().contains("encoder"));
    }
}
