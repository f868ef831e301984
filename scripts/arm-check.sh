#!/usr/bin/env bash
# The Arm (AArch64) check, on an x86-64 machine: cross-compiles the CPU
# kernels' tests and `logits_digest` (ferrum-models' example: one
# perplexity-style chunk of a real model, every logit's bits hashed), runs
# the kernel tests under qemu-user on three CPU models (`max`: NEON +
# dotprod + i8mm; cortex-a76: dotprod, no i8mm; cortex-a53: plain NEON),
# then the digest on `max` and cortex-a53, which must equal this machine's
# native digest.
#
# Installs what it needs (the rustup target; Debian's qemu-user and
# gcc-aarch64-linux-gnu, as root). Models come from $FERRUM_MODELS.
# Speed under emulation means nothing: this checks results only.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
rustup target list --installed | grep -q "^$TARGET$" || rustup target add "$TARGET"
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
fi
SYSROOT=/usr/aarch64-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++

# One build for the tests and the digest: separate cargo invocations would
# unify features differently and compile the kernels and their
# dependencies twice.
echo "== [$((SECONDS / 60))m] aarch64: build the kernel tests and logits_digest"
cargo test -q --no-run --message-format=json-render-diagnostics --target "$TARGET" \
  -p ferrum-kernels -p ferrum-models --lib --test cpu_ops --test quant_gemm --test dequant \
  --example logits_digest >target/arm-build.json
# "package name"/"target name"/executable of each built executable.
mapfile -t BUILT < <(python3 - <<'PY'
import json
for line in open("target/arm-build.json"):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["package_id"].split("#")[0].rsplit("/", 1)[-1], m["target"]["name"], m["executable"])
PY
)
TESTS=() DIGEST=
for row in "${BUILT[@]}"; do
  read -r pkg name exe <<<"$row"
  case "$pkg/$name" in
    ferrum-kernels/*) TESTS+=("$exe") ;;
    */logits_digest) DIGEST=$exe ;;
  esac
done
if [ ${#TESTS[@]} -ne 4 ] || [ -z "$DIGEST" ]; then
  echo "error: expected 4 kernel test binaries and logits_digest, got: ${BUILT[*]}" >&2
  exit 1
fi

MODELS=${FERRUM_MODELS:-$HOME/.cache/ferrum/models}
MODEL=$MODELS/gemma-3-270m-q4_k_m.gguf
TEXT=/usr/share/common-licenses/GPL-3
IDS=target/arm-digest-ids.json
native=
if [ -f "$MODEL" ] && [ -f "$TEXT" ]; then
  # `cargo test --workspace` builds the native digest and CLI; build them
  # where it has not. The CLI tokenizes the text here, so the Arm build
  # needs no tokenizer.
  NATIVE=target/debug/examples/logits_digest
  [ -x "$NATIVE" ] || cargo build -q -p ferrum-models --example logits_digest
  [ -x target/debug/ferrum ] || cargo build -q -p ferrum-cli
  target/debug/ferrum tokenize --model "$MODEL" --json --add-special -- "$(cat "$TEXT")" | tail -1 >"$IDS"
  native=$("$NATIVE" "$MODEL" "$IDS")
  echo "native: $native"
else
  echo "the logits check is skipped: $MODEL or $TEXT is missing (scripts/fetch-models.sh gemma3)"
fi

kernel_tests() {
  echo "-- kernel tests, qemu -cpu $1"
  for exe in "${TESTS[@]}"; do
    qemu-aarch64 -L $SYSROOT -cpu "$1" "$exe" -q
  done
}

# The SMMLA + SDOT kernels (max) and the plain NEON ones (cortex-a53).
# Arm computes x86's bits: the quantized kernels take the same integer
# sums and float steps in the same order on both (kernel tests hold both
# to one scalar statement), and the f32 helpers' portable versions take
# the AVX2 versions' steps (a test holds them to its bits). So every logit
# is equal to the last bit: any difference is a path that has drifted from
# its statement. (Before the helpers and the Arm k-quant kernels were
# aligned, perplexity on this text moved 1.5%: last-bit differences
# flipped 8-bit activation roundings.)
digest() {
  [ -n "$native" ] || return 0
  local arm
  arm=$(qemu-aarch64 -L $SYSROOT -cpu "$1" "$DIGEST" "$MODEL" "$IDS")
  if [ "$arm" = "$native" ]; then
    echo "arm ($1): $arm: equal"
  else
    echo "arm ($1): $arm: DIFFERS from native" >&2
    return 1
  fi
}

# Each emulated run uses one core: two lanes keep CI's two cores busy,
# the second also running clippy on the Arm code paths. Each lane's log
# is printed whole once both end.
echo "== [$((SECONDS / 60))m] aarch64: kernel tests and logits under qemu, clippy (two lanes)"
(
  set -e
  kernel_tests max
  kernel_tests cortex-a76
  digest cortex-a53
) >target/arm-lane1.log 2>&1 &
lane1=$!
(
  set -e
  kernel_tests cortex-a53
  digest max
  echo "-- clippy on the Arm code paths"
  cargo clippy -q -p ferrum-kernels --target "$TARGET" --all-targets -- -D warnings
) >target/arm-lane2.log 2>&1 &
lane2=$!
status=0
wait $lane1 || status=1
wait $lane2 || status=1
cat target/arm-lane1.log target/arm-lane2.log
[ $status -eq 0 ] || echo "error: the Arm check failed (see the lanes above)" >&2
exit $status
