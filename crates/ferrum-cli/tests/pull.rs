//! `ferrum pull` against a fake Hugging Face Hub on loopback: the real
//! binary downloads through hf-hub into the standard cache layout; then
//! `ferrum list` and `ferrum rm` on what was fetched.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A tiny valid GGUF: header plus `general.architecture = llama`.
fn tiny_gguf() -> Vec<u8> {
    gguf_with_file_type(None)
}

/// A GGUF with no tensors, and `general.file_type` when given.
fn gguf_with_file_type(file_type: Option<u32>) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((1 + u64::from(file_type.is_some())).to_le_bytes());
    let key = b"general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(8u32.to_le_bytes());
    b.extend(5u64.to_le_bytes());
    b.extend(b"llama");
    if let Some(t) = file_type {
        let key = b"general.file_type";
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key);
        b.extend(4u32.to_le_bytes());
        b.extend(t.to_le_bytes());
    }
    b
}

/// Serves `/acme/tiny/resolve/main/tiny.gguf` like the Hub (ranged GETs
/// with etag and commit headers); everything else is 404. Handles at most
/// `max` connections, then stops.
fn fake_hub(body: Vec<u8>, max: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(max) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if request.is_empty() {
                    request = line.clone();
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = v.trim().split_once('-').unwrap();
                    let start: usize = a.parse().unwrap();
                    let end = if b.is_empty() {
                        body.len() - 1
                    } else {
                        b.parse::<usize>().unwrap()
                    };
                    range = Some((start, end.min(body.len() - 1)));
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let response = if path == "/acme/tiny/resolve/main/tiny.gguf" {
                let (s, e) = range.unwrap_or((0, body.len() - 1));
                let mut r = format!(
                    "HTTP/1.1 206 Partial Content\r\netag: \"abc123\"\r\nx-repo-commit: {COMMIT}\r\n\
                     Content-Range: bytes {s}-{e}/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len(),
                    e + 1 - s
                )
                .into_bytes();
                r.extend(&body[s..=e]);
                r
            } else {
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            };
            let _ = stream.write_all(&response);
        }
    });
    format!("http://{addr}")
}

#[test]
fn pulls_from_the_hub_into_the_standard_cache() {
    let body = tiny_gguf();
    let endpoint = fake_hub(body.clone(), 20);
    let (hf_tmp, models_tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (hf_home, models) = (hf_tmp.path(), models_tmp.path());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferrum"))
            .args(args)
            .env("HF_ENDPOINT", &endpoint)
            .env("HF_HOME", hf_home)
            .env("FERRUM_MODELS", models)
            .output()
            .unwrap()
    };
    let out = run(&["pull", "acme/tiny:tiny.gguf"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert_eq!(std::fs::read(&path).unwrap(), body);
    let expected = hf_home.join(format!(
        "hub/models--acme--tiny/snapshots/{COMMIT}/tiny.gguf"
    ));
    assert_eq!(
        std::fs::canonicalize(&path).unwrap(),
        std::fs::canonicalize(expected).unwrap()
    );

    // Resolution fetches on first use (here: already cached) and opens it.
    let out = run(&["inspect", "--model", "acme/tiny:tiny.gguf"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success() && text.contains("architecture:   llama"),
        "{text}"
    );

    let out = run(&["pull", "acme/tiny:missing.gguf"]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && err.contains("missing.gguf"),
        "{err}"
    );
    let out = run(&["pull", "not-a-repo"]);
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("neither an alias"));

    // `list` names it as `--model` takes it; `rm` frees the bytes.
    let out = run(&["list", "--json"]);
    let listed = String::from_utf8(out.stdout).unwrap();
    let entry: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(entry["name"], "acme/tiny:tiny.gguf", "{listed}");
    assert_eq!(entry["format"], "gguf");
    assert_eq!(entry["bytes"], body.len());
    let blob = std::fs::canonicalize(&path).unwrap();
    let out = run(&["rm", "acme/tiny:tiny.gguf"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!blob.exists() && !path.exists());
    assert!(
        !hf_home.join("hub/models--acme--tiny").exists(),
        "no empty repo folder is left"
    );
    assert!(run(&["list", "--json"]).stdout.is_empty());
}

#[test]
fn list_and_rm_cover_the_model_cache() {
    let (hf_tmp, models_tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let models = models_tmp.path();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferrum"))
            .args(args)
            .env("HF_HOME", hf_tmp.path())
            .env("FERRUM_MODELS", models)
            .output()
            .unwrap()
    };
    let out = run(&["list"]);
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no models yet"));

    // An alias's file (Q4_K_M is file type 15), a folder, and what is not a model.
    std::fs::write(
        models.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        gguf_with_file_type(Some(15)),
    )
    .unwrap();
    let folder = models.join("tiny-bf16");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("config.json"), r#"{"torch_dtype": "bfloat16"}"#).unwrap();
    std::fs::create_dir(models.join("vocab")).unwrap();
    std::fs::write(models.join("notes.txt"), "not a model").unwrap();

    let out = run(&["list"]);
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(rows[0], ["NAME", "FORMAT", "QUANT", "SIZE"]);
    assert_eq!(rows[1][..3], ["smollm2", "gguf", "Q4_K_M"], "{table}");
    assert_eq!(
        rows[2][..3],
        ["tiny-bf16", "safetensors", "bfloat16"],
        "{table}"
    );

    let out = run(&["rm", "nonesuch"]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && err.contains("smollm2, tiny-bf16"),
        "{err}"
    );
    assert!(run(&["rm", "smollm2"]).status.success());
    assert!(run(&["rm", "tiny-bf16"]).status.success());
    assert!(!folder.exists());
    assert!(models.join("vocab").exists() && models.join("notes.txt").exists());
    assert!(run(&["list", "--json"]).stdout.is_empty());
}
