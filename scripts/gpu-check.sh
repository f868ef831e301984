#!/usr/bin/env bash
# Every CUDA test and benchmark in one GPU call (the GPU machine has no Rust
# toolchain and no network, and a call may carry 64 MiB and run 10 minutes).
#
#   bash scripts/gpu-check.sh prep   # here, no GPU needed (~15 min on 2 cores):
#                                    # builds stripped test binaries and a release
#                                    # `ferrum --features cuda` into .gpu/ with the fixtures
#                                    # and the kernels compiled for sm_90 (every variant)
#   bash scripts/gpu-check.sh run    # on the GPU machine, with .gpu/ carried:
#                                    # tests (a skip is a failure there), benchmarks,
#                                    # ptxas -v, compute-sanitizer, ncu; results in $OUT
#
# From ../shared/gpu (gpu_prep.sh, gpu_lease.sh), kept working here.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
G=$PWD/.gpu

# Kernel variants the run times against the default (FERRUM_CUDA_TUNE):
# columns a block and threads a block of the q8_1 GEMV.
VARIANTS=("cols=2")

prep() {
  set -e
  rm -rf .gpu && mkdir -p .gpu/bin
  cargo test -p ferrum-kernels -p ferrum-models --features cuda --test cuda_ops --test cuda_models --no-run \
    --message-format=json | jq -r 'select(.profile.test == true and .executable != null) | .executable' |
    while read -r t; do strip -o ".gpu/bin/$(basename "$t" | sed 's/-[0-9a-f]*$//')" "$t"; done
  cargo build --release -p ferrum-cli --features cuda
  strip -o .gpu/bin/ferrum target/release/ferrum
  # One folder for the test binaries, whose build paths do not exist there.
  cp -r fixtures/hf-tiny .gpu/hf-tiny
  cp -r crates/ferrum-models/tests/data/hf-tiny/. .gpu/hf-tiny/ # and the crate's own
  # The quantized checkpoints (GPTQ, AWQ, FP8, compressed-tensors) of the
  # hf-tiny llama, as .ci/run makes them (qwen3's too would pass 60 MB).
  local venv=${FERRUM_CI_VENV:-target/ci-venv}
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "gguf>=0.10" "safetensors>=0.4" "numpy>=1.24" \
    "ml_dtypes>=0.4" nvidia-cuda-nvrtc
  "$venv/bin/python" scripts/make_quant_fixtures.py fixtures/hf-tiny/llama .gpu/quant >/dev/null
  rm -rf .gpu/quant-bad
  # The kernels for Hopper (sm_90: H100, H200), the default and each
  # variant, compiled here by NVRTC's wheel: the GPU machine loads them as
  # they are (or compiles afresh if its driver refuses them).
  local nvrtc
  nvrtc=$(find "$venv" -name 'libnvrtc.so.13' -printf '%h\n' | head -1)
  LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FERRUM_KERNEL_CACHE=$PWD/.gpu/kernels \
    cargo run --release -q -p ferrum-kernels --features cuda --example precompile_kernels -- 90 "" "${VARIANTS[@]}"
  ls .gpu/bin/cuda_ops .gpu/bin/cuda_models .gpu/bin/ferrum >/dev/null
  du -sh .gpu
  (($(du -sm .gpu | cut -f1) < 58)) || { echo ".gpu too big for the 64 MiB carry" >&2; exit 1; }
  echo "now: run 'bash scripts/gpu-check.sh run' on the GPU machine, carrying .gpu"
}

