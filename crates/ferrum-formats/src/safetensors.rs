//! Hugging Face safetensors checkpoints, single-file or sharded, memory-mapped.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ferrum_types::{FerrumError, Result};
use half::{bf16, f16};
pub use safetensors::Dtype;

use crate::file_bytes::FileBytes;

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// A borrowed tensor: its type, shape and raw little-endian bytes.
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Every tensor of a checkpoint, across its shards.
pub struct SafeTensors {
    files: Vec<(PathBuf, Arc<FileBytes>)>,
    entries: HashMap<String, Entry>,
    /// Names fetched so far: a loader checks that it used every tensor
    /// ([`SafeTensors::unread`]).
    read: Mutex<HashSet<String>>,
}

impl SafeTensors {
    /// Opens `dir/model.safetensors`, or every shard named by
    /// `dir/model.safetensors.index.json`.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| FerrumError::io(&index, e))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| FerrumError::bad_file(&index, format!("invalid JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| FerrumError::bad_file(&index, "no weight_map object"))?;
            let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            shards.sort_unstable();
            shards.dedup();
            if shards.iter().any(|s| s.contains('/') || s.contains("..")) {
                return Err(FerrumError::bad_file(
                    &index,
                    "shard names must be plain file names",
                ));
            }
            let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
            return Self::open_files(&paths);
        }
        let single = dir.join("model.safetensors");
        if single.exists() {
            return Self::open_files(&[single]);
        }
        Err(FerrumError::bad_file(
            dir,
            "no model.safetensors or model.safetensors.index.json in this folder",
        ))
    }

    /// Opens the given files as one checkpoint (tensor names must be unique).
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut entries = HashMap::new();
        for (fi, path) in paths.iter().enumerate() {
            let file = File::open(path).map_err(|e| FerrumError::io(path, e))?;
            let map = FileBytes::open(&file, path)?;
            // Validates the header and that every tensor lies inside the file.
            let (header_len, meta) =
                safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
                    FerrumError::bad_file(path, format!("not a valid safetensors file: {e}"))
                })?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                if entries.contains_key(&name) {
                    return Err(FerrumError::bad_file(
                        path,
                        format!("tensor {name} appears in two shards"),
                    ));
                }
                entries.insert(
                    name,
                    Entry {
                        file: fi,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: base + s,
                        end: base + e,
                    },
                );
            }
            files.push((path.clone(), Arc::new(map)));
        }
        Ok(Self {
            files,
            entries,
            read: Mutex::new(HashSet::new()),
        })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Names no [`SafeTensors::get`] (or read through it) has fetched,
    /// sorted: what a loader left unused.
    pub fn unread(&self) -> Vec<&str> {
        let read = match self.read.lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        let mut v: Vec<&str> = self
            .entries
            .keys()
            .filter(|k| !read.contains(*k))
            .map(String::as_str)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let (key, e) = self.entries.get_key_value(name)?;
        match self.read.lock() {
            Ok(mut r) => r.insert(key.clone()),
            Err(p) => p.into_inner().insert(key.clone()),
        };
        Some(TensorView {
            name: key,
            dtype: e.dtype,
            shape: &e.shape,
            data: &self.files[e.file].1[e.start..e.end],
        })
    }

    fn require(&self, name: &str) -> Result<TensorView<'_>> {
        self.get(name).ok_or_else(|| {
            let path = self.files.first().map(|f| f.0.clone()).unwrap_or_default();
            FerrumError::bad_file(
                path,
                format!("tensor {name} is missing from the checkpoint"),
            )
        })
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.entries
            .get(name)
            .map(|e| self.files[e.file].0.clone())
            .unwrap_or_default()
    }

    /// The tensor as f32 values (from F32, F16 or BF16) and its shape.
    pub fn to_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let t = self.require(name)?;
        let d = t.data;
        let values = match t.dtype {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(FerrumError::bad_file(
                    self.path_of(name),
                    format!("tensor {name} is {other:?}; expected F32, F16 or BF16"),
                ))
            }
        };
        Ok((values, t.shape.to_vec()))
    }

    /// The tensor as i32 values (from I32, or I64 that fits) and its shape;
    /// the packed words of GPTQ/AWQ checkpoints.
    pub fn to_i32(&self, name: &str) -> Result<(Vec<i32>, Vec<usize>)> {
        let t = self.require(name)?;
        let d = t.data;
        let values = match t.dtype {
            Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| {
                    let v = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                    i32::try_from(v).map_err(|_| {
                        FerrumError::bad_file(
                            self.path_of(name),
                            format!("tensor {name} value {v} does not fit in i32"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            other => {
                return Err(FerrumError::bad_file(
                    self.path_of(name),
                    format!("tensor {name} is {other:?}; expected I32 or I64"),
                ))
            }
        };
        Ok((values, t.shape.to_vec()))
    }
}
