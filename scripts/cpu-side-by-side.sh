#!/usr/bin/env bash
# ferrum against llama.cpp on another machine's CPU (the lent GPU host's
# Xeon), where no model file can be copied: a call carries 64 MiB, so the
# models travel as their GGUF headers and are rebuilt there with random
# weights of the same shapes and block types (scripts/random_like_gguf.py).
#
#   bash scripts/cpu-side-by-side.sh prep LLAMA_BENCH MODEL.gguf...
#       here: packs a stripped release `ferrum`, LLAMA_BENCH (build it with
#       -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF and the other CPU's
#       extensions on, e.g. -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON) with the
#       libraries it opens, and the models' headers, xz-compressed, into
#       .cpu-side/ (git-ignored)
#       (ferrum-kernels' CPU tests and its `gemm` bench go along too)
#   BUDGET=400 [ALSO_ISA=avx-vnni] bash scripts/cpu-side-by-side.sh run
#       there, carrying .cpu-side: rebuilds the files, pins two cores, runs
#       the kernel tests on that CPU (a path this machine lacks is only
#       tested there; $OUT/kernel-tests.txt) and the 8-bit `gemm_quant`
#       benches, as detected and capped at ALSO_ISA ($OUT/gemm-*.txt), then
#       alternates `llama-bench -t 2 -p 512 -n 64 -r 1` and `ferrum bench -t 2
#       -p 512 -n 64 -r 1 --batch 8` (and with ALSO_ISA, the same under
#       `FERRUM_CPU_ISA=$ALSO_ISA`) per model (order swapped each round)
#       until BUDGET seconds (one round at least); medians and paired
#       ratios in $OUT/summary.txt, then one `ferrum bench --profile` run per
#       model (tg and batch 8 by op) in $OUT/profile-MODEL.txt
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
C=$PWD/.cpu-side

prep() {
  set -e
  local llama=$1
  shift
  rm -rf "$C" && mkdir -p "$C/lib"
  cargo build --release -p ferrum-cli
  strip -o "$C/ferrum" target/release/ferrum
  strip -o "$C/llama-bench" "$llama"
  ldd "$llama" | awk '/=> \// {print $3}' | grep -E 'libgomp|libssl|libcrypto' | xargs -r cp -L -t "$C/lib"
  local t=0 exe
  for exe in $({ cargo test --release -p ferrum-kernels --lib --test cpu_ops --test quant_gemm --no-run 2>&1 &&
    cargo bench -p ferrum-benches --bench gemm --no-run 2>&1; } | grep -o 'target/release/deps/[a-z_0-9-]*'); do
    case $exe in
      */gemm-*) strip -o "$C/gemm-bench" "$exe" ;;
      *) strip -o "$C/test-$t" "$exe" && t=$((t + 1)) ;;
    esac
  done
  xz -T0 -6 "$C/ferrum" "$C/llama-bench" "$C/gemm-bench" "$C"/test-*
  for m in "$@"; do
    python3 scripts/random_like_gguf.py "$m" --header-only "$C/$(basename "$m" .gguf).head"
  done
  du -sh "$C"
  (($(du -sm "$C" | cut -f1) < 56)) || { echo ".cpu-side too big for a 64 MiB call" >&2; exit 1; }
}

