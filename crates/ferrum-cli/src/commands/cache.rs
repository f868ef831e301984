//! `ferrum list` and `ferrum rm`: the models this machine has fetched.
//!
//! Two places hold them: Ferrum's model cache (`FERRUM_MODELS`), where
//! aliases live (as files, folders, or links into the Hub cache), and the
//! Hugging Face Hub cache (`HF_HOME/hub`), where `owner/repo:file` pulls of
//! GGUF files stay. An alias fetched from the Hub is both a link in the first
//! and a file in the second; it is listed once, under its alias.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_formats::gguf::GgufFile;
use ferrum_formats::model_cache_dir as cache_dir;
use ferrum_formats::safetensors::SafeTensors;
use serde_json::json;

use super::human_bytes;
use crate::pull::RECIPES;

#[derive(Args)]
pub struct ListArgs {
    /// One JSON object per model instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RmArgs {
    /// What `ferrum list` names: an alias, a cache entry, or owner/repo:file.
    model: String,
}

/// One model on disk.
struct Entry {
    /// How `ferrum list` names it, and what `--model` and `ferrum rm` take.
    name: String,
    /// Where it is (a file, a folder, or a link to either).
    path: PathBuf,
    format: &'static str,
    quantization: String,
    bytes: u64,
}

pub fn list(args: ListArgs) -> Result<()> {
    let entries = entries();
    if args.json {
        for e in &entries {
            let line = json!({"name": e.name, "format": e.format, "quantization": e.quantization,
                              "bytes": e.bytes, "path": e.path});
            println!("{line}");
        }
        return Ok(());
    }
    if entries.is_empty() {
        eprintln!(
            "no models yet in {}; `ferrum pull smollm2` (or any `--model ALIAS`) fetches one",
            cache_dir().display()
        );
        return Ok(());
    }
    let width = entries
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    println!(
        "{:<width$}  {:<11}  {:<12}  {:>9}",
        "NAME", "FORMAT", "QUANT", "SIZE"
    );
    for e in &entries {
        println!(
            "{:<width$}  {:<11}  {:<12}  {:>9}",
            e.name,
            e.format,
            e.quantization,
            human_bytes(e.bytes)
        );
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> Result<()> {
    let entries = entries();
    let Some(e) = entries.iter().find(|e| e.name == args.model) else {
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        bail!(
            "{} is not in the model cache (it has: {}); `ferrum list` shows what is there",
            args.model,
            if names.is_empty() {
                "nothing".to_string()
            } else {
                names.join(", ")
            }
        );
    };
    remove(&e.path).with_context(|| format!("cannot remove {}", e.path.display()))?;
    println!("removed {} ({})", e.name, human_bytes(e.bytes));
    Ok(())
}

/// Every model in both caches, Ferrum's first, each by name.
fn entries() -> Vec<Entry> {
    let mut out = ferrum_entries(&cache_dir());
    let seen: HashSet<PathBuf> = out.iter().flat_map(|e| real_files(&e.path)).collect();
    out.extend(
        hub_entries(hf_hub::Cache::from_env().path())
            .into_iter()
            .filter(|e| real_files(&e.path).iter().all(|f| !seen.contains(f))),
    );
    out
}

fn sorted_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Models in Ferrum's cache: `.gguf` files and folders with `config.json`
/// (anything else there, such as test vectors, is not a model).
fn ferrum_entries(dir: &Path) -> Vec<Entry> {
    sorted_dir(dir)
        .into_iter()
        .filter_map(|path| {
            let file = path.file_name()?.to_str()?.to_string();
            let name = RECIPES
                .iter()
                .find(|r| r.cache_name == file)
                .map_or(file, |r| r.alias.to_string());
            describe(name, path)
        })
        .collect()
}

/// GGUF files in the Hub cache, as `owner/repo:file`.
fn hub_entries(hub: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    for repo_dir in sorted_dir(hub) {
        let Some(repo) = repo_dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("models--"))
            .map(|n| n.replacen("--", "/", 1))
        else {
            continue;
        };
        for snapshot in sorted_dir(&repo_dir.join("snapshots")) {
            for path in sorted_dir(&snapshot) {
                let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                if file.ends_with(".gguf") && path.exists() {
                    let name = format!("{repo}:{file}");
                    out.extend(describe(name, path.clone()));
                }
            }
        }
    }
    out
}

/// What a path holds, or `None` when it is not a model.
fn describe(name: String, path: PathBuf) -> Option<Entry> {
    let bytes = real_files(&path)
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let (format, quantization) = if path.is_dir() {
        ("safetensors", hf_quantization(&path.join("config.json"))?)
    } else if path.extension().is_some_and(|e| e == "gguf") {
        let q = GgufFile::open(&path)
            .map(|g| gguf_quantization(&g))
            .unwrap_or_else(|_| "unreadable".into());
        ("gguf", q)
    } else {
        return None;
    };
    Some(Entry { name, path, format, quantization, bytes })
}

/// The files whose bytes a path holds, links resolved: the file itself, or
/// each file in a folder.
fn real_files(path: &Path) -> Vec<PathBuf> {
    let files = if path.is_dir() {
        sorted_dir(path)
    } else {
        vec![path.to_path_buf()]
    };
    files
        .into_iter()
        .filter_map(|f| std::fs::canonicalize(f).ok())
        .filter(|f| f.is_file())
        .collect()
}

/// A folder's weight type from `config.json`: its `quantization_config`
/// (GPTQ, AWQ, FP8 ...), else its `torch_dtype`, else the safetensors type
/// holding most parameters. `None` without a config.
fn hf_quantization(config: &Path) -> Option<String> {
    let text = std::fs::read_to_string(config).ok()?;
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Some("unreadable".into());
    };
    if let Some(q) = v.get("quantization_config") {
        let method = q
            .get("quant_method")
            .and_then(|m| m.as_str())
            .unwrap_or("quantized");
        return Some(match q.get("bits").and_then(|b| b.as_u64()) {
            Some(bits) => format!("{method} {bits}-bit"),
            None => method.to_string(),
        });
    }
    let dtype = v
        .get("torch_dtype")
        .or_else(|| v.get("dtype"))
        .and_then(|d| d.as_str())
        .map(str::to_string);
    Some(dtype.unwrap_or_else(|| {
        config
            .parent()
            .and_then(|dir| SafeTensors::open_dir(dir).ok())
            .and_then(|st| {
                let sizes = st
                    .names()
                    .into_iter()
                    .filter_map(|n| st.get(n))
                    .map(|t| (format!("{:?}", t.dtype).to_lowercase(), t.numel() as u64));
                dominant(sizes)
            })
            .unwrap_or_else(|| "unknown".into())
    }))
}

