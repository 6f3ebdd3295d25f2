"""Smoke test of librcclrs through ctypes (plain python or pytest).

Finds the library at $RCCLRS_LIB, else under $CARGO_TARGET_DIR or target/
(release, then debug).
"""
import ctypes
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

ncclSuccess, ncclInvalidArgument = 0, 4
ncclFloat32, ncclSum = 7, 0


def load():
    if os.environ.get("RCCLRS_LIB"):
        return ctypes.CDLL(os.environ["RCCLRS_LIB"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    for profile in ("release", "debug"):
        lib = target / profile / "librcclrs.so"
        if lib.exists():
            return ctypes.CDLL(str(lib))
    raise FileNotFoundError("librcclrs.so: build it with cargo build --release -p rccl-ffi")


lib = load()
lib.ncclGetErrorString.restype = ctypes.c_char_p
lib.ncclGetLastError.restype = ctypes.c_char_p
lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def test_version():
    v = ctypes.c_int()
    assert lib.ncclGetVersion(ctypes.byref(v)) == ncclSuccess
    assert v.value >= 23200, v.value


def test_unique_id():
    uid = UniqueId()
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == ncclSuccess
    assert any(uid.internal)


def test_all_reduce_two_comms_in_a_group():
    comms = (ctypes.c_void_p * 2)()
    assert lib.ncclCommInitAll(comms, 2, None) == ncclSuccess
    n = 8
    send = [(ctypes.c_float * n)(*[r + i for i in range(n)]) for r in range(2)]
    recv = [(ctypes.c_float * n)() for _ in range(2)]
    assert lib.ncclGroupStart() == ncclSuccess
    for r in range(2):
        rc = lib.ncclAllReduce(send[r], recv[r], n, ncclFloat32, ncclSum, comms[r], None)
        assert rc == ncclSuccess
    assert lib.ncclGroupEnd() == ncclSuccess
    for r in range(2):
        assert list(recv[r]) == [float(2 * i + 1) for i in range(n)]
    for c in comms:
        assert lib.ncclCommDestroy(c) == ncclSuccess


def test_error_path():
    assert lib.ncclGetErrorString(ncclSuccess) == b"no error"
    assert lib.ncclGetErrorString(ncclInvalidArgument).startswith(b"invalid argument")
    buf = (ctypes.c_float * 4)()
    rc = lib.ncclAllReduce(buf, buf, 4, 99, ncclSum, None, None)
    assert rc == ncclInvalidArgument
    assert b"comm is NULL" in lib.ncclGetLastError(None)
    comms = (ctypes.c_void_p * 1)()
    assert lib.ncclCommInitAll(comms, 1, None) == ncclSuccess
    assert lib.ncclAllReduce(buf, buf, 4, 99, ncclSum, comms[0], None) == ncclInvalidArgument
    assert b"unknown datatype 99" in lib.ncclGetLastError(comms[0])
    assert lib.ncclCommDestroy(comms[0]) == ncclSuccess
    assert lib.ncclCommDestroy(comms[0]) == 5  # ncclInvalidUsage: already destroyed


def test_unique_ids_still_serve_in_a_forked_child():
    """One thread serves every unique id of a process; a child forked while
    it runs (multiprocessing's default on Linux) starts its own."""
    unused = UniqueId()
    assert lib.ncclGetUniqueId(ctypes.byref(unused)) == ncclSuccess  # the thread runs
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.environ["RCCL_TIMEOUT_MS"] = "5000"
        comms = (ctypes.c_void_p * 2)()
        rc = lib.ncclCommInitAll(comms, 2, None)
        os.write(write, bytes([rc]))
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == bytes([ncclSuccess]), got


if __name__ == "__main__":
    tests = [f for name, f in sorted(globals().items()) if name.startswith("test_")]
    for test in tests:
        test()
        print(f"{test.__name__}: ok")
    print(f"{len(tests)} passed")
