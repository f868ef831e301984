//! safetensors checkpoints and config.json: the transformers fixtures, the
//! fetched MiniLM, generated sharded checkpoints and broken files.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::safetensors::{Dtype, SafeTensors};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny")
}

/// Writes a safetensors file with the given `(name, dtype, shape, bytes)`.
fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.to_string(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

#[test]
fn every_fixture_checkpoint_and_config_loads() {
    let dir = fixtures();
    if !dir.is_dir() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    for name in [
        "llama",
        "llama-rope-scaling",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3-moe",
        "gemma3",
        "bert",
    ] {
        let d = dir.join(name);
        let cfg = HfConfig::load(d.join("config.json")).unwrap();
        let st = SafeTensors::open_dir(&d).unwrap();
        let embed = if name == "bert" {
            "embeddings.word_embeddings.weight"
        } else {
            "model.embed_tokens.weight"
        };
        let (w, shape) = st.to_f32(embed).unwrap();
        assert_eq!(shape, vec![cfg.vocab_size, cfg.hidden_size], "{name}");
        assert_eq!(w.len(), cfg.vocab_size * cfg.hidden_size);
        assert!(w.iter().all(|v| v.is_finite()));
    }
    let q3 = HfConfig::load(dir.join("qwen3/config.json")).unwrap();
    assert_eq!(q3.head_dim(), 32, "head_dim differs from hidden / heads");
    let moe = HfConfig::load(dir.join("qwen3-moe/config.json")).unwrap();
    assert_eq!(
        (moe.num_experts, moe.num_experts_per_tok),
        (Some(8), Some(2)),
        "num_local_experts alias"
    );
    let rs = HfConfig::load(dir.join("llama-rope-scaling/config.json"))
        .unwrap()
        .rope(None);
    assert_eq!(
        (
            rs.rope_type.as_str(),
            rs.factor,
            rs.original_max_position_embeddings
        ),
        ("llama3", Some(8.0), Some(64))
    );
    let g = HfConfig::load(dir.join("gemma3/config.json")).unwrap();
    assert_eq!(g.rope(Some("sliding_attention")).theta, 1e4);
    assert_eq!(g.rope(Some("full_attention")).theta, 1e6);
    assert!(g.is_sliding_layer(1) && !g.is_sliding_layer(2));
    let st = SafeTensors::open_dir(dir.join("llama")).unwrap();
    assert!(!st.contains("lm_head.weight"), "tied");
}

#[test]
fn minilm_without_bert_prefix() {
    let base = ferrum_formats::model_cache_dir();
    let d = base.join("all-MiniLM-L6-v2");
    if !d.is_dir() {
        eprintln!("skipping: {} not found", d.display());
        return;
    }
    let cfg = HfConfig::load(d.join("config.json")).unwrap();
    assert_eq!(
        (
            cfg.model_type.as_str(),
            cfg.hidden_size,
            cfg.num_hidden_layers
        ),
        ("bert", 384, 6)
    );
    let st = SafeTensors::open_dir(&d).unwrap();
    assert!(st.names().iter().all(|n| !n.starts_with("bert.")));
    let (_, shape) = st.to_f32("encoder.layer.5.output.dense.weight").unwrap();
    assert_eq!(shape, vec![384, 1536]);
}

#[test]
fn half_precision_integer_and_sharded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let vals = [1.5f32, -2.25, 0.0, 65504.0];
    let f16: Vec<u8> = vals
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16: Vec<u8> = vals
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let i64s: Vec<u8> = [7i64, -3].iter().flat_map(|v| v.to_le_bytes()).collect();
    write(
        &dir.join("model-00001-of-00002.safetensors"),
        &[("a", Dtype::F16, vec![2, 2], f16)],
    );
    write(
        &dir.join("model-00002-of-00002.safetensors"),
        &[
            ("b", Dtype::BF16, vec![4], bf16),
            ("c", Dtype::I64, vec![2], i64s),
        ],
    );
    let map: HashMap<&str, &str> = [
        ("a", "model-00001-of-00002.safetensors"),
        ("b", "model-00002-of-00002.safetensors"),
        ("c", "model-00002-of-00002.safetensors"),
    ]
    .into();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let st = SafeTensors::open_dir(dir).unwrap();
    assert_eq!(st.names(), vec!["a", "b", "c"]);
    assert_eq!(st.to_f32("a").unwrap(), (vals.to_vec(), vec![2, 2]));
    assert_eq!(
        st.to_f32("b").unwrap().0,
        vec![1.5, -2.25, 0.0, 65536.0],
        "bf16 rounds 65504"
    );
    assert_eq!(st.to_i32("c").unwrap().0, vec![7, -3]);
    assert!(st.to_f32("c").is_err() && st.to_i32("a").is_err());
    let err = st.to_f32("missing").unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn broken_checkpoints_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(SafeTensors::open_dir(dir)
        .err()
        .unwrap()
        .to_string()
        .contains("no model.safetensors"));
    write(
        &dir.join("model.safetensors"),
        &[("w", Dtype::F32, vec![64], vec![0u8; 256])],
    );
    let good = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &good[..good.len() - 4]).unwrap();
    let err = SafeTensors::open_dir(dir).err().unwrap().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("not a valid safetensors"),
        "{err}"
    );
    std::fs::write(
        dir.join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage",
    )
    .unwrap();
    assert!(SafeTensors::open_dir(dir).is_err());
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"w": "../../etc/passwd"}}"#,
    )
    .unwrap();
    assert!(SafeTensors::open_dir(dir)
        .err()
        .unwrap()
        .to_string()
        .contains("plain file names"));
}
