"""Every NCCL symbol that the installed torch's CUDA library imports is
exported by librcclrs.so, so that preloading it in place of NCCL
(`LD_PRELOAD=librcclrs.so`, README "PyTorch's NCCL process group") leaves
no symbol to NVIDIA's library. A torch that starts importing a new NCCL
symbol fails here rather than in a user's job.
"""

import pathlib
import re
import shutil
import subprocess

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