run() {
  local R=${OUT:-/tmp/cpu-side-out} W=/tmp/cpu-side-work BUDGET=${BUDGET:-400}
  local T0
  T0=$(date +%s)
  mkdir -p "$R" "$W"
  : >"$R/rounds.txt"
  exec > >(tee -a "$R/log.txt") 2>&1
  lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"
  grep -o -w -E 'avx2|avx512f|avx512_vnni|avx_vnni|amx_int8' /proc/cpuinfo | sort | uniq -c
  local pids=() m b
  for b in "$C"/*.xz; do
    b=$(basename "$b" .xz)
    xz -dc "$C/$b.xz" >"$W/$b" &
    pids+=($!)
  done
  for m in "$C"/*.head; do
    python3 scripts/random_like_gguf.py "$m" "$W/$(basename "$m" .head).gguf" &
    pids+=($!)
  done
  wait "${pids[@]}" # not a bare `wait`: it would wait for the tee above
  chmod +x "$W"/*
  "$W/ferrum" system-info
  # Two cores, skipping the first two (interrupts land there).
  local cpus pin=()
  cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '!seen[$2]++ {print $1}' | sed -n 3,4p | paste -sd,)
  command -v taskset >/dev/null && [ -n "$cpus" ] && pin=(taskset -c "$cpus")
  echo "pinned to: ${cpus:-none}"
  for b in "$W"/test-*; do
    "${pin[@]}" "$b" --test-threads 2 2>&1 |
      grep -E "^test |test result|panicked|left:|right:" >>"$R/kernel-tests.txt"
  done
  grep -E "test result|FAILED|panicked" "$R/kernel-tests.txt"
  local isa
  for isa in detected ${ALSO_ISA:-}; do
    FERRUM_CPU_ISA=$isa "${pin[@]}" timeout 120 "$W/gemm-bench" --bench 'gemm_quant/(Q4_1|Q8_0)_int8' 2>&1 |
      grep -E "^gemm|time:|thrpt:" >"$R/gemm-$isa.txt"
  done
  llama() {
    echo "llama $1 $2 $(LD_LIBRARY_PATH=$C/lib "${pin[@]}" timeout 200 "$W/llama-bench" -m "$W/$1.gguf" \
      -t 2 -p 512 -n 64 -r 1 -o csv 2>/dev/null | tail -2 | awk -F'","' '{printf "%s ", $(NF-1)}')"
  }
  # One `ferrum bench` line, labelled $1, under FERRUM_CPU_ISA=$4 if given.
  fer1() {
    echo "$1 $2 $3 $(FERRUM_CPU_ISA=${4:-} "${pin[@]}" timeout 200 "$W/ferrum" bench -m "$W/$2.gguf" -t 2 \
      -p 512 -n 64 -r 1 --batch 8 --json 2>/dev/null | tail -1)"
  }
  fer() {
    fer1 ferrum "$1" "$2"
    [ -z "${ALSO_ISA:-}" ] || fer1 "ferrum-$ALSO_ISA" "$1" "$2" "$ALSO_ISA"
  }
  local r=0
  while ((r == 0 || $(date +%s) - T0 < BUDGET)); do
    for m in "$C"/*.head; do
      m=$(basename "$m" .head)
      if ((r % 2)); then fer "$m" $r && llama "$m" $r; else llama "$m" $r && fer "$m" $r; fi
    done | tee -a "$R/rounds.txt"
    r=$((r + 1))
  done
  python3 - "$R/rounds.txt" <<'EOF' | tee "$R/summary.txt"
import collections, json, statistics as st, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    engine, model, r, rest = (line.split(" ", 3) + ["", "", ""])[:4]
    rest = rest.strip()
    try:
        if engine.startswith("ferrum"):
            # "ferrum": as detected (f...); "ferrum-ISA": capped (x...).
            j, p = json.loads(rest), "f" if engine == "ferrum" else "x"
            runs[model, r].update({p + "pp": j["pp_tok_s"], p + "tg": j["tg_tok_s"], p + "b": j["batch_tok_s"]})
            if p == "x":
                runs[model, r]["isa"] = engine[len("ferrum-"):]
        elif engine == "llama":
            lpp, ltg = map(float, rest.split())
            runs[model, r].update(lpp=lpp, ltg=ltg)
    except (ValueError, KeyError):
        print("unparsed:", line.strip())
for model in sorted({m for m, _ in runs}):
    rs = [v for (m, _), v in runs.items() if m == model and len(v) >= 5]
    if not rs:
        continue
    med = lambda f: st.median(f(v) for v in rs)
    print(f"{model}: {len(rs)} rounds; llama.cpp pp512 {med(lambda v: v['lpp']):.1f} tg64 {med(lambda v: v['ltg']):.2f};"
          f" ferrum pp512 {med(lambda v: v['fpp']):.1f} tg64 {med(lambda v: v['ftg']):.2f} batch8 {med(lambda v: v['fb']):.1f};"
          f" paired medians pp {med(lambda v: v['fpp'] / v['lpp']):.2f}x tg {med(lambda v: v['ftg'] / v['ltg']):.2f}x"
          f" batch8/tg {med(lambda v: v['fb'] / v['ftg']):.2f}x")
    xs = [v for v in rs if "isa" in v]
    if xs:
        xmed = lambda f: st.median(f(v) for v in xs)
        print(f"  ferrum with FERRUM_CPU_ISA={xs[0]['isa']}: {len(xs)} rounds; pp512 {xmed(lambda v: v['xpp']):.1f}"
              f" tg64 {xmed(lambda v: v['xtg']):.2f} batch8 {xmed(lambda v: v['xb']):.1f}; paired, detected over capped:"
              f" pp {xmed(lambda v: v['fpp'] / v['xpp']):.2f}x tg {xmed(lambda v: v['ftg'] / v['xtg']):.2f}x"
              f" batch8 {xmed(lambda v: v['fb'] / v['xb']):.2f}x; its batch8/tg {xmed(lambda v: v['xb'] / v['xtg']):.2f}x")
EOF
  # Where the time goes, after the timed rounds (the clock reads cost a
  # little): no profiler runs there.
  for m in "$C"/*.head; do
    m=$(basename "$m" .head)
    "${pin[@]}" timeout 120 "$W/ferrum" bench -m "$W/$m.gguf" -t 2 -p 0 -n 64 -r 2 --batch 8 \
      --profile >"$R/profile-$m.txt" 2>&1
  done
}

case "${1:-}" in
  prep) shift && prep "$@" ;;
  run) run ;;
  *) echo "usage: bash scripts/cpu-side-by-side.sh prep LLAMA_BENCH MODEL.gguf... | run" >&2; exit 2 ;;
esac
