#!/usr/bin/env bash
# Every CUDA test and benchmark in one GPU call (the GPU machine has no Rust
# toolchain and no network, and a call may carry 64 MiB and run 10 minutes).
#
#   bash scripts/gpu-check.sh prep   # here, no GPU needed (~15 min on 2 cores):
#                                    # builds stripped test binaries and a release
#                                    # `ferrum --features cuda` into .gpu/ with the fixtures
#   bash scripts/gpu-check.sh run    # on the GPU machine, with .gpu/ carried:
#                                    # tests (a skip is a failure there), benchmarks,
#                                    # ptxas -v, compute-sanitizer, ncu; results in $OUT
#
# From ../shared/gpu (gpu_prep.sh, gpu_lease.sh), kept working here.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
G=$PWD/.gpu

prep() {
  set -e
  rm -rf .gpu && mkdir -p .gpu/bin
  cargo test -p ferrum-kernels -p ferrum-models --features cuda --test cuda_ops --test cuda_models --no-run \
    --message-format=json | jq -r 'select(.profile.test == true and .executable != null) | .executable' |
    while read -r t; do strip -o ".gpu/bin/$(basename "$t" | sed 's/-[0-9a-f]*$//')" "$t"; done
  cargo build --release -p ferrum-cli --features cuda
  strip -o .gpu/bin/ferrum target/release/ferrum
  local shared=${FERRUM_SHARED:-../shared}
  cp -r "$shared/fixtures/hf-tiny" .gpu/hf-tiny # ../shared does not travel
  cp -r crates/ferrum-models/tests/data/hf-tiny/. .gpu/hf-tiny/ # and the crate's own
  # The quantized checkpoints (GPTQ, AWQ, FP8, compressed-tensors) of the
  # hf-tiny llama, as .ci/run makes them (qwen3's too would pass 60 MB).
  local venv=${FERRUM_CI_VENV:-target/ci-venv}
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "gguf>=0.10" "safetensors>=0.4" "numpy>=1.24" "ml_dtypes>=0.4"
  "$venv/bin/python" scripts/make_quant_fixtures.py "$shared/fixtures/hf-tiny/llama" .gpu/quant >/dev/null
  rm -rf .gpu/quant-bad
  ls .gpu/bin/cuda_ops .gpu/bin/cuda_models .gpu/bin/ferrum >/dev/null
  du -sh .gpu
  (($(du -sm .gpu | cut -f1) < 55)) || { echo ".gpu too big for the 64 MiB carry" >&2; exit 1; }
  echo "now: run 'bash scripts/gpu-check.sh run' on the GPU machine, carrying .gpu"
}

run() {
  local R=${OUT:-/tmp/gpu-check-out}
  mkdir -p "$R"
  : >"$R/summary.txt"
  exec > >(tee -a "$R/check.log") 2>&1
  local T0
  T0=$(date +%s)
  local BUDGET=${BUDGET:-560}
  say() { echo "$*" | tee -a "$R/summary.txt"; }
  step() { # step NAME LIMIT_S LOGFILE CMD...
    local n=$1 lim=$2 log=$3
    shift 3
    local left=$((BUDGET - $(date +%s) + T0))
    ((lim > left - 10)) && lim=$((left - 10))
    ((lim < 15)) && { say "SKIP  $n (out of time)"; return 1; }
    echo "=== $n (limit ${lim}s)"
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
  export FERRUM_KERNEL_CACHE=/tmp/fk FERRUM_HF_TINY=$G/hf-tiny FERRUM_QUANT_FIXTURES=$G/quant RUST_BACKTRACE=1
  PATH=/usr/local/cuda/bin:$PATH
  local FER=$G/bin/ferrum

  # 1. Correctness: both CUDA suites; a skip is a failure on a GPU machine.
  "$FER" system-info >>"$R/summary.txt" 2>&1
  step "cuda_ops" 90 tests.log "$G/bin/cuda_ops" --nocapture --test-threads=1
  step "cuda_models" 150 tests.log "$G/bin/cuda_models" --nocapture --test-threads=1
  grep -nE "skipped: no CUDA GPU|^skipping " "$R/tests.log" && say "FAIL tests skipped on a GPU machine"

  # 2. Benchmarks, most wanted first: the mixture of experts (Qwen3-30B-A3B
  #    shapes, grouped expert GEMMs), then 8B shapes, random weights (Q4_K
  #    as the README; Q4_0 is what GPTQ int4 runs as, Q5_0 AWQ, with and
  #    without act-order).
  bench() {
    step "bench ${*:2}" "$1" bench.log env FERRUM_KV_CAPACITY=8192 "$FER" bench --device cuda --json "${@:2}" &&
      grep -E "^\|" "$R/bench.log" | tail -4 | sed "s|^|  |" >>"$R/summary.txt"
  }
  bench 150 --random-weights qwen3-30b-a3b --random-type q4_k -p 512 -n 64 -r 2 --batch 8
  bench 100 --random-weights llama3-8b --random-type q4_k -p 512 -n 128 -r 3 --batch 8
  bench 100 --random-weights llama3-8b --random-type q4_k -p 0 -n 64 -d 4096 -r 1
  bench 70 --random-weights llama3-8b --random-type q4_0 -p 512 -n 64 -r 2

  # 3. Memory errors in the quantized and grouped-expert kernels.
  step "memcheck quant" 90 sanitizer.txt compute-sanitizer --tool memcheck --error-exitcode 9 "$G/bin/cuda_ops" grouped quantized --test-threads=1

  # 4. Where decode time goes: counters of the main kernels in steady steps,
  #    dense and mixture.
  step "ncu" 90 ncu.txt ncu --clock-control none --target-processes all -k "regex:gemv_q4_k|attention|rms_norm" -s 400 -c 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    "$FER" bench --device cuda --random-weights llama3-8b -p 0 -n 4 -r 1
  step "ncu moe" 90 ncu-moe.txt ncu --clock-control none --target-processes all -k "regex:gemv_experts_q4_k" -s 600 -c 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    "$FER" bench --device cuda --random-weights qwen3-30b-a3b -p 0 -n 4 -r 1

  # 5. The rest: act-order, registers and spills, races, all of memcheck.
  bench 70 --random-weights llama3-8b --random-type q5_0 --random-act-order -p 512 -n 64 -r 2
  local P
  P=$(ls $FERRUM_KERNEL_CACHE/*.ptx 2>/dev/null | head -1)
  [ -n "$P" ] && step "ptxas -v" 30 ptxas.txt ptxas -arch=sm_90 -v --warn-on-spills --warn-on-local-memory-usage "$P" -o /tmp/k.cubin &&
    { cuobjdump -sass /tmp/k.cubin 2>/dev/null | gzip >"$R/sass.txt.gz"; }
  step "memcheck" 120 sanitizer.txt compute-sanitizer --tool memcheck --error-exitcode 9 "$G/bin/cuda_ops" --test-threads=1
  step "racecheck" 90 sanitizer.txt compute-sanitizer --tool racecheck --error-exitcode 9 "$G/bin/cuda_ops" attention elementwise --test-threads=1

  say "total $(($(date +%s) - T0))s"
  ! grep -q "^FAIL" "$R/summary.txt"
}

case "${1:-}" in
  prep) prep ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu-check.sh prep|run" >&2; exit 2 ;;
esac
