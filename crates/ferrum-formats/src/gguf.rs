//! GGUF (versions 2 and 3): memory-mapped, zero-copy tensor data.
//!
//! Layout: magic `GGUF`, version, tensor count, metadata count, the metadata
//! key/value pairs, the tensor infos, padding to `general.alignment`
//! (default 32), then the tensor data. All integers are little-endian.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrum_types::{FerrumError, GgmlType, Result};

use crate::file_bytes::FileBytes;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// One metadata value. Arrays may nest.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short type name for messages (`"u32"`, `"array"` ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` varies fastest. A linear weight
    /// `[n_out, k_in]` is stored as `dims = [k_in, n_out]`.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Byte length of the data.
    pub size: u64,
}

impl TensorInfo {
    /// Number of values.
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row-major shape, outermost first (the reverse of `dims`).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed header: metadata in file order and the tensor directory.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

/// A GGUF file opened for reading, its bytes memory-mapped (or read into
/// memory, see [`crate::file_bytes`]).
pub struct GgufFile {
    path: PathBuf,
    map: Arc<FileBytes>,
    header: GgufHeader,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens, maps and validates `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| FerrumError::io(&path, e))?;
        let meta = file.metadata().map_err(|e| FerrumError::io(&path, e))?;
        if !meta.is_file() {
            return Err(FerrumError::bad_file(&path, "not a regular file"));
        }
        let map = FileBytes::open(&file, &path)?;
        let header = parse_header(&map).map_err(|msg| FerrumError::bad_file(&path, msg))?;
        let meta_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            path,
            map: Arc::new(map),
            header,
            meta_index,
            tensor_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// Metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index
            .get(key)
            .map(|&i| &self.header.metadata[i].1)
    }

    /// An error naming this file, for callers that find a problem in it.
    pub fn error(&self, msg: impl Into<String>) -> FerrumError {
        FerrumError::bad_file(&self.path, msg)
    }

    /// Required string metadata.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| {
            self.error(format!(
                "metadata {key} is {} , expected a string",
                v.type_name()
            ))
        })
    }

    /// Required non-negative integer metadata.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| {
            self.error(format!(
                "metadata {key} is {}, expected a non-negative integer",
                v.type_name()
            ))
        })
    }

    /// Required numeric metadata as f64.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| {
            self.error(format!(
                "metadata {key} is {}, expected a number",
                v.type_name()
            ))
        })
    }

    fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key)
            .ok_or_else(|| self.error(format!("metadata key {key} is missing")))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The bytes of `t` (zero-copy; bounds were validated at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.map[self.tensor_range(t)]
    }

    /// Where `t`'s data lies in [`GgufFile::mapping`].
    pub fn tensor_range(&self, t: &TensorInfo) -> std::ops::Range<usize> {
        let start = (self.header.data_offset + t.offset) as usize;
        start..start + t.size as usize
    }

    /// The mapping itself, for callers that keep tensor bytes alive without
    /// copying (quantized weights).
    pub fn mapping(&self) -> Arc<FileBytes> {
        Arc::clone(&self.map)
    }

    /// Drops the mapped pages from this process's resident set (they come
    /// back from the page cache when read again): after a load has copied
    /// the weights out, the only later reads are a few embedding rows, and
    /// the pages the copy touched would otherwise count twice. Advisory: an
    /// error changes nothing but the resident set.
    pub fn release_resident_pages(&self) -> std::io::Result<()> {
        match &*self.map {
            #[cfg(unix)]
            // SAFETY: the mapping is shared and read-only, so MADV_DONTNEED
            // discards no data: later reads see the file's bytes again.
            FileBytes::Mapped(m) => unsafe {
                m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
            },
            _ => Ok(()),
        }
    }
}

/// A bounds-checked little-endian reader over the header bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

type ParseResult<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> ParseResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(format!(
                "file ends inside {what} (needs {n} bytes at offset {}, {} left): truncated or not a GGUF file",
                self.pos,
                self.remaining()
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> ParseResult<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> ParseResult<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> ParseResult<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must describe items of at least `min_item` bytes each in
    /// what is left of the file; checked before anything is allocated.
    fn count(&mut self, what: &str, min_item: usize) -> ParseResult<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(min_item) <= self.remaining());
        fits.ok_or_else(|| {
            format!(
                "{what} is {n}, more than the {} bytes left in the file could hold",
                self.remaining()
            )
        })
    }

    fn string(&mut self, what: &str) -> ParseResult<String> {
        let len = self.count(&format!("length of {what}"), 1)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not valid UTF-8"))
    }
}

/// Smallest encoded size of a value of GGUF type `t` (for array counts).
fn min_value_size(t: u32) -> usize {
    match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        _ => 8,
    }
}

/// Arrays nest at most this deep; deeper is malicious, not a model.
const MAX_NESTING: u32 = 8;

fn read_value(c: &mut Cursor, t: u32, key: &str, depth: u32) -> ParseResult<MetaValue> {
    let what = format!("value of {key}");
    Ok(match t {
        0 => MetaValue::U8(c.array::<1>(&what)?[0]),
        1 => MetaValue::I8(c.array::<1>(&what)?[0] as i8),
        2 => MetaValue::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => MetaValue::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => MetaValue::U32(c.u32(&what)?),
        5 => MetaValue::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => MetaValue::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => match c.array::<1>(&what)?[0] {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            b => return Err(format!("{what} is a bool with byte {b}")),
        },
        8 => MetaValue::String(c.string(&what)?),
        9 => {
            if depth >= MAX_NESTING {
                return Err(format!("{what} nests arrays deeper than {MAX_NESTING}"));
            }
            let et = c.u32(&format!("element type of {key}"))?;
            let n = c.count(&format!("length of array {key}"), min_value_size(et))?;
            // `n` is bounded by the bytes left, but a MetaValue is larger
            // than its encoding: reserve modestly and let real data grow it.
            let mut items = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                items.push(read_value(c, et, key, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(c.u64(&what)?),
        11 => MetaValue::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => MetaValue::F64(f64::from_le_bytes(c.array(&what)?)),
        other => return Err(format!("{key} has unknown metadata type {other}")),
    })
}

/// Parses and validates a whole GGUF image (header plus data extents).
/// Errors are messages without the file name; [`GgufFile::open`] adds it.
pub fn parse_header(buf: &[u8]) -> ParseResult<GgufHeader> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c
        .take(4, "the magic number")
        .map_err(|_| "file is too short to be GGUF".to_string())?;
    if magic != MAGIC {
        return Err(format!(
            "not a GGUF file (magic bytes {magic:02x?}, expected \"GGUF\")"
        ));
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "unsupported GGUF version {version} (Ferrum reads versions 2 and 3)"
        ));
    }
    // A tensor info takes at least 8 (name length) + 4 + 4 + 8 bytes.
    let n_tensors = c.count("tensor count", 24)?;
    // A key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
    let n_meta = c.count("metadata count", 13)?;

    let mut metadata = Vec::with_capacity(n_meta);
    for i in 0..n_meta {
        let key = c.string(&format!("metadata key #{i}"))?;
        let t = c.u32(&format!("type of {key}"))?;
        let v = read_value(&mut c, t, &key, 0)?;
        metadata.push((key, v));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return Err(format!("general.alignment {v:?} is not a power of two")),
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&format!("dimension count of {name}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&format!("dimensions of {name}"))?);
        }
        let tid = c.u32(&format!("type of {name}"))?;
        let ty = GgmlType::from_id(tid)
            .ok_or_else(|| format!("tensor {name} has unknown ggml type {tid}"))?;
        let offset = c.u64(&format!("offset of {name}"))?;
        let numel = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("tensor {name} dimensions {dims:?} overflow"))?;
        let size = ty.bytes_for(numel).ok_or_else(|| {
            format!(
                "tensor {name}: {numel} values are not whole {ty} blocks of {}",
                ty.block_size()
            )
        })?;
        if offset % alignment != 0 {
            return Err(format!(
                "tensor {name} offset {offset} is not aligned to {alignment}"
            ));
        }
        tensors.push(TensorInfo { name, dims, ty, offset, size });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let data_len = (buf.len() as u64).saturating_sub(data_offset);
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    for t in &tensors {
        if !seen.insert(t.name.as_str()) {
            return Err(format!("tensor {} appears twice", t.name));
        }
        let end = t.offset.checked_add(t.size).filter(|&e| e <= data_len);
        if end.is_none() {
            return Err(format!(
                "tensor {} ({} bytes at data offset {}) lies past the end of the file ({} data bytes): the file is truncated",
                t.name, t.size, t.offset, data_len
            ));
        }
    }
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
