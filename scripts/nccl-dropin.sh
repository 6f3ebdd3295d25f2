#!/usr/bin/env bash
# Builds librcclrs and makes it loadable as NCCL: target/<profile>/nccl/
# gets libnccl.so.2 and libnccl.so (links to librcclrs.so) and nccl.h.
# Programs built against NVIDIA's NCCL then run on rccl-rs with
#   LD_LIBRARY_PATH=target/release/nccl ./program
# Usage: scripts/nccl-dropin.sh [--debug]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
flag=--release
if [ "${1:-}" = "--debug" ]; then profile=debug; flag=; fi
cargo build $flag -p rccl-ffi
target="${CARGO_TARGET_DIR:-target}"
out="$target/$profile/nccl"
mkdir -p "$out"
ln -sf ../librcclrs.so "$out/libnccl.so.2"
ln -sf libnccl.so.2 "$out/libnccl.so"
cp ffi/include/nccl.h "$out/nccl.h"
echo "$out: libnccl.so.2 -> librcclrs.so, nccl.h"
echo "run programs built against NCCL with: LD_LIBRARY_PATH=$(cd "$out" && pwd) <program>"
