"""torch.distributed on rccl-rs.

``import rcclrs`` registers the ``"rcclrs"`` backend for CPU tensors::

    import torch.distributed as dist
    import rcclrs  # noqa: F401

    dist.init_process_group("rcclrs")      # under torchrun
    group = dist.new_group(backend="rcclrs")  # or beside another default group

The library, librcclrs.so, is found through $RCCLRS_LIBRARY, else in the
cargo target folder of the repository this package lives in.
"""

from ._nccl import RcclError, find_library
from .backend import BACKEND_NAME, ProcessGroupRccl, Work, create_process_group, register

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupRccl",
    "RcclError",
    "Work",
    "create_process_group",
    "find_library",
    "register",
]

register()
