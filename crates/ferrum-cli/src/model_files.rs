//! What a `--model` path points at: a GGUF file or a Hugging Face folder.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use ferrum_formats::gguf::GgufFile;
use ferrum_tokenizer::Tokenizer;

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

    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Ok(match self {
            Self::Gguf(g) => Tokenizer::from_gguf(g)?,
            Self::HfDir(d) => Tokenizer::from_hf_dir(d)?,
        })
    }
}
