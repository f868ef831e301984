#!/usr/bin/env bash
# The Arm (AArch64) check, on an x86-64 machine: cross-compiles the CPU
# kernels' tests and the `ferrum` binary, runs the kernel tests under
# qemu-user on three CPU models (`max`: NEON + dotprod + i8mm; cortex-a76:
# dotprod, no i8mm; cortex-a53: plain NEON), then one perplexity chunk of
# a real model on `max` and cortex-a53, which must equal this machine's
# native figure to the last digit.
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

echo "== [$((SECONDS / 60))m] aarch64: kernel tests under qemu"
for cpu in max cortex-a76 cortex-a53; do
  echo "-- qemu -cpu $cpu"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT -cpu $cpu" \
    cargo test -q -p ferrum-kernels --target "$TARGET" --lib --test cpu_ops --test quant_gemm --test dequant
done

echo "== [$((SECONDS / 60))m] aarch64: clippy on the Arm code paths"
cargo clippy -q -p ferrum-kernels --target "$TARGET" --all-targets -- -D warnings

echo "== [$((SECONDS / 60))m] aarch64: one perplexity chunk of a real model under qemu"
MODELS=${FERRUM_MODELS:-$HOME/.cache/ferrum/models}
MODEL=$MODELS/gemma-3-270m-q4_k_m.gguf
TEXT=/usr/share/common-licenses/GPL-3
if [ ! -f "$MODEL" ] || [ ! -f "$TEXT" ]; then
  echo "skipped: $MODEL or $TEXT is missing (fetch.sh gemma3)"
  exit 0
fi
# The native figure comes from $FERRUM_BIN where CI has built one already.
NATIVE=${FERRUM_BIN:-}
if [ -z "$NATIVE" ]; then
  cargo build -q -p ferrum-cli
  NATIVE=target/debug/ferrum
fi
cargo build -q -p ferrum-cli --target "$TARGET"
ARGS=(perplexity --model "$MODEL" --file "$TEXT" --ctx 128 --chunks 1 --json)
native=$("$NATIVE" "${ARGS[@]}" 2>/dev/null | tail -1)
echo "native: $native"
# The SMMLA + SDOT kernels (max) and the plain NEON ones (cortex-a53).
for cpu in max cortex-a53; do
arm=$(qemu-aarch64 -L $SYSROOT -cpu $cpu "target/$TARGET/debug/ferrum" "${ARGS[@]}" 2>/dev/null | tail -1)
echo "arm ($cpu): $arm"
python3 - "$native" "$arm" <<'EOF'
import json, sys
native, arm = (json.loads(s)["ppl"] for s in sys.argv[1:3])
# Arm computes x86's bits: the quantized kernels take the same integer
# sums and float steps in the same order on both (kernel tests hold both
# to one scalar statement), and the f32 helpers' portable versions take
# the AVX2 versions' steps (a test holds them to its bits). So the whole
# model gives the same perplexity to the last digit: any difference is a
# path that has drifted from its statement. (Before the helpers and the
# Arm k-quant kernels were aligned, this chunk moved 1.5%: last-bit
# differences flipped 8-bit activation roundings.)
print(f"perplexity: native {native!r}, arm {arm!r}")
sys.exit(0 if arm == native else 1)
EOF
done
