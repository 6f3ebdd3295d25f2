#!/usr/bin/env bash
# Static check of the committed fatbin: what an H100/H200 (sm_90) would
# execute, kernel by kernel. Reports registers, stack, spills, declared
# threads per block and the global/generic memory instructions by width,
# then holds each kernel to device/fatbin/CHECKS (no spills, at least its
# minimum threads per block, at most its budget of payload accesses
# narrower than 16 bytes). scripts/check_kernels.py parses cuobjdump's
# output and documents how an access is classed. No GPU and no compiler
# needed; the table also goes to target/check-kernels.md.
#
# cuobjdump (and nvdisasm, which its -sass runs) come from NVIDIA's PyPI
# wheels into .cuda/sass-tools (ignored by git; RCCL_SASS_TOOLS names
# another folder). Their wheels start at 13.2, which reads the cubins
# nvcc 13.0 writes; the pin keeps the SASS spelling the parser reads
# fixed. A failed download is tried once more, then the check exits 2.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tools=${RCCL_SASS_TOOLS:-$root/.cuda/sass-tools}
pins=(
  nvidia-cuda-cuobjdump==13.2.86
  nvidia-cuda-nvdisasm==13.2.86
)
bin=$tools/nvidia/cu13/bin
if [ ! -x "$bin/cuobjdump" ] || [ ! -x "$bin/nvdisasm" ]; then
  install() { python3 -m pip install --quiet --no-deps --upgrade --target "$tools" "${pins[@]}"; }
  if ! install && ! { echo "check-kernels: download failed, retrying" >&2; install; }; then
    echo "check-kernels: could not install ${pins[*]} into $tools (no network or no package index?)" >&2
    exit 2
  fi
fi

mkdir -p target
PATH="$bin:$PATH" python3 scripts/check_kernels.py "$bin/cuobjdump" \
  device/fatbin/kernels.fatbin device/fatbin/CHECKS target/check-kernels.md