run() {
  local R=${OUT:-/tmp/gpu-check-out}
  mkdir -p "$R"
  : >"$R/summary.txt"
  exec > >(tee -a "$R/check.log") 2>&1
  local T0
  T0=$(date +%s)
  local BUDGET=${BUDGET:-400}
  say() { echo "$*" | tee -a "$R/summary.txt"; }
  step() { # step NAME LIMIT_S LOGFILE CMD...
    local n=$1 lim=$2 log=$3
    shift 3
    local left=$((BUDGET - $(date +%s) + T0))
    ((lim > left - 5)) && lim=$((left - 5))
    ((lim < 10)) && { say "SKIP  $n (out of time)"; return 1; }
    echo "=== $n (limit ${lim}s)" | tee -a "$R/$log"
    local s
    s=$(date +%s)
    timeout -k 5 "$lim" "$@" >>"$R/$log" 2>&1
    local rc=$?
    say "$( ((rc == 0)) && echo PASS || echo "FAIL rc=$rc") $n $(($(date +%s) - s))s"
    return $rc
  }

  # 0. The GPU, then the libraries cudarc opens by name.
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader |
    tee -a "$R/summary.txt" || { say "NO GPU: abort"; exit 1; }
  for lib in libnvrtc.so.13 libcublas.so.13 libnvrtc.so.12 libcublas.so.12; do
    local d
    d=$(find /usr/local/cuda*/ /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
    [ -n "$d" ] && export LD_LIBRARY_PATH=$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
  python3 -c "import ctypes;[ctypes.CDLL(l) for l in ('libcuda.so.1','libnvrtc.so.13','libcublas.so.13')]" ||
    { say "CUDA libraries not loadable (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}): tests would skip; abort"; exit 1; }
  mkdir -p /tmp/fk && cp "$G"/kernels/*.cubin /tmp/fk/ 2>/dev/null
  export FERRUM_KERNEL_CACHE=/tmp/fk FERRUM_HF_TINY=$G/hf-tiny FERRUM_QUANT_FIXTURES=$G/quant RUST_BACKTRACE=1
  PATH=/usr/local/cuda/bin:$PATH
  local FER=$G/bin/ferrum

  # 1. Correctness: every op against the CPU (a skip is a failure here).
  "$FER" system-info >>"$R/summary.txt" 2>&1
  step "cuda_ops" 100 tests.log "$G/bin/cuda_ops" --nocapture --test-threads=1
  grep -E "nmse" "$R/tests.log" | sort -t' ' -k1,1 -u | sed 's/^/  /' | head -40 >>"$R/summary.txt"

  # 2. Decode and prefill, the new kernels (q8_1 GEMV, bf16 prefill, paged
  #    attention) and the f32 ones alternated on one card: llama3-8b Q4_K.
  bench() { # bench LIMIT LABEL ENV... -- ARGS...
    local lim=$1 label=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    step "bench $label: $*" "$lim" bench.log env FERRUM_KV_CAPACITY=4096 "${envs[@]}" "$FER" bench --device cuda --json "$@" &&
      { grep -E "^\| " "$R/bench.log" | grep -v "^| test\|^|---" | tail -3 | sed "s|^|  $label |" >>"$R/summary.txt"; }
  }
  local L8=(--random-weights llama3-8b --random-type q4_k)
  bench 60 default X=1 -- "${L8[@]}" -p 512 -n 128 -r 2 --batch 8

  # 3. The models against the CPU and transformers, graphs on and off, f32
  #    activations and 8-bit.
  step "cuda_models" 120 tests.log "$G/bin/cuda_models" --nocapture --test-threads=1
  grep -nE "skipped: no CUDA GPU|^skipping " "$R/tests.log" && say "FAIL tests skipped on a GPU machine"
  grep -E "graphs:|batched within" "$R/tests.log" | sed 's/^/  /' | head -20 >>"$R/summary.txt"

  # 4. Graphs off, the f32 reference kernels, the GEMV variant, each beside
  #    the default.
  bench 35 "no graphs" FERRUM_CUDA_GRAPHS=0 -- "${L8[@]}" -p 0 -n 128 -r 2
  bench 35 "f32 activations" FERRUM_CUDA_F32=1 -- "${L8[@]}" -p 0 -n 128 -r 2
  for v in "${VARIANTS[@]}"; do
    bench 35 "tune $v" FERRUM_CUDA_TUNE="$v" -- "${L8[@]}" -p 0 -n 128 -r 2
  done
  bench 35 "tune default" X=1 -- "${L8[@]}" -p 0 -n 128 -r 2

  # 5. Other shapes: the 1.5B, a batch of 32, depth, the mixture of experts.
  bench 40 default X=1 -- --random-weights qwen2.5-1.5b --random-type q4_k -p 512 -n 128 -r 2 --batch 8
  bench 50 default FERRUM_KV_CAPACITY=1024 -- "${L8[@]}" -p 0 -n 32 -r 1 --batch 32
  bench 40 default FERRUM_KV_CAPACITY=8192 -- "${L8[@]}" -p 0 -n 64 -d 4096 -r 1
  bench 100 moe X=1 -- --random-weights qwen3-30b-a3b --random-type q4_k -p 512 -n 64 -r 2 --batch 8

  # 6. Where decode time goes: the GEMV and attention kernels in steady steps.
  step "ncu" 60 ncu.txt ncu --clock-control none --target-processes all -k "regex:mmvq1_q4_k|attention|quantize" -s 300 -c 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    "$FER" bench --device cuda --random-weights llama3-8b -p 0 -n 4 -r 1

  # 7. Registers and spills of what ran; memory errors in the new kernels.
  local C
  C=$(ls -t $FERRUM_KERNEL_CACHE/*.cubin 2>/dev/null | head -1)
  [ -n "$C" ] && cuobjdump -res-usage "$C" 2>/dev/null | grep -A1 -E "mmvq1?_q4_k|attention\b|rows_qkv" >"$R/res-usage.txt"
  step "memcheck" 90 sanitizer.txt compute-sanitizer --tool memcheck --error-exitcode 9 "$G/bin/cuda_ops" paged quantized grouped --test-threads=1

  say "total $(($(date +%s) - T0))s"
  ! grep -q "^FAIL" "$R/summary.txt"
}

case "${1:-}" in
  prep) prep ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu-check.sh prep|run" >&2; exit 2 ;;
esac