/// llama.cpp's `general.file_type` names (`LLAMA_FTYPE_MOSTLY_*`); files
/// without it are named for the type holding most of their bytes.
fn gguf_quantization(g: &GgufFile) -> String {
    const NAMES: &[(u64, &str)] = &[
        (0, "F32"),
        (1, "F16"),
        (2, "Q4_0"),
        (3, "Q4_1"),
        (7, "Q8_0"),
        (8, "Q5_0"),
        (9, "Q5_1"),
        (10, "Q2_K"),
        (11, "Q3_K_S"),
        (12, "Q3_K_M"),
        (13, "Q3_K_L"),
        (14, "Q4_K_S"),
        (15, "Q4_K_M"),
        (16, "Q5_K_S"),
        (17, "Q5_K_M"),
        (18, "Q6_K"),
        (19, "IQ2_XXS"),
        (20, "IQ2_XS"),
        (21, "Q2_K_S"),
        (22, "IQ3_XS"),
        (23, "IQ3_XXS"),
        (24, "IQ1_S"),
        (25, "IQ4_NL"),
        (26, "IQ3_S"),
        (27, "IQ3_M"),
        (28, "IQ2_S"),
        (29, "IQ2_M"),
        (30, "IQ4_XS"),
        (31, "IQ1_M"),
        (32, "BF16"),
        (36, "TQ1_0"),
        (37, "TQ2_0"),
    ];
    let named = g
        .get("general.file_type")
        .and_then(|v| v.as_u64())
        .and_then(|t| NAMES.iter().find(|(k, _)| *k == t))
        .map(|(_, n)| n.to_string());
    named.unwrap_or_else(|| {
        let sizes = g
            .tensors()
            .iter()
            .map(|t| (t.ty.to_string(), g.tensor_range(t).len() as u64));
        dominant(sizes).unwrap_or_else(|| "none".into())
    })
}

/// The type with the largest total among `(type, size)` pairs.
fn dominant(sizes: impl Iterator<Item = (String, u64)>) -> Option<String> {
    let mut totals: HashMap<String, u64> = HashMap::new();
    for (ty, n) in sizes {
        *totals.entry(ty).or_default() += n;
    }
    totals.into_iter().max_by_key(|&(_, n)| n).map(|(ty, _)| ty)
}

/// Removes a cache entry and the bytes it points at: a link into the Hub
/// cache takes its target (the Hub's blob) with it, so space is freed, not
/// just a name. A later pull downloads again.
fn remove(path: &Path) -> std::io::Result<()> {
    let files = real_files(path);
    for f in &files {
        std::fs::remove_file(f)?;
    }
    // A Hub repo folder with no blobs left holds only names (refs, empty
    // snapshot folders, hf-hub's `.lock` files): it goes too, so the cache
    // keeps no empty shells.
    for repo in files.iter().filter_map(|f| hub_repo_of(f)) {
        let blobs_left = std::fs::read_dir(repo.join("blobs")).map_or(0, |d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
                .count()
        });
        if blobs_left == 0 {
            let _ = std::fs::remove_dir_all(repo);
        }
    }
    // What is left of the name: a link, or a folder (of links).
    let left = if path.is_symlink() {
        std::fs::remove_file(path)
    } else if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        Ok(())
    };
    match left {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// The Hub repo folder (`models--owner--name`) a file lies in, if any.
fn hub_repo_of(file: &Path) -> Option<&Path> {
    file.ancestors().find(|a| {
        a.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("models--"))
    })
}
