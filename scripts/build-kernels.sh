#!/usr/bin/env bash
# Builds the CUDA kernels (device/kernels/*.cu, *.h) into device/fatbin/
# and writes device/fatbin/MANIFEST: the compiler's version, its flags, the
# sha256 of every source and of the fatbin. The fatbin and the manifest are
# committed, so `cargo build` never needs nvcc; the device crate's test
# `manifest` fails when a source or the fatbin no longer matches.
#
# nvcc comes from NVIDIA's PyPI wheels, pinned to 13.0.x and installed into
# .cuda/wheels (ignored by git): the GPU machines run a CUDA 13.0 driver,
# which refuses PTX of a newer ISA.
#
# Targets: SASS for sm_80, sm_90 and sm_100, and compute_80 PTX that newer
# GPUs compile at load time.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
wheels=${RCCL_CUDA_WHEELS:-$root/.cuda/wheels}
pins=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.88
  nvidia-cuda-cccl==13.0.85
)
nvcc=$wheels/nvidia/cu13/bin/nvcc
if [ ! -x "$nvcc" ]; then
  python3 -m pip install --quiet --no-deps --target "$wheels" "${pins[@]}"
fi
version=$("$nvcc" --version | grep -o 'V[0-9][0-9.]*' | tail -1)
case "$version" in
  V13.0.*) ;;
  *) echo "build-kernels: nvcc $version is not 13.0.x" >&2; exit 1 ;;
esac

flags=(
  -std=c++17 -O3
  # Each multiply and add rounded on its own, as the host kernels do.
  -fmad=false
  --compress-mode=size
  -gencode arch=compute_80,code=sm_80
  -gencode arch=compute_90,code=sm_90
  -gencode arch=compute_100,code=sm_100
  -gencode arch=compute_80,code=compute_80
)
out=device/fatbin/kernels.fatbin
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$nvcc" --threads 0 -fatbin "${flags[@]}" -o "$tmp/kernels.fatbin" device/kernels/kernels.cu
mv "$tmp/kernels.fatbin" "$out"

sha() { sha256sum "$1" | cut -d' ' -f1; }
{
  echo "# Written by scripts/build-kernels.sh; checked by the device crate's test 'manifest'."
  echo "nvcc $version"
  echo "flags ${flags[*]}"
  for source in $(cd device/kernels && ls -- *.cu *.h | LC_ALL=C sort); do
    echo "source device/kernels/$source $(sha "device/kernels/$source")"
  done
  echo "fatbin $out $(sha "$out") $(stat -c %s "$out")"
} > device/fatbin/MANIFEST
cat device/fatbin/MANIFEST
