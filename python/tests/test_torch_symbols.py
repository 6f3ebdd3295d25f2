"""Every NCCL symbol that the installed torch's CUDA library imports is
exported by librcclrs.so, so that preloading it in place of NCCL
(`LD_PRELOAD=librcclrs.so`, README "PyTorch's NCCL process group") leaves
no symbol to NVIDIA's library. A torch that starts importing a new NCCL
symbol fails here rather than in a user's job.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch

from rcclrs import _nccl

TORCH_CUDA = pathlib.Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"


def dynamic_symbols(library, *flags):
    out = subprocess.run(
        ["nm", "-D", *flags, str(library)], check=True, capture_output=True, text=True
    ).stdout
    return {m.group(1) for m in re.finditer(r"\b(p?nccl[A-Za-z0-9_]+)$", out, re.M)}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
@pytest.mark.skipif(not TORCH_CUDA.is_file(), reason="this torch has no libtorch_cuda.so")
def test_every_nccl_symbol_torch_imports_is_exported():
    imported = dynamic_symbols(TORCH_CUDA, "--undefined-only")
    assert len(imported) > 20, f"torch imports only {sorted(imported)}: is this its NCCL build?"
    exported = dynamic_symbols(_nccl.find_library(), "--defined-only")
    missing = sorted(imported - exported)
    assert not missing, f"torch {torch.__version__} imports NCCL symbols librcclrs.so lacks: {missing}"


UNIQUE_ID = "import torch; print(bytes(torch.cuda.nccl.unique_id()[:4]))"


@pytest.mark.skipif(not TORCH_CUDA.is_file(), reason="this torch has no libtorch_cuda.so")
def test_preloaded_library_serves_torchs_nccl_calls():
    # torch.cuda.nccl.unique_id() calls ncclGetUniqueId from
    # libtorch_cuda.so at run time, no GPU needed; rccl-rs's ids start
    # with "RCID". Without the preload NVIDIA's library answers.
    def unique_id_magic(env):
        out = subprocess.run(
            [sys.executable, "-c", UNIQUE_ID], env=env, check=True, capture_output=True,
            text=True, timeout=120,
        )
        return out.stdout.strip(), out.stderr

    library = str(_nccl.find_library())
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_DEBUG")}
    magic, _ = unique_id_magic(plain)
    assert magic != "b'RCID'", "without the preload, torch's own NCCL should answer"
    magic, bindings = unique_id_magic({**plain, "LD_PRELOAD": library, "LD_DEBUG": "bindings"})
    assert magic == "b'RCID'", magic
    bound = [l for l in bindings.splitlines() if "libtorch_cuda.so" in l and "`ncclGetUniqueId'" in l]
    assert bound and all(library in l for l in bound), bound
