//! The `ferrum` binary as a user runs it.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::process::{Command, Output};

fn ferrum(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args(args)
        .output()
        .unwrap()
}

fn model(name: &str) -> Option<String> {
    let base = ferrum_formats::model_cache_dir();
    let p = base.join(name);
    if p.exists() {
        Some(p.to_string_lossy().into_owned())
    } else {
        eprintln!(
            "skipping: {} not found (run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

#[test]
fn help_lists_the_commands() {
    let out = ferrum(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for cmd in [
        "inspect",
        "tokenize",
        "system-info",
        "run",
        "serve",
        "embed",
        "bench",
        "perplexity",
        "list",
        "rm",
    ] {
        assert!(text.contains(cmd), "{text}");
    }
}

#[test]
fn tokenize_json_prints_the_ids_on_the_last_line() {
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let out = ferrum(&[
        "tokenize",
        "--model",
        &m,
        "--json",
        "--",
        "The capital of France is",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // The ids' correctness is established by the tokenizer crate's tests
    // against llama.cpp's vectors; here the CLI must report the same.
    let g = ferrum_formats::gguf::GgufFile::open(&m).unwrap();
    let tok = ferrum_tokenizer::Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(
        ids,
        tok.encode("The capital of France is", false, false)
            .unwrap()
    );
    assert_eq!(tok.decode(&ids, false), "The capital of France is");
    let special = ferrum(&[
        "tokenize",
        "--model",
        &m,
        "--json",
        "--parse-special",
        "--",
        "<|im_start|>",
    ]);
    assert_eq!(String::from_utf8(special.stdout).unwrap().trim(), "[1]");
}

#[test]
fn inspect_describes_a_gguf() {
    let Some(m) = model("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let out = ferrum(&["inspect", "--model", &m]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "architecture:   gemma3",
        "layers:         18",
        "vocab size:     262144",
        "chat template:  no",
        "Q4_K",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn bad_models_fail_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.gguf");
    std::fs::write(&junk, b"definitely not a model").unwrap();
    let junk = junk.to_string_lossy().into_owned();
    let mut cases = vec![
        ("/nonexistent/model.gguf", "model not found"),
        ("/dev/null", "not a regular file"),
    ];
    cases.push((junk.as_str(), "not a GGUF file"));
    let truncated = model("truncated-qwen2-7b-q4_k_m.gguf.part0000");
    if let Some(t) = &truncated {
        cases.push((t.as_str(), "truncated"));
    }
    for (path, want) in cases {
        let out = ferrum(&["inspect", "--model", path]);
        assert!(!out.status.success(), "{path}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{path}: {err}");
        assert!(
            err.contains(want) && err.contains("error:"),
            "{path}: {err}"
        );
    }
}

fn ferrum_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrum"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn run_one_shot_prints_only_the_completion() {
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let greedy = |extra: &[&str]| {
        let base = ["run", "--model", &m, "--prompt", "The capital of France is"];
        let greedy = ["--temperature", "0", "-n", "3"];
        ferrum(&[&base[..], &greedy, extra].concat())
    };
    let out = greedy(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
    // No log lines or timings unless asked for.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = greedy(&["--verbose"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    let stderr = String::from_utf8(out.stderr).unwrap();
    // The settings in use (no model recommendation in this file: Ferrum's
    // defaults where the command line sets nothing), then the timings.
    let (settings, timing) = stderr.split_once('\n').unwrap_or_default();
    assert_eq!(
        settings,
        "sampling: temperature 0, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1"
    );
    assert!(
        timing.starts_with("[prompt 5 tokens (0 cached) ")
            && timing.contains("| answer 3 tokens ")
            && timing.ends_with("| finish length]\n"),
        "{timing:?}"
    );
    // Same seed, same sampled text.
    let sample = |seed: &str| {
        let o = ferrum(&[
            "run",
            "--model",
            &m,
            "--prompt",
            "Once upon a time",
            "--seed",
            seed,
            "-n",
            "12",
        ]);
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(sample("3"), sample("3"));
}

#[test]
fn run_refuses_what_it_cannot_do() {
    if let Some(g) = model("gemma-3-270m-q4_k_m.gguf") {
        let out = ferrum(&["run", "--model", &g]);
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            !out.status.success() && err.contains("no chat template"),
            "{err}"
        );
    }
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let long = "word ".repeat(40);
    let out = ferrum_env(
        &["run", "--model", &m, "--prompt", &long],
        &[("FERRUM_KV_CAPACITY", "16")],
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && err.contains("context overflow"),
        "{err}"
    );
    let out = ferrum(&["run", "--model", &m, "--prompt", "x", "--top-p", "1.5"]);
    assert!(String::from_utf8(out.stderr).unwrap().contains("top_p"));
    let out = ferrum(&["run", "--model", "no-such-alias"]);
    assert!(
        String::from_utf8(out.stderr).unwrap().contains("smollm2"),
        "lists the aliases"
    );
}

#[test]
fn device_options_that_cannot_work_are_errors() {
    // f16 K/V on CUDA (its kernels read f32): refused by name where CUDA
    // is built in, before anything loads; elsewhere CUDA itself is.
    let want = if cfg!(feature = "cuda") {
        "--kv-cache-dtype: an f16 KV cache is not supported on CUDA"
    } else {
        "built without CUDA"
    };
    if let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") {
        let out = ferrum(&[
            "run",
            "--model",
            &m,
            "--device",
            "cuda",
            "--kv-cache-dtype",
            "f16",
            "--prompt",
            "x",
        ]);
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success() && err.contains(want), "{err}");
    }
    // Embedding models take --device like generation (the same refusal
    // in a build without CUDA; a CUDA build would serve them).
    if let Some(e) = model("all-MiniLM-L6-v2").filter(|_| !cfg!(feature = "cuda")) {
        for args in [
            &["serve", "--model", &e, "--device", "cuda", "--port", "0"][..],
            &["embed", "--model", &e, "--device", "cuda", "hello"][..],
        ] {
            let out = ferrum(args);
            let err = String::from_utf8(out.stderr).unwrap();
            assert!(
                !out.status.success() && err.contains(want),
                "{args:?}: {err}"
            );
        }
    }
}

#[test]
fn perplexity_json_is_the_last_line() {
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("text.txt");
    std::fs::write(&file, text).unwrap();
    let out = ferrum(&[
        "perplexity",
        "--model",
        &m,
        "--file",
        file.to_str().unwrap(),
        "--ctx",
        "128",
        "--chunks",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        (v["chunks"].as_u64(), v["tokens"].as_u64()),
        (Some(2), Some(256))
    );
    // A repeated sentence is nearly certain after the first copy.
    let ppl = v["ppl"].as_f64().unwrap();
    assert!(ppl > 1.0 && ppl < 1.5, "{ppl}");
}

#[test]
fn bench_json_reports_positive_rates() {
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let out = ferrum(&[
        "bench", "-m", &m, "-p", "16", "-n", "4", "-r", "2", "--batch", "2", "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for key in ["pp_tok_s", "tg_tok_s", "batch_tok_s"] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
    for key in ["pp_std", "tg_std", "batch_std"] {
        assert!(v[key].as_f64().unwrap() >= 0.0, "{key}: {v}");
    }
    assert!(
        stdout.contains("| pp16 |") && stdout.contains("| tg4 |"),
        "{stdout}"
    );
}

#[test]
fn bench_profile_breaks_each_test_down_by_op() {
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let out = ferrum(&[
        "bench",
        "-m",
        &m,
        "-t",
        "2",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "--batch",
        "2",
        "--profile",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for test in ["pp16", "tg4", "tg4 batch 2"] {
        let table = stdout
            .split(&format!("\n{test}: "))
            .nth(1)
            .unwrap_or_else(|| panic!("no profile of {test}: {stdout}"));
        let gemm = table
            .lines()
            .find(|l| l.starts_with("| quantized GEMM |"))
            .unwrap_or_else(|| panic!("{test}: {table}"));
        // Each forward pass: 30 layers of QKV, output, gate+up and down
        // projections, and the head.
        assert!(gemm.ends_with("| 121.0 |"), "{test}: {gemm}");
        assert!(table.contains("| outside backend ops |"), "{test}: {table}");
        assert!(table.contains("pool thread(s) waited"), "{test}: {table}");
    }
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert!(v["batch_tok_s"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn bench_rejects_bad_presets_and_devices() {
    for args in [
        &["bench", "--random-weights", "gpt-17"][..],
        &[
            "bench",
            "--random-weights",
            "qwen2.5-0.5b",
            "--random-type",
            "q4_k",
        ][..],
        &["bench", "--device", "tpu"][..],
        &["bench", "-r", "0"][..],
    ] {
        let out = ferrum(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A block format without kernels is refused with the list of those that
    // have them (from the one quant-format table).
    let args = [
        "bench",
        "--random-weights",
        "qwen2.5-0.5b",
        "--random-type",
        "iq2_xxs",
    ];
    let out = ferrum(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("choose one of q4_0, q4_1") && err.contains("iq4_xs"),
        "{err}"
    );
}

#[test]
fn unknown_kv_cache_dtypes_are_named_in_the_error() {
    let by_flag = ferrum(&["bench", "--kv-cache-dtype", "f8"]);
    let by_env = ferrum_env(&["bench"], &[("FERRUM_KV_CACHE_DTYPE", "q4")]);
    for (out, bad) in [(by_flag, "f8"), (by_env, "q4")] {
        assert!(!out.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("unknown KV cache dtype '{bad}'")) && err.contains("f16 or f32"),
            "{err}"
        );
    }
}

#[test]
fn embed_prints_one_unit_vector_per_input() {
    let Some(m) = model("all-MiniLM-L6-v2") else {
        return;
    };
    let out = ferrum(&[
        "embed",
        "--model",
        &m,
        "--json",
        "first text",
        "second text",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i);
        let v: Vec<f64> = l["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(v.len(), 384);
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    // A decoder model is not an embedding model: a clear error, no panic.
    if let Some(g) = model("SmolLM2-135M-Instruct.Q4_1.gguf") {
        let out = ferrum(&["embed", "--model", &g, "x"]);
        assert!(!out.status.success());
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

/// The default model (no `--model`) answers ten simple questions with known
/// answers, greedily, at least eight right: the first answers a newcomer
/// sees. SmolLM2-135M, the default before, gets 7 of these 10 (all three
/// sums but 17 * 3 wrong), so the test tells a good default from a bad one.
#[test]
fn the_default_model_answers_simple_questions() {
    if model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").is_none() {
        return;
    }
    let questions: [(&str, &[&str]); 10] = [
        (
            "What is the capital of France? Answer in one word.",
            &["paris"],
        ),
        (
            "What is the capital of Japan? Answer in one word.",
            &["tokyo"],
        ),
        (
            "What is the capital of Italy? Answer in one word.",
            &["rome"],
        ),
        ("What is 17 * 3?", &["51"]),
        ("What is 23 + 19?", &["42"]),
        ("What is 9 * 8?", &["72"]),
        (
            "What is the opposite of 'hot'? Answer in one word.",
            &["cold"],
        ),
        (
            "What is the opposite of 'up'? Answer in one word.",
            &["down"],
        ),
        ("What is 15 - 7?", &["8"]),
        (
            "What color is the sky on a clear day? Answer in one word.",
            &["blue"],
        ),
    ];
    let mut report = Vec::new();
    let mut right = 0;
    for (q, want) in questions {
        let out = ferrum(&[
            "run",
            "--chat",
            "--prompt",
            q,
            "--temperature",
            "0",
            "-n",
            "32",
        ]);
        let answer = String::from_utf8_lossy(&out.stdout).to_lowercase();
        let ok = out.status.success() && want.iter().any(|w| answer.contains(w));
        right += usize::from(ok);
        report.push(format!(
            "{} {q} -> {:?}",
            if ok { "ok " } else { "BAD" },
            answer.trim()
        ));
    }
    assert!(right >= 8, "{right} of 10 right:\n{}", report.join("\n"));
}
