//! GGUF reader: round trips through a writer written here, every bad-input
//! case the issue lists, and the real fetched models when present.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_formats::gguf::{parse_header, GgufFile, MetaValue};
use ferrum_types::GgmlType;

/// Minimal GGUF v3 writer for tests.
#[derive(Default)]
struct Writer {
    meta: Vec<u8>,
    n_meta: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

impl Writer {
    fn kv(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
        put_str(&mut self.meta, key);
        self.meta.extend(ty.to_le_bytes());
        self.meta.extend(value);
        self.n_meta += 1;
        self
    }
    fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        let mut b = Vec::new();
        put_str(&mut b, v);
        self.kv(key, 8, &b)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, bytes: &[u8]) -> &mut Self {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        put_str(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ty.id().to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.n_tensors += 1;
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_meta.to_le_bytes());
        out.extend(&self.meta);
        out.extend(&self.infos);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

fn sample() -> Writer {
    let mut w = Writer::default();
    w.kv_str("general.architecture", "llama")
        .kv("u8", 0, &[200])
        .kv("i8", 1, &[0xFE])
        .kv("u16", 2, &513u16.to_le_bytes())
        .kv("i16", 3, &(-300i16).to_le_bytes())
        .kv("u32", 4, &70000u32.to_le_bytes())
        .kv("i32", 5, &(-70000i32).to_le_bytes())
        .kv("f32", 6, &1.5f32.to_le_bytes())
        .kv("bool", 7, &[1])
        .kv("u64", 10, &(1u64 << 40).to_le_bytes())
        .kv("i64", 11, &(-5i64).to_le_bytes())
        .kv("f64", 12, &0.25f64.to_le_bytes());
    // Array of arrays of u16: [[1, 2], []]
    let mut nested = Vec::new();
    nested.extend(9u32.to_le_bytes());
    nested.extend(2u64.to_le_bytes());
    for items in [&[1u16, 2][..], &[][..]] {
        nested.extend(2u32.to_le_bytes());
        nested.extend((items.len() as u64).to_le_bytes());
        for i in items {
            nested.extend(i.to_le_bytes());
        }
    }
    w.kv("nested", 9, &nested);
    let mut strs = Vec::new();
    strs.extend(8u32.to_le_bytes());
    strs.extend(2u64.to_le_bytes());
    put_str(&mut strs, "a");
    put_str(&mut strs, "héllo");
    w.kv("strings", 9, &strs);
    let f: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    w.tensor("w", &[3, 2], GgmlType::F32, &f);
    w.tensor("q", &[64], GgmlType::Q8_0, &[7u8; 68]);
    w
}

/// `bytes` written as `name` in a fresh directory, removed when the
/// returned guard drops.
fn temp_file(name: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

#[test]
fn round_trip_every_value_type() {
    let (_dir, path) = temp_file("ok.gguf", &sample().bytes());
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.header().version, 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get("u8"), Some(&MetaValue::U8(200)));
    assert_eq!(g.get("i8"), Some(&MetaValue::I8(-2)));
    assert_eq!(g.get("u16").unwrap().as_u64(), Some(513));
    assert_eq!(g.get("i16").unwrap().as_i64(), Some(-300));
    assert_eq!(g.get_u64("u32").unwrap(), 70000);
    assert_eq!(g.get("i32").unwrap().as_i64(), Some(-70000));
    assert_eq!(g.get_f64("f32").unwrap(), 1.5);
    assert_eq!(g.get("bool").unwrap().as_bool(), Some(true));
    assert_eq!(g.get_u64("u64").unwrap(), 1 << 40);
    assert_eq!(g.get("i64").unwrap().as_i64(), Some(-5));
    assert!(g.get_u64("i64").is_err(), "negative is not a u64");
    assert_eq!(g.get_f64("f64").unwrap(), 0.25);
    let nested = g.get("nested").unwrap().as_array().unwrap();
    assert_eq!(
        nested[0],
        MetaValue::Array(vec![MetaValue::U16(1), MetaValue::U16(2)])
    );
    assert_eq!(nested[1], MetaValue::Array(vec![]));
    let strs = g.get("strings").unwrap().as_array().unwrap();
    assert_eq!(strs[1].as_str(), Some("héllo"));
    let err = g.get_str("missing.key").unwrap_err().to_string();
    assert!(
        err.contains("missing.key") && err.contains("ok.gguf"),
        "{err}"
    );

    let w = g.tensor("w").unwrap();
    assert_eq!(
        (w.shape(), w.ty, w.numel(), w.size),
        (vec![2, 3], GgmlType::F32, 6, 24)
    );
    let data = g.tensor_data(w);
    assert_eq!(f32::from_le_bytes(data[20..24].try_into().unwrap()), 6.0);
    let q = g.tensor("q").unwrap();
    assert_eq!((q.offset % 32, q.size), (0, 68));
    assert!(g.tensor_data(q).iter().all(|&b| b == 7));
}

/// The message of a file that must fail to open.
fn open_err(name: &str, bytes: &[u8]) -> String {
    let (_dir, path) = temp_file(name, bytes);
    let msg = GgufFile::open(&path)
        .err()
        .expect("must be rejected")
        .to_string();
    assert!(msg.contains(name), "error names the file: {msg}");
    msg
}

#[test]
fn bad_files_get_one_line_errors() {
    let missing = GgufFile::open("/nonexistent/dir/model.gguf")
        .err()
        .unwrap()
        .to_string();
    assert!(missing.contains("/nonexistent/dir/model.gguf"), "{missing}");
    assert!(open_err("empty.gguf", b"").contains("too short"));
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    assert!(open_err("random.gguf", &random).contains("not a GGUF file"));
    let mut v1 = b"GGUF".to_vec();
    v1.extend(1u32.to_le_bytes());
    assert!(open_err("v1.gguf", &v1).contains("version 1"));

    // Header claiming 2^60 tensors: rejected before allocating.
    let mut huge = b"GGUF".to_vec();
    huge.extend(3u32.to_le_bytes());
    huge.extend((1u64 << 60).to_le_bytes());
    huge.extend(0u64.to_le_bytes());
    assert!(open_err("huge-count.gguf", &huge).contains("tensor count"));

    // A key whose string claims 2^62 bytes.
    let mut huge_str = b"GGUF".to_vec();
    huge_str.extend(3u32.to_le_bytes());
    huge_str.extend(0u64.to_le_bytes());
    huge_str.extend(1u64.to_le_bytes());
    huge_str.extend((1u64 << 62).to_le_bytes());
    huge_str.extend(b"abcdefgh");
    assert!(open_err("huge-string.gguf", &huge_str).contains("length of metadata key"));

    // Tensor data past the end of the file.
    let full = sample().bytes();
    let msg = open_err("short-data.gguf", &full[..full.len() - 10]);
    assert!(
        msg.contains("tensor q") && msg.contains("past the end"),
        "{msg}"
    );

    // Every truncation of the header is an error, never a panic.
    for cut in 0..full.len() - 70 {
        assert!(parse_header(&full[..cut]).is_err(), "cut at {cut}");
    }
    // Every single-byte corruption is an error or a valid parse, never a panic.
    for pos in 0..full.len() {
        let mut bad = full.clone();
        bad[pos] ^= 0xA5;
        let _ = parse_header(&bad);
    }
}

#[test]
fn unknown_tensor_type_and_bad_shapes_are_rejected() {
    let mut w = Writer::default();
    w.tensor("t", &[32], GgmlType::Q8_0, &[0u8; 34]);
    let mut bytes = w.bytes();
    // Header (magic, version, two counts) is 24 bytes; the tensor info is
    // name length (8) + "t" (1) + n_dims (4) + one dim (8), then the type.
    let tpos = 24 + 8 + 1 + 4 + 8;
    assert_eq!(
        u32::from_le_bytes(bytes[tpos..tpos + 4].try_into().unwrap()),
        GgmlType::Q8_0.id()
    );
    bytes[tpos..tpos + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(parse_header(&bytes)
        .unwrap_err()
        .contains("unknown ggml type 99"));

    let mut w = Writer::default();
    w.tensor("odd", &[33], GgmlType::Q8_0, &[0u8; 34]);
    assert!(parse_header(&w.bytes()).unwrap_err().contains("whole"));
}

fn models_dir() -> PathBuf {
    ferrum_formats::model_cache_dir()
}

/// A fetched model, or `None` (and a note) when `fetch.sh` has not run.
fn model(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} not found (run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

#[test]
fn real_models_open_and_describe_themselves() {
    for (file, arch, layers) in [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "llama", 30),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2", 24),
        ("gemma-3-270m-q4_k_m.gguf", "gemma3", 18),
    ] {
        let Some(path) = model(file) else { continue };
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.architecture().unwrap(), arch);
        assert_eq!(g.get_u64(&format!("{arch}.block_count")).unwrap(), layers);
        let tokens = g.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
        assert!(tokens.len() > 40000, "{file}: {} tokens", tokens.len());
        assert!(g.tensor("token_embd.weight").is_some());
        // Tensors tile the data section without overlap.
        let mut spans: Vec<(u64, u64)> = g
            .tensors()
            .iter()
            .map(|t| (t.offset, t.offset + t.size))
            .collect();
        spans.sort();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "{file}: overlapping tensors"
        );
    }
}

#[test]
fn truncated_real_file_is_a_clear_error() {
    let Some(path) = model("truncated-qwen2-7b-q4_k_m.gguf.part0000") else {
        return;
    };
    let msg = GgufFile::open(&path).err().expect("truncated").to_string();
    assert!(
        msg.contains("past the end of the file") && msg.contains("truncated"),
        "{msg}"
    );
}
