"""ctypes bindings of the NCCL C API exported by librcclrs.so.

Only what the torch.distributed backend uses is declared. Every call goes
through :func:`check`, which turns a failure code into :class:`RcclError`
carrying the library's own message (``ncclGetLastError``).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading

import torch.distributed as dist

# ncclResult_t
SUCCESS = 0
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
IN_PROGRESS = 7
RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}

# ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4

# ncclScalarResidence_t
SCALAR_HOST_IMMEDIATE = 1

# How the library's message says that RCCL_TIMEOUT_MS ran out.
TIMEOUT_DETAIL = "timed out after"

LIBRARY_ENV = "RCCLRS_LIBRARY"
LIBRARY_NAME = "librcclrs.so"


class RcclError(dist.DistBackendError):
    """A failure reported by librcclrs: ``code`` is the ``ncclResult_t``."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def _repo_root() -> pathlib.Path:
    # python/rcclrs/_nccl.py -> the repository root
    return pathlib.Path(__file__).resolve().parents[2]


def candidates() -> list[pathlib.Path]:
    """Where the library is looked for, in order (after $RCCLRS_LIBRARY)."""
    dirs = []
    if os.environ.get("CARGO_TARGET_DIR"):
        dirs.append(pathlib.Path(os.environ["CARGO_TARGET_DIR"]))
    dirs.append(_repo_root() / "target")
    return [d / "release" / LIBRARY_NAME for d in dirs]


def find_library() -> pathlib.Path:
    """The path of librcclrs.so: $RCCLRS_LIBRARY, else the cargo target
    folder ($CARGO_TARGET_DIR, then the repository's target/) release build."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        path = pathlib.Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"{LIBRARY_ENV}={explicit}: no such file")
        return path
    for path in candidates():
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates())
    raise FileNotFoundError(
        f"{LIBRARY_NAME} not found (looked at {looked}). Build it with "
        f"`cargo build --release -p rccl-ffi` in the rccl-rs repository, or set "
        f"{LIBRARY_ENV} to its path."
    )


_lib = None
_lib_lock = threading.Lock()

_c_int, _c_size, _vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
_SIGNATURES = {
    "ncclGetVersion": [ctypes.POINTER(_c_int)],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(_vp), _c_int, UniqueId, _c_int],
    "ncclCommDestroy": [_vp],
    "ncclCommAbort": [_vp],
    "ncclCommGetAsyncError": [_vp, ctypes.POINTER(_c_int)],
    "ncclAllReduce": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclBroadcast": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclReduce": [_vp, _vp, _c_size, _c_int, _c_int, _c_int, _vp, _vp],
    "ncclAllGather": [_vp, _vp, _c_size, _c_int, _vp, _vp],
    "ncclReduceScatter": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclAlltoAll": [_vp, _vp, _c_size, _c_int, _vp, _vp],
    "ncclGather": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclScatter": [_vp, _vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclSend": [_vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclRecv": [_vp, _c_size, _c_int, _c_int, _vp, _vp],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclRedOpCreatePreMulSum": [ctypes.POINTER(_c_int), _vp, _c_int, _c_int, _vp],
    "ncclRedOpDestroy": [_c_int, _vp],
}


def lib() -> ctypes.CDLL:
    """The loaded library (loaded once, on first use)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            path = find_library()
            handle = ctypes.CDLL(str(path))
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.argtypes = argtypes
                fn.restype = _c_int
            handle.ncclGetLastError.argtypes = [_vp]
            handle.ncclGetLastError.restype = ctypes.c_char_p
            handle.ncclGetErrorString.argtypes = [_c_int]
            handle.ncclGetErrorString.restype = ctypes.c_char_p
            handle.path = path
            _lib = handle
        return _lib


def check(code: int, what: str, comm=None) -> int:
    """Raises :class:`RcclError` unless ``code`` is ncclSuccess."""
    if code == SUCCESS:
        return code
    message = lib().ncclGetLastError(comm)
    detail = message.decode(errors="replace") if message else ""
    if not detail:
        detail = (lib().ncclGetErrorString(code) or b"").decode(errors="replace")
    name = RESULT_NAMES.get(code, f"ncclResult {code}")
    if TIMEOUT_DETAIL in detail:
        # Worded as torch's callers look for a timeout (gloo: "Timed out
        # waiting 1000ms for recv operation to complete").
        raise RcclError(f"rcclrs: {what} failed ({name}): Timed out waiting for the other ranks: {detail}", code)
    raise RcclError(f"rcclrs: {what} failed ({name}): {detail}", code)


def version() -> int:
    v = ctypes.c_int()
    check(lib().ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return v.value
